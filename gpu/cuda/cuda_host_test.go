package cuda

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// These tests need no GPU: they check the host-side logic (argument
// packing, cache keys, launch shapes) and that the embedded source defines
// what the Go side launches.

func TestCacheKeyCoversWhatChangesTheCode(t *testing.T) {
	base := cacheKey("src", []string{"-a", "-b"}, 13000, "13.0")
	if got := cacheKey("src", []string{"-b", "-a"}, 13000, "13.0"); got != base {
		t.Errorf("option order changed the key: %s vs %s", got, base)
	}
	for name, k := range map[string]string{
		"source": cacheKey("src2", []string{"-a", "-b"}, 13000, "13.0"),
		"option": cacheKey("src", []string{"-a", "-b", "-DFAULT_X"}, 13000, "13.0"),
		"driver": cacheKey("src", []string{"-a", "-b"}, 13010, "13.0"),
		"nvrtc":  cacheKey("src", []string{"-a", "-b"}, 13000, "13.1"),
		"arch":   cacheKey("src", compileOptions("sm_80", ""), 13000, "13.0"),
	} {
		if k == base {
			t.Errorf("a different %s gave the same cache key", name)
		}
	}
	if a, b := cacheKey("s", compileOptions("sm_90", ""), 1, "1"), cacheKey("s", compileOptions("sm_89", ""), 1, "1"); a == b {
		t.Error("architectures share a cache entry")
	}
}

func TestCachePath(t *testing.T) {
	if p := cachePath("-", "k"); p != "" {
		t.Errorf(`cachePath("-") = %q, want no cache`, p)
	}
	if p := cachePath("/x/y", "k"); p != "/x/y/k.cubin" {
		t.Errorf("cachePath = %q", p)
	}
	if p := cachePath("", "k"); p != "" && !strings.HasSuffix(p, "omni-pipe/cuda/k.cubin") {
		t.Errorf("default cache path %q", p)
	}
}

// TestModuleOptionsQuickBuild: only the emulator's builds of light
// controls carry the quick-build define; a GPU's modules, the emulator's
// fault-free module and its heavy controls never do.
func TestModuleOptionsQuickBuild(t *testing.T) {
	quick := func(emulated bool, fault string) bool {
		d := &Device{drv: &driver{emulated: emulated}, arch: "sm_90"}
		return slices.Contains(d.moduleOptions(fault), emuQuickBuild)
	}
	for _, c := range []struct {
		emulated bool
		fault    string
		want     bool
	}{
		{false, "", false}, {false, "ROPE", false}, {false, "MMA", false},
		{true, "", false}, {true, "ROPE", true}, {true, "CONV2D_PW", true},
		{true, "MMA", false}, {true, "GEMV", false}, {true, "MMV_GLU", false}, {true, "EPILOGUE", false}, {true, "SAMPLE_TOPK", false},
	} {
		if got := quick(c.emulated, c.fault); got != c.want {
			t.Errorf("emulated %v, fault %q: quick build %v, want %v", c.emulated, c.fault, got, c.want)
		}
	}
}

func TestCompileOptionsTargetMachineCode(t *testing.T) {
	o := strings.Join(compileOptions("sm_90", ""), " ")
	if !strings.Contains(o, "--gpu-architecture=sm_90") || strings.Contains(o, "compute_") {
		t.Errorf("options %q do not ask for sm_90 machine code", o)
	}
	if !strings.Contains(o, "--fmad=false") {
		t.Errorf("options %q let the compiler contract products (rounding points move)", o)
	}
	if f := strings.Join(compileOptions("sm_90", "ROPE"), " "); !strings.Contains(f, "-DFAULT_ROPE") {
		t.Errorf("fault options %q", f)
	}
}

func TestKernelSourceDefinesEveryLaunchedKernel(t *testing.T) {
	for _, k := range kernelNames {
		plain := regexp.MustCompile(`__global__ void (__launch_bounds__\(\d+\) )?` + k + `\(`)
		macro := regexp.MustCompile(`((MATMUL|MMA)_KERNEL|\nMATMUL_TILED|\nGEMV(R|_NORM)?|\nMMVT?(_NORM(_GLU)?)?|\nSTD_BLOCK)\(` + k + `,`)
		if !plain.MatchString(kernelSource) && !macro.MatchString(kernelSource) {
			t.Errorf("kernels.cu defines no kernel %s", k)
		}
	}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		for _, r := range []int{1, 2, 3, 4, 5, 9, 100} {
			name := matmulKernel(matmulRows(r), dt)
			found := false
			for _, k := range kernelNames {
				found = found || k == name
			}
			if !found {
				t.Errorf("matmul of %d rows of %v launches %s, which is not loaded", r, dt, name)
			}
		}
	}
}

func TestEveryFaultIsPlanted(t *testing.T) {
	for f, op := range testFaults {
		if !strings.Contains(kernelSource, "FAULT_"+f+"\n") {
			t.Errorf("fault %s (%s) is not in kernels.cu", f, op)
		}
	}
	for f := range hostFaults {
		if _, ok := Faults[f]; !ok {
			t.Errorf("host fault %s has no contract control", f)
		}
	}
	for f, op := range Faults {
		if hostFaults[f] {
			continue // planted in the Go code (cublas.go); its control proves it
		}
		if !strings.Contains(kernelSource, "FAULT_"+f+"\n") {
			t.Errorf("fault %s (op %s) is not in kernels.cu", f, op)
		}
	}
	for _, m := range regexp.MustCompile(`FAULT_([A-Z0-9_]+)`).FindAllStringSubmatch(kernelSource, -1) {
		_, contract := Faults[m[1]]
		if _, own := testFaults[m[1]]; !contract && !own {
			t.Errorf("kernels.cu plants FAULT_%s, which no contract control checks", m[1])
		}
	}
}

func TestArgumentPacking(t *testing.T) {
	if a := f(1.5); a.v != uint64(math.Float32bits(1.5)) || a.reloc {
		t.Errorf("f(1.5) = %+v", a)
	}
	if a := i(-3); int64(a.v) != -3 {
		t.Errorf("i(-3) = %+v (an int kernel parameter reads the low 4 bytes: %d)", a, int32(a.v))
	}
	if a := i(-3); int32(uint32(a.v)) != -3 {
		t.Errorf("low word of i(-3) = %d", int32(uint32(a.v)))
	}
	if a := upload(48); !a.reloc || a.v != 48 {
		t.Errorf("upload(48) = %+v", a)
	}
	if b2i(true).v != 1 || b2i(false).v != 0 {
		t.Error("b2i")
	}
}

func TestMatmulLaunchShape(t *testing.T) {
	for _, c := range []struct{ m, n, r int }{{1, 1, 1}, {1, 6144, 1}, {2, 5, 2}, {3, 33, 4}, {9, 2048, 8}, {300, 65536, 8}} {
		if r := matmulRows(c.m); r != c.r {
			t.Errorf("matmulRows(%d) = %d, want %d", c.m, r, c.r)
		}
		g := matmulGrid(c.m, c.n, c.r)
		// 4 warps a block, 4 weight rows a warp: every output is covered.
		if int(g[0])*16 < c.n || int(g[1])*c.r < c.m || int(g[0]-1)*16 >= c.n || int(g[1]-1)*c.r >= c.m {
			t.Errorf("grid %v for %d×%d with %d-row tiles", g, c.m, c.n, c.r)
		}
	}
}

func TestMMALaunchShape(t *testing.T) {
	for _, c := range []struct {
		m, n        int
		force, name string
	}{
		{1, 1, "", "mma_bf16_m8"}, {8, 8192, "", "mma_bf16_m8"}, {9, 16, "", "mma_bf16_m16"}, {16, 17, "", "mma_bf16_m16"},
		{17, 65536, "", "mma_bf16_big"}, {32, 8192, "", "mma_bf16_big"}, {33, 4096, "", "mma_bf16_big"}, {20, 100, "mma_bf16_m32", "mma_bf16_m32"}, {93, 2049, "", "mma_bf16_big"},
		{512, 8192, "", "mma_bf16_big"}, {93, 2048, "mma_bf16_m32", "mma_bf16_m32"}, {5, 100, "mma_bf16_big", "mma_bf16_big"},
		{40, 100, "mma_bf16_m8", "mma_bf16_m8"},
		// Few 64 × 64 tiles: still the tile kernel (its classes split over
		// blocks, mmaBigSplit), not mma_tile's blocks.
		{62, 512, "", "mma_bf16_big"}, {62, 2048, "", "mma_bf16_big"}, {32, 2048, "", "mma_bf16_big"}, {20, 100, "", "mma_bf16_big"},
		{100, 1024, "", "mma_bf16_big"}, {100, 1088, "", "mma_bf16_big"}, {1000, 64, "", "mma_bf16_big"}, {4096, 64, "", "mma_bf16_big"},
		{20, 100, "mma_bf16_m16", "mma_bf16_m16"},
	} {
		name, g := mmaLaunch(c.m, c.n, 132, c.force)
		tn, tm := 16, map[string]int{"mma_bf16_m8": 8, "mma_bf16_m16": 16, "mma_bf16_m32": 32}[name]
		if name == "mma_bf16_big" {
			tn, tm = 64, 64
		}
		if name != c.name || int(g[0])*tn < c.n || int(g[0]-1)*tn >= c.n || int(g[1])*tm < c.m || int(g[1]-1)*tm >= c.m {
			t.Errorf("mmaLaunch(%d, %d, %q) = %s %v", c.m, c.n, c.force, name, g)
		}
	}
}

func TestMMABigSplit(t *testing.T) {
	for _, c := range []struct {
		m, n, k int
		force   string
		want    int
	}{
		{100, 2048, 2048, "", 8}, // 64 tiles: doubled while under 3 × 132 blocks
		{256, 2048, 8192, "", 4}, // 128 tiles; 16 planes of 256 × 2048 sums are 32 MiB
		{130, 2048, 2048, "", 8}, // 96 tiles
		{64, 8192, 2048, "", 4},  // 128 tiles
		{64, 8448, 2048, "", 1},  // 132 tiles fill the device
		{257, 2048, 8192, "", 1}, // their sums past 32 MiB
		{256, 8192, 2048, "", 1}, // 512 tiles fill the device
		{130, 1100, 300, "", 4},  // five classes: not 8
		{130, 1100, 64, "", 1},   // one class
		{17, 64, 2048, "", 16},   // one tile
		{100, 2048, 2048, "mma_bf16_big/1", 1},
		{100, 2048, 2048, "mma_bf16_big/3", 3},
		{100, 2048, 300, "mma_bf16_big/16", 5}, // at most the classes
		{100, 2048, 2048, "mma_bf16_big", 8},   // the name alone: the pick
	} {
		if got := mmaBigSplit(c.m, c.n, c.k, 132, c.force); got != c.want {
			t.Errorf("mmaBigSplit(%d, %d, %d, %q) = %d, want %d", c.m, c.n, c.k, c.force, got, c.want)
		}
	}
	for _, force := range []string{"mma_bf16_big/", "mma_bf16_big/0", "mma_bf16_big/x"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("mmaBigSplit(%q) did not panic", force)
				}
			}()
			mmaBigSplit(100, 2048, 2048, 132, force)
		}()
	}
	// A forced split still names the 64 × 64 kernel.
	if name, _ := mmaLaunch(5, 100, 132, "mma_bf16_big/4"); name != "mma_bf16_big" {
		t.Errorf("mmaLaunch(mma_bf16_big/4) = %s", name)
	}
}

func TestNoDriverIsAClearError(t *testing.T) {
	if _, err := loadDriver(); err == nil {
		t.Skip("this machine has a CUDA driver")
	}
	_, err := New(Options{})
	if !errors.Is(err, ErrNoDriver) || err.Error() != "no CUDA driver: libcuda.so.1 not found" {
		t.Errorf("New without a driver: %v", err)
	}
}

// TestKernelsParseWithHostCompiler type-checks kernels.cu, and every
// planted-fault variant, with the host's C++ compiler against stand-ins
// for the CUDA builtins (testdata/cuda_stub.h), so that a syntax or type
// error in the kernels fails here, on machines without NVRTC, instead of
// at the first run on a GPU. Skipped where there is no g++.
func TestKernelsParseWithHostCompiler(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++ on this machine")
	}
	src := regexp.MustCompile(`asm (volatile)?\(`).ReplaceAllString(kernelSource, "ASMSTUB(")
	file := filepath.Join(t.TempDir(), "kernels.cpp")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	stub, err := filepath.Abs("testdata/cuda_stub.h")
	if err != nil {
		t.Fatal(err)
	}
	variants := []string{""}
	for f := range Faults {
		variants = append(variants, f)
	}
	for _, f := range variants {
		args := []string{"-std=c++17", "-fsyntax-only", "-Wshadow", "-Werror=shadow", "-Wno-unknown-pragmas",
			"-include", stub, "-DASMSTUB(...)=(void)0", file}
		if f != "" {
			args = append(args, "-DFAULT_"+f)
		}
		if out, err := exec.Command(gxx, args...).CombinedOutput(); err != nil {
			t.Errorf("kernels.cu (fault %q) does not compile as C++: %v\n%s", f, err, out)
		}
	}
}

func TestGraphShapes(t *testing.T) {
	var g graphCache
	step := func(grid uint32, args ...uint64) ([]cmd, []uint64) {
		var cmds []cmd
		var slots []uint64
		for j := range minGraph {
			cmds = append(cmds, cmd{fn: uintptr(100 + j), grid: [3]uint32{grid, 1, 1}, block: [2]uint32{256, 1}, a0: int32(len(slots)), na: int32(len(args))})
			slots = append(slots, args...)
		}
		return cmds, slots
	}
	a, _ := step(4, 1, 2)
	b, _ := step(4, 7, 9) // other argument values (positions, lengths): the same graph
	c, _ := step(8, 1, 2) // another grid (a bigger batch): another graph
	if g.shapeKey(a) != g.shapeKey(b) || !sameCmdShape(a, b) {
		t.Error("batches that differ only in argument values have different shapes")
	}
	if g.shapeKey(a) == g.shapeKey(c) || sameCmdShape(a, c) {
		t.Error("batches with different grids share a shape")
	}
	r := &batch{cmds: a}
	if !graphable(r) {
		t.Error("a batch of launches is not graphable")
	}
	r.cmds = append(append([]cmd(nil), a...), cmd{free: 0x1000})
	if graphable(r) {
		t.Error("a batch with a stream-ordered free was graphable")
	}
	r.cmds = append(append([]cmd(nil), a...), cmd{gemm: &gemmCmd{m: 64, n: 64, k: 64}})
	if graphable(r) {
		t.Error("a batch with a cuBLAS GEMM (a prompt product) was graphable")
	}
	r.cmds = a[:minGraph-1]
	if graphable(r) {
		t.Error("a batch too short for a graph was graphable")
	}
	// The node parameters point at the command's own argument slots.
	params := make([]unsafe.Pointer, 2*minGraph)
	np := nodeParams(a[3], params)
	if np.params != uintptr(unsafe.Pointer(&params[a[3].a0])) || np.gx != 4 || np.bx != 256 || np.bz != 1 || np.fn != a[3].fn {
		t.Errorf("node params %+v", np)
	}
	if unsafe.Sizeof(kernelNodeParams{}) != 72 {
		t.Errorf("kernelNodeParams is %d bytes; CUDA_KERNEL_NODE_PARAMS_v2 is 72", unsafe.Sizeof(kernelNodeParams{}))
	}
}

// hostQueue is a Queue that records but never launches: enough to test
// what the recorder folds, without a GPU.
func hostQueue() *Queue {
	// closed: whatever would go to the owner thread fails at once (there is
	// no GPU): a recorder is what these tests look at.
	d := &Device{fns: map[string]uintptr{}, fnNames: map[uintptr]string{}, sms: 132, closed: true}
	for j, k := range kernelNames {
		d.fns[k] = uintptr(j + 1)
		d.fnNames[uintptr(j+1)] = k
	}
	return &Queue{d: d, name: "host"}
}

var nextFake uintptr = 1 << 20

func fakeTensor(dt gpu.DType, rows, cols int) gpu.Tensor {
	nextFake += 1 << 20
	return gpu.Tensor{Buf: &buffer{ptr: nextFake, dt: dt, n: rows * cols}, Rows: rows, Cols: cols, Stride: cols}
}

func TestRecorderFolds(t *testing.T) {
	x, y, o := fakeTensor(gpu.F32, 1, 64), fakeTensor(gpu.F32, 1, 32), fakeTensor(gpu.F32, 1, 32)
	w := fakeTensor(gpu.BF16, 32, 64)
	nw := fakeTensor(gpu.BF16, 1, 32)
	for _, c := range []struct {
		name     string
		ops      func(q *Queue)
		launches int
	}{
		{"matmul, round, silu, round, mul, round", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.RoundBF16(y)
			q.Act(y, y, gpu.SiLU)
			q.RoundBF16(y)
			q.Mul(y, y, o)
			q.RoundBF16(y)
		}, 1},
		{"rmsnorm, round, mulrow, round", func(q *Queue) {
			q.RMSNorm(y, o, 1e-5)
			q.RoundBF16(y)
			q.MulRow(y, y, nw)
			q.RoundBF16(y)
		}, 1},
		{"shortconv, round, mul, round (LFM2's C gate)", func(q *Queue) {
			q.ShortConv(y, o, fakeTensor(gpu.BF16, 32, 3), fakeTensor(gpu.F32, 2, 32))
			q.RoundBF16(y)
			q.Mul(y, x.ColSlice(0, 32), y)
			q.RoundBF16(y)
		}, 1},
		{"rope in fp32, round", func(q *Queue) {
			q.RoPE(y, gpu.RoPEParams{Style: gpu.Interleaved, HeadDim: 8, InvFreq: make([]float32, 4), Pos: []int32{3}})
			q.RoundBF16(y)
		}, 1},
		{"a round of another tensor is not folded", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.RoundBF16(o)
		}, 2},
		{"an op in between stops the fold", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.Fill(o, 0)
			q.RoundBF16(y)
		}, 3},
		{"an act after the elementwise step is not folded", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.Add(y, y, o)
			q.Act(y, y, gpu.SiLU)
		}, 2},
		{"an add of the output's own buffer is not folded", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.Add(y, y, y)
		}, 2},
		{"a mulrow does not fold into a product", func(q *Queue) {
			q.MatMul(y, x, w, gpu.Tensor{})
			q.MulRow(y, y, nw)
		}, 2},
	} {
		q := hostQueue()
		c.ops(q)
		if got := len(q.rec.cmds); got != c.launches {
			t.Errorf("%s: %d launches, want %d", c.name, got, c.launches)
		}
	}
	// The folded arguments: the gemv's epilogue is rnd, act, rnd1, e, lde, eop, rnd2.
	q := hostQueue()
	q.MatMul(y, x, w, gpu.Tensor{})
	q.RoundBF16(y)
	q.Act(y, y, gpu.SiLU)
	q.RoundBF16(y)
	q.Mul(y, o, y)
	q.RoundBF16(y)
	c := q.rec.cmds[0]
	epi := q.rec.slots[c.a0+c.na-7 : c.a0+c.na]
	want := []uint64{1, uint64(gpu.SiLU), 1, uint64(o.Buf.(*buffer).ptr), uint64(o.Stride), opMul, 1}
	if !slices.Equal(epi, want) {
		t.Errorf("epilogue arguments %v, want %v", epi, want)
	}
}

func TestAttentionChunksLongPrefills(t *testing.T) {
	q := hostQueue()
	const heads, hd = 32, 64
	rows := maxScores/(heads*4096) + 3 // a prefill over 4096 keys one chunk too long
	qt, dst := fakeTensor(gpu.F32, rows, heads*hd), fakeTensor(gpu.F32, rows, heads*hd)
	k, v := fakeTensor(gpu.F32, 4096, 8*hd), fakeTensor(gpu.F32, 4096, 8*hd)
	q.scores = &buffer{ptr: 1 << 40, dt: gpu.F32, n: maxScores} // no allocation on the host
	q.Attention(dst, qt, k, v, gpu.AttnParams{Heads: heads, KVHeads: 8, HeadDim: hd, Scale: 0.125, QPos0: 4096 - rows, Causal: true})
	if len(q.rec.cmds) != 2 {
		t.Fatalf("%d launches, want 2 chunks", len(q.rec.cmds))
	}
	c0, c1 := q.rec.cmds[0], q.rec.cmds[1]
	if int(c0.grid[0])+int(c1.grid[0]) != rows || int(c0.grid[0])*heads*4096 > maxScores {
		t.Errorf("chunks of %d and %d rows for %d", c0.grid[0], c1.grid[0], rows)
	}
	// The second chunk starts where the first ends: its QPos0 argument.
	if qpos := int(q.rec.slots[c1.a0+14]); qpos != 4096-rows+int(c0.grid[0]) {
		t.Errorf("second chunk at position %d", qpos)
	}
}

// TestWriteProfile: the profile table sums the rows and states each share.
func TestWriteProfile(t *testing.T) {
	var b strings.Builder
	WriteProfile(&b, []ProfileRow{
		{Kernel: "gemv_bf16", Grid: [3]uint32{64, 1, 1}, Calls: 4, Time: 3 * time.Millisecond},
		{Kernel: "rmsnorm_f32", Grid: [3]uint32{1, 1, 1}, Calls: 2, Time: time.Millisecond},
	})
	out := b.String()
	for _, want := range []string{"6 launches, 4.000 ms", "gemv_bf16", "64x1x1", "750.00", " 75.0%", "rmsnorm_f32", "500.00", " 25.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("profile table lacks %q:\n%s", want, out)
		}
	}
}

// TestGemvVariant: the one-row kernel keeps two blocks per multiprocessor
// where it can and loads eight chunks ahead where K has them.
func TestGemvVariant(t *testing.T) {
	for _, c := range []struct {
		N, K     int
		name     string
		rowsPerB int
	}{
		{1024, 1024, "gemv_bf16_c1u4", 4},
		{2048, 8192, "gemv_bf16_c1u8", 4},
		{2816, 1024, "gemv_bf16_c2u4", 8},
		{6144, 2048, "gemv_bf16_c4u8", 16},
		{65536, 2048, "gemv_bf16_c4u8", 16},
		{65536, 1024, "gemv_bf16", 16},
		{3, 5, "gemv_bf16_c1u4", 4},
	} {
		name, rows := gemvVariant(c.N, c.K)
		if name != c.name || rows != c.rowsPerB {
			t.Errorf("gemvVariant(%d, %d) = %s, %d rows per block; want %s, %d", c.N, c.K, name, rows, c.name, c.rowsPerB)
		}
		found := false
		for _, k := range kernelNames {
			found = found || k == name
		}
		if !found {
			t.Errorf("%s is not among the kernels loaded", name)
		}
	}
}

// TestChunkBoundaryIsNotFoldedInto: the launch that fills a chunk hands
// it over; an op that would fold into that launch (its output's rounding)
// is recorded as its own kernel in the next chunk instead of rewriting the
// arguments of a batch already handed over.
func TestChunkBoundaryIsNotFoldedInto(t *testing.T) {
	q := hostQueue()
	x, y, o := fakeTensor(gpu.F32, 1, 64), fakeTensor(gpu.F32, 1, 32), fakeTensor(gpu.F32, 1, 32)
	w := fakeTensor(gpu.BF16, 32, 64)
	for range maxBatch - 1 {
		q.Fill(o, 1)
	}
	gen := q.gen
	q.MatMul(y, x, w, gpu.Tensor{}) // the chunk's last launch
	if q.gen != gen+1 || len(q.rec.cmds) != 0 {
		t.Fatalf("after %d launches: %d flushes, %d recorded; want the chunk handed over", maxBatch, q.gen-gen, len(q.rec.cmds))
	}
	q.RoundBF16(y)
	if len(q.rec.cmds) != 1 || q.rec.cmds[0].fn != q.d.fns["round_bf16"] {
		t.Errorf("the rounding after a chunk boundary: %d commands recorded, want one round_bf16", len(q.rec.cmds))
	}
}

// TestFusedLaunches: which fused ops take one launch and which fall back
// to their op sequence, and what PrepHeads packs for the kernel.
func TestFusedLaunches(t *testing.T) {
	x, h := fakeTensor(gpu.F32, 1, 64), fakeTensor(gpu.F32, 1, 64)
	y := fakeTensor(gpu.F32, 1, 32)
	w, nw := fakeTensor(gpu.BF16, 32, 64), fakeTensor(gpu.BF16, 1, 64)
	x3, h3, y3 := fakeTensor(gpu.F32, 3, 64), fakeTensor(gpu.F32, 3, 64), fakeTensor(gpu.F32, 3, 32)
	n := gpu.RowNorm{Eps: 1e-5, Round: true, W: nw, RoundW: true}
	qkv := fakeTensor(gpu.F32, 1, 4*16)
	kc, vc := fakeTensor(gpu.F32, 1, 16), fakeTensor(gpu.F32, 1, 16)
	hn := gpu.RowNorm{Eps: 1e-6, W: fakeTensor(gpu.BF16, 1, 8), RoundW: true}
	rp := gpu.RoPEParams{Style: gpu.Interleaved, HeadDim: 8, InvFreq: make([]float32, 4), Pos: []int32{5}}
	items := []gpu.HeadPrep{
		{Dst: qkv.ColSlice(0, 32), Src: qkv.ColSlice(0, 32), Norm: hn},
		{Dst: kc, Src: qkv.ColSlice(32, 48), Norm: hn},
		{Dst: vc, Src: qkv.ColSlice(48, 64), Copy: true},
	}
	for _, c := range []struct {
		name   string
		ops    func(q *Queue)
		first  string
		launch int
	}{
		{"one row: norm inside the product", func(q *Queue) { q.NormMatMul(y, h, x, n, w, gpu.Tensor{}) }, "gemvn_bf16_c1u4", 1},
		{"three rows: norm, then the product", func(q *Queue) { q.NormMatMul(y3, h3, x3, n, w, gpu.Tensor{}) }, "rmsnorm_f32", 2},
		{"h aliasing x: separate", func(q *Queue) { q.NormMatMul(y, x, x, n, w, gpu.Tensor{}) }, "rmsnorm_f32", 2},
		{"q, k, v of one qkv: one launch", func(q *Queue) { q.PrepHeads(rp, true, items) }, "prep_heads_f32", 1},
		{"a copy of part of a head: the sequence", func(q *Queue) {
			q.PrepHeads(rp, true, []gpu.HeadPrep{{Dst: fakeTensor(gpu.F32, 1, 12), Src: qkv.ColSlice(48, 60), Copy: true}})
		}, "copy_u32", 1},
		{"overlapping columns: the sequence", func(q *Queue) {
			q.PrepHeads(rp, true, []gpu.HeadPrep{items[0], {Dst: kc, Src: qkv.ColSlice(24, 40), Norm: hn}})
		}, "rmsnorm_f32", 5},
	} {
		q := hostQueue()
		c.ops(q)
		if got := len(q.rec.cmds); got != c.launch {
			t.Errorf("%s: %d launches, want %d", c.name, got, c.launch)
		}
		if len(q.rec.cmds) > 0 && q.rec.cmds[0].fn != q.d.fns[c.first] {
			t.Errorf("%s: first kernel is not %s", c.name, c.first)
		}
	}
	// The items' records: pointers, strides, heads, flags, first blocks.
	q := hostQueue()
	q.PrepHeads(rp, false, items)
	if len(q.rec.up) < 3*headItemBytes {
		t.Fatalf("uploaded %d bytes, want 3 items of %d", len(q.rec.up), headItemBytes)
	}
	le := binary.LittleEndian
	for i, it := range items {
		b := q.rec.up[i*headItemBytes:]
		if got := uintptr(le.Uint64(b[0:])); got != uintptr(q.ptr(it.Dst)) {
			t.Errorf("item %d: dst %#x, want %#x", i, got, q.ptr(it.Dst))
		}
		if got := int(le.Uint64(b[24:])); got != it.Src.Stride {
			t.Errorf("item %d: src stride %d, want %d", i, got, it.Src.Stride)
		}
		if heads, first := le.Uint32(b[40:]), le.Uint32(b[64:]); int(heads) != it.Dst.Cols/8 || int(first) != []int{0, 4, 6}[i] {
			t.Errorf("item %d: %d heads from block %d", i, heads, first)
		}
		if cp := le.Uint32(b[60:]); (cp == 1) != it.Copy {
			t.Errorf("item %d: copy flag %d", i, cp)
		}
	}
	if c := q.rec.cmds[0]; c.grid[0] != 8 {
		t.Errorf("prep heads grid %v, want 8 blocks (4 + 2 + 2 heads)", c.grid)
	}
}

// TestGemvrVariant: the few-row pick by rows, and that every pick is a
// variant the bit-identity test covers.
func TestGemvrVariant(t *testing.T) {
	for M, want := range map[int]string{2: "gemvr_bf16_r2c4u4", 3: "gemvr_bf16_r3c4u4", 4: "gemvr_bf16_r4c4u2", 32: "gemvr_bf16_r4c4u2"} {
		if got := gemvrVariant(M).name; got != want {
			t.Errorf("M=%d: %s, want %s", M, got, want)
		}
	}
	for M := 2; M <= gemvrMaxRows; M++ {
		v := gemvrVariant(M)
		if !slices.Contains(gemvrVariants, v) {
			t.Errorf("M=%d: %v is not among the tested variants", M, v)
		}
	}
}

// TestMmvVariant: every row count and weight size the few-row tensor-core
// kernels take gets a tested variant whose grid covers every output once:
// 16·nt weight rows a block in x, 8·mt rows of x in y.
func TestMmvVariant(t *testing.T) {
	for M := 1; M <= mmvMaxRows; M++ {
		for _, N := range []int{1, 15, 16, 17, 2048, 2049, 8192, mmvMaxN} {
			v := mmvVariant(N)
			if !slices.Contains(mmvVariants, v) {
				t.Fatalf("M=%d N=%d: %v is not among the tested variants", M, N, v)
			}
			if 8*v.mt < M {
				t.Errorf("M=%d N=%d: %s covers %d rows of x a block", M, N, v.name, 8*v.mt)
			}
			g := v.grid(M, N)
			if int(g[0])*16*v.nt < N || int(g[0]-1)*16*v.nt >= N || int(g[1])*8*v.mt < M || int(g[1]-1)*8*v.mt >= M || g[2] != 1 {
				t.Errorf("M=%d N=%d: %s grid %v does not cover the outputs exactly", M, N, v.name, g)
			}
		}
	}
	if mmvVariant(2048).name != "mmv_bf16_w16n1m1" || mmvVariant(2049).name != "mmv_bf16_w16n4m1" || mmvNormDefault.name != "mmvn_bf16_w16" {
		t.Errorf("defaults %s, %s, %s: not the measured picks", mmvVariant(2048).name, mmvVariant(2049).name, mmvNormDefault.name)
	}
	for _, v := range append(mmvVariants, mmvNormVariants...) {
		if !slices.Contains(kernelNames, v.name) {
			t.Errorf("%s is not loaded", v.name)
		}
		if b := v.block(); b[0] != uint32(32*v.w) || v.w != 4 && v.w != 16 {
			t.Errorf("%s: block %v for %d warps", v.name, b, v.w)
		}
	}
}

// TestProductKernels: which kernel a product launches — with Options.MatMul
// "mma" the tensor cores for BF16 weights (few rows: mmv, fused norm: mmvn,
// many rows: split_bf16 then the tile kernel, not recorded here as it
// allocates), unless the queue asked for
// fp32 products (gpu.FP32Products: the FMA kernels, as without "mma").
func TestProductKernels(t *testing.T) {
	x1, y1, h1 := fakeTensor(gpu.F32, 1, 64), fakeTensor(gpu.F32, 1, 32), fakeTensor(gpu.F32, 1, 64)
	x40, y40 := fakeTensor(gpu.F32, 40, 64), fakeTensor(gpu.F32, 40, 32)
	w := fakeTensor(gpu.BF16, 32, 64)
	wBig, yBig := fakeTensor(gpu.BF16, mmvMaxN+1, 64), fakeTensor(gpu.F32, 1, mmvMaxN+1)
	n := gpu.RowNorm{Eps: 1e-5}
	for _, c := range []struct {
		name      string
		mma, fp32 bool
		ops       func(q *Queue)
		first     string
		grid      [3]uint32 // checked when set
		block     [2]uint32
	}{
		{"fma: one row", false, false, func(q *Queue) { q.MatMul(y1, x1, w, gpu.Tensor{}) }, "gemv_bf16_c1u4", [3]uint32{}, [2]uint32{}},
		{"mma: one row", true, false, func(q *Queue) { q.MatMul(y1, x1, w, gpu.Tensor{}) }, "mmv_bf16_w16n1m1", [3]uint32{}, [2]uint32{}},
		{"mma: norm and one row", true, false, func(q *Queue) { q.NormMatMul(y1, h1, x1, n, w, gpu.Tensor{}) }, "mmvn_bf16_w16", [3]uint32{2, 1, 1}, [2]uint32{512, 1}},
		{"mma: norm and one row, the 4-warp kernel forced", true, false, func(q *Queue) {
			q.mmvForce = "mmvn_bf16_w4"
			q.NormMatMul(y1, h1, x1, n, w, gpu.Tensor{})
		}, "mmvn_bf16_w4", [3]uint32{2, 1, 1}, [2]uint32{128, 1}},
		{"mma: norm and a head past the few-row kernels: the norm, then the tile kernel's split", true, false, func(q *Queue) {
			defer func() { recover() }() // the split's scratch needs a device
			q.NormMatMul(yBig, h1, x1, n, wBig, gpu.Tensor{})
		}, "rmsnorm_f32", [3]uint32{}, [2]uint32{}},
		{"fma: norm and the same head", false, false, func(q *Queue) { q.NormMatMul(yBig, h1, x1, n, wBig, gpu.Tensor{}) }, "gemvn_bf16_c4u4", [3]uint32{}, [2]uint32{}},
		{"mma, fp32 queue: one row", true, true, func(q *Queue) { q.MatMul(y1, x1, w, gpu.Tensor{}) }, "gemv_bf16_c1u4", [3]uint32{}, [2]uint32{}},
		{"mma, fp32 queue: norm and one row", true, true, func(q *Queue) { q.NormMatMul(y1, h1, x1, n, w, gpu.Tensor{}) }, "gemvn_bf16_c1u4", [3]uint32{}, [2]uint32{}},
		{"mma, fp32 queue: 40 rows", true, true, func(q *Queue) { q.MatMul(y40, x40, w, gpu.Tensor{}) }, "matmul_r8_bf16", [3]uint32{}, [2]uint32{}},
	} {
		q := hostQueue()
		q.d.mmaMatMul = c.mma
		if c.fp32 {
			var fp gpu.FP32Products = q
			fp.UseFP32Products()
		}
		c.ops(q)
		if len(q.rec.cmds) == 0 || q.rec.cmds[0].fn != q.d.fns[c.first] {
			t.Errorf("%s: first kernel is not %s", c.name, c.first)
			continue
		}
		if cmd := q.rec.cmds[0]; c.grid != [3]uint32{} && (cmd.grid != c.grid || cmd.block != c.block) {
			t.Errorf("%s: grid %v block %v, want %v %v", c.name, cmd.grid, cmd.block, c.grid, c.block)
		}
	}
}

// TestPagedAttentionArguments: with a block table the launch passes the
// table, its block rows and the key count (not the pool's rows); without,
// a null table, one-row blocks and the key rows; a table that cannot hold
// the keys is refused.
func TestPagedAttentionArguments(t *testing.T) {
	const heads, hd = 4, 8
	qt, dst := fakeTensor(gpu.F32, 1, heads*hd), fakeTensor(gpu.F32, 1, heads*hd)
	pool, vpool := fakeTensor(gpu.F32, 4*16, 2*hd), fakeTensor(gpu.F32, 4*16, 2*hd)
	table := fakeTensor(gpu.I32, 1, 3)
	ap := gpu.AttnParams{Heads: heads, KVHeads: 2, HeadDim: hd, Scale: 0.25, QPos0: 40, Causal: true}
	for _, c := range []struct {
		name         string
		p            gpu.AttnParams
		nkeys, brows int
		table        uintptr
	}{
		{"contiguous", ap, 64, 1, 0},
		{"paged", func() gpu.AttnParams { p := ap; p.Blocks, p.BlockRows, p.Keys = table, 16, 41; return p }(), 41, 16, table.Buf.(*buffer).ptr},
	} {
		q := hostQueue()
		q.scores = &buffer{ptr: 1 << 40, dt: gpu.F32, n: maxScores}
		q.Attention(dst, qt, pool, vpool, c.p)
		if len(q.rec.cmds) != 1 {
			t.Fatalf("%s: %d launches", c.name, len(q.rec.cmds))
		}
		cm := q.rec.cmds[0]
		args := q.rec.slots[cm.a0 : cm.a0+cm.na]
		// … window, nkeys, probBF16, blocks, brows, shs, then the fused
		// rounding; the scores of so few keys in shared memory.
		n := len(args)
		if int(args[n-6]) != c.nkeys || uintptr(args[n-4]) != c.table || int(args[n-3]) != c.brows {
			t.Errorf("%s: nkeys %d, table %#x, block rows %d; want %d, %#x, %d", c.name, args[n-6], args[n-4], args[n-3], c.nkeys, c.table, c.brows)
		}
		if want, _ := attnShm(hd, c.nkeys); args[n-2] != 1 || int(cm.shm) != want {
			t.Errorf("%s: scores in shared memory %d, %d bytes of it; want 1, %d", c.name, args[n-2], cm.shm, want)
		}
	}
	bad := ap
	bad.Blocks, bad.BlockRows, bad.Keys = table, 16, 49 // 3 blocks of 16 hold 48 keys
	defer func() {
		if recover() == nil {
			t.Error("a table too short for its keys was accepted")
		}
	}()
	hostQueue().Attention(dst, qt, pool, vpool, bad)
}

// TestBatchedCopyGrids: the batched copies' grids give every pair (or row
// pair) its own block row and enough blocks across for the widest.
func TestBatchedCopyGrids(t *testing.T) {
	for _, c := range []struct {
		n, most int
		want    [3]uint32
	}{{1, 1, [3]uint32{1, 1, 1}}, {3, 256, [3]uint32{3, 1, 1}}, {3, 257, [3]uint32{3, 2, 1}}, {256, 1 << 20, [3]uint32{256, 64, 1}}, {2, 0, [3]uint32{2, 1, 1}}} {
		if g := copyManyGrid(c.n, c.most); g != c.want {
			t.Errorf("copyManyGrid(%d, %d) = %v, want %v", c.n, c.most, g, c.want)
		}
	}
	for _, c := range []struct {
		rows, cols int
		want       [3]uint32
	}{{5, 1, [3]uint32{5, 1, 1}}, {5, 512, [3]uint32{5, 2, 1}}, {12, 100000, [3]uint32{12, 8, 1}}} {
		if g := copyRowsGrid(c.rows, c.cols); g != c.want {
			t.Errorf("copyRowsGrid(%d, %d) = %v, want %v", c.rows, c.cols, g, c.want)
		}
	}
}

// uploadAt returns the n bytes of the recorded uploads that launch arg
// slot i (an upload offset) points at.
func uploadAt(q *Queue, slot uint64, n int) []byte { return q.rec.up[slot : int(slot)+n] }

// TestBatchedOpsPacking: each batched op is one launch whose uploaded
// records carry every sequence's (or pair's) own pointers, strides,
// positions and counts, in kernels.cu's layouts.
func TestBatchedOpsPacking(t *testing.T) {
	le := binary.LittleEndian
	t.Run("attention", func(t *testing.T) {
		const heads, hd = 4, 8
		qt, dst := fakeTensor(gpu.F32, 4, heads*hd), fakeTensor(gpu.F32, 4, heads*hd)
		pool, vpool := fakeTensor(gpu.F32, 4*16, 2*hd), fakeTensor(gpu.F32, 4*16, 2*hd)
		own, ownv := fakeTensor(gpu.F32, 9, 2*hd), fakeTensor(gpu.F32, 9, 2*hd)
		t1, t2 := fakeTensor(gpu.I32, 1, 3), fakeTensor(gpu.I32, 1, 2)
		seqs := []gpu.AttnSeq{
			{Rows: 1, QPos0: 40, K: pool, V: vpool, Blocks: t1, Keys: 41},
			{Rows: 0, QPos0: 7, K: pool, V: vpool, Blocks: t2, Keys: 7},
			{Rows: 2, QPos0: 7, K: own, V: ownv},
			{Rows: 1, QPos0: 20, K: pool, V: vpool, Blocks: t2, Keys: 21},
		}
		q := hostQueue()
		q.scores = &buffer{ptr: 1 << 40, dt: gpu.F32, n: maxScores}
		q.AttentionSeqs(dst, qt, gpu.AttnParams{Heads: heads, KVHeads: 2, HeadDim: hd, Scale: 0.25, Causal: true, BlockRows: 16}, seqs)
		if len(q.rec.cmds) != 1 || q.rec.cmds[0].fn != q.d.fns["attention_seqs_f32"] || q.rec.cmds[0].grid != [3]uint32{4, heads, 1} {
			t.Fatalf("%d launches (%+v), want one attention_seqs_f32 on a 4 × %d grid", len(q.rec.cmds), q.rec.cmds, heads)
		}
		cm := q.rec.cmds[0]
		args := q.rec.slots[cm.a0 : cm.a0+cm.na]
		if maxL := int(args[6]); maxL != 41 {
			t.Errorf("scores of %d keys a row, want 41 (the longest sequence)", maxL)
		}
		recs := uploadAt(q, args[4], 4*attnRowBytes)
		ptr := func(x gpu.Tensor) uint64 { return uint64(x.Buf.(*buffer).ptr) }
		want := []struct {
			k, v, tab uint64
			pos, keys int
		}{
			{ptr(pool), ptr(vpool), ptr(t1), 40, 41},
			{ptr(own), ptr(ownv), 0, 7, 9},
			{ptr(own), ptr(ownv), 0, 8, 9},
			{ptr(pool), ptr(vpool), ptr(t2), 20, 21},
		}
		for r, w := range want {
			b := recs[r*attnRowBytes:]
			got := []uint64{le.Uint64(b), le.Uint64(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:]), uint64(le.Uint32(b[40:])), uint64(le.Uint32(b[44:]))}
			if got[0] != w.k || got[1] != w.v || got[2] != w.tab || got[3] != uint64(2*hd) || int(got[4]) != w.pos || int(got[5]) != w.keys {
				t.Errorf("row %d: k %#x v %#x table %#x ldk %d pos %d keys %d; want %#x %#x %#x %d %d %d",
					r, got[0], got[1], got[2], got[3], got[4], got[5], w.k, w.v, w.tab, 2*hd, w.pos, w.keys)
			}
		}
	})
	t.Run("shortconv", func(t *testing.T) {
		x, dst := fakeTensor(gpu.F32, 4, 8), fakeTensor(gpu.F32, 4, 8)
		w := fakeTensor(gpu.BF16, 8, 3)
		s := []gpu.Tensor{fakeTensor(gpu.F32, 2, 8), fakeTensor(gpu.F32, 2, 8), fakeTensor(gpu.F32, 2, 8)}
		q := hostQueue()
		q.ShortConvSeqs(dst, x, w, s, []int{3, 0, 1})
		if len(q.rec.cmds) != 1 || q.rec.cmds[0].fn != q.d.fns["shortconv_seqs_f32"] || q.rec.cmds[0].grid != [3]uint32{1, 2, 1} {
			t.Fatalf("%+v, want one shortconv_seqs_f32 over the 2 sequences with rows", q.rec.cmds)
		}
		cm := q.rec.cmds[0]
		recs := uploadAt(q, q.rec.slots[cm.a0+6], 2*convSeqBytes)
		for i, w := range []struct {
			st     gpu.Tensor
			r0, rs int
		}{{s[0], 0, 3}, {s[2], 3, 1}} {
			b := recs[i*convSeqBytes:]
			if le.Uint64(b) != uint64(w.st.Buf.(*buffer).ptr) || le.Uint64(b[8:]) != 8 || int(le.Uint32(b[16:])) != w.r0 || int(le.Uint32(b[20:])) != w.rs {
				t.Errorf("sequence %d: state %#x ld %d rows %d+%d", i, le.Uint64(b), le.Uint64(b[8:]), le.Uint32(b[16:]), le.Uint32(b[20:]))
			}
		}
	})
	t.Run("copies", func(t *testing.T) {
		a, b := fakeTensor(gpu.F32, 8, 4), fakeTensor(gpu.F32, 8, 4)
		h, g := fakeTensor(gpu.BF16, 2, 4), fakeTensor(gpu.BF16, 2, 4)
		q := hostQueue()
		q.CopyRows(a, b, []int32{5, 2}, []int32{0, 7})
		cm := q.rec.cmds[0]
		if pairs := uploadAt(q, q.rec.slots[cm.a0+4], 16); le.Uint32(pairs) != 5 || le.Uint32(pairs[4:]) != 0 || le.Uint32(pairs[8:]) != 2 || le.Uint32(pairs[12:]) != 7 {
			t.Errorf("row pairs % x", pairs)
		}
		for _, c := range []struct {
			name  string
			pairs []gpu.CopyPair
			want  []string
		}{
			{"one pair: the plain copy", []gpu.CopyPair{{Dst: a, Src: b}}, []string{"copy_u32"}},
			{"4- and 2-byte pairs: a launch each", []gpu.CopyPair{{Dst: a.Row(0), Src: b.Row(1)}, {Dst: h, Src: g}, {Dst: a.Row(3), Src: b.Row(2)}}, []string{"copy_many_u32", "copy_many_u16"}},
			{"empty pairs: nothing", []gpu.CopyPair{{Dst: a.Slice(0, 0), Src: b.Slice(0, 0)}, {Dst: a.Slice(1, 1), Src: b.Slice(1, 1)}}, nil},
		} {
			q := hostQueue()
			q.CopyMany(c.pairs)
			if len(q.rec.cmds) != len(c.want) {
				t.Errorf("%s: %d launches, want %v", c.name, len(q.rec.cmds), c.want)
				continue
			}
			for i, name := range c.want {
				if q.rec.cmds[i].fn != q.d.fns[name] {
					t.Errorf("%s: launch %d is not %s", c.name, i, name)
				}
			}
		}
		q = hostQueue()
		q.CopyMany([]gpu.CopyPair{{Dst: a.Row(0), Src: b.Row(1)}, {Dst: a.Slice(2, 5), Src: b.Slice(4, 7)}})
		cm = q.rec.cmds[0]
		recs := uploadAt(q, q.rec.slots[cm.a0], 2*copyPairBytes)
		r := recs[copyPairBytes:]
		if le.Uint64(r) != uint64(a.Buf.(*buffer).ptr)+2*4*4 || le.Uint64(r[8:]) != uint64(b.Buf.(*buffer).ptr)+4*4*4 || le.Uint32(r[32:]) != 3 || le.Uint32(r[36:]) != 4 {
			t.Errorf("second pair's record % x", r[:copyPairBytes])
		}
	})
}

// TestFMATilesPick: the FMA products take the 64 × 64 tile kernel when
// they have a tile per two multiprocessors (66 of 132 here), 64 rows and 32 weight
// rows (any weight type, one block per 64 × 64 outputs), the warp tiles
// otherwise; the tensor cores keep bf16 weights; fmaTiles forces either
// way.
func TestFMATilesPick(t *testing.T) {
	for _, c := range []struct {
		name     string
		M, N     int
		dt       gpu.DType
		mma      bool
		force    int8
		kernel   string
		grid     [3]uint32
		blockDim uint32
	}{
		{"f32, 12 × 11 tiles", 64 * 12, 64 * 11, gpu.F32, false, 0, "matmul_t64_f32", [3]uint32{11, 12, 1}, 256},
		{"f32, 132 tiles of 64 × 32 columns", 64 * 132, 32, gpu.F32, false, 0, "matmul_t64_f32", [3]uint32{1, 132, 1}, 256},
		{"f32, 66 tiles", 64 * 66, 64, gpu.F32, false, 0, "matmul_t64_f32", [3]uint32{1, 66, 1}, 256},
		{"f32, 65 tiles", 64 * 65, 64, gpu.F32, false, 0, "matmul_r8_f32", [3]uint32{}, 128},
		{"f32, 63 rows", 63, 64 * 200, gpu.F32, false, 0, "matmul_r8_f32", [3]uint32{}, 128},
		{"f32, 31 weight rows", 64 * 200, 31, gpu.F32, false, 0, "matmul_r8_f32", [3]uint32{}, 128},
		{"f16, 1000 × 1000", 1000, 1000, gpu.F16, false, 0, "matmul_t64_f16", [3]uint32{16, 16, 1}, 256},
		{"bf16 on the FMA kernels", 1000, 1000, gpu.BF16, false, 0, "matmul_t64_bf16", [3]uint32{16, 16, 1}, 256},
		{"bf16 on the tensor cores", 1000, 1000, gpu.BF16, true, 0, "split_bf16", [3]uint32{}, 128},
		{"forced on, 5 rows", 5, 8, gpu.F32, false, 1, "matmul_t64_f32", [3]uint32{1, 1, 1}, 256},
		{"forced off", 1000, 1000, gpu.F32, false, -1, "matmul_r8_f32", [3]uint32{}, 128},
	} {
		q := hostQueue()
		q.d.mmaMatMul = c.mma
		q.fmaTiles = c.force
		K := 40
		x, w, y := fakeTensor(gpu.F32, c.M, K), fakeTensor(c.dt, c.N, K), fakeTensor(gpu.F32, c.M, c.N)
		func() {
			defer func() { recover() }() // the tensor cores' split needs a device for its scratch
			q.MatMul(y, x, w, gpu.Tensor{})
		}()
		if len(q.rec.cmds) == 0 {
			if c.kernel != "split_bf16" {
				t.Errorf("%s: nothing launched", c.name)
			}
			continue
		}
		cm := q.rec.cmds[0]
		if cm.fn != q.d.fns[c.kernel] {
			t.Errorf("%s: first kernel is not %s", c.name, c.kernel)
			continue
		}
		if c.grid != [3]uint32{} && cm.grid != c.grid || cm.block[0] != c.blockDim {
			t.Errorf("%s: grid %v block %v, want %v %d", c.name, cm.grid, cm.block, c.grid, c.blockDim)
		}
	}
}

// TestFMATilesThreshold: Options.FMATiles moves the tile count at which
// the FMA products take the 64 × 64 tile kernel (the default being the
// multiprocessors' half, 66 of 132 here), the rows' and columns' minimums kept.
func TestFMATilesThreshold(t *testing.T) {
	for _, c := range []struct {
		name   string
		least  int
		M, N   int
		kernel string
	}{
		{"64 tiles, threshold 64", 64, 64 * 8, 64 * 8, "matmul_t64_f32"},
		{"63 tiles, threshold 64", 64, 64 * 9, 64 * 7, "matmul_r8_f32"},
		{"64 tiles, the default threshold", 0, 64 * 8, 64 * 8, "matmul_r8_f32"},
		{"66 tiles, the default threshold", 0, 64 * 6, 64 * 11, "matmul_t64_f32"},
		{"63 rows, threshold 1", 1, 63, 64 * 8, "matmul_r8_f32"},
		{"one tile, threshold 1", 1, 64, 64, "matmul_t64_f32"},
	} {
		q := hostQueue()
		q.d.mmaMatMul = false
		q.d.fmaTiles = c.least
		x, w, y := fakeTensor(gpu.F32, c.M, 40), fakeTensor(gpu.F32, c.N, 40), fakeTensor(gpu.F32, c.M, c.N)
		q.MatMul(y, x, w, gpu.Tensor{})
		if len(q.rec.cmds) == 0 || q.rec.cmds[0].fn != q.d.fns[c.kernel] {
			t.Errorf("%s: want %s", c.name, c.kernel)
		}
	}
}

// TestLaunchStructLayout pins the C layouts the programmatic launch passes
// to the driver (CUlaunchConfig, CUlaunchAttribute, CUgraphEdgeData on a
// 64-bit host) and the attribute pdlConfig sets.
func TestLaunchStructLayout(t *testing.T) {
	var cfg launchConfig
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(cfg), 56},
		{"offsetof(hStream)", unsafe.Offsetof(cfg.stream), 32},
		{"offsetof(attrs)", unsafe.Offsetof(cfg.attrs), 40},
		{"offsetof(numAttrs)", unsafe.Offsetof(cfg.nattrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(launchAttr{}), 72},
		{"offsetof(value)", unsafe.Offsetof(launchAttr{}.val), 8},
		{"sizeof(CUgraphEdgeData)", unsafe.Sizeof(graphEdge{}), 8},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	var a launchAttr
	cm := cmd{fn: 1, grid: [3]uint32{3, 4, 5}, block: [2]uint32{128, 2}, shm: 96}
	c := pdlConfig(cm, 77, &a)
	if c.gx != 3 || c.gy != 4 || c.gz != 5 || c.bx != 128 || c.by != 2 || c.bz != 1 || c.shm != 96 || c.stream != 77 || c.attrs != &a || c.nattrs != 1 {
		t.Errorf("config %+v", c)
	}
	if a.id != launchAttrProgrammaticSerialization || a.val[0] != 1 || slices.ContainsFunc(a.val[1:], func(b byte) bool { return b != 0 }) {
		t.Errorf("attribute %+v", a)
	}
}

func TestPDLUsable(t *testing.T) {
	full := &driver{cuLaunchKernelEx: 1, cuGraphAddDependencies: 2}
	for _, c := range []struct {
		name           string
		cc             int
		drv            *driver
		off, profiling bool
		want           bool
	}{
		{"hopper", 9, full, false, false, true},
		{"blackwell", 10, full, false, false, true},
		{"ampere", 8, full, false, false, false},
		{"no cuLaunchKernelEx", 9, &driver{cuGraphAddDependencies: 2}, false, false, false},
		{"no programmatic edges", 9, &driver{cuLaunchKernelEx: 1}, false, false, false},
		{"turned off", 9, full, true, false, false},
		{"profiling", 9, full, false, true, false},
	} {
		if got := pdlUsable(c.cc, c.drv, c.off, c.profiling); got != c.want {
			t.Errorf("%s: pdlUsable = %v, want %v", c.name, got, c.want)
		}
	}
}

// preWaitKernels may read before their PDL_ENTER, and only what no kernel
// writes: the launch's uploaded bytes (staging: pinned host memory the
// host fills, or its device mirror, copied before the batch's first
// kernel), constants and weights; they write nothing global before it.
// The value names the function whose body holds their PDL_ENTER.
var preWaitKernels = map[string]string{
	"prep_heads_f32":           "prep_heads_f32",
	"sample_f32":               "sample_f32",
	"attention_seqs_f32":       "attention_seqs_f32",
	"shortconv_seqs_f32":       "shortconv_seqs_f32",
	"shortconv_seqs_gated_f32": "shortconv_seqs_gated_f32",
	"copy_rows_u32":            "copy_rows",
	"copy_rows_u16":            "copy_rows",
	"copy_many_u32":            "copy_many",
	"copy_many_u16":            "copy_many",
	"conv2d_rows_f32":          "conv2d_rows_f32", // stages its weights in shared memory first
}

// TestKernelsBeginWithPDLEnter checks that every kernel in kernels.cu
// begins with PDL_ENTER (at most an L2 prefetch of weights before it):
// a kernel that read or wrote memory before its griddepcontrol.wait could
// race the kernel before it under programmatic launch. The kernels of
// preWaitKernels read their uploaded tables first; their bodies (or the
// helper named there) must still hold the wait.
func TestKernelsBeginWithPDLEnter(t *testing.T) {
	lines := strings.Split(kernelSource, "\n")
	n := 0
	seen := map[string]bool{}
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.Contains(l, "__global__") || strings.HasPrefix(l, "//") {
			continue
		}
		name := kernelName(l)
		for i < len(lines) && !strings.Contains(lines[i], "{") {
			i++
		}
		n++
		if helper, ok := preWaitKernels[name]; ok {
			seen[name] = true
			if !bodyHasPDLEnter(lines, helper) {
				t.Errorf("kernels.cu: %s reads its uploads before the wait, but %s holds no PDL_ENTER", name, helper)
			}
			continue
		}
		j := i + 1
		for j < len(lines) && strings.Contains(lines[j], "pdl_prefetch_rows(") {
			j++
		}
		if j >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[j]), "PDL_ENTER();") {
			t.Errorf("kernels.cu:%d: the kernel opened here does not begin with PDL_ENTER (line %d: %q)", i+1, j+1, strings.TrimSpace(lines[min(j, len(lines)-1)]))
		}
	}
	if n < 30 {
		t.Errorf("found %d kernels in kernels.cu, expected more", n)
	}
	for name := range preWaitKernels {
		if !seen[name] {
			t.Errorf("preWaitKernels names %s, which kernels.cu does not define", name)
		}
	}
}

// kernelName returns the name of the kernel declared on line l ("" for a
// macro's template of kernels).
func kernelName(l string) string {
	_, after, ok := strings.Cut(l, " void ")
	if !ok {
		return ""
	}
	after = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(after), "__launch_bounds__"))
	if strings.HasPrefix(after, "(") {
		after = after[strings.Index(after, ")")+1:]
	}
	name, _, _ := strings.Cut(strings.TrimSpace(after), "(")
	return strings.TrimSpace(name)
}

// bodyHasPDLEnter says the definition of function fn in lines (from its
// signature to the closing brace at column 0) contains PDL_ENTER().
func bodyHasPDLEnter(lines []string, fn string) bool {
	for i, l := range lines {
		if !strings.Contains(l, " "+fn+"(") || strings.HasPrefix(strings.TrimSpace(l), "//") || !strings.Contains(l, "void") {
			continue
		}
		for j := i; j < len(lines) && lines[j] != "}"; j++ {
			if strings.Contains(lines[j], "PDL_ENTER();") {
				return true
			}
		}
	}
	return false
}

func TestKernelsFromFile(t *testing.T) {
	t.Setenv(KernelsEnv, "")
	if src, path, err := kernelsToCompile(); err != nil || path != "" || src != kernelSource {
		t.Fatalf("without %s: %d bytes from %q, %v; want the embedded kernels", KernelsEnv, len(src), path, err)
	}
	f := filepath.Join(t.TempDir(), "k.cu")
	if err := os.WriteFile(f, []byte("// other kernels\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KernelsEnv, f)
	if src, path, err := kernelsToCompile(); err != nil || path != f || src != "// other kernels\n" {
		t.Fatalf("with %s=%s: %q from %q, %v", KernelsEnv, f, src, path, err)
	}
	t.Setenv(KernelsEnv, f+".missing")
	if _, _, err := kernelsToCompile(); err == nil || !strings.Contains(err.Error(), KernelsEnv) {
		t.Fatalf("a missing file: %v, want an error naming %s", err, KernelsEnv)
	}
}

// fakeCompiler stands for NVRTC: it counts its compiles; with noSplit it
// refuses the split-compile option as an NVRTC before CUDA 12.1 does.
type fakeCompiler struct {
	calls   int
	noSplit bool
	opts    [][]string
}

func (f *fakeCompiler) Compile(source string, opts []string) ([]byte, error) {
	f.calls++
	f.opts = append(f.opts, opts)
	if f.noSplit && slices.ContainsFunc(opts, func(o string) bool { return strings.HasPrefix(o, splitOption) }) {
		return nil, &Error{Call: "nvrtcCompileProgram", Code: nvrtcInvalidOption, Msg: "NVRTC_ERROR_INVALID_OPTION"}
	}
	return []byte("cubin of " + source), nil
}

func TestSplitCompile(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"", "--split-compile=0"}, {"0", "--split-compile=0"}, {"1", ""}, {"4", "--split-compile=4"},
		{"-2", ""}, {"many", ""},
	} {
		if got := splitCompile(tc.env); got != tc.want {
			t.Errorf("%s=%q: %q, want %q", NVRTCThreadsEnv, tc.env, got, tc.want)
		}
	}
	t.Setenv(NVRTCThreadsEnv, "")
	if o := compileOptions("sm_90", ""); !slices.Contains(o, "--split-compile=0") {
		t.Errorf("options %q do not split the compile", o)
	}
	t.Setenv(NVRTCThreadsEnv, "1")
	if o := compileOptions("sm_90", ""); slices.ContainsFunc(o, func(s string) bool { return strings.HasPrefix(s, splitOption) }) {
		t.Errorf("options %q split a compile asked for one thread", o)
	}
}

// An NVRTC that refuses the split option compiles on one thread, with the
// other options unchanged; other errors are not retried.
func TestCompileCachedWithoutSplit(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	nv := &fakeCompiler{noSplit: true}
	opts := []string{"--gpu-architecture=sm_90", "--split-compile=0", "-DFAULT_ROPE"}
	cubin, _, err := compileCached(nv, log, "sm_90", "src", opts, "")
	if err != nil || string(cubin) != "cubin of src" || nv.calls != 2 {
		t.Fatalf("%q, %v after %d compiles; want the cubin after 2", cubin, err, nv.calls)
	}
	if want := []string{"--gpu-architecture=sm_90", "-DFAULT_ROPE"}; !slices.Equal(nv.opts[1], want) {
		t.Errorf("retried with %q, want %q", nv.opts[1], want)
	}
	if !slices.Equal(opts, []string{"--gpu-architecture=sm_90", "--split-compile=0", "-DFAULT_ROPE"}) {
		t.Errorf("the caller's options changed: %q", opts)
	}
	if !strings.Contains(buf.String(), "does not split") {
		t.Errorf("the retry was not logged: %s", buf.String())
	}
	nv = &fakeCompiler{noSplit: true}
	if _, _, err := compileCached(nv, nil, "sm_90", "src", nil, ""); err != nil || nv.calls != 1 {
		t.Errorf("without the option: %v after %d compiles", err, nv.calls)
	}
}

func TestCompileCachedSaysWhenItCompiles(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k.cubin")
	for _, tc := range []struct {
		name, file string
		compiles   int      // compiles through NVRTC
		cached     bool     // fromCache
		want       []string // messages logged, in order
	}{
		{"first use: compiles, writes the cache and says so", file, 1, false, []string{"compiling CUDA kernels", "CUDA kernels compiled"}},
		{"the cache holds it: read back, quiet", file, 0, true, nil},
		{"no disk cache: every open compiles", "", 1, false, []string{"compiling CUDA kernels", "CUDA kernels compiled"}},
	} {
		var buf strings.Builder
		log := slog.New(slog.NewTextHandler(&buf, nil))
		nv := &fakeCompiler{}
		cubin, cached, err := compileCached(nv, log, "sm_90", "src", nil, tc.file)
		if err != nil || string(cubin) != "cubin of src" || nv.calls != tc.compiles || cached != tc.cached {
			t.Fatalf("%s: %q, cached %v, %v after %d compiles; want %d, cached %v", tc.name, cubin, cached, err, nv.calls, tc.compiles, tc.cached)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if _, m, ok := strings.Cut(l, `msg="`); ok {
				got = append(got, strings.TrimSpace(m[:strings.IndexAny(m, "(\"")]))
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: logged %q, want %q:\n%s", tc.name, got, tc.want, buf.String())
		}
	}
	// Without a logger nothing is written and the compile still happens.
	nv := &fakeCompiler{}
	if _, _, err := compileCached(nv, nil, "sm_90", "src", nil, ""); err != nil || nv.calls != 1 {
		t.Fatalf("without a logger: %v after %d compiles", err, nv.calls)
	}
}

func TestPruneCacheKeepsRecentWithinBytes(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	write := func(name string, size int, age int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		mt := base.Add(time.Duration(age) * time.Minute)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldest := write("a.cubin", 400, 0)
	old := write("b.cubin", 400, 1)
	newer := write("c.cubin", 400, 2)
	kept := write("d.cubin", 400, -5) // the module just written, whatever its time
	other := write("notes.txt", 5000, -10)
	pruneCache(dir, kept, 900)
	for _, c := range []struct {
		path string
		want bool
	}{{oldest, false}, {old, false}, {newer, true}, {kept, true}, {other, true}} {
		if _, err := os.Stat(c.path); (err == nil) != c.want {
			t.Errorf("%s: present %v, want %v", filepath.Base(c.path), err == nil, c.want)
		}
	}
	// Within the bound nothing goes.
	pruneCache(dir, kept, 1<<20)
	if _, err := os.Stat(newer); err != nil {
		t.Errorf("within the bound: %v", err)
	}
}

// TestAttnShmSteps: the attention kernels' shared memory holds the scores
// and key rows of up to attnShmKeys keys, in a few power-of-two steps (a
// decode step's launch keeps its graph's shape as the keys grow by one),
// and none beyond.
func TestAttnShmSteps(t *testing.T) {
	base := 4 * (64 + 32 + 128)
	for _, c := range []struct {
		maxL, bytes int
		shs         bool
	}{
		{1, base + 8*512, true}, {512, base + 8*512, true}, {513, base + 8*1024, true},
		{4096, base + 8*4096, true}, {4097, base, false}, {1 << 15, base, false},
	} {
		bytes, shs := attnShm(64, c.maxL)
		if bytes != c.bytes || shs != c.shs {
			t.Errorf("attnShm(64, %d) = %d, %v; want %d, %v", c.maxL, bytes, shs, c.bytes, c.shs)
		}
	}
	if b, _ := attnShm(256, attnShmKeys); b > 48<<10 {
		t.Errorf("attnShm(256, %d) = %d bytes, beyond 48 KiB", attnShmKeys, b)
	}
}

// TestSampleKeepsScratchOnChipWhereItFits: sample_f32 gets the row's ew
// and cand in dynamic shared memory (its last argument set, 12 bytes an
// entry beside the two bitmaps) while that stays within sampleSharedBytes
// (the audio vocabulary, 2,049, does; 3,343 is the largest that does),
// and only the bitmaps, with the global scratch, beyond (the text
// vocabulary, 65,536).
func TestSampleKeepsScratchOnChipWhereItFits(t *testing.T) {
	for _, c := range []struct {
		V, shm   int
		inShared bool
	}{
		{1, 8 + 12, true},
		{2049, 2*65*4 + 12*2049, true},
		{3343, 2*105*4 + 12*3343, true},
		{3344, 2 * 105 * 4, false},
		{6007, 2 * 188 * 4, false},
		{65536, 2 * 2048 * 4, false},
	} {
		q := hostQueue()
		q.sampleBuf = &buffer{ptr: 1 << 40, dt: gpu.F32, n: 1 << 30}
		logits, ids := fakeTensor(gpu.F32, 2, c.V), fakeTensor(gpu.I32, 2, 1)
		q.Sample(ids, logits, []gpu.SampleRow{{Temperature: 1, TopK: 4}, {}})
		if len(q.rec.cmds) != 1 || q.rec.cmds[0].fn != q.d.fns["sample_f32"] {
			t.Fatalf("V %d: %+v, want one sample_f32 launch", c.V, q.rec.cmds)
		}
		cm := q.rec.cmds[0]
		args := q.rec.slots[cm.a0 : cm.a0+cm.na]
		if len(args) != 13 {
			t.Fatalf("V %d: %d arguments, want sample_f32's 13", c.V, len(args))
		}
		sh := args[12] != 0
		if int(cm.shm) != c.shm || sh != c.inShared || cm.shm > sampleSharedBytes {
			t.Errorf("V %d: %d bytes of dynamic shared memory, scratch there %v; want %d, %v (at most %d)", c.V, cm.shm, sh, c.shm, c.inShared, sampleSharedBytes)
		}
	}
}

// TestLaunchPlans pins the host's shape rules for this stop's kernels: the
// short convolution's row chunks, conv2d_rows_f32's channel tiles and
// shared memory, and the few-row kernels' share of 9–128-row products.
func TestLaunchPlans(t *testing.T) {
	a, b := fakeTensor(gpu.F32, 40, 8), fakeTensor(gpu.F32, 40, 8)
	for _, c := range []struct {
		rows    int
		inPlace bool
		chunk   int
		nz      uint32
	}{{0, false, 1, 1}, {1, false, 1, 1}, {16, false, 16, 1}, {17, false, 16, 2}, {37, false, 16, 3}, {37, true, 37, 1}} {
		dst := b
		if c.inPlace {
			dst = a
		}
		if chunk, nz := shortConvChunks(dst, a, c.rows); chunk != c.chunk || nz != c.nz {
			t.Errorf("shortConvChunks(%d rows, in place %v) = %d, %d; want %d, %d", c.rows, c.inPlace, chunk, nz, c.chunk, c.nz)
		}
	}
	conv := func(cin, w, wout, k, groups int) gpu.Conv2DParams {
		return gpu.Conv2DParams{Cin: cin, W: w, Wout: wout, KH: k, KW: k, StrideH: 1, StrideW: 1, Groups: groups}
	}
	for _, c := range []struct {
		name    string
		cp      gpu.Conv2DParams
		cout    int
		ob, shm int
		ok      bool
	}{
		{"pointwise 256 × 32", conv(256, 32, 32, 1, 1), 256, 8, 4 * (256*32 + 8*256), true},
		{"pointwise 256 × 16", conv(256, 16, 16, 1, 1), 256, 16, 4 * (256*16 + 16*256), true},
		{"depthwise 256 × 64", conv(256, 64, 32, 3, 256), 256, 8, 4 * (3*9*64 + 8*9), true},
		{"stem", conv(1, 128, 64, 3, 1), 256, 4, 4 * (3*128 + 4*9), true},
		{"rows past shared memory", conv(1, 4100, 2050, 3, 1), 2, 0, 0, false},
	} {
		ob, shm, ok := conv2dRowsPlan(c.cp, c.cout)
		if ob != c.ob || shm != c.shm || ok != c.ok {
			t.Errorf("conv2dRowsPlan(%s) = %d, %d, %v; want %d, %d, %v", c.name, ob, shm, ok, c.ob, c.shm, c.ok)
		}
		if ok && shm > conv2dRowsMaxShm {
			t.Errorf("%s: %d bytes of shared memory", c.name, shm)
		}
	}
	for _, c := range []struct {
		M, N, K int
		want    string // "" for none
	}{
		{8, 512, 512, ""}, {9, 512, 512, "mmv_bf16_w4n1m1"}, {62, 512, 512, "mmv_bf16_w4n1m1"},
		{62, 2048, 512, "mmv_bf16_w4n1m1"}, {62, 512, 2048, "mmv_bf16_w16n1m2"},
		// 64 tiles of 64 × 64 and more: the split tiles (mmaBigSplit).
		{100, 2048, 2048, ""}, {100, 2048, 8192, ""}, {40, 4096, 1024, ""},
		{100, 8192, 2048, ""}, {100, 6144, 2048, ""}, {129, 512, 512, ""},
		{12, 8500, 40, ""}, {64, 20000, 64, ""}, {64, 8192, 2048, ""}, {64, 6144, 2048, ""},
		{40, 2048, 1024, "mmv_bf16_w4n1m1"}, {128, 1024, 1024, "mmv_bf16_w4n1m1"},
	} {
		v, ok := mmvMidVariant(c.M, c.N, c.K, 132)
		if got := map[bool]string{true: v.name}[ok]; got != c.want {
			t.Errorf("mmvMidVariant(%d, %d, %d) = %q, want %q", c.M, c.N, c.K, got, c.want)
		}
	}
}

// TestKernelsHaveCLinkage: every kernel the backend loads by name and
// kernels.cu declares by that name is declared inside an extern "C" block
// (or with extern "C" on its line): NVRTC mangles C++ names, so a kernel
// outside one is "named symbol not found" on a GPU, while the emulator,
// which resolves kernels by their source names, would not notice.
func TestKernelsHaveCLinkage(t *testing.T) {
	loaded := map[string]bool{}
	for _, k := range kernelNames {
		loaded[k] = true
	}
	decl := regexp.MustCompile(`__global__\s+void\s+([A-Za-z_0-9]+)\s*\(`)
	inC, checked := false, 0
	for i, line := range strings.Split(kernelSource, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trim, `extern "C" {`):
			inC = true
		case strings.HasPrefix(trim, `}  // extern "C"`):
			inC = false
		}
		m := decl.FindStringSubmatch(line)
		if m == nil || !loaded[m[1]] {
			continue
		}
		checked++
		if !inC && !strings.Contains(line, `extern "C"`) {
			t.Errorf("kernels.cu:%d: kernel %s is not declared with C linkage", i+1, m[1])
		}
	}
	if checked < 20 {
		t.Errorf("only %d kernels found by name in kernels.cu", checked)
	}
}

// TestNormGrid: a fused-norm product launches a block a tile while the
// GPU holds them all, else as many blocks as it holds (each taking its
// tiles in turn), and a block a tile again with Options.TilePerBlock or
// for a kernel the device has no count of.
func TestNormGrid(t *testing.T) {
	d := &Device{resident: map[string]int{"mmvngt_bf16_w16": 132, "mmvnt_bf16_w16": 264}}
	q := &Queue{d: d, name: "host"}
	for _, c := range []struct {
		name    string
		N       int
		perTile bool
		want    uint32
	}{
		{"mmvngt_bf16_w16", 2048, false, 128}, // 128 tiles: all at once
		{"mmvngt_bf16_w16", 2112, false, 132}, // exactly one block each
		{"mmvngt_bf16_w16", 2113, false, 132}, // 133 tiles: one block takes two
		{"mmvngt_bf16_w16", 8192, false, 132}, // the backbone's gate and up
		{"mmvnt_bf16_w16", 6144, false, 264},  // two blocks a multiprocessor
		{"mmvnt_bf16_w16", 3072, false, 192},  // fewer tiles than that
		{"mmvngt_bf16_w16", 8192, true, 512},  // Options.TilePerBlock
		{"mmvn_bf16_w16", 8192, false, 512},   // no count read
	} {
		d.tilePerBlock = c.perTile
		if got := q.normGrid(c.name, (c.N+15)/16); got != c.want {
			t.Errorf("normGrid(%s, %d) with tilePerBlock %v = %d, want %d", c.name, c.N, c.perTile, got, c.want)
		}
	}
}
