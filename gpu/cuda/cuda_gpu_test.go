package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// The tests in this file need an NVIDIA GPU with its driver and NVRTC; on
// other machines they are skipped with the reason.

var (
	gpuOnce sync.Once
	gpuDev  *Device
	gpuErr  error
)

// openGPU returns the shared test device, or skips the test. It runs the
// FMA products (MatMul "fma"); a test of the tensor-core kernels sets
// mmaMatMul for its duration.
func openGPU(t testing.TB) *Device {
	t.Helper()
	gpuOnce.Do(func() { gpuDev, gpuErr = New(Options{MatMul: "fma"}) })
	if gpuErr != nil {
		if errors.Is(gpuErr, ErrNoDriver) || errors.Is(gpuErr, errNoGPU) {
			t.Skipf("no usable GPU: %v", gpuErr)
		}
		t.Fatalf("the GPU is there but the backend failed: %v", gpuErr)
	}
	return gpuDev
}

// openTestDevice opens a device of its own with o for t (skipping t where
// openGPU does), closed when t ends.
func openTestDevice(t testing.TB, o Options) *Device {
	t.Helper()
	openGPU(t)
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestDeviceOpens(t *testing.T) {
	d := openGPU(t)
	in := d.Info()
	t.Logf("device %s; %s; kernels %s; memory %d MiB", in.Name, in.Driver, d.KernelSource(), in.MemTotal>>20)
	if in.Kind != "cuda" || in.MemTotal <= 0 || d.Arch() == "" {
		t.Errorf("info %+v", in)
	}
}

// TestPriorityQueue: with OMNIPIPE_CUDA_PRIORITY=on, gpu.NewUrgentQueue
// gives a stream of the device's greatest priority where the driver has
// stream priorities (an H200's range is 0 to −5), a plain one elsewhere
// (the emulator) and by default; its work runs like any queue's.
func TestPriorityQueue(t *testing.T) {
	d := openGPU(t)
	if q := gpu.NewUrgentQueue(d, "default").(*Queue); os.Getenv("OMNIPIPE_CUDA_PRIORITY") != "on" && q.priority != 0 {
		t.Errorf("priority %d by default", q.priority)
	}
	t.Setenv("OMNIPIPE_CUDA_PRIORITY", "on")
	q := gpu.NewUrgentQueue(d, "urgent").(*Queue)
	c := d.drv
	switch {
	case c.cuStreamCreateWithPriority == 0 || c.cuCtxGetStreamPriorityRange == 0:
		if q.priority != 0 {
			t.Errorf("priority %d without the driver's stream priorities", q.priority)
		}
	case !d.Emulated() && q.priority >= 0:
		t.Errorf("priority %d: want the greatest (negative) priority", q.priority)
	}
	t.Logf("stream priority %d", q.priority)
	x := d.Alloc(gpu.F32, 3, 5)
	defer d.Free(x)
	in := []float32{1, -2, 3, 4.5, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -15}
	q.Write(x, in)
	q.Scale(x, x, 2)
	got := make([]float32, len(in))
	if err := q.Read(got, x); err != nil {
		t.Fatal(err)
	}
	for i, v := range in {
		if got[i] != 2*v {
			t.Fatalf("element %d: %v, want %v", i, got[i], 2*v)
		}
	}
}

// TestMatchesCPUBackend runs a small mixed sequence of ops on both
// backends and compares the results (a smoke test: the per-kernel
// contract with float64 replays is in contract_test.go).
func TestMatchesCPUBackend(t *testing.T) {
	d := openGPU(t)
	c := cpu.New(2)
	defer c.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.Float64()*2 - 1)
		}
		return v
	}
	const M, K, N = 5, 300, 37
	xs, ws := rnd(M*K), rnd(N*K)
	wb := make([]byte, 2*len(ws))
	for i, v := range ws {
		h := gpu.F32ToBF16(v)
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	run := func(dev gpu.Device) []float32 {
		q := dev.NewQueue("t")
		x := dev.Alloc(gpu.F32, M, K)
		w, err := dev.Load(gpu.BF16, N, K, wb)
		if err != nil {
			t.Fatal(err)
		}
		y := dev.Alloc(gpu.F32, M, N)
		q.Write(x, xs)
		q.MatMul(y, x, w, gpu.Tensor{})
		q.RMSNorm(y, y, 1e-5)
		q.Act(y, y, gpu.SiLU)
		q.RoundBF16(y)
		out := make([]float32, M*N)
		if err := q.Read(out, y); err != nil {
			t.Fatal(err)
		}
		return out
	}
	g, h := run(d), run(c)
	var worst float64
	for i := range g {
		worst = math.Max(worst, math.Abs(float64(g[i]-h[i])))
	}
	t.Logf("max |gpu − cpu| = %g", worst)
	if worst > 1e-2 || math.IsNaN(worst) {
		t.Errorf("GPU and CPU differ by %g", worst)
	}
}

// checkFused runs op sequences the backend folds into one kernel (a
// product's rounding, activation and elementwise Add/Mul; a norm's
// rounding and row weight) twice: as recorded, and with an unrelated op
// between every two so that nothing folds. Both must give the same bits,
// and the first must have launched fewer kernels.
func checkFused(d *Device) error {
	rng := rand.New(rand.NewPCG(5, 6))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.Float64()*2 - 1)
		}
		return v
	}
	const K, N = 520, 48
	wb := make([]byte, 2*N*K)
	for i, v := range rnd(N * K) {
		h := gpu.F32ToBF16(v)
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	w, err := d.Load(gpu.BF16, N, K, wb)
	if err != nil {
		return err
	}
	defer d.Free(w)
	wt := d.Alloc(gpu.F32, N, K) // an F32 weight: the FMA tile kernels
	defer d.Free(wt)
	nv, err := d.Load(gpu.BF16, 1, N, wb[:2*N])
	if err != nil {
		return err
	}
	defer d.Free(nv)
	type step func(q gpu.Queue, y, x, o gpu.Tensor)
	for _, c := range []struct {
		name  string
		rows  int
		steps []step
	}{
		{"gemv+round", 1, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.MatMul(y, x, w, gpu.Tensor{}) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
		{"matmul+round+silu+round", 3, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.MatMul(y, x, w, gpu.Tensor{}) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.Act(y, y, gpu.SiLU) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
		{"gemv+round+mul+round", 1, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.MatMul(y, x, w, gpu.Tensor{}) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.Mul(y, y, o) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
		{"f32-matmul+add+round", 5, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.MatMul(y, x, wt, gpu.Tensor{}) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.Add(y, o, y) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
		{"rmsnorm+round+mulrow+round", 3, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RMSNorm(y, o, 1e-5) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.MulRow(y, y, nv) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
		{"add+round", 3, []step{
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.Add(y, o, o) },
			func(q gpu.Queue, y, x, o gpu.Tensor) { q.RoundBF16(y) }}},
	} {
		q := d.NewQueue("fuse").(*Queue)
		x, o := d.Alloc(gpu.F32, c.rows, K), d.Alloc(gpu.F32, c.rows, N)
		y1, y2, junk := d.Alloc(gpu.F32, c.rows, N), d.Alloc(gpu.F32, c.rows, N), d.Alloc(gpu.F32, 1, 1)
		q.Write(x, rnd(c.rows*K))
		q.Write(o, rnd(c.rows*N))
		q.Write(wt, rnd(N*K))
		before := len(q.rec.cmds)
		for _, s := range c.steps {
			s(q, y1, x, o)
		}
		if got := len(q.rec.cmds) - before; got != 1 {
			return fmt.Errorf("%s: %d launches, want 1 (nothing folded)", c.name, got)
		}
		for _, s := range c.steps {
			s(q, y2, x, o)
			q.Fill(junk, 0) // breaks every fold
		}
		a, b := make([]float32, c.rows*N), make([]float32, c.rows*N)
		if err := q.Read(a, y1); err != nil {
			return err
		}
		if err := q.Read(b, y2); err != nil {
			return err
		}
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				return fmt.Errorf("%s: element %d: folded %v, separate %v", c.name, i, a[i], b[i])
			}
		}
		for _, t := range []gpu.Tensor{x, o, y1, y2, junk} {
			d.Free(t)
		}
	}
	return nil
}

func TestFusedOpsEqualSeparate(t *testing.T) {
	if err := checkFused(openGPU(t)); err != nil {
		t.Error(err)
	}
}

// TestMMAInvarianceMixedRows checks the tensor-core products' batch
// invariance where it is most at risk: a batch mixing rows that are exact
// bf16 values (whose mid and lo parts are zero, skipped when a whole tile
// has none) with full fp32 rows. Every row alone must equal the same row in
// the batch, bit for bit.
func TestMMAInvarianceMixedRows(t *testing.T) {
	d := openTestDevice(t, Options{MatMul: "mma"})
	rng := rand.New(rand.NewPCG(7, 8))
	const M, K, N = 19, 333, 40
	wb := make([]byte, 2*N*K)
	for i := range N * K {
		h := gpu.F32ToBF16(float32(rng.Float64()*2 - 1))
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	w, err := d.Load(gpu.BF16, N, K, wb)
	if err != nil {
		t.Fatal(err)
	}
	xs := make([]float32, M*K)
	for r := range M {
		for k := range K {
			v := float32(rng.Float64()*2 - 1)
			if r%3 != 0 {
				v = gpu.RoundBF16(v)
			}
			xs[r*K+k] = v
		}
	}
	q := d.NewQueue("mixed")
	x, y := d.Alloc(gpu.F32, M, K), d.Alloc(gpu.F32, M, N)
	q.Write(x, xs)
	q.MatMul(y, x, w, gpu.Tensor{})
	all := make([]float32, M*N)
	if err := q.Read(all, y); err != nil {
		t.Fatal(err)
	}
	for r := range M {
		x1, y1 := d.Alloc(gpu.F32, 1, K), d.Alloc(gpu.F32, 1, N)
		q.Write(x1, xs[r*K:(r+1)*K])
		q.MatMul(y1, x1, w, gpu.Tensor{})
		one := make([]float32, N)
		if err := q.Read(one, y1); err != nil {
			t.Fatal(err)
		}
		for n := range N {
			if math.Float32bits(one[n]) != math.Float32bits(all[r*N+n]) {
				t.Fatalf("row %d col %d: alone %v, in the batch %v", r, n, one[n], all[r*N+n])
			}
		}
	}
}

// TestGemvVariantsBitIdentical: every one-row kernel variant (rows per
// warp, chunks in flight) gives the bits of the tile kernels' row, for
// shapes with ragged N and K (tails of the chunk loop, the last block's
// clamped rows) and the model's shapes.
func TestGemvVariantsBitIdentical(t *testing.T) {
	d := openGPU(t)
	rng := rand.New(rand.NewPCG(9, 9))
	for _, sh := range []struct{ N, K int }{{1024, 1024}, {2816, 1024}, {1024, 2816}, {2048, 8192}, {777, 1000}, {3, 4104}, {1536, 264}, {65, 2056}} {
		w := loadNormalBF16(t, d, rng, sh.N, sh.K)
		xs := normals(rng, 2*sh.K)
		q := d.NewQueue("gemv").(*Queue)
		x2 := d.Alloc(gpu.F32, 2, sh.K)
		y2 := d.Alloc(gpu.F32, 2, sh.N)
		q.Write(x2, xs)
		q.MatMul(y2, x2, w, gpu.Tensor{}) // the tile kernel, two rows
		want := make([]float32, 2*sh.N)
		if err := q.Read(want, y2); err != nil {
			t.Fatal(err)
		}
		for _, v := range gemvVariants {
			q.gemvForce, q.gemvForceRows = v.name, 4*v.c
			y := d.Alloc(gpu.F32, 1, sh.N)
			q.MatMul(y, x2.Row(1), w, gpu.Tensor{})
			got := make([]float32, sh.N)
			if err := q.Read(got, y); err != nil {
				t.Fatal(err)
			}
			if bad := differing(got, want[sh.N:]); bad > 0 {
				t.Errorf("%s on %dx%d: %d/%d outputs differ from the tile kernel's row", v.name, sh.N, sh.K, bad, sh.N)
			}
			d.Free(y)
		}
		q.gemvForce = ""
		d.Free(x2)
		d.Free(y2)
		d.Free(w)
	}
}

// TestGemvrVariantsBitIdentical: every few-row kernel variant gives, for
// every row of x, the bits of the tile kernels' row — ragged N and K, row
// counts that leave a tile part-empty, several row tiles — so a session's
// row is the same whether it is stepped alone or with up to 31 others.
func TestGemvrVariantsBitIdentical(t *testing.T) {
	names := []string{""} // "": the default pick
	for _, v := range gemvrVariants {
		names = append(names, v.name)
	}
	variantsEqualTile(t, openGPU(t), rand.New(rand.NewPCG(10, 10)), "",
		[]struct{ N, K int }{{1024, 1024}, {2816, 1024}, {1024, 2816}, {777, 1000}, {3, 4104}, {1536, 264}, {65, 2056}},
		[]int{2, 3, 4, 5, 8, 11, 32}, names, func(q *Queue, name string) { q.gemvrForce = name }, nil)
}

// TestMmvVariantsBitIdentical: with MatMul "mma", every few-row
// tensor-core kernel variant gives, for every row of x, the bits of the
// tensor-core tile kernel (split_bf16 then mma_bf16) — ragged N and K
// (superblock tails, clamped weight rows), row counts that leave a tile
// part-empty, fp32 rows and exact-bf16 rows mixed (the parts skipped per
// superblock against per row) — so a row's bits do not depend on the
// kernel, nor on the batch. Each runs on the weights' tiled copy (Load's,
// where the weight has 16 rows or more: tiled.go) and, "/rows", on their
// rows.
func TestMmvVariantsBitIdentical(t *testing.T) {
	d := openGPU(t)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	names := []string{"", "/rows"}
	for _, v := range mmvVariants {
		names = append(names, v.name, v.name+"/rows")
	}
	everyOtherRowBF16 := func(xs []float32, M, K int) {
		for r := 0; r < M; r += 2 {
			for k := range K {
				xs[r*K+k] = gpu.RoundBF16(xs[r*K+k])
			}
		}
	}
	// The emulator (every CI run) takes two row counts of the eight: one
	// row, and three 8-row tiles, the last part-empty.
	Ms, Ms2 := []int{1, 2, 3, 5, 8, 11, 17, 32}, []int{1, 3}
	if d.Emulated() {
		Ms, Ms2 = []int{1, 17}, []int{1}
	}
	variantsEqualTile(t, d, rand.New(rand.NewPCG(14, 15)), "",
		[]struct{ N, K int }{{1024, 1024}, {2816, 1024}, {1024, 2816}, {777, 1000}, {3, 4104}, {1536, 264}, {65, 2056}, {40, 7}},
		Ms, names, func(q *Queue, name string) {
			q.mmvForce, q.untiled = strings.CutSuffix(name, "/rows")
		}, everyOtherRowBF16)
	// Rows whose even superblocks are exact bf16 and odd ones not: the
	// mid and lo parts are skipped superblock by superblock (mmv_tile),
	// row by row (the tile kernel), so both skip and take them in one
	// product; and K past 8,192.
	alternateSuperblocks := func(xs []float32, M, K int) {
		for i := range xs {
			if (i%K)/64%2 == 0 {
				xs[i] = gpu.RoundBF16(xs[i])
			}
		}
	}
	variantsEqualTile(t, d, rand.New(rand.NewPCG(16, 17)), "",
		[]struct{ N, K int }{{1024, 1024}, {777, 1000}, {3, 4104}, {65, 2056}, {40, 7}, {2048, 8200}},
		Ms2, names, func(q *Queue, name string) {
			q.mmvForce, q.untiled = strings.CutSuffix(name, "/rows")
		}, alternateSuperblocks)
}

// TestMmaBigBitIdentical: the 64 × 64 tensor-core tile kernel (K walked
// class by class, operands through shared memory) gives the bits of
// mma_tile's kernel for every output — rows all exact bf16 (its staged
// path), all fp32 and mixed (its global-memory path, parts per 8-row
// tile), K below 1024 (empty classes), ragged K and N, weights whose rows
// are not 16-byte aligned, and rows past the last tile — unsplit
// ("/1"), with its classes split over 2, 5 or 16 blocks a tile
// (mma_bf16_bigp and mma_fold_f32; fewer where K has fewer classes) and
// as mmaBigSplit picks.
func TestMmaBigBitIdentical(t *testing.T) {
	d := openGPU(t)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	rng := rand.New(rand.NewPCG(21, 22))
	preps := map[string]func(xs []float32, M, K int){
		"bf16": func(xs []float32, M, K int) {
			for i := range xs {
				xs[i] = gpu.RoundBF16(xs[i])
			}
		},
		"fp32": nil,
		"mixed": func(xs []float32, M, K int) { // rows 0–63 exact bf16, the rest every other row
			for r := 0; r < M; r++ {
				if r < 64 || r%2 == 0 {
					for k := range K {
						xs[r*K+k] = gpu.RoundBF16(xs[r*K+k])
					}
				}
			}
		},
	}
	for _, pn := range []string{"bf16", "fp32", "mixed"} {
		t.Run("x="+pn, func(t *testing.T) {
			variantsEqualTile(t, d, rng, "mma_bf16_m32",
				[]struct{ N, K int }{{2048, 2048}, {777, 1000}, {130, 4104}, {64, 264}, {100, 7}, {3, 2056}, {1536, 8192}},
				[]int{1, 33, 64, 100, 130}, []string{"mma_bf16_big", "mma_bf16_big/1", "mma_bf16_big/2", "mma_bf16_big/5", "mma_bf16_big/16"},
				func(q *Queue, name string) { q.tileForce, q.tileKernel = name != "", name }, preps[pn])
		})
	}
}

// TestMmaBigSplitBitIdentical is TestMmaBigBitIdentical's split at sizes
// the CUDA emulator runs in seconds: the 64 × 64 tile kernel with its
// classes split over 2, 3 or 16 blocks a tile (mma_bf16_bigp, then
// mma_fold_f32), and as mmaBigSplit picks, equals mma_tile's bits on
// rows of exact bf16 (the staged path) and of fp32 (the global path) —
// K with every class (18 superblocks: classes of one and two), K with 5
// classes, ragged M and N, a bias and a folded activation.
func TestMmaBigSplitBitIdentical(t *testing.T) {
	d := openGPU(t)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	rng := rand.New(rand.NewPCG(23, 24))
	bf16 := func(xs []float32, M, K int) {
		for i := range xs {
			xs[i] = gpu.RoundBF16(xs[i])
		}
	}
	for _, pn := range []string{"bf16", "fp32"} {
		prep := bf16
		if pn == "fp32" {
			prep = nil
		}
		t.Run("x="+pn, func(t *testing.T) {
			variantsEqualTile(t, d, rng, "mma_bf16_m32", []struct{ N, K int }{{130, 1100}, {70, 300}},
				[]int{17, 70}, []string{"mma_bf16_big/1", "mma_bf16_big/2", "mma_bf16_big/3", "mma_bf16_big/16", "mma_bf16_big"},
				func(q *Queue, name string) { q.tileForce, q.tileKernel = name != "", name }, prep)
		})
	}
	// The fold's bias and epilogue: a split product with a bias, then a
	// folded SiLU, equals the unsplit kernel's.
	const M, N, K = 40, 100, 700
	w := loadNormalBF16(t, d, rng, N, K)
	bias := d.Alloc(gpu.F32, 1, N)
	x, y := d.Alloc(gpu.F32, M, K), d.Alloc(gpu.F32, M, N)
	q := d.NewQueue("split-epi").(*Queue)
	q.Write(bias, normals(rng, N))
	q.Write(x, normals(rng, M*K))
	var want []float32
	stop := d.countLaunches()
	for _, name := range []string{"mma_bf16_big/1", "mma_bf16_big/4"} {
		q.tileForce, q.tileKernel = true, name
		q.Fill(y, float32(math.NaN()))
		q.MatMul(y, x, w, bias)
		q.Act(y, y, gpu.SiLU)
		got := make([]float32, M*N)
		if err := q.Read(got, y); err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = got
		} else if bad := differing(got, want); bad > 0 {
			t.Errorf("%s with a bias and SiLU: %d/%d outputs differ from the unsplit kernel's", name, bad, len(got))
		}
	}
	if n := stop(); n["mma_fold_f32"] == 0 || n["mma_bf16_bigp"] == 0 {
		t.Errorf("the split kernels were not launched: %v", n)
	}
}

// variantsEqualTile checks, for every weight shape and row count, that the
// product of each named kernel variant (force selects it on the queue;
// "" is the default pick) equals the tile kernel's bit for bit — the tile
// kernel ref, or the default tile pick for "" — its output poisoned with
// NaNs before each launch. prep, when set, edits the random rows of x
// first.
func variantsEqualTile(t *testing.T, d *Device, rng *rand.Rand, ref string, shapes []struct{ N, K int }, Ms []int, names []string,
	force func(q *Queue, name string), prep func(xs []float32, M, K int)) {
	t.Helper()
	for _, sh := range shapes {
		w := loadNormalBF16(t, d, rng, sh.N, sh.K)
		q := d.NewQueue("variants").(*Queue)
		for _, M := range Ms {
			xs := normals(rng, M*sh.K)
			if prep != nil {
				prep(xs, M, sh.K)
			}
			x, y := d.Alloc(gpu.F32, M, sh.K), d.Alloc(gpu.F32, M, sh.N)
			q.Write(x, xs)
			q.tileForce, q.tileKernel = true, ref
			q.MatMul(y, x, w, gpu.Tensor{})
			q.tileForce, q.tileKernel = false, ""
			want := make([]float32, M*sh.N)
			if err := q.Read(want, y); err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				force(q, name)
				q.Fill(y, float32(math.NaN()))
				q.MatMul(y, x, w, gpu.Tensor{})
				got := make([]float32, M*sh.N)
				if err := q.Read(got, y); err != nil {
					t.Fatal(err)
				}
				if bad := differing(got, want); bad > 0 {
					t.Errorf("%q on M=%d %dx%d: %d/%d outputs differ from the tile kernel's", name, M, sh.N, sh.K, bad, len(got))
				}
			}
			force(q, "")
			d.Free(x)
			d.Free(y)
		}
		d.Free(w)
	}
}

// TestNormFusedEqualsSeparate: the fused norm kernels (gpu.NormFuser) give
// the bits of the op sequences they replace — every rounding flag, a bf16
// and an f32 norm weight, products with folded epilogues after them, and
// head rotations in both styles, fp32 and bf16, in place and into another
// buffer.
func TestNormFusedEqualsSeparate(t *testing.T) {
	d := openGPU(t)
	rng := rand.New(rand.NewPCG(12, 13))
	vals := func(n int) []float32 { return normals(rng, n) }
	run := func(unfused bool, fn func(q *Queue) []gpu.Tensor) [][]float32 {
		q := d.NewQueue("fuse").(*Queue)
		q.unfused = unfused
		outs := fn(q)
		res := make([][]float32, len(outs))
		for i, o := range outs {
			res[i] = make([]float32, o.Len())
			if err := q.Read(res[i], o); err != nil {
				t.Fatal(err)
			}
		}
		return res
	}
	same := func(name string, a, b [][]float32) {
		for i := range a {
			for j := range a[i] {
				if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
					t.Errorf("%s: output %d element %d: fused %v, separate %v", name, i, j, a[i][j], b[i][j])
					return
				}
			}
		}
	}
	// The product after the norm in both orders: the FMA kernels' (gemvn)
	// and the tensor cores' (mmvn, each variant).
	for _, kind := range []string{"fma", "mmvn_bf16_w4", "mmvn_bf16_w16"} {
		d.mmaMatMul = kind != "fma"
		force := ""
		if d.mmaMatMul {
			force = kind
		}
		runK := func(unfused bool, fn func(q *Queue) []gpu.Tensor) [][]float32 {
			return run(unfused, func(q *Queue) []gpu.Tensor {
				if !unfused {
					q.mmvForce = force
				}
				return fn(q)
			})
		}
		normMatMulCases(t, d, rng, kind, runK, same)
	}
	d.mmaMatMul = false
	for ci, c := range []struct {
		style           gpu.RoPEStyle
		hd, heads, rows int
		bf16, round     bool
		nround, inplace bool
	}{
		{gpu.Interleaved, 64, 16, 1, false, true, false, false},
		{gpu.Interleaved, 64, 4, 3, false, true, false, true},
		{gpu.RotateHalf, 64, 32, 1, true, false, true, true},
		{gpu.RotateHalf, 64, 8, 5, true, false, true, false},
		{gpu.RotateHalf, 128, 3, 2, false, false, true, false},
	} {
		nwb := loadNormalBF16(t, d, rng, 1, c.hd)
		cols := c.hd * c.heads
		xs := vals(c.rows * (cols + 7))
		inv := make([]float32, c.hd/2)
		for j := range inv {
			inv[j] = float32(math.Pow(1e6, -2*float64(j)/float64(c.hd)))
		}
		pos := make([]int32, c.rows)
		for r := range pos {
			pos[r] = int32(rng.IntN(5000))
		}
		fn := func(q *Queue) []gpu.Tensor {
			whole := d.Alloc(gpu.F32, c.rows, cols+7)
			q.Write(whole, xs)
			src := whole.ColSlice(3, 3+cols)
			dst := src
			if !c.inplace {
				dst = d.Alloc(gpu.F32, c.rows, cols)
			}
			if c.inplace && c.rows > 1 {
				dst = d.Alloc(gpu.F32, c.rows, cols)
				q.Copy(dst, src)
				src = dst
			}
			rp := gpu.RoPEParams{Style: c.style, HeadDim: c.hd, InvFreq: inv, Pos: pos, BF16: c.bf16}
			gpu.HeadNormRoPE(q, dst, src, gpu.RowNorm{Eps: 1e-5, Round: c.nround, W: nwb, RoundW: true}, rp, c.round)
			return []gpu.Tensor{dst}
		}
		same(fmt.Sprintf("headnormrope case %d", ci), run(false, fn), run(true, fn))
		d.Free(nwb)
	}
	// An attention's q (in place in qkv), k (into a cache row) and v
	// (copied) in one PrepHeads, one and three rows.
	for _, rows := range []int{1, 3} {
		const hd, hq, hk = 64, 16, 4
		cols := (hq + 2*hk) * hd
		qn := loadNormalBF16(t, d, rng, 1, hd)
		kn := loadNormalBF16(t, d, rng, 1, hd)
		xs := vals(rows * cols)
		inv := make([]float32, hd/2)
		for j := range inv {
			inv[j] = float32(math.Pow(1e6, -2*float64(j)/float64(hd)))
		}
		pos := make([]int32, rows)
		for r := range pos {
			pos[r] = int32(r + 3)
		}
		fn := func(q *Queue) []gpu.Tensor {
			qkv := d.Alloc(gpu.F32, rows, cols)
			q.Write(qkv, xs)
			kc, vc := d.Alloc(gpu.F32, 8, rows*hk*hd), d.Alloc(gpu.F32, 8, rows*hk*hd)
			k, v := kc.Row(5).Reshape(rows, hk*hd), vc.Row(5).Reshape(rows, hk*hd)
			qd := qkv.ColSlice(0, hq*hd)
			if rows > 1 {
				qd = d.Alloc(gpu.F32, rows, hq*hd)
			}
			n := func(w gpu.Tensor) gpu.RowNorm { return gpu.RowNorm{Eps: 1e-5, W: w, RoundW: true} }
			gpu.PrepHeads(q, gpu.RoPEParams{Style: gpu.Interleaved, HeadDim: hd, InvFreq: inv, Pos: pos}, true,
				gpu.HeadPrep{Dst: qd, Src: qkv.ColSlice(0, hq*hd), Norm: n(qn)},
				gpu.HeadPrep{Dst: k, Src: qkv.ColSlice(hq*hd, (hq+hk)*hd), Norm: n(kn)},
				gpu.HeadPrep{Dst: v, Src: qkv.ColSlice((hq+hk)*hd, cols), Copy: true})
			return []gpu.Tensor{qd, k, v}
		}
		same(fmt.Sprintf("prepheads rows %d", rows), run(false, fn), run(true, fn))
		d.Free(qn)
		d.Free(kn)
	}
}

// differing counts the elements of got whose bits differ from want's.
func differing(got, want []float32) int {
	bad := 0
	for n := range got {
		if math.Float32bits(got[n]) != math.Float32bits(want[n]) {
			bad++
		}
	}
	return bad
}

// loadNormalBF16 loads an [n, k] bf16 weight of standard normal values
// drawn from rng.
func loadNormalBF16(tb testing.TB, d *Device, rng *rand.Rand, n, k int) gpu.Tensor {
	tb.Helper()
	b := make([]byte, 2*n*k)
	for i := 0; i < n*k; i++ {
		binary.LittleEndian.PutUint16(b[2*i:], gpu.F32ToBF16(float32(rng.NormFloat64())))
	}
	w, err := d.Load(gpu.BF16, n, k, b)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

// normals returns n standard normal values drawn from rng.
func normals(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// normMatMulCases runs TestNormFusedEqualsSeparate's NormMatMul cases: fused
// (run(false)) against the norm and the product launched apart.
func normMatMulCases(t *testing.T, d *Device, rng *rand.Rand, kind string, run func(bool, func(*Queue) []gpu.Tensor) [][]float32, same func(string, [][]float32, [][]float32)) {
	for _, sh := range []struct{ N, K int }{{1536, 1024}, {1024, 2048}, {65, 264}, {8192, 2048}} {
		w := loadNormalBF16(t, d, rng, sh.N, sh.K)
		nwb := loadNormalBF16(t, d, rng, 1, sh.K)
		xs, nwf, other := normals(rng, sh.K), normals(rng, sh.K), normals(rng, sh.N)
		for ci, c := range []struct {
			round, roundW, f32w bool
			epi                 string
		}{{true, true, false, "round"}, {false, true, false, "silu"}, {false, false, true, "add"}, {true, false, false, ""}} {
			fn := func(q *Queue) []gpu.Tensor {
				x, h, y, o := d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.N), d.Alloc(gpu.F32, 1, sh.N)
				q.Write(x, xs)
				q.Write(o, other)
				nw := nwb
				if c.f32w {
					nw = d.Alloc(gpu.F32, 1, sh.K)
					q.Write(nw, nwf)
				}
				gpu.NormMatMul(q, y, h, x, gpu.RowNorm{Eps: 1e-5, Round: c.round, W: nw, RoundW: c.roundW}, w, gpu.Tensor{})
				switch c.epi {
				case "round":
					q.RoundBF16(y)
				case "silu":
					q.RoundBF16(y)
					q.Act(y, y, gpu.SiLU)
					q.RoundBF16(y)
				case "add":
					q.Add(y, y, o)
					q.RoundBF16(y)
				}
				return []gpu.Tensor{y, h}
			}
			same(fmt.Sprintf("normmatmul %s %dx%d case %d", kind, sh.N, sh.K, ci), run(false, fn), run(true, fn))
		}
		d.Free(w)
		d.Free(nwb)
	}
}

// TestMatMulTiledBitIdentical: the FMA product on 64 × 64 tiles
// (matmul_t64_*) gives the warp tiles' bits (matmul_r*_*) for every output
// — f32, bf16 and f16 weights, K short and long (one to several 256-term
// rounds, ragged), N and M ragged, strided x, a bias — its output poisoned
// with NaNs first. (The default picks the tile kernel from 64 rows and 32
// weight rows; both are forced here, on few rows too.)
func TestMatMulTiledBitIdentical(t *testing.T) {
	d := openGPU(t)
	rng := rand.New(rand.NewPCG(31, 32))
	q := d.NewQueue("fma-tiles").(*Queue)
	load := func(dt gpu.DType, n, k int) gpu.Tensor {
		vals := normals(rng, n*k)
		var b []byte
		switch dt {
		case gpu.F32:
			b = make([]byte, 4*n*k)
			for i, v := range vals {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
		case gpu.BF16:
			b = make([]byte, 2*n*k)
			for i, v := range vals {
				binary.LittleEndian.PutUint16(b[2*i:], gpu.F32ToBF16(v))
			}
		case gpu.F16: // finite halves of magnitude 2^-5 … 2^5, random signs and mantissas
			b = make([]byte, 2*n*k)
			for i := range vals {
				h := uint16(rng.IntN(2))<<15 | uint16(10+rng.IntN(11))<<10 | uint16(rng.IntN(1024))
				binary.LittleEndian.PutUint16(b[2*i:], h)
			}
		}
		w, err := d.Load(dt, n, k, b)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	shapes := []struct{ N, K int }{{64, 32}, {512, 192}, {33, 7}, {100, 300}, {70, 1030}, {130, 4100}, {1, 256}, {256, 1536}}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		for si, sh := range shapes {
			w := load(dt, sh.N, sh.K)
			bias := d.Alloc(gpu.F32, 1, sh.N)
			q.Write(bias, normals(rng, sh.N))
			for _, M := range []int{1, 5, 64, 100, 257} {
				pad := (si % 2) * 3 // odd strides on every other shape: x's rows unaligned
				xb := d.Alloc(gpu.F32, M, sh.K+pad)
				q.Write(xb, normals(rng, M*(sh.K+pad)))
				x := xb.ColSlice(0, sh.K)
				y := d.Alloc(gpu.F32, M, sh.N)
				var b gpu.Tensor
				if M%2 == 1 {
					b = bias
				}
				run := func(tiles int8) []float32 {
					q.fmaTiles = tiles
					q.Fill(y, float32(math.NaN()))
					q.MatMul(y, x, w, b)
					q.fmaTiles = 0
					out := make([]float32, M*sh.N)
					if err := q.Read(out, y); err != nil {
						t.Fatal(err)
					}
					return out
				}
				want, got := run(-1), run(1)
				if bad := differing(got, want); bad > 0 {
					t.Errorf("%v weights [%d, %d], M=%d (x stride %d): %d/%d outputs differ from the warp tiles'", dt, sh.N, sh.K, M, x.Stride, bad, len(got))
				}
				d.Free(xb)
				d.Free(y)
			}
			d.Free(w)
			d.Free(bias)
		}
	}
}

// TestProgrammaticLaunchOrders checks that programmatic dependent launch
// (launch.go) keeps every kernel behind the one before it: a chain of
// fill, long product and copy, launched directly, then built into a graph
// and replayed, gives the bits of a device without it. Its control, the
// kernels built with FAULT_PDL (no griddepcontrol.wait), must give other
// values: each copy then reads its product's output before the product
// has written it.
func TestProgrammaticLaunchOrders(t *testing.T) {
	openGPU(t)
	const N, K, links = 16384, 2048, 4
	rng := rand.New(rand.NewPCG(7, 8))
	wb := make([]byte, 2*N*K)
	for i := range N * K {
		h := gpu.F32ToBF16(float32(rng.Float64()*2 - 1))
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	xs := make([]float32, K)
	for i := range xs {
		xs[i] = float32(rng.Float64()*2 - 1)
	}
	// run makes the chain four times (launched directly twice, as the
	// batches' shapes are new; then a graph is built and run; then it is
	// replayed) and returns each run's copies.
	run := func(o Options) ([][]float32, bool) {
		d, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		w, err := d.Load(gpu.BF16, N, K, wb)
		if err != nil {
			t.Fatal(err)
		}
		q := d.NewQueue("pdl")
		x := d.Alloc(gpu.F32, 1, K)
		q.Write(x, xs)
		ys, es := make([]gpu.Tensor, links), d.Alloc(gpu.F32, links, N)
		for i := range ys {
			ys[i] = d.Alloc(gpu.F32, 1, N)
		}
		var out [][]float32
		for range 4 {
			for i := range links {
				q.Fill(ys[i], float32(math.NaN()))
				q.MatMul(ys[i], x, w, gpu.Tensor{})
				q.Copy(es.Row(i), ys[i])
			}
			got := make([]float32, links*N)
			if err := q.Read(got, es); err != nil {
				t.Fatal(err)
			}
			out = append(out, got)
			q.Fill(es, 0)
		}
		return out, d.pdl.Load()
	}
	want, on := run(Options{NoPDL: true})
	if on {
		t.Fatal("NoPDL device launched programmatically")
	}
	got, on := run(Options{})
	if !on {
		t.Skipf("programmatic dependent launch not available on %s", openGPU(t).Arch())
	}
	for r := range got {
		if i := firstDiffering(got[r], want[r]); i >= 0 {
			t.Fatalf("run %d: element %d is %v with programmatic launch, %v without", r, i, got[r][i], want[r][i])
		}
		for i, v := range want[r] {
			if math.IsNaN(float64(v)) {
				t.Fatalf("run %d: element %d unwritten", r, i)
			}
		}
	}
	if openGPU(t).Emulated() {
		// The emulator runs each kernel to its end before the next: a
		// missing wait cannot show there. What ran above still checks the
		// programmatic launches and graph edges the backend builds.
		t.Logf("programmatic launch: 4 runs × %d links equal the serial launch's bits (on the emulator: no control)", links)
		return
	}
	bad, _ := run(Options{Fault: "PDL"})
	caught := 0
	for r := range bad {
		if firstDiffering(bad[r], want[r]) >= 0 {
			caught++
		}
	}
	if caught == 0 {
		t.Error("planted fault PDL (no griddepcontrol.wait) was not caught: every copy saw its product's output")
	}
	t.Logf("programmatic launch: 4 runs × %d links equal the serial launch's bits; control caught in %d of 4 runs", links, caught)
}

// firstDiffering returns the first index where a and b differ in their
// bits, or −1.
func firstDiffering(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// conv2dShape is one convolution of conv2dShapes: H input rows of Cin
// channels to Cout.
type conv2dShape struct {
	name         string
	H, Cin, Cout int
	cp           gpu.Conv2DParams
}

// Hout is the convolution's output rows.
func (c conv2dShape) Hout() int { return (c.H+2*c.cp.PadH-c.cp.KH)/c.cp.StrideH + 1 }

// conv2dShapes are the conformer subsampling's convolutions at the
// released size (a 4.9 s clip: 490 mel rows of 128 bins, 256 channels):
// the stem, then per stage the depthwise 3 × 3 and the pointwise 1 × 1;
// the emulator takes the same kinds at a tenth of the channels and rows.
func conv2dShapes(emulated bool) []conv2dShape {
	C, H, F := 256, 490, 128
	if emulated {
		C, H, F = 24, 40, 32
	}
	s3 := func(cin, w, groups int) gpu.Conv2DParams {
		return gpu.Conv2DParams{Cin: cin, W: w, Wout: (w + 1) / 2, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, Groups: groups}
	}
	pw := func(w int) gpu.Conv2DParams {
		return gpu.Conv2DParams{Cin: C, W: w, Wout: w, KH: 1, KW: 1, StrideH: 1, StrideW: 1, Groups: 1}
	}
	return []conv2dShape{
		{"stem", H, 1, C, s3(1, F, 1)},
		{"depthwise1", (H + 1) / 2, C, C, s3(C, F/2, C)},
		{"pointwise1", (H + 3) / 4, C, C, pw(F / 4)},
		{"depthwise2", (H + 3) / 4, C, C, s3(C, F/4, C)},
		{"pointwise2", (H + 7) / 8, C, C, pw(F / 8)},
		// Ragged tiles of conv2d_pw_f32: input channels past a 32-channel
		// step, output channels past 64, positions past 32.
		{"pointwise-ragged", 3, 70, 67, gpu.Conv2DParams{Cin: 70, W: 37, Wout: 37, KH: 1, KW: 1, StrideH: 1, StrideW: 1, Groups: 1}},
	}
}

// TestConv2DRowsBitIdentical: conv2d_rows_f32 (a block an output row and
// tile of channels, operands in shared memory) and conv2d_pw_f32 (the
// pointwise ones as tiles of 64 channels × 32 positions) give conv2d_f32's bits
// for every output of the conformer's convolutions, with bf16 weights and
// biases as the checkpoint holds them.
func TestConv2DRowsBitIdentical(t *testing.T) {
	d := openGPU(t)
	rng := rand.New(rand.NewPCG(31, 32))
	for _, sh := range conv2dShapes(d.Emulated()) {
		cp, Hout := sh.cp, sh.Hout()
		if _, _, ok := conv2dRowsPlan(cp, sh.Cout); !ok {
			t.Fatalf("%s: conv2d_rows_f32 does not take it", sh.name)
		}
		x := d.Alloc(gpu.F32, sh.H, cp.Cin*cp.W)
		w := loadNormalBF16(t, d, rng, sh.Cout, cp.Cin/cp.Groups*cp.KH*cp.KW)
		b := loadNormalBF16(t, d, rng, 1, sh.Cout)
		q := d.NewQueue("conv2d").(*Queue)
		q.Write(x, normals(rng, sh.H*cp.Cin*cp.W))
		// conv2d_f32, conv2d_rows_f32, and the default pick (conv2d_pw_f32
		// for the pointwise ones).
		var got [3][]float32
		for k, mode := range []struct{ direct, rows bool }{{true, false}, {false, true}, {false, false}} {
			q.conv2dDirect, q.conv2dRows = mode.direct, mode.rows
			y := d.Alloc(gpu.F32, Hout, sh.Cout*cp.Wout)
			got[k] = make([]float32, Hout*sh.Cout*cp.Wout)
			q.Conv2D(y, x, w, b, cp)
			q.RoundBF16(y)
			if err := q.Read(got[k], y); err != nil {
				t.Fatal(err)
			}
			d.Free(y)
		}
		if i := sameBits(got[0], got[1]); i >= 0 {
			t.Errorf("%s: output %d: conv2d_rows_f32 %v, conv2d_f32 %v", sh.name, i, got[1][i], got[0][i])
		}
		if i := sameBits(got[0], got[2]); i >= 0 {
			t.Errorf("%s: output %d: the default pick %v, conv2d_f32 %v", sh.name, i, got[2][i], got[0][i])
		}
		d.Free(x)
		d.Free(w)
		d.Free(b)
	}
}

// TestNormGLUEqualsSeq holds the fused SwiGLU kernel (gpu.NormGLU: the
// norm, the gate's and up products as one dual tile, their roundings) to
// the op sequence it stands for on a queue that fuses nothing, bit for
// bit: h and the output, on the weights' tiled copies and their rows, with
// and without rounding, at the backbone's FFN size and ragged ones, and
// counts that the fused kernel ran (and that unaligned rows did not take it).
func TestNormGLUEqualsSeq(t *testing.T) {
	d := openGPU(t)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul = false }()
	rng := rand.New(rand.NewPCG(41, 42))
	shapes := []struct{ F, K int }{{8192, 2048}, {2816, 1024}, {33, 264}, {300, 1030}}
	if d.Emulated() {
		shapes = []struct{ F, K int }{{96, 1024}, {33, 264}, {17, 1030}}
	}
	for _, sh := range shapes {
		w1, w3 := loadNormalBF16(t, d, rng, sh.F, sh.K), loadNormalBF16(t, d, rng, sh.F, sh.K)
		nw := loadNormalBF16(t, d, rng, 1, sh.K)
		xs := normals(rng, sh.K)
		for _, c := range []struct {
			round, untiled bool
		}{{true, false}, {false, false}, {true, true}} {
			name := fmt.Sprintf("F=%d/K=%d/round=%v/untiled=%v", sh.F, sh.K, c.round, c.untiled)
			var got [2][2][]float32
			for k, unfused := range []bool{false, true} {
				q := d.NewQueue("glu").(*Queue)
				q.unfused, q.untiled = unfused, c.untiled
				x, hh := d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.K)
				dst, a := d.Alloc(gpu.F32, 1, sh.F), d.Alloc(gpu.F32, 1, sh.F)
				q.Write(x, xs)
				stop := d.countLaunches()
				gpu.NormGLU(q, dst, a, hh, x, gpu.RowNorm{Eps: 1e-5, Round: true, W: nw, RoundW: true}, w1, w3, c.round)
				q.flush()
				n := stop()
				// Rows of 1030 bf16 values are not 16-byte aligned: the sequence.
				if fused := n["mmvng_bf16_w16"] + n["mmvngt_bf16_w16"]; fused != b01(!unfused && sh.K%8 == 0) {
					t.Errorf("%s unfused=%v: %d fused launches (%v)", name, unfused, fused, n)
				}
				for j, o := range []gpu.Tensor{hh, dst} {
					got[k][j] = make([]float32, o.Len())
					if err := q.Read(got[k][j], o); err != nil {
						t.Fatal(err)
					}
				}
				for _, b := range []gpu.Tensor{x, hh, dst, a} {
					d.Free(b)
				}
			}
			for j, what := range []string{"h", "output"} {
				if i := sameBits(got[0][j], got[1][j]); i >= 0 {
					t.Errorf("%s: %s %d: fused %v, sequence %v", name, what, i, got[0][j][i], got[1][j][i])
				}
			}
		}
		for _, w := range []gpu.Tensor{w1, w3, nw} {
			d.Free(w)
		}
	}
}

// TestKernelResources: the driver reports what the compiler gave a
// kernel (mma_bf16_big's three stages of 64 weight and 64 x rows of 128
// bytes are 48 KiB of static shared memory), and an unknown name is an
// error. The host emulator has no cuFuncGetAttribute: there the call must
// say so rather than report zeros.
func TestKernelResources(t *testing.T) {
	d := openGPU(t)
	if _, err := d.KernelResources("no_such_kernel"); err == nil {
		t.Error("KernelResources(no_such_kernel): no error")
	}
	r, err := d.KernelResources("mma_bf16_big")
	if d.drv.emulated {
		if err == nil || !strings.Contains(err.Error(), "cuFuncGetAttribute") {
			t.Errorf("emulated: KernelResources = %+v, %v; want the missing entry point named", r, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Registers <= 0 || r.Registers > 255 || r.SharedBytes != 3*2*64*128 {
		t.Errorf("mma_bf16_big: %+v", r)
	}
	t.Logf("mma_bf16_big: %+v", r)
}

// TestSplitBF16Paths: split_bf16's four-float path (K a multiple of 4, a
// 16-byte-aligned row) and its scalar path give every row's three bf16
// parts and its flags as the host's split does: a stride that alternates
// the two paths row by row, K not a multiple of 4, rows that start off
// alignment, exact-bf16 rows (flags 0), rows with only a mid part, padding
// past K zero.
func TestSplitBF16Paths(t *testing.T) {
	d := openGPU(t)
	q := d.NewQueue("split").(*Queue)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct{ M, K, ld, off int }{
		{5, 2048, 2048, 0}, {7, 1000, 1001, 0}, {3, 7, 7, 0}, {4, 256, 256, 1}, {9, 64, 66, 2}, {2, 4100, 4100, 0},
	} {
		Kp := (c.K + 63) &^ 63
		host := make([]float32, c.off+c.M*c.ld)
		for i := range host {
			host[i] = float32(rng.NormFloat64())
		}
		for m := range c.M {
			row := host[c.off+m*c.ld : c.off+m*c.ld+c.K]
			switch m % 3 {
			case 1: // exact bf16: no mid, no lo
				for k := range row {
					row[k] = gpu.RoundBF16(row[k])
				}
			case 2: // hi + mid exactly: no lo
				for k := range row {
					h := gpu.RoundBF16(row[k])
					row[k] = h + gpu.RoundBF16(row[k]-h)
				}
			}
		}
		x := d.Alloc(gpu.F32, 1, len(host))
		q.Write(x, host)
		xv := gpu.Tensor{Buf: x.Buf, Off: c.off, Rows: c.M, Cols: c.K, Stride: c.ld}
		parts := d.Alloc(gpu.I32, 1, 3*c.M*Kp/2) // u16 pairs
		flags := d.Alloc(gpu.I32, 1, c.M)
		q.launch("split_bf16", [3]uint32{uint32(c.M), 1, 1}, blk128, 0, q.t(parts), q.t(flags), q.t(xv), ld(xv), i(c.M), i(c.K), i(Kp))
		words := make([]int32, parts.Len())
		fl := make([]int32, c.M)
		if err := q.ReadInt(words, parts); err != nil {
			t.Fatal(err)
		}
		if err := q.ReadInt(fl, flags); err != nil {
			t.Fatal(err)
		}
		u16 := func(j int) uint16 { return uint16(uint32(words[j/2]) >> (16 * (j % 2))) }
		bad := 0
		for m := range c.M {
			var want uint32
			for k := range Kp {
				v := float32(0)
				if k < c.K {
					v = host[c.off+m*c.ld+k]
				}
				h := gpu.RoundBF16(v)
				md := gpu.RoundBF16(v - h)
				lo := gpu.RoundBF16(v - h - md)
				if md != 0 {
					want |= 1
				}
				if lo != 0 {
					want |= 2
				}
				for pi, pv := range []float32{h, md, lo} {
					got := u16((pi*c.M+m)*Kp + k)
					if got != uint16(math.Float32bits(pv)>>16) && bad < 5 {
						bad++
						t.Errorf("M %d K %d ld %d off %d: row %d k %d part %d: %#04x, want %#04x (x %g)", c.M, c.K, c.ld, c.off, m, k, pi, got, math.Float32bits(pv)>>16, v)
					}
				}
			}
			if uint32(fl[m]) != want {
				t.Errorf("M %d K %d ld %d off %d: row %d flags %d, want %d", c.M, c.K, c.ld, c.off, m, fl[m], want)
			}
		}
		for _, b := range []gpu.Tensor{x, parts, flags} {
			d.Free(b)
		}
	}
}

// TestPromptProducts runs the contract's check of the prompt products
// (gpu.MatMulPrompt: cuBLAS past promptMinRows) on a tensor-core device and
// logs every case with its error and bound.
func TestPromptProducts(t *testing.T) {
	d := openTestDevice(t, Options{MatMul: "mma"})
	t.Logf("prompt products on %q", d.PromptGEMM())
	rep := gputest.RunWith(d, 20261201, gputest.Options{TensorCoreMatMul: true, Ops: []string{"matmulprompt"}})
	for _, c := range rep.Checks {
		if !c.Pass {
			t.Errorf("%s: err %g > bound %g %s", c.Case, c.Err, c.Bound, c.Detail)
		} else {
			t.Logf("%s: err %.3g, bound %.3g", c.Case, c.Err, c.Bound)
		}
	}
	if len(rep.Checks) == 0 {
		t.Error("no checks ran")
	}
}

// TestLogMelOnDevice runs the contract's check of the log-mel front end
// (gpu.LogMeler against package audio's host Compute) and its planted
// fault, logging every case.
func TestLogMelOnDevice(t *testing.T) {
	d := openGPU(t)
	rep := gputest.RunWith(d, 20261201, gputest.Options{Ops: []string{"logmel"}})
	for _, c := range rep.Checks {
		if !c.Pass {
			t.Errorf("%s: %s", c.Case, c.Detail)
		} else {
			t.Logf("%s: %s", c.Case, c.Detail)
		}
	}
	if len(rep.Checks) == 0 {
		t.Error("no checks ran")
	}
	if msg := runControl("LOGMEL"); msg != "" {
		t.Error(msg)
	}
}

// TestNormGridEqualsTilePerBlock: the fused-norm products give the same
// bits (h and the output) whether a block takes one 16-row tile or, on a
// grid of only the blocks the GPU holds at once, several in turn with the
// row normalised once (MMV_NORM_TILES) — on shapes of more tiles than
// that grid, the backbone's where the GPU's is large.
func TestNormGridEqualsTilePerBlock(t *testing.T) {
	d := openGPU(t)
	d.mmaMatMul = true
	defer func() { d.mmaMatMul, d.tilePerBlock = false, false }()
	t.Logf("blocks held at once: %v", d.resident)
	for k := range normGridKernels() {
		if r, err := d.KernelResources(k); err == nil { // a diagnostic (the emulator has no such query)
			t.Logf("%s: %d registers, %d bytes of local memory a thread", k, r.Registers, r.LocalBytes)
		}
	}
	rng := rand.New(rand.NewPCG(43, 44))
	shapes := []struct{ N, K int }{{8192, 2048}, {6144, 2048}, {4220, 264}, {2816, 1024}}
	if d.Emulated() {
		shapes = []struct{ N, K int }{{4220, 264}, {2200, 72}}
	}
	for _, sh := range shapes {
		w1, w3 := loadNormalBF16(t, d, rng, sh.N, sh.K), loadNormalBF16(t, d, rng, sh.N, sh.K)
		nw := loadNormalBF16(t, d, rng, 1, sh.K)
		xs := normals(rng, sh.K)
		if tiles, n := (sh.N+15)/16, d.resident["mmvngt_bf16_w16"]; n >= tiles {
			t.Logf("N=%d: %d tiles, all held at once (%d): one grid either way", sh.N, tiles, n)
		}
		var got [2][3][]float32
		for k, perTile := range []bool{false, true} {
			d.tilePerBlock = perTile
			q := d.NewQueue("normgrid").(*Queue)
			x, hh, h2 := d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.K), d.Alloc(gpu.F32, 1, sh.K)
			dst, a, y := d.Alloc(gpu.F32, 1, sh.N), d.Alloc(gpu.F32, 1, sh.N), d.Alloc(gpu.F32, 1, sh.N)
			q.Write(x, xs)
			n := gpu.RowNorm{Eps: 1e-5, Round: true, W: nw, RoundW: true}
			stop := d.countLaunches()
			gpu.NormGLU(q, dst, a, hh, x, n, w1, w3, true)
			gpu.NormMatMul(q, y, h2, x, n, w1, gpu.Tensor{})
			q.flush()
			if c := stop(); c["mmvng_bf16_w16"]+c["mmvngt_bf16_w16"] != 1 || c["mmvn_bf16_w16"]+c["mmvnt_bf16_w16"] != 1 {
				t.Fatalf("N=%d K=%d: launches %v, want one fused GLU and one fused norm product", sh.N, sh.K, c)
			}
			for j, o := range []gpu.Tensor{hh, dst, y} {
				got[k][j] = make([]float32, o.Len())
				if err := q.Read(got[k][j], o); err != nil {
					t.Fatal(err)
				}
			}
			for _, b := range []gpu.Tensor{x, hh, h2, dst, a, y} {
				d.Free(b)
			}
		}
		for j, what := range []string{"h", "GLU output", "norm product"} {
			if i := sameBits(got[0][j], got[1][j]); i >= 0 {
				t.Errorf("N=%d K=%d: %s %d: %v on the held grid, %v a block a tile", sh.N, sh.K, what, i, got[0][j][i], got[1][j][i])
			}
		}
		for _, w := range []gpu.Tensor{w1, w3, nw} {
			d.Free(w)
		}
	}
}
