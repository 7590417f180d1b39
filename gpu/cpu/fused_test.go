package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestNormGLUEqualsSeq: the fused feed-forward (one loop for the gate's
// and the up product) gives gpu.NormGLUSeq's bits — h, and dst on padded,
// strided views — for one to streamRows rows, ragged K and N, rounding on
// and off, BF16 and F32 weights, on one and on three workers; where it
// does not apply (more rows, F16 weights) it declines and changes nothing.
func TestNormGLUEqualsSeq(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, c := range []struct {
			M, K, N int
			dt      gpu.DType
			round   bool
			fused   bool
		}{
			{1, 1024, 2816, gpu.BF16, true, true},
			{4, 1024, 2816, gpu.BF16, true, true},
			{3, 1031, 203, gpu.BF16, false, true}, // K with a tail, N not a multiple of 12
			{16, 264, 97, gpu.F32, true, true},
			{2, 64, 24, gpu.BF16, true, true},
			{17, 128, 96, gpu.BF16, true, false}, // past streamRows: the sequence
			{1, 128, 96, gpu.F16, true, false},
		} {
			for _, workers := range []int{1, 3} {
				name := fmt.Sprintf("%s/M=%d/K=%d/N=%d/%v/round=%v/workers=%d", ks.name, c.M, c.K, c.N, c.dt, c.round, workers)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(c.M), uint64(c.N)))
					dev, q := newTestDevice(t, workers, ks.asm)
					x := view(dev, gpu.F32, c.M, c.K, 2, 1)
					w1, w3 := view(dev, c.dt, c.N, c.K, 1, 0), view(dev, c.dt, c.N, c.K, 0, 3)
					nw := view(dev, gpu.BF16, 1, c.K, 0, 0)
					for _, v := range []gpu.Tensor{x, w1, w3, nw} {
						fillRandom(rng, v)
					}
					n := gpu.RowNorm{Eps: 1e-5, Round: true, W: nw, RoundW: true}
					var got [2][2]gpu.Tensor
					for k := range 2 {
						h, dst := view(dev, gpu.F32, c.M, c.K, 1, 0), view(dev, gpu.F32, c.M, c.N, 3, 2)
						if k == 0 {
							if ok := q.NormGLU(dst, h, x, n, w1, w3, c.round); ok != c.fused {
								t.Fatalf("NormGLU took the shapes: %v, want %v", ok, c.fused)
							}
							if !c.fused {
								return
							}
						} else {
							a := view(dev, gpu.F32, c.M, c.N, 0, 0)
							gpu.NormGLUSeq(q, dst, a, h, x, n, w1, w3, c.round)
						}
						checkPadding(t, h)
						checkPadding(t, dst)
						got[k] = [2]gpu.Tensor{h, dst}
					}
					for j, what := range []string{"h", "dst"} {
						if r, col, ok := bitsEqual(got[0][j], got[1][j]); !ok {
							t.Errorf("%s [%d,%d]: fused %v, sequence %v", what, r, col, at(got[0][j], r, col), at(got[1][j], r, col))
						}
					}
				})
			}
		}
	}
}
