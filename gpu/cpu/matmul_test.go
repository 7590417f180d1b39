package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// matmulBound returns the number of float32 roundings any term of an output
// passes through in the documented summation order (matmul.go): K8/8 lane
// steps (+1 for the Go kernels' rounded product), 3 reduction adds, at most
// two roundings per tail term (product, sum) and the bias add.
func matmulRoundings(K int) int {
	K8 := K &^ 7
	return K8/8 + 1 + 3 + 2*(K-K8) + 1
}

// checkMatMul replays dst = x·wᵀ + bias in float64 and checks every element
// against γ_n·(Σ_k |x_k·w_k| + |b|), the float32 rounding bound of the
// summation order with n = matmulRoundings(K). The float64 replay's own
// error (K·2⁻⁵³ relative) is below that by nine orders of magnitude.
func checkMatMul(dst, x, w, bias gpu.Tensor) errStats {
	var st errStats
	K := x.Cols
	g := gamma(matmulRoundings(K))
	for m := 0; m < x.Rows; m++ {
		for n := 0; n < w.Rows; n++ {
			var s, a float64
			for k := 0; k < K; k++ {
				p := at(x, m, k) * at(w, n, k)
				s += p
				a += math.Abs(p)
			}
			if !bias.IsNil() {
				b := at(bias, 0, n)
				s += b
				a += math.Abs(b)
			}
			st.add(float32(at(dst, m, n)), s, g*a, func() string {
				return fmt.Sprintf("[%d,%d] got %v want %v", m, n, at(dst, m, n), s)
			})
		}
	}
	return st
}

var weightTypes = []gpu.DType{gpu.BF16, gpu.F16, gpu.F32}

func TestMatMul(t *testing.T) {
	type tc struct{ M, N, K int }
	cases := []tc{
		{1, 1, 1}, {1, 3, 7}, {1, 7, 8}, {1, 9, 9}, {1, 17, 17}, {1, 33, 63}, {1, 65, 64},
		{1, 64, 65}, {1, 1000, 33}, {2, 5, 1000}, {3, 63, 65}, {4, 3, 8}, {5, 7, 17},
		{7, 13, 1031}, {8, 9, 16}, {9, 97, 100}, {17, 200, 64}, {33, 1, 520},
		{65, 12, 9}, {130, 101, 24}, {3, 1, 3},
	}
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			rng := rand.New(rand.NewPCG(1, uint64(workers)))
			for _, dt := range weightTypes {
				for i, c := range cases {
					strided := i%2 == 1
					pad, off := 0, 0
					if strided {
						pad, off = 5, 3
					}
					name := fmt.Sprintf("%s/w%d/%v/%dx%dx%d/strided=%v", ks.name, workers, dt, c.M, c.N, c.K, strided)
					t.Run(name, func(t *testing.T) {
						x := view(dev, gpu.F32, c.M, c.K, pad, off)
						w := view(dev, dt, c.N, c.K, pad, off+1)
						dst := view(dev, gpu.F32, c.M, c.N, pad, off)
						fillRandom(rng, x)
						fillRandom(rng, w)
						var bias gpu.Tensor
						if i%3 == 0 {
							bias = view(dev, dt, 1, c.N, 0, 1)
							fillRandom(rng, bias)
						}
						q.MatMul(dst, x, w, bias)
						checkPadding(t, dst)
						st := checkMatMul(dst, x, w, bias)
						if st.bad > 0 {
							t.Fatalf("%d of %d outputs outside the float32 bound; first %s", st.bad, st.n, st.first)
						}
						if c.K >= 512 {
							t.Logf("max |err| %.3g, max |err|/bound %.3g", st.maxErr, st.maxRatio)
						}
					})
				}
			}
		}
	}
}

// TestMatMulPlantedFault runs a perturbed product, computed by the same
// driver with K−1 (the last term of every output dropped: a wrong tail, or a
// short vector loop when K is a multiple of 8), and requires the check of
// TestMatMul to reject it: the bound is sharp enough to see one term.
func TestMatMulPlantedFault(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		rng := rand.New(rand.NewPCG(7, 7))
		for _, c := range []struct{ M, N, K int }{{1, 64, 1024}, {1, 40, 1027}, {13, 50, 600}, {70, 30, 1033}} {
			for _, dt := range weightTypes {
				x := view(dev, gpu.F32, c.M, c.K, 0, 0)
				w := view(dev, dt, c.N, c.K, 0, 0)
				dst := view(dev, gpu.F32, c.M, c.N, 0, 0)
				fillRandom(rng, x)
				fillRandom(rng, w)
				g := mm{x: f32s(x), xs: x.Stride, dst: f32s(dst), ds: dst.Stride, M: c.M, N: c.N, K: c.K - 1}
				g.setWeight(w)
				q.gemm(&g)
				st := checkMatMul(dst, x, w, gpu.Tensor{})
				t.Logf("%s %v %dx%dx%d: fault flagged in %d of %d outputs (max |err|/bound %.3g)",
					ks.name, dt, c.M, c.N, c.K, st.bad, st.n, st.maxRatio)
				if st.bad < st.n/2 {
					t.Errorf("%s %v %dx%dx%d: the check caught a dropped term in only %d of %d outputs",
						ks.name, dt, c.M, c.N, c.K, st.bad, st.n)
				}
			}
		}
	}
}

// TestMatMulRowsIndependent checks the MatMul contract: an output row is
// the same floats whether computed alone (the GEMV path), inside batches of
// any size and offset (the GEMM path, with K blocks, edge tiles, row or
// column splits), or on pools of different sizes.
func TestMatMulRowsIndependent(t *testing.T) {
	const M, N, K = 77, 203, 1031 // K: three K blocks and a tail
	for _, ks := range kernelSets(t) {
		for _, dt := range weightTypes {
			t.Run(ks.name+"/"+dt.String(), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(3, uint64(dt)))
				dev, q := newTestDevice(t, 2, ks.asm)
				x := view(dev, gpu.F32, M, K, 3, 1)
				w := view(dev, dt, N, K, 2, 0)
				bias := view(dev, gpu.F32, 1, N, 0, 0)
				fillRandom(rng, x)
				fillRandom(rng, w)
				fillRandom(rng, bias)
				full := view(dev, gpu.F32, M, N, 0, 0)
				q.MatMul(full, x, w, bias)

				check := func(what string, q *Queue, lo, hi int) {
					t.Helper()
					got := view(dev, gpu.F32, hi-lo, N, 1, 0)
					q.MatMul(got, x.Slice(lo, hi), w, bias)
					if r, c, ok := bitsEqual(got, full.Slice(lo, hi)); !ok {
						t.Fatalf("%s rows [%d,%d): element [%d,%d] is %v, %v in the full batch",
							what, lo, hi, lo+r, c, at(got, r, c), at(full, lo+r, c))
					}
				}
				_, q1 := newTestDevice(t, 1, ks.asm)
				for r := 0; r < M; r++ {
					check("alone", q1, r, r+1)
				}
				_, q3 := newTestDevice(t, 3, ks.asm)
				// Up to streamRows rows one pass (groups of four rows and
				// a remainder), more the blocked GEMM.
				for _, b := range []int{2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, streamRows, streamRows + 1, 64, 76} {
					for range 3 {
						lo := rng.IntN(M - b + 1)
						check(fmt.Sprintf("batch of %d (2 workers)", b), q, lo, lo+b)
						check(fmt.Sprintf("batch of %d (3 workers)", b), q3, lo, lo+b)
					}
				}
				check("full batch on 1 worker", q1, 0, M)
				check("full batch on 3 workers", q3, 0, M)
			})
		}
	}
}

// TestMatMulBatchOnePass checks that the product of a decode step's batch
// (up to 16 rows) takes one pass over K, reading each weight once
// with every row against it: no accumulators are spilled between K blocks
// (the blocked GEMM's re-reads and re-stores, which made a 4-row product
// cost several 1-row ones). More rows do take the blocked GEMM, so the
// check can fail.
func TestMatMulBatchOnePass(t *testing.T) {
	const batch = 16 // the largest batch that must take one pass
	if !haveAsm {
		t.Skip("the Go kernels have no K blocks")
	}
	const N, K = 100, 3*kcBlock + 9 // N ≥ 2M: cut into column chunks
	for _, workers := range []int{1, 2} {
		for _, M := range []int{1, 2, 3, 4, 5, 8, 11, batch, streamRows + 1, 2 * streamRows} {
			dev, q := newTestDevice(t, workers, true)
			rng := rand.New(rand.NewPCG(4, uint64(M)))
			x := view(dev, gpu.F32, M, K, 0, 0)
			w := view(dev, gpu.BF16, N, K, 0, 0)
			dst := view(dev, gpu.F32, M, N, 0, 0)
			fillRandom(rng, x)
			fillRandom(rng, w)
			q.MatMul(dst, x, w, gpu.Tensor{})
			spilled := false
			for _, wk := range q.work {
				spilled = spilled || len(wk.acc) > 0
			}
			if want := M > max(batch, streamRows); spilled != want {
				t.Errorf("%d rows on %d workers: K blocked %v, want %v", M, workers, spilled, want)
			}
			if st := checkMatMul(dst, x, w, gpu.Tensor{}); st.bad > 0 {
				t.Fatalf("%d rows: %d of %d outside the bound; first %s", M, st.bad, st.n, st.first)
			}
		}
	}
}

// TestMatMulStridedWeight uses a column slice of an F32 activation as the
// right operand (attention's K·Qᵀ shape of use).
func TestMatMulStridedWeight(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		rng := rand.New(rand.NewPCG(5, 5))
		act := view(dev, gpu.F32, 37, 3*64, 0, 0)
		fillRandom(rng, act)
		w := act.ColSlice(64, 128)
		x := view(dev, gpu.F32, 9, 64, 0, 0)
		fillRandom(rng, x)
		dst := view(dev, gpu.F32, 9, 37, 0, 0)
		q.MatMul(dst, x, w, gpu.Tensor{})
		if st := checkMatMul(dst, x, w, gpu.Tensor{}); st.bad > 0 {
			t.Fatalf("%s: %d of %d outside the bound; first %s", ks.name, st.bad, st.n, st.first)
		}
	}
}

// TestMatMulEmptyK: with K = 0 every output is its bias (or zero).
func TestMatMulEmptyK(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		x := view(dev, gpu.F32, 3, 0, 2, 0)
		w := view(dev, gpu.BF16, 5, 0, 1, 0)
		for _, withBias := range []bool{false, true} {
			var bias gpu.Tensor
			if withBias {
				bias = view(dev, gpu.F32, 1, 5, 0, 0)
				fillRandom(rand.New(rand.NewPCG(1, 1)), bias)
			}
			dst := view(dev, gpu.F32, 3, 5, 0, 0)
			q.MatMul(dst, x, w, bias)
			for m := 0; m < 3; m++ {
				for n := 0; n < 5; n++ {
					if got, want := at(dst, m, n), biasAt(bias, n); got != want {
						t.Fatalf("%s bias=%v: dst[%d,%d] = %v, want %v", ks.name, withBias, m, n, got, want)
					}
				}
			}
		}
	}
}

// TestMatMulNaNWeight: a NaN weight poisons exactly its own column.
func TestMatMulNaNWeight(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		rng := rand.New(rand.NewPCG(9, 9))
		x := view(dev, gpu.F32, 6, 40, 0, 0)
		w := view(dev, gpu.BF16, 10, 40, 0, 0)
		fillRandom(rng, x)
		fillRandom(rng, w)
		buf(w).u16[4*40+21] = 0x7fc0 // w[4,21] = NaN
		dst := view(dev, gpu.F32, 6, 10, 0, 0)
		q.MatMul(dst, x, w, gpu.Tensor{})
		for m := 0; m < 6; m++ {
			for n := 0; n < 10; n++ {
				if nan := math.IsNaN(at(dst, m, n)); nan != (n == 4) {
					t.Fatalf("%s: dst[%d,%d] = %v", ks.name, m, n, at(dst, m, n))
				}
			}
		}
	}
}
