package cuda

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

//go:embed kernels.cu
var kernelSource string

// KernelsEnv names a file of kernels to compile in place of the embedded
// kernels.cu: for measuring a kernel change against the binary's own in
// one session (an A/B on a GPU machine without a Go toolchain). The file
// must define the same kernels with the same parameters; the device's
// KernelSource names it.
const KernelsEnv = "OMNIPIPE_CUDA_KERNELS"

// kernelsToCompile returns the embedded kernels, or the file KernelsEnv
// names and its path.
func kernelsToCompile() (src, path string, err error) {
	path = os.Getenv(KernelsEnv)
	if path == "" {
		return kernelSource, "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("cuda: %s: %w", KernelsEnv, err)
	}
	return string(b), path, nil
}

// nvrtc holds libnvrtc's entry points.
type nvrtc struct {
	lib                                                            string
	create, destroy, compile, logSize, getLog, cubinSize, getCubin uintptr
	version, errString                                             uintptr
}

var (
	nvOnce sync.Once
	nv     *nvrtc
	nvErr  error
)

// nvrtcNames are the sonames tried in order (CUDA 13, 12, unversioned).
var nvrtcNames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}

func loadNVRTC() (*nvrtc, error) {
	nvOnce.Do(func() {
		var h uintptr
		var name string
		names := nvrtcNames
		if p := os.Getenv(NVRTCEnv); p != "" {
			names = []string{p}
		}
		for _, n := range names {
			if p, err := purego.Dlopen(n, rtldNowGlobl); err == nil {
				h, name = p, n
				break
			}
		}
		if h == 0 {
			nvErr = fmt.Errorf("cuda: NVRTC not found (tried %s): install the CUDA toolkit's libnvrtc", strings.Join(names, ", "))
			return
		}
		n := &nvrtc{lib: name}
		for _, s := range []struct {
			p    *uintptr
			name string
		}{
			{&n.create, "nvrtcCreateProgram"}, {&n.destroy, "nvrtcDestroyProgram"},
			{&n.compile, "nvrtcCompileProgram"}, {&n.logSize, "nvrtcGetProgramLogSize"},
			{&n.getLog, "nvrtcGetProgramLog"}, {&n.cubinSize, "nvrtcGetCUBINSize"},
			{&n.getCubin, "nvrtcGetCUBIN"}, {&n.version, "nvrtcVersion"},
			{&n.errString, "nvrtcGetErrorString"},
		} {
			p, err := purego.Dlsym(h, s.name)
			if err != nil {
				nvErr = fmt.Errorf("cuda: %s lacks %s", name, s.name)
				return
			}
			*s.p = p
		}
		nv = n
	})
	return nv, nvErr
}

// Version returns NVRTC's major and minor version.
func (n *nvrtc) Version() (int, int) {
	var maj, min int32
	purego.SyscallN(n.version, uintptr(unsafe.Pointer(&maj)), uintptr(unsafe.Pointer(&min)))
	return int(maj), int(min)
}

func (n *nvrtc) check(call string, r uintptr) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(r)}
	if p, _, _ := purego.SyscallN(n.errString, r); p != 0 {
		e.Msg = goString(*(**byte)(unsafe.Pointer(&p)))
	}
	return e
}

// compileOptions returns NVRTC's options for an architecture and fault.
// Contraction of a*b+c into FMA is off so that every rounding point is the
// one written in the source (explicit fmaf calls stay fused). The
// optimiser runs its passes on as many threads as NVRTCThreadsEnv says
// (splitCompile).
func compileOptions(arch string, fault string) []string {
	opts := []string{"--gpu-architecture=" + arch, "--std=c++17", "--fmad=false", "-default-device"}
	if o := splitCompile(os.Getenv(NVRTCThreadsEnv)); o != "" {
		opts = append(opts, o)
	}
	if fault != "" {
		opts = append(opts, "-DFAULT_"+fault)
	}
	return opts
}

// NVRTCThreadsEnv bounds the threads NVRTC's optimiser may use on a
// compile (its --split-compile): unset or 0, every core; 1, one thread
// (NVRTC's own default). A first compile of the kernels took 76 s on one
// core of the H200 machine, 32 s on its 16.
const NVRTCThreadsEnv = "OMNIPIPE_NVRTC_THREADS"

// splitOption is the prefix of NVRTC's split-compile option.
const splitOption = "--split-compile="

// splitCompile returns the split-compile option for the value of
// NVRTCThreadsEnv ("" where it asks for one thread or is not a count).
func splitCompile(env string) string {
	n := 0
	if env != "" {
		v, err := strconv.Atoi(env)
		if err != nil || v < 0 {
			return ""
		}
		n = v
	}
	if n == 1 {
		return ""
	}
	return splitOption + strconv.Itoa(n)
}

// nvrtcInvalidOption is NVRTC_ERROR_INVALID_OPTION.
const nvrtcInvalidOption = 5

// isInvalidOption reports whether err is NVRTC refusing an option.
func isInvalidOption(err error) bool {
	var ce *Error
	return errors.As(err, &ce) && ce.Code == nvrtcInvalidOption
}

// withoutSplit returns opts less the split-compile option (ok false: it
// had none).
func withoutSplit(opts []string) (rest []string, ok bool) {
	i := slices.IndexFunc(opts, func(o string) bool { return strings.HasPrefix(o, splitOption) })
	if i < 0 {
		return opts, false
	}
	return slices.Delete(slices.Clone(opts), i, i+1), true
}

// emuQuickBuild is the define that has the CUDA emulator compile a module
// without optimisation (g++ -O0: about half -Og's build time, its kernels
// 3–4× slower).
const emuQuickBuild = "-DOMNI_EMU_QUICK_BUILD"

// moduleOptions is compileOptions for d: on the emulator a planted fault
// whose check is light (all but the products', the fused ops' and the
// sampler's, which take seconds there) builds quickly, since the contract's
// controls are a C++ build each there and their checks then run in
// milliseconds; NVRTC never sees the define. A host fault (hostFaults)
// compiles nothing of its own.
func (d *Device) moduleOptions(fault string) []string {
	if hostFaults[fault] {
		fault = "" // planted in the Go code: the embedded kernels as they are
	}
	opts := compileOptions(d.arch, fault)
	if d.drv.emulated && fault != "" {
		switch Faults[fault] {
		case "matmul", "normglu", "fused", "sample": // checks of seconds
		default:
			opts = append(opts, emuQuickBuild)
		}
	}
	return opts
}

// cacheKey names the compiled module of source under opts for a driver
// and NVRTC version: any change to one of them compiles afresh.
func cacheKey(source string, opts []string, driverVersion int, nvrtcVersion string) string {
	h := sha256.New()
	fmt.Fprintf(h, "omni-pipe cuda kernels\x00driver %d\x00nvrtc %s\x00", driverVersion, nvrtcVersion)
	o := append([]string(nil), opts...)
	sort.Strings(o)
	for _, s := range o {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write([]byte(source))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// cachePath returns the cache file for key under dir ("" means the user's
// cache directory; "-" disables the cache).
func cachePath(dir, key string) string {
	if dir == "-" {
		return ""
	}
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(base, "omni-pipe", "cuda")
	}
	return filepath.Join(dir, key+".cubin")
}

// kernelCompiler compiles kernel source to a cubin (NVRTC; a fake in tests).
type kernelCompiler interface {
	Compile(source string, opts []string) ([]byte, error)
}

// compileCached returns the cubin for source under opts from cacheFile
// when it holds one ("" means no disk cache; a hit refreshes the file's
// time, so that pruning takes it last), else compiles it through nv —
// telling log, when set, before (a first compile takes half a minute to a minute) and
// how long it took after — and writes it there, pruning the cache to
// maxCacheBytes. fromCache says which.
func compileCached(nv kernelCompiler, log *slog.Logger, arch, source string, opts []string, cacheFile string) (cubin []byte, fromCache bool, err error) {
	if cacheFile != "" {
		if b, err := os.ReadFile(cacheFile); err == nil && len(b) > 0 {
			now := time.Now()
			os.Chtimes(cacheFile, now, now)
			return b, true, nil
		}
	}
	if log != nil {
		log.Info("compiling CUDA kernels (first use of this build on this GPU and driver; half a minute to a minute)", "arch", arch, "cache", cacheFile)
	}
	start := time.Now()
	cubin, err = nv.Compile(source, opts)
	if isInvalidOption(err) {
		// An NVRTC older than split compilation (CUDA 12.1's) compiles on
		// one thread; any other refusal stands.
		if rest, split := withoutSplit(opts); split {
			if log != nil {
				log.Warn("NVRTC does not split compiles; compiling on one thread", "err", err)
			}
			cubin, err = nv.Compile(source, rest)
		}
	}
	if err != nil {
		return nil, false, err
	}
	if log != nil {
		log.Info("CUDA kernels compiled", "arch", arch, "seconds", fmt.Sprintf("%.1f", time.Since(start).Seconds()), "bytes", len(cubin))
	}
	if cacheFile != "" {
		// Best effort: write a temporary file and rename it into place so
		// that concurrent processes never read a partial module.
		if err := os.MkdirAll(filepath.Dir(cacheFile), 0o755); err == nil {
			tmp := fmt.Sprintf("%s.%d.tmp", cacheFile, os.Getpid())
			if os.WriteFile(tmp, cubin, 0o644) == nil && os.Rename(tmp, cacheFile) == nil {
				pruneCache(filepath.Dir(cacheFile), cacheFile, maxCacheBytes)
			}
		}
	}
	return cubin, false, nil
}

// Compile returns machine code (a cubin) for the kernels (no cache:
// compileCached adds it).
func (n *nvrtc) Compile(source string, opts []string) ([]byte, error) {
	src := cString(source)
	name := cString("omni-pipe.cu")
	var prog uintptr
	r, _, _ := purego.SyscallN(n.create, uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(&src[0])),
		uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
	if err := n.check("nvrtcCreateProgram", r); err != nil {
		return nil, err
	}
	defer purego.SyscallN(n.destroy, uintptr(unsafe.Pointer(&prog)))
	cs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cs[i] = cString(o)
		ptrs[i] = &cs[i][0]
	}
	r, _, _ = purego.SyscallN(n.compile, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&ptrs[0])))
	if cerr := n.check("nvrtcCompileProgram", r); cerr != nil {
		var ls uintptr
		purego.SyscallN(n.logSize, prog, uintptr(unsafe.Pointer(&ls)))
		if ls > 1 {
			log := make([]byte, ls)
			purego.SyscallN(n.getLog, prog, uintptr(unsafe.Pointer(&log[0])))
			return nil, fmt.Errorf("%w:\n%s", cerr, strings.TrimRight(string(log), "\x00\n"))
		}
		return nil, cerr
	}
	var size uintptr
	r, _, _ = purego.SyscallN(n.cubinSize, prog, uintptr(unsafe.Pointer(&size)))
	if err := n.check("nvrtcGetCUBINSize", r); err != nil {
		return nil, err
	}
	cubin := make([]byte, size)
	r, _, _ = purego.SyscallN(n.getCubin, prog, uintptr(unsafe.Pointer(&cubin[0])))
	if err := n.check("nvrtcGetCUBIN", r); err != nil {
		return nil, err
	}
	return cubin, nil
}

// maxCacheBytes bounds the kernel cache on disk. Every build of the
// kernels (a new release, another driver, each of the kernel contract's
// planted faults) adds a module of a few megabytes; past the bound the
// least recently used go.
const maxCacheBytes = 1 << 30

// pruneCache removes the least recently used modules (*.cubin, by
// modification time, which a cache hit refreshes) of dir until the rest
// fit in max bytes, never keep (the module just written). Best effort: a
// module another process is reading stays readable (it is unlinked), and
// a process that finds one gone compiles it again.
func pruneCache(dir, keep string, max int64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type mod struct {
		path string
		size int64
		mod  time.Time
	}
	var mods []mod
	var total int64
	for _, e := range ents {
		if e.IsDir() || filepath.Ext(e.Name()) != ".cubin" {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		mods = append(mods, mod{filepath.Join(dir, e.Name()), fi.Size(), fi.ModTime()})
		total += fi.Size()
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].mod.Before(mods[j].mod) })
	for _, m := range mods {
		if total <= max {
			break
		}
		if m.path == keep {
			continue
		}
		if os.Remove(m.path) == nil {
			total -= m.size
		}
	}
}
