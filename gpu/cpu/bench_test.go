package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Benchmarks report the machine's memory bandwidth (BenchmarkMemcpy,
// BenchmarkMemRead), the GEMV of a decode step in GB/s of weight bytes
// (BenchmarkGEMV), the GEMM of prefill and encoders in GFLOP/s
// (BenchmarkGEMM) and one LFM2 decode step's matmuls against the
// weight-bytes / bandwidth floor (BenchmarkDecodeStep).
//
// Working sets are far larger than the caches (the weights of a decode step
// stream from DRAM), so GEMV benchmarks rotate through enough copies of the
// weights to fill benchBytes.

const benchBytes = 1 << 30

// benchWorkers is the pool size of the benchmarks: every core.
var benchWorkers = runtime.NumCPU()

// BenchmarkMemcpy measures copy bandwidth (bytes copied per second; each is
// read once and written once) over a 512 MB buffer, on 1 core and on all.
func BenchmarkMemcpy(b *testing.B) {
	const n = 256 << 20
	src := make([]byte, n)
	dst := make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	for _, par := range []int{1, benchWorkers} {
		b.Run(fmt.Sprintf("cores=%d", par), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				parallel(par, func(c int) {
					lo, hi := n*c/par, n*(c+1)/par
					copy(dst[lo:hi], src[lo:hi])
				})
			}
		})
	}
}

// BenchmarkMemRead measures read-only streaming bandwidth (what a GEMV
// needs) with the assembly dot kernel over F32 "weights" against a tiny x:
// 8 bytes loaded per FMA lane pair, far below the FMA throughput.
func BenchmarkMemRead(b *testing.B) {
	for _, par := range []int{1, benchWorkers} {
		b.Run(fmt.Sprintf("cores=%d", par), func(b *testing.B) {
			const n = 512 << 20
			s := make([]uint64, n/8)
			for i := range s {
				s[i] = uint64(i)
			}
			sums := make([]uint64, par)
			b.SetBytes(n)
			for b.Loop() {
				parallel(par, func(c int) {
					lo, hi := len(s)*c/par, len(s)*(c+1)/par
					var a0, a1, a2, a3 uint64
					p := s[lo:hi]
					for i := 0; i+4 <= len(p); i += 4 {
						a0 += p[i]
						a1 += p[i+1]
						a2 += p[i+2]
						a3 += p[i+3]
					}
					sums[c] = a0 + a1 + a2 + a3
				})
			}
		})
	}
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

// benchWeights returns copies of a random [n, k] weight of dt, enough to
// span benchBytes when stream is set (so each use comes from DRAM).
func benchWeights(d *Device, dt gpu.DType, n, k int, stream bool) []gpu.Tensor {
	rng := rand.New(rand.NewPCG(1, 2))
	one := n * k * dt.Size()
	copies := 1
	if stream {
		copies = max(1, benchBytes/one)
	}
	ws := make([]gpu.Tensor, copies)
	for i := range ws {
		ws[i] = d.Alloc(dt, n, k)
		b := buf(ws[i])
		for j := range b.u16 {
			b.u16[j] = gpu.F32ToBF16(float32(rng.NormFloat64() * 0.02))
		}
		for j := range b.f32 {
			b.f32[j] = float32(rng.NormFloat64() * 0.02)
		}
	}
	return ws
}

func benchKernels(b *testing.B) []kernelSet {
	if testing.Short() {
		return kernelSets(b)[:1]
	}
	return kernelSets(b)
}

// decodeShapes are LFM2-1.2B's decode matmuls [out, in]: fused qkv (or the
// conv layers' in_proj), q / out projections, k / v, w1 / w3, w2 and the
// tied 65536-row text head.
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

// BenchmarkGEMV: one row times a bf16 weight, reported as weight bytes per
// second (b.SetBytes), from DRAM.
func BenchmarkGEMV(b *testing.B) {
	for _, ks := range benchKernels(b) {
		d := newDevice(benchWorkers, ks.asm)
		q := d.NewQueue("bench")
		for _, sh := range decodeShapes {
			b.Run(fmt.Sprintf("%s/bf16/%s", ks.name, sh.name), func(b *testing.B) {
				ws := benchWeights(d, gpu.BF16, sh.n, sh.k, true)
				x := d.Alloc(gpu.F32, 1, sh.k)
				q.Fill(x, 0.5)
				dst := d.Alloc(gpu.F32, 1, sh.n)
				b.SetBytes(int64(sh.n * sh.k * 2))
				i := 0
				for b.Loop() {
					q.MatMul(dst, x, ws[i%len(ws)], gpu.Tensor{})
					i++
				}
				for _, w := range ws {
					d.Free(w)
				}
			})
		}
		d.Close()
	}
}

// BenchmarkGEMM: prefill (93 rows: the reference's prompt), encoder and
// batch shapes, reported as GFLOP/s (2·M·N·K per op).
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
		{4, 8192, 2048, gpu.BF16},
	}
	for _, ks := range benchKernels(b) {
		d := newDevice(benchWorkers, ks.asm)
		q := d.NewQueue("bench")
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("%s/%v/%dx%dx%d", ks.name, sh.dt, sh.m, sh.n, sh.k), func(b *testing.B) {
				w := benchWeights(d, sh.dt, sh.n, sh.k, false)[0]
				x := d.Alloc(gpu.F32, sh.m, sh.k)
				q.Fill(x, 0.25)
				dst := d.Alloc(gpu.F32, sh.m, sh.n)
				for b.Loop() {
					q.MatMul(dst, x, w, gpu.Tensor{})
				}
				flop := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k)
				b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		d.Close()
	}
}

// BenchmarkDecodeStep times the matmuls of one LFM2-1.2B decode step at real
// size with random bf16 weights: 16 layers (6 attention: q 2048², k and v
// 512×2048, out 2048²; 10 conv: in_proj 6144×2048, out_proj 2048²; every
// layer w1, w3 8192×2048 and w2 2048×8192) plus the 65536×2048 text head.
// b.SetBytes is the weight bytes, so MB/s compares directly with
// BenchmarkMemRead: the floor of a step is bytes / read bandwidth.
func BenchmarkDecodeStep(b *testing.B) {
	attn := map[int]bool{2: true, 5: true, 8: true, 10: true, 12: true, 14: true}
	for _, ks := range benchKernels(b) {
		b.Run(ks.name, func(b *testing.B) {
			d := newDevice(benchWorkers, ks.asm)
			defer d.Close()
			q := d.NewQueue("bench")
			var ops []gpu.Tensor
			var bytes int64
			add := func(n, k int) {
				ops = append(ops, benchWeights(d, gpu.BF16, n, k, false)[0])
				bytes += int64(n * k * 2)
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
			x := d.Alloc(gpu.F32, 1, 8192)
			q.Fill(x, 0.5)
			dst := d.Alloc(gpu.F32, 1, 65536)
			b.SetBytes(bytes)
			for b.Loop() {
				for _, w := range ops {
					q.MatMul(dst.ColSlice(0, w.Rows), x.ColSlice(0, w.Cols), w, gpu.Tensor{})
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/step")
		})
	}
}
