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
	pg := pagesOf(k, p)
	qs, ks, vs, ds := f32s(qt), f32s(k), f32s(v), f32s(dst)
	G := p.Heads / p.KVHeads // query heads per KV head
	workers := q.dev.pool.workers
	ws := q.workspace(workers)
	asm := q.asm
	items := qt.Rows * p.KVHeads
	grain := max(1, 1<<14/max(1, pg.keys*hd*G)) // items per chunk: about 64 KB of scores·values work
	q.dev.pool.ForW(items, grain, func(wi, lo, hi int) {
		wk := ws[wi]
		for it := lo; it < hi; it++ {
			i, kh := it/p.KVHeads, it%p.KVHeads
			pos := p.QPos0 + i
			first, last := 0, min(pg.keys-1, pos)
			if !p.Causal {
				last = pg.keys - 1
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
			// sc[g, j] = q[i, (kh·G+g)·hd : …] · k[first+j, kh·hd : …], a
			// run of keys adjacent in the pool at a time (each score
			// depends only on its query and key rows).
			for j0 := first; j0 <= last; {
				r, n := pg.run(j0, last)
				s := mm{
					x: qs[i*qt.Stride+kh*G*hd:], xs: hd,
					wt: gpu.F32, w32: ks[r*k.Stride+kh*hd:], ws: k.Stride,
					dst: sc[j0-first:], ds: L, M: G, N: n, K: hd,
				}
				s.run(wk, 0, G, 0, n, asm)
				j0 += n
			}
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
			// out[g, :] = Σ_j sc[g, j] · v[first+j, kh·hd : …], j ascending:
			// each run of adjacent keys continues the sums of the runs
			// before it (xw.add), the order of one product over them all.
			for j0 := first; j0 <= last; {
				r, n := pg.run(j0, last)
				o := xw{
					x: sc[j0-first:], xs: L,
					wt: gpu.F32, w32: vs[r*v.Stride+kh*hd:], ws: v.Stride,
					dst: out, ds: hd, M: G, N: hd, K: n, add: j0 > first,
				}
				o.run(wk, 0, G, 0, hd, asm)
				j0 += n
			}
			if p.ProbBF16 {
				for g := 0; g < G; g++ {
					vDivs(asm, out[g*hd:(g+1)*hd], sums[g])
				}
			}
		}
	})
}

// pages maps an Attention call's key rows to rows of k and v: contiguous
// keys, or a block table over pools (gpu.AttnParams.Blocks).
type pages struct {
	keys  int     // key rows (positions)
	table []int32 // nil: key row j is row j
	rows  int     // rows per block
}

// pagesOf validates p's paging of k and returns it. Every table entry
// that covers a key must name a block inside the pool.
func pagesOf(k gpu.Tensor, p gpu.AttnParams) pages {
	if p.Blocks.IsNil() {
		return pages{keys: k.Rows}
	}
	b := p.Blocks
	if p.BlockRows < 1 || p.Keys < 0 || b.DType() != gpu.I32 || b.Rows != 1 || b.Cols*p.BlockRows < p.Keys || k.Rows%p.BlockRows != 0 {
		panic(fmt.Sprintf("cpu: paged attention of %d keys in blocks of %d rows, table %v, pool %v", p.Keys, p.BlockRows, b, k))
	}
	n := (p.Keys + p.BlockRows - 1) / p.BlockRows
	table := i32s(b)[:n:n]
	for lb, pb := range table {
		if pb < 0 || int(pb) >= k.Rows/p.BlockRows {
			panic(fmt.Sprintf("cpu: paged attention: logical block %d is pool block %d of %d", lb, pb, k.Rows/p.BlockRows))
		}
	}
	return pages{keys: p.Keys, table: table, rows: p.BlockRows}
}

// run returns the pool row of key j and how many keys j … last follow it
// in the pool (at least one).
func (pg pages) run(j, last int) (row, n int) {
	if pg.table == nil {
		return j, last - j + 1
	}
	off := j % pg.rows
	return int(pg.table[j/pg.rows])*pg.rows + off, min(last-j+1, pg.rows-off)
}
