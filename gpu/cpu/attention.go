package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Attention implements gpu.Queue. Each (query row, KV head) pair is one
// work item: the scores of the query heads that share the KV head against
// the row's visible keys are a matrix product with the keys (MatMul's
// summation order), scaled, soft-maxed, and multiplied by the visible
// values (the x·w order of axpy.go). Only visible key and value rows are
// read, and a row's output depends only on its own query, its position and
// the cache: never on how many rows one call computes. dst may be q itself
// (each item reads its query heads before it writes their outputs).
//
// With p.ProbBF16 the weights are the flash kernels': p_j = exp(s_j − m)
// is rounded to bf16 before the product with the values, the row sum l is
// taken over the unrounded fp32 p_j, and the weighted sum is divided by l
// after the product (out = Σ bf16(p_j)·v_j / l).
func (q *Queue) Attention(dst, qt, k, v gpu.Tensor, p gpu.AttnParams) {
	hd := p.HeadDim
	if hd < 1 || p.KVHeads < 1 || p.Heads%p.KVHeads != 0 || qt.Cols != p.Heads*hd || dst.Cols != qt.Cols ||
		dst.Rows != qt.Rows || k.Cols != p.KVHeads*hd || v.Cols != k.Cols || v.Rows != k.Rows || p.Window < 0 {
		panic(fmt.Sprintf("cpu: attention q %v k %v v %v dst %v heads %d/%d dim %d", qt, k, v, dst, p.Heads, p.KVHeads, hd))
	}
	if qt.Rows == 0 {
		return
	}
	qs, ks, vs, ds := f32s(qt), f32s(k), f32s(v), f32s(dst)
	G := p.Heads / p.KVHeads // query heads per KV head
	workers := q.dev.pool.workers
	ws := q.workspace(workers)
	asm := q.asm
	items := qt.Rows * p.KVHeads
	grain := max(1, 1<<14/max(1, k.Rows*hd*G)) // items per chunk: about 64 KB of scores·values work
	q.dev.pool.ForW(items, grain, func(wi, lo, hi int) {
		wk := ws[wi]
		for it := lo; it < hi; it++ {
			i, kh := it/p.KVHeads, it%p.KVHeads
			pos := p.QPos0 + i
			first, last := 0, min(k.Rows-1, pos)
			if !p.Causal {
				last = k.Rows - 1
			}
			if p.Window > 0 {
				first = max(first, pos-p.Window+1)
			}
			out := ds[i*dst.Stride+kh*G*hd:][:G*hd]
			if last < first {
				clear(out)
				continue
			}
			L := last - first + 1
			wk.col = grow(wk.col, G*L+G)
			sc, sums := wk.col[:G*L], wk.col[G*L:]
			// sc[g, j] = q[i, (kh·G+g)·hd : …] · k[first+j, kh·hd : …]
			s := mm{
				x: qs[i*qt.Stride+kh*G*hd:], xs: hd,
				wt: gpu.F32, w32: ks[first*k.Stride+kh*hd:], ws: k.Stride,
				dst: sc, ds: L, M: G, N: L, K: hd,
			}
			s.run(wk, 0, G, 0, L, asm)
			for g := 0; g < G; g++ {
				row := sc[g*L : (g+1)*L]
				vScale(asm, row, row, p.Scale)
				if !p.ProbBF16 {
					softmax(asm, row)
					continue
				}
				vExpShift(asm, row, row, vMax(asm, row))
				sums[g] = vSum(asm, row) // the fp32 p_j, before rounding
				vRound(asm, row)
			}
			// out[g, :] = Σ_j sc[g, j] · v[first+j, kh·hd : …]
			o := xw{
				x: sc, xs: L,
				wt: gpu.F32, w32: vs[first*v.Stride+kh*hd:], ws: v.Stride,
				dst: out, ds: hd, M: G, N: hd, K: L,
			}
			o.run(wk, 0, G, 0, hd, asm)
			if p.ProbBF16 {
				for g := 0; g < G; g++ {
					vDivs(asm, out[g*hd:(g+1)*hd], sums[g])
				}
			}
		}
	})
}
