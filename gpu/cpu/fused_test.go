package cpu

import (
	"fmt"
	"math"
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

// TestPrepHeadsEqualsSeq: the fused head preparation gives
// gpu.PrepHeadsSeq's bits on padded views — in place and into another
// view, strided sources and destinations, both RoPE styles with and
// without the bf16 rotation, norms with and without a weight and their
// roundings, rows at one shared position (a depthformer frame), at
// distinct ones (a batched backbone step) and at repeated runs of them,
// enough rows to split over the pool — and leaves a copy item a copy.
func TestPrepHeadsEqualsSeq(t *testing.T) {
	type tcase struct {
		rows, heads, hd int
		style           gpu.RoPEStyle
		bf16, round     bool
		norm            gpu.RowNorm // W set below when weighted
		weighted        bool
		inPlace         bool
		pos             string // "same", "distinct", "runs"
	}
	cases := []tcase{
		{4, 16, 64, gpu.Interleaved, false, true, gpu.RowNorm{Eps: 1e-5, RoundW: true}, true, false, "same"},
		{1, 16, 64, gpu.Interleaved, false, true, gpu.RowNorm{Eps: 1e-5, RoundW: true}, true, true, "same"},
		{7, 8, 64, gpu.RotateHalf, true, true, gpu.RowNorm{Eps: 1e-6, Round: true, RoundW: true}, true, false, "distinct"},
		{40, 16, 64, gpu.RotateHalf, false, false, gpu.RowNorm{Eps: 1e-5}, false, true, "runs"},
		{40, 3, 128, gpu.Interleaved, true, true, gpu.RowNorm{Eps: 1e-5, Round: true}, true, false, "runs"},
		{5, 2, 32, gpu.Interleaved, true, false, gpu.RowNorm{Eps: 1e-5, Round: true, RoundW: true}, true, true, "distinct"},
	}
	for _, ks := range kernelSets(t) {
		for ci, c := range cases {
			for _, workers := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/case%d/workers=%d", ks.name, ci, workers), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ci), 7))
					dev, q := newTestDevice(t, workers, ks.asm)
					cols := c.heads * c.hd
					src := view(dev, gpu.F32, c.rows, cols, 5, 3) // strided: rows cols+5 apart
					fillRandom(rng, src)
					vsrc := view(dev, gpu.F32, c.rows, 24, 0, 0) // the copy item
					fillRandom(rng, vsrc)
					n := c.norm
					if c.weighted {
						n.W = view(dev, gpu.BF16, 1, c.hd, 0, 0)
						fillRandom(rng, n.W)
					}
					inv := make([]float32, c.hd/2)
					for j := range inv {
						inv[j] = float32(math.Pow(10000, -float64(2*j)/float64(c.hd)))
					}
					pos := make([]int32, c.rows)
					for r := range pos {
						switch c.pos {
						case "same":
							pos[r] = 5
						case "distinct":
							pos[r] = int32(3*r + 1)
						case "runs":
							pos[r] = int32(r / 3 * 40)
						}
					}
					rp := gpu.RoPEParams{Style: c.style, HeadDim: c.hd, InvFreq: inv, Pos: pos, BF16: c.bf16}
					run := func(fused bool) (gpu.Tensor, gpu.Tensor) {
						s := view(dev, gpu.F32, c.rows, cols, 5, 3)
						q.Copy(s, src)
						d := s
						if !c.inPlace {
							d = view(dev, gpu.F32, c.rows, cols, 2, 1)
						}
						vd := view(dev, gpu.F32, c.rows, 24, 1, 0)
						items := []gpu.HeadPrep{{Dst: d, Src: s, Norm: n}, {Dst: vd, Src: vsrc, Copy: true}}
						if fused {
							q.PrepHeads(rp, c.round, items)
						} else {
							gpu.PrepHeadsSeq(q, rp, c.round, items)
						}
						checkPadding(t, d)
						checkPadding(t, vd)
						return d, vd
					}
					gd, gv := run(true)
					wd, wv := run(false)
					if r, col, ok := bitsEqual(gd, wd); !ok {
						t.Fatalf("head rows [%d,%d]: fused %v, sequence %v", r, col, at(gd, r, col), at(wd, r, col))
					}
					if r, col, ok := bitsEqual(gv, wv); !ok {
						t.Fatalf("copy item [%d,%d]: fused %v, sequence %v", r, col, at(gv, r, col), at(wv, r, col))
					}
					if r, col, ok := bitsEqual(gv, vsrc); !ok {
						t.Fatalf("copy item [%d,%d]: %v, source %v", r, col, at(gv, r, col), at(vsrc, r, col))
					}
				})
			}
		}
	}
}

// TestNormRowsEqualsSeq: the CPU queue's one-pass row norm gives
// gpu.NormRows's bits (RMSNorm, RoundBF16, MulRow, RoundBF16) on padded,
// strided views and in place, with and without a weight and each
// rounding, for one row to enough rows to split over the pool.
func TestNormRowsEqualsSeq(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for ci, c := range []struct {
			rows, cols     int
			round, rw, wtd bool
			inPlace        bool
		}{
			{1, 1024, true, true, true, false},
			{4, 1024, false, true, true, true},
			{40, 1024, true, false, true, false},
			{7, 37, true, true, false, false},
			{300, 64, false, false, false, true},
		} {
			for _, workers := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/case%d/workers=%d", ks.name, ci, workers), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ci), 9))
					dev, q := newTestDevice(t, workers, ks.asm)
					x := view(dev, gpu.F32, c.rows, c.cols, 3, 1)
					fillRandom(rng, x)
					n := gpu.RowNorm{Eps: 1e-5, Round: c.round, RoundW: c.rw}
					if c.wtd {
						n.W = view(dev, gpu.BF16, 1, c.cols, 0, 0)
						fillRandom(rng, n.W)
					}
					run := func(fused bool) gpu.Tensor {
						src := view(dev, gpu.F32, c.rows, c.cols, 3, 1)
						q.Copy(src, x)
						h := src
						if !c.inPlace {
							h = view(dev, gpu.F32, c.rows, c.cols, 2, 0)
						}
						if fused {
							q.normRows(h, src, n)
						} else {
							gpu.NormRows(q, h, src, n)
						}
						checkPadding(t, h)
						return h
					}
					got, want := run(true), run(false)
					if r, col, ok := bitsEqual(got, want); !ok {
						t.Fatalf("[%d,%d]: one pass %v, sequence %v", r, col, at(got, r, col), at(want, r, col))
					}
				})
			}
		}
	}
}
