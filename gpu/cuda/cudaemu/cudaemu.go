// Package cudaemu builds omni-pipe's CUDA emulator: a shared library with
// the CUDA driver and NVRTC entry points that package cuda calls, which
// runs the kernels of kernels.cu on the host CPU. NVRTC's compile becomes
// the host C++ compiler's (g++, or $CXX) with emu_rt.h, which gives every
// CUDA thread of a block its own fiber and gives way at each barrier and
// warp collective; the driver runs each stream's work when it is issued.
//
// It exists so that the backend's GPU tests (the kernel contract with its
// planted faults, the bit-identity tests of kernel variants, the graph
// replays with updated arguments) also run where there is no GPU: on CI
// and on a developer's laptop. It checks what a kernel computes, not how
// fast or in which hardware order: timing, races between blocks, the
// asynchrony of copies and of cp.async, and the tensor cores' own order of
// summation are outside it (mma.sync sums exactly and rounds once). A
// device opened on it says so (cuda.Device.Emulated; its name is "omni-pipe
// CUDA emulator (host CPU)").
//
// Use: call Enable before the first cuda.New of the process (it sets
// OMNIPIPE_CUDA_DRIVER and OMNIPIPE_NVRTC), or build the library with
// Build and set them yourself.
package cudaemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

//go:embed csrc/emu_rt.h csrc/emu_driver.cpp
var sources embed.FS

// Env turns the emulator on in the test binaries that honour it
// (OMNIPIPE_CUDA_EMU=1).
const Env = "OMNIPIPE_CUDA_EMU"

// ErrUnsupported reports a host the emulator does not build on.
var ErrUnsupported = errors.New("cudaemu: needs linux with a C++17 compiler (g++ or $CXX)")

var (
	enableOnce sync.Once
	enableLib  string
	enableErr  error
)

// Enable builds the emulator into the user's cache directory (once per
// process; later calls return the first result) and points package cuda at
// it through OMNIPIPE_CUDA_DRIVER and OMNIPIPE_NVRTC. It must run before
// the process's first cuda.New.
func Enable() (string, error) {
	enableOnce.Do(func() {
		enableLib, enableErr = Build(context.Background(), "")
		if enableErr != nil {
			return
		}
		for _, k := range []string{"OMNIPIPE_CUDA_DRIVER", "OMNIPIPE_NVRTC"} {
			if err := os.Setenv(k, enableLib); err != nil {
				enableErr = fmt.Errorf("cudaemu: %w", err)
				return
			}
		}
	})
	return enableLib, enableErr
}

// RunTests is a TestMain body for packages whose tests open CUDA devices:
// with OMNIPIPE_CUDA_EMU=1 it enables the emulator first (a failure to is
// fatal: the emulator was asked for), then runs the tests and returns
// their exit code.
func RunTests(m interface{ Run() int }) int {
	if _, err := EnableIfAsked(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// EnableIfAsked calls Enable when OMNIPIPE_CUDA_EMU=1 and says whether it
// was asked.
func EnableIfAsked() (bool, error) {
	if os.Getenv(Env) != "1" {
		return false, nil
	}
	_, err := Enable()
	return true, err
}

// Build compiles the emulator's library under dir ("" for the user's
// cache directory, or the temporary one where there is none) unless a build of the same sources by the same compiler
// is there, and returns its path.
func Build(ctx context.Context, dir string) (string, error) {
	if runtime.GOOS != "linux" {
		return "", ErrUnsupported
	}
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	ver, err := exec.CommandContext(ctx, cxx, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("cudaemu: %s --version: %w", cxx, err)
	}
	rt, _ := sources.ReadFile("csrc/emu_rt.h")
	drv, _ := sources.ReadFile("csrc/emu_driver.cpp")
	h := sha256.New()
	for _, b := range [][]byte{ver, rt, drv} {
		binary.Write(h, binary.LittleEndian, uint64(len(b)))
		h.Write(b)
	}
	sum := h.Sum(nil)
	key := hex.EncodeToString(sum)[:16]
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "omni-pipe-cudaemu") // no $HOME (a CI container)
		if base, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(base, "omni-pipe", "cudaemu")
		}
	}
	out := filepath.Join(dir, key)
	lib := filepath.Join(out, "libcudaemu.so")
	if fi, err := os.Stat(lib); err == nil && fi.Size() > 0 {
		return lib, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", fmt.Errorf("cudaemu: %w", err)
	}
	for name, b := range map[string][]byte{"emu_rt.h": rt, "emu_driver.cpp": drv} {
		if err := writeAtomic(filepath.Join(out, name), b); err != nil {
			return "", err
		}
	}
	// The module cache of package cuda keys on NVRTC's version: the
	// emulator reports 0.<its sources' hash>, so a changed emu_rt.h
	// compiles the kernels afresh.
	tag := binary.LittleEndian.Uint32(sum) & 0x7fffffff
	tmp := fmt.Sprintf("%s.%d.tmp", lib, os.Getpid())
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
		fmt.Sprintf("-DEMU_RT_DIR=%q", out), fmt.Sprintf("-DEMU_VERSION=%d", tag),
		filepath.Join(out, "emu_driver.cpp"), "-o", tmp, "-ldl")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("cudaemu: build the driver library: %w\n%s", err, stderr.Bytes())
	}
	if err := os.Rename(tmp, lib); err != nil {
		return "", fmt.Errorf("cudaemu: %w", err)
	}
	return lib, nil
}

// writeAtomic writes b to path through a temporary file, so that a
// concurrent build never reads a partial file.
func writeAtomic(path string, b []byte) error {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("cudaemu: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cudaemu: %w", err)
	}
	return nil
}
