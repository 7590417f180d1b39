package cpu

import (
	"os"

	"github.com/omni-pipe/omni-pipe/gpu"
)

var _ gpu.GLUFuser = (*Queue)(nil)

// unfusedGLU makes NormGLU decline every shape, so that the feed-forward
// runs as its op sequence (env OMNIPIPE_CPU_FUSE=off; for A/B
// measurements: the same bits either way).
var unfusedGLU = os.Getenv("OMNIPIPE_CPU_FUSE") == "off"

// NormGLU implements gpu.GLUFuser for the few rows of a decode step (at
// most streamRows, BF16 or F32 weights of one type): the norm, then the
// gate's and the up product in one parallel loop over column chunks, each
// participant finishing the columns it computed (the gate rounded, SiLU,
// rounded; the up product rounded, times the gate, rounded) — the floats of
// gpu.NormGLUSeq, whose products each cut the same columns into a loop of
// their own (every output's sum is the same whatever the cut, matmul.go,
// and the elementwise kernels' Go twins give their assembly's bits). One
// loop where the sequence posts two: a 1024-wide layer's loops are a few
// microseconds of work each, so on many cores their joins are what its
// batched rows cost.
func (q *Queue) NormGLU(dst, h, x gpu.Tensor, n gpu.RowNorm, w1, w3 gpu.Tensor, round bool) bool {
	M, K, N := x.Rows, x.Cols, w1.Rows
	if unfusedGLU || M == 0 || M > streamRows || N < 24 || K < 8 || w1.DType() != w3.DType() ||
		dst.Buf == x.Buf || dst.Buf == h.Buf || dst.Buf == w1.Buf || dst.Buf == w3.Buf || h.Buf == x.Buf {
		return false
	}
	switch w1.DType() {
	case gpu.BF16, gpu.F32:
	default:
		return false
	}
	gpu.NormRows(q, h, x, n)
	q.glu = grow(q.glu, M*N)
	gate := q.glu[:M*N]
	g1 := mm{x: f32s(h), xs: h.Stride, dst: gate, ds: N, M: M, N: N, K: K}
	g1.setWeight(w1)
	g3 := mm{x: f32s(h), xs: h.Stride, dst: f32s(dst), ds: dst.Stride, M: M, N: N, K: K}
	g3.setWeight(w3)
	asm := q.asm
	p := q.dev.pool
	ws := q.workspace(p.workers)
	cols := func(w, lo, hi int) {
		g1.run(ws[w], 0, M, lo, hi, asm)
		g3.run(ws[w], 0, M, lo, hi, asm)
		for r := range M {
			a := gate[r*N+lo : r*N+hi]
			d := g3.dst[r*g3.ds+lo : r*g3.ds+hi]
			if round {
				vRound(asm, a)
			}
			vSiLU(asm, a, a)
			if round {
				vRound(asm, a)
				vRound(asm, d)
			}
			vMul(asm, d, d, a)
			if round {
				vRound(asm, d)
			}
		}
	}
	if p.workers == 1 {
		cols(0, 0, N)
		return true
	}
	// gemm's one-pass chunks, each now two weights' rows.
	p.ForW(N, streamGrain(N, 2*K*w1.DType().Size(), p.workers), cols)
	return true
}
