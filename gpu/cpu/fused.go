package cpu

import (
	"os"

	"github.com/omni-pipe/omni-pipe/gpu"
)

var (
	_ gpu.GLUFuser  = (*Queue)(nil)
	_ gpu.NormFuser = (*Queue)(nil)
)

// unfused makes NormGLU decline every shape and the row norms and
// PrepHeads run their op sequences (env OMNIPIPE_CPU_FUSE=off; for A/B
// measurements: the same bits either way).
var unfused = os.Getenv("OMNIPIPE_CPU_FUSE") == "off"

// NormMatMul implements gpu.NormFuser: the row norm in one pass
// (normRows), then the product — on a CPU the norm stays outside the
// product's loop, a pass over a few kilobytes beside its megabytes of
// weights.
func (q *Queue) NormMatMul(dst, h, x gpu.Tensor, n gpu.RowNorm, w, bias gpu.Tensor) {
	q.normRows(h, x, n)
	q.MatMul(dst, h, w, bias)
}

// normRows is gpu.NormRows(q, h, x, n) — RMSNorm, RoundBF16, MulRow,
// RoundBF16 as n asks — in one pass over each row (normInto)
// (the same floats: TestNormRowsEqualsSeq): a decode step's norms are a
// few kilobytes, which four op dispatches cost more than.
func (q *Queue) normRows(h, x gpu.Tensor, n gpu.RowNorm) {
	if unfused {
		gpu.NormRows(q, h, x, n)
		return
	}
	sameShape("normrows", h, x)
	var nw []float32
	if !n.W.IsNil() {
		nw = q.rowVector(n.W, h.Cols, false)
	}
	xs := f32s(x)
	asm := q.asm
	q.eachRow(h, func(r int, d []float32) { normInto(asm, d, row(x, xs, r), n, nw) })
}

// PrepHeads implements gpu.NormFuser: each row of each item in one pass —
// copied, every head normalised (the sum of squares, the inverse root in
// float64, the scale, the rounding and the weight of Queue.RMSNorm,
// RoundBF16 and MulRow: normInto), rotated (Queue.RoPE's ropeRow, its cos and sin
// computed once for the rows that share a position: all of a depthformer
// frame's rows) and rounded — the floats of gpu.PrepHeadsSeq, whose dozen
// ops over the same few kilobytes (a decode step's q and k) cost more in
// dispatch than in arithmetic: at four rows the sequence took 1.5 ms of a
// 16-core depthformer frame in RoPE's per-element closures alone
// (docs/performance.md). Rows are split over the pool as eachRow splits
// them.
func (q *Queue) PrepHeads(rp gpu.RoPEParams, round bool, items []gpu.HeadPrep) {
	if unfused {
		gpu.PrepHeadsSeq(q, rp, round, items)
		return
	}
	for _, it := range items {
		if it.Copy {
			q.Copy(it.Dst, it.Src)
			continue
		}
		q.prepHeads(it, rp, round)
	}
}

// prepHeads is PrepHeads for one item: gpu.HeadNormRoPESeq(it.Dst,
// it.Src, it.Norm, rp, round).
func (q *Queue) prepHeads(it gpu.HeadPrep, rp gpu.RoPEParams, round bool) {
	dst, src := it.Dst, it.Src
	hd := rp.HeadDim
	sameShape("prepheads", dst, src)
	checkRoPE("prep heads", dst, rp)
	if dst.Rows == 0 || dst.Cols == 0 {
		return
	}
	n := it.Norm
	var nw []float32
	if !n.W.IsNil() {
		nw = q.rowVector(n.W, hd, false)
	}
	inPlace := gpu.SameView(dst, src)
	ds, ss := f32s(dst), f32s(src)
	asm := q.asm
	p := q.dev.pool
	ws := q.workspace(p.workers)
	p.ForW(dst.Rows, max(1, elemGrain/dst.Cols), func(w, lo, hi int) {
		wk := ws[w]
		wk.col = grow(wk.col, hd)
		cs := wk.col // cos of pair j at 2j, sin at 2j+1, for position at
		at := int32(-1)
		for r := lo; r < hi; r++ {
			d := row(dst, ds, r)
			if !inPlace {
				copy(d, row(src, ss, r))
			}
			for h := 0; h < dst.Cols; h += hd {
				normInto(asm, d[h:h+hd], d[h:h+hd], n, nw)
			}
			if pos := rp.Pos[r]; pos != at || r == lo {
				at = pos
				ropeAngles(cs, pos, rp.InvFreq, rp.BF16)
			}
			ropeRow(d, cs, hd, rp.Style, rp.BF16)
			if round {
				vRound(asm, d)
			}
		}
	})
}

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
	if unfused || M == 0 || M > streamRows || N < 24 || K < 8 || w1.DType() != w3.DType() ||
		dst.Buf == x.Buf || dst.Buf == h.Buf || dst.Buf == w1.Buf || dst.Buf == w3.Buf || h.Buf == x.Buf {
		return false
	}
	switch w1.DType() {
	case gpu.BF16, gpu.F32:
	default:
		return false
	}
	q.normRows(h, x, n)
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
