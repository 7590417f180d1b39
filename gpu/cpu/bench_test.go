package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Benchmarks: the machine's memory bandwidth (BenchmarkMemcpy,
// BenchmarkMemRead), the GEMV of a decode step in GB/s of weight bytes
// (BenchmarkGEMV), GEMM in GFLOP/s (BenchmarkGEMM), one LFM2 decode step's
// matmuls against the weight-bytes / bandwidth floor (BenchmarkDecodeStep),
// and convolutions, attention and elementwise ops at real sizes.
//
// Besides Go's mean per iteration, every benchmark reports its best
// iteration ("-best" metrics): on a shared machine the mean absorbs other
// processes' load, the best iteration much less.
//
// Weights that a decode step streams from DRAM are benchmarked from DRAM:
// BenchmarkGEMV rotates through copies of the weight filling streamBytes.

const streamBytes = 1 << 30

// benchWorkers is the pool size of the benchmarks: every core.
var benchWorkers = runtime.NumCPU()

// timed runs fn once per benchmark iteration and returns the fastest.
func timed(b *testing.B, fn func()) time.Duration {
	best := time.Duration(1 << 62)
	for b.Loop() {
		t0 := time.Now()
		fn()
		best = min(best, time.Since(t0))
	}
	return best
}

func reportRate(b *testing.B, best time.Duration, amount float64, unit string) {
	b.ReportMetric(amount*float64(b.N)/b.Elapsed().Seconds(), unit)
	b.ReportMetric(amount/best.Seconds(), unit+"-best")
}

func parallel(n int, fn func(c int)) {
	var wg sync.WaitGroup
	for c := 1; c < n; c++ {
		wg.Add(1)
		go func() { defer wg.Done(); fn(c) }()
	}
	fn(0)
	wg.Wait()
}

// BenchmarkMemcpy measures copy bandwidth (bytes copied per second; each is
// read once and written once) over 256 MB, on one core and on all.
func BenchmarkMemcpy(b *testing.B) {
	const n = 256 << 20
	src := make([]byte, n)
	dst := make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	for _, par := range []int{1, benchWorkers} {
		b.Run(fmt.Sprintf("cores=%d", par), func(b *testing.B) {
			best := timed(b, func() {
				parallel(par, func(c int) {
					lo, hi := n*c/par, n*(c+1)/par
					copy(dst[lo:hi], src[lo:hi])
				})
			})
			reportRate(b, best, n/1e9, "GB/s")
		})
	}
}

// BenchmarkMemRead measures read-only streaming bandwidth (what a GEMV
// needs) over 512 MB: an AVX2 loop with four independent sums where the CPU
// has it, else a Go loop.
func BenchmarkMemRead(b *testing.B) {
	const n = 512 << 20
	s := make([]float32, n/4)
	for i := range s {
		s[i] = float32(i & 1023)
	}
	for _, par := range []int{1, benchWorkers} {
		b.Run(fmt.Sprintf("cores=%d", par), func(b *testing.B) {
			sums := make([]float32, par)
			best := timed(b, func() {
				parallel(par, func(c int) {
					lo, hi := len(s)*c/par/32*32, len(s)*(c+1)/par/32*32
					sums[c] = streamRead(s[lo:hi])
				})
			})
			reportRate(b, best, n/1e9, "GB/s")
		})
	}
}

// BenchmarkFMAPeak measures the FMA throughput of one core and of all: 12
// independent 8-lane FMAs per iteration on registers, in GFLOP/s (2 flops
// per lane): the ceiling the GEMM is compared against.
func BenchmarkFMAPeak(b *testing.B) {
	if !haveAsm {
		b.Skip("no AVX2+FMA")
	}
	const iters = 1 << 22
	for _, par := range []int{1, benchWorkers} {
		b.Run(fmt.Sprintf("cores=%d", par), func(b *testing.B) {
			best := timed(b, func() { parallel(par, func(int) { vfmapeak(8 * iters) }) })
			reportRate(b, best, float64(par)*iters*12*8*2/1e9, "GFLOP/s")
		})
	}
}

// streamRead reads a (a multiple of 32 floats) and returns some sum of it.
func streamRead(a []float32) float32 {
	if haveAsm {
		return vstream(p32(a), len(a))
	}
	var s0, s1, s2, s3 float32
	for i := 0; i+4 <= len(a); i += 4 {
		s0 += a[i]
		s1 += a[i+1]
		s2 += a[i+2]
		s3 += a[i+3]
	}
	return s0 + s1 + s2 + s3
}

// fillBench fills a tensor with pseudo-random values of magnitude about
// 0.02 (a random 64K-element block repeated at shifting offsets: fast for
// gigabytes, and the values do not matter for speed).
func fillBench(t gpu.Tensor) {
	rng := rand.New(rand.NewPCG(1, 2))
	var block [1 << 16]float32
	for i := range block {
		block[i] = float32(rng.NormFloat64() * 0.02)
	}
	b := buf(t)
	for i := range b.u16 {
		b.u16[i] = gpu.F32ToBF16(block[(i*7+i>>16)&(len(block)-1)])
	}
	for i := range b.f32 {
		b.f32[i] = block[(i*7+i>>16)&(len(block)-1)]
	}
}

func benchTensor(d *Device, dt gpu.DType, rows, cols int) gpu.Tensor {
	t := d.Alloc(dt, rows, cols)
	fillBench(t)
	return t
}

func benchKernels(b *testing.B) []kernelSet {
	if testing.Short() {
		return kernelSets(b)[:1]
	}
	return kernelSets(b)
}

// decodeShapes are LFM2-1.2B's decode matmuls [out, in]: q and out
// projections, the conv layers' in_proj (6144), w1 / w3, w2 and the tied
// 65536-row text head.
var decodeShapes = []struct {
	name string
	n, k int
}{
	{"2048x2048", 2048, 2048},
	{"6144x2048", 6144, 2048},
	{"8192x2048", 8192, 2048},
	{"2048x8192", 2048, 8192},
	{"65536x2048", 65536, 2048},
}

// BenchmarkGEMV: one row times a bf16 weight, from DRAM, in GB/s of weight
// bytes.
func BenchmarkGEMV(b *testing.B) {
	for _, ks := range benchKernels(b) {
		for _, sh := range decodeShapes {
			b.Run(fmt.Sprintf("%s/bf16/%s", ks.name, sh.name), func(b *testing.B) {
				d := newDevice(benchWorkers, ks.asm)
				defer d.Close()
				q := d.NewQueue("bench")
				bytes := sh.n * sh.k * 2
				ws := make([]gpu.Tensor, max(1, streamBytes/bytes))
				for i := range ws {
					ws[i] = benchTensor(d, gpu.BF16, sh.n, sh.k)
				}
				x := benchTensor(d, gpu.F32, 1, sh.k)
				dst := d.Alloc(gpu.F32, 1, sh.n)
				i := 0
				best := timed(b, func() {
					q.MatMul(dst, x, ws[i%len(ws)], gpu.Tensor{})
					i++
				})
				reportRate(b, best, float64(bytes)/1e9, "GB/s")
			})
		}
	}
}

// depthShapes are the depthformer's products [out, in] (dim 1024, 8 KV
// heads of 32, SwiGLU 2816, 2049-entry codebook tables), its input
// projection from the 2048-wide backbone, and the backbone's longest rows
// (LFM2-1.2B's w2).
var depthShapes = []struct {
	name string
	n, k int
}{
	{"qkv/1536x1024", 1536, 1024},
	{"out/1024x1024", 1024, 1024},
	{"w1/2816x1024", 2816, 1024},
	{"w2/1024x2816", 1024, 2816},
	{"logits/2049x1024", 2049, 1024},
	{"linear/8192x2048", 8192, 2048},
	{"lfm2-w2/2048x8192", 2048, 8192},
}

// BenchmarkBatchGEMV: M rows (the sessions of a batched decode step) times
// a bf16 weight at the depthformer's shapes, from DRAM, in µs per product
// and GB/s of weight bytes. A batch streams the weight once, so while the
// product is bandwidth-bound µs/op should barely grow with M; x-rows1 is
// the product's time over the same shape's one-row time.
func BenchmarkBatchGEMV(b *testing.B) {
	for _, ks := range benchKernels(b) {
		for _, sh := range depthShapes {
			one := 0.0
			for _, m := range []int{1, 2, 3, 4, 5, 6, 8, 16, 32, 64} {
				b.Run(fmt.Sprintf("%s/%s/M=%d", ks.name, sh.name, m), func(b *testing.B) {
					d := newDevice(benchWorkers, ks.asm)
					defer d.Close()
					q := d.NewQueue("bench")
					bytes := sh.n * sh.k * 2
					ws := make([]gpu.Tensor, max(1, streamBytes/4/bytes))
					for i := range ws {
						ws[i] = benchTensor(d, gpu.BF16, sh.n, sh.k)
					}
					x := benchTensor(d, gpu.F32, m, sh.k)
					dst := d.Alloc(gpu.F32, m, sh.n)
					i := 0
					best := timed(b, func() {
						q.MatMul(dst, x, ws[i%len(ws)], gpu.Tensor{})
						i++
					})
					reportRate(b, best, float64(bytes)/1e9, "GB/s")
					us := b.Elapsed().Seconds() * 1e6 / float64(b.N)
					b.ReportMetric(us, "us/op")
					b.ReportMetric(best.Seconds()*1e6, "us/op-best")
					if m == 1 {
						one = us
					} else if one > 0 {
						b.ReportMetric(us/one, "x-rows1")
					}
				})
			}
		}
	}
}

// BenchmarkGEMM: prefill (93 rows: the reference's prompt), encoder and
// batch shapes, in GFLOP/s (2·M·N·K per product).
func BenchmarkGEMM(b *testing.B) {
	shapes := []struct {
		m, n, k int
		dt      gpu.DType
	}{
		{93, 8192, 2048, gpu.BF16},
		{93, 2048, 8192, gpu.BF16},
		{93, 2048, 2048, gpu.BF16},
		{512, 512, 2048, gpu.BF16},
		{256, 2048, 2048, gpu.BF16},
		{256, 2048, 2048, gpu.F32},
		{8, 2048, 2048, gpu.BF16},
	}
	for _, ks := range benchKernels(b) {
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("%s/%v/%dx%dx%d", ks.name, sh.dt, sh.m, sh.n, sh.k), func(b *testing.B) {
				d := newDevice(benchWorkers, ks.asm)
				defer d.Close()
				q := d.NewQueue("bench")
				w := benchTensor(d, sh.dt, sh.n, sh.k)
				x := benchTensor(d, gpu.F32, sh.m, sh.k)
				dst := d.Alloc(gpu.F32, sh.m, sh.n)
				best := timed(b, func() { q.MatMul(dst, x, w, gpu.Tensor{}) })
				reportRate(b, best, 2*float64(sh.m)*float64(sh.n)*float64(sh.k)/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkDecodeStep times the matmuls of one LFM2-1.2B decode step at real
// size with random bf16 weights (2.34 GB): 16 layers (6 attention: q
// 2048², k and v 512×2048, out 2048²; 10 conv: in_proj 6144×2048, out_proj
// 2048²; every layer w1, w3 8192×2048 and w2 2048×8192) plus the 65536×2048
// text head. It reports GB/s of weights: the floor of a step is its bytes
// over BenchmarkMemRead's bandwidth.
func BenchmarkDecodeStep(b *testing.B) {
	attn := map[int]bool{2: true, 5: true, 8: true, 10: true, 12: true, 14: true}
	for _, ks := range benchKernels(b) {
		b.Run(ks.name, func(b *testing.B) {
			d := newDevice(benchWorkers, ks.asm)
			defer d.Close()
			q := d.NewQueue("bench")
			var ws []gpu.Tensor
			var bytes float64
			add := func(n, k int) {
				ws = append(ws, benchTensor(d, gpu.BF16, n, k))
				bytes += float64(n * k * 2)
			}
			for l := 0; l < 16; l++ {
				if attn[l] {
					add(2048, 2048)
					add(512, 2048)
					add(512, 2048)
					add(2048, 2048)
				} else {
					add(6144, 2048)
					add(2048, 2048)
				}
				add(8192, 2048)
				add(8192, 2048)
				add(2048, 8192)
			}
			add(65536, 2048)
			x := benchTensor(d, gpu.F32, 1, 8192)
			dst := d.Alloc(gpu.F32, 1, 65536)
			best := timed(b, func() {
				for _, w := range ws {
					q.MatMul(dst.ColSlice(0, w.Rows), x.ColSlice(0, w.Cols), w, gpu.Tensor{})
				}
			})
			reportRate(b, best, bytes/1e9, "GB/s")
			b.ReportMetric(best.Seconds()*1e3, "ms/step-best")
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
		})
	}
}

// BenchmarkConv: Mimi's SEANet decoder and the conformer's subsampling at
// real size (f32 weights, as Mimi runs), in GFLOP/s.
func BenchmarkConv(b *testing.B) {
	type conv struct {
		name           string
		rows, cin, out int
		k, stride      int
		transposed     bool
	}
	convs := []conv{
		{"conv1d/512to512k7/T200", 200, 512, 512, 7, 1, false},
		{"conv1d/256to128k3/T1200", 1200, 256, 128, 3, 1, false},
		{"conv1d/32to64k1/T24000", 24000, 32, 64, 1, 1, false},
		{"conv1d/64to1k7/T24000", 24000, 64, 1, 7, 1, false},
		{"conv1d/512to512k7/T2(stream)", 2, 512, 512, 7, 1, false},
		{"convT/512to256k12s6/Tin200", 200, 512, 256, 12, 6, true},
		{"convT/128to64k8s4/Tin6000", 6000, 128, 64, 8, 4, true},
		{"convT/1024to512k16s8/Tin2(stream)", 2, 1024, 512, 16, 8, true},
	}
	for _, ks := range benchKernels(b) {
		for _, c := range convs {
			b.Run(ks.name+"/"+c.name, func(b *testing.B) {
				d := newDevice(benchWorkers, ks.asm)
				defer d.Close()
				q := d.NewQueue("bench")
				p := gpu.ConvParams{K: c.k, Stride: c.stride, Dilation: 1, Groups: 1}
				var run func()
				if c.transposed {
					x := benchTensor(d, gpu.F32, c.rows, c.cin)
					w := benchTensor(d, gpu.F32, c.cin, c.out*c.k)
					dst := d.Alloc(gpu.F32, (c.rows-1)*c.stride+c.k, c.out)
					run = func() { q.ConvTranspose1D(dst, x, w, gpu.Tensor{}, p) }
				} else {
					x := benchTensor(d, gpu.F32, c.rows+c.k-1, c.cin)
					w := benchTensor(d, gpu.F32, c.out, c.cin*c.k)
					dst := d.Alloc(gpu.F32, c.rows, c.out)
					run = func() { q.Conv1D(dst, x, w, gpu.Tensor{}, p) }
				}
				best := timed(b, run)
				reportRate(b, best, 2*float64(c.rows*c.cin*c.out*c.k)/1e9, "GFLOP/s")
			})
		}
		// The conformer's subsampling on 4 s of audio (401 mel frames).
		conv2 := []struct {
			name                string
			h, cin, w, cout, k  int
			stride, pad, groups int
		}{
			{"conv2d/1to256k3s2", 401, 1, 128, 256, 3, 2, 1, 1},
			{"conv2d/dw256k3s2", 201, 256, 64, 256, 3, 2, 1, 256},
			{"conv2d/pw256", 101, 256, 32, 256, 1, 1, 0, 1},
		}
		for _, c := range conv2 {
			b.Run(ks.name+"/"+c.name, func(b *testing.B) {
				d := newDevice(benchWorkers, ks.asm)
				defer d.Close()
				q := d.NewQueue("bench")
				p := gpu.Conv2DParams{Cin: c.cin, W: c.w, KH: c.k, KW: c.k, StrideH: c.stride, StrideW: c.stride,
					PadH: c.pad, PadW: c.pad, Groups: c.groups}
				p.Wout = (c.w+2*c.pad-c.k)/c.stride + 1
				hout := (c.h+2*c.pad-c.k)/c.stride + 1
				x := benchTensor(d, gpu.F32, c.h, c.cin*c.w)
				w := benchTensor(d, gpu.F32, c.cout, c.cin/c.groups*c.k*c.k)
				dst := d.Alloc(gpu.F32, hout, c.cout*p.Wout)
				best := timed(b, func() { q.Conv2D(dst, x, w, gpu.Tensor{}, p) })
				reportRate(b, best, 2*float64(hout*p.Wout*c.cout*c.cin/c.groups*c.k*c.k)/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkElementwise: activations, norms and adds on a prefill block
// ([93, 2048]) and on codec activations ([24000, 64]), in ns per element.
func BenchmarkElementwise(b *testing.B) {
	for _, ks := range benchKernels(b) {
		for _, sh := range [][2]int{{93, 2048}, {24000, 64}} {
			d := newDevice(benchWorkers, ks.asm)
			q := d.NewQueue("bench")
			a := benchTensor(d, gpu.F32, sh[0], sh[1])
			c := benchTensor(d, gpu.F32, sh[0], sh[1])
			v := benchTensor(d, gpu.F32, 1, sh[1])
			ops := []struct {
				name string
				fn   func()
			}{
				{"add", func() { q.Add(c, a, a) }},
				{"mulrow", func() { q.MulRow(c, a, v) }},
				{"roundbf16", func() { q.RoundBF16(c) }},
				{"silu", func() { q.Act(c, a, gpu.SiLU) }},
				{"elu", func() { q.Act(c, a, gpu.ELU) }},
				{"gelu", func() { q.Act(c, a, gpu.GELU) }},
				{"rmsnorm", func() { q.RMSNorm(c, a, 1e-5) }},
				{"layernorm", func() { q.LayerNorm(c, a, v, v, 1e-5) }},
				{"softmax", func() { q.Copy(c, a); q.Softmax(c) }},
			}
			for _, op := range ops {
				b.Run(fmt.Sprintf("%s/%dx%d/%s", ks.name, sh[0], sh[1], op.name), func(b *testing.B) {
					best := timed(b, op.fn)
					b.ReportMetric(float64(best.Nanoseconds())/float64(sh[0]*sh[1]), "ns/elem-best")
				})
			}
			d.Close()
		}
	}
}
