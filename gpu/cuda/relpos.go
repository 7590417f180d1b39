package cuda

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The conformer's relative-position attention core (gpu.RelPosScorer,
// gpu.HeadsMultiplier): for one clip of T rows and 8 heads the op
// sequence is 24 products (each a launch of a few blocks) and 20
// elementwise launches a layer; here it is two launches, whose sums and
// roundings are the sequence's (kernels.cu: relpos_scores_f32 and
// heads_matmul_f32 sum with mm_tile's own helpers).

var (
	_ gpu.RelPosScorer    = (*Queue)(nil)
	_ gpu.HeadsMultiplier = (*Queue)(nil)
)

// relPosCols is the scores of one row a warp of relpos_scores_f32
// computes (kernels.cu: RP_C).
const relPosCols = 8

// maxGridYZ is the most blocks a launch grid has along y or z.
const maxGridYZ = 65535

// RelPosScores implements gpu.RelPosScorer: one relpos_scores_f32 launch,
// a warp for each 8 scores of a row of a head, each score's two dot
// products summed as the FMA product kernels sum them and rounded where
// gpu.RelPosScoresSeq rounds (work is not touched). Shapes past the
// grid's limits run the sequence.
func (q *Queue) RelPosScores(scores, work, qu, qv, k, p gpu.Tensor, rp gpu.RelPosParams) {
	T, d := qu.Rows, rp.Heads*rp.HeadDim
	if rp.Heads < 1 || rp.HeadDim < 1 || T < 1 || qu.Cols != d || qv.Rows != T || qv.Cols != d || k.Rows != T || k.Cols != d ||
		p.Rows != 2*T-1 || p.Cols != d || scores.Rows != rp.Heads*T || scores.Cols != T {
		panic(fmt.Sprintf("cuda: relpos scores %v from qu %v qv %v k %v p %v, %d heads of %d", scores, qu, qv, k, p, rp.Heads, rp.HeadDim))
	}
	wantF32("relposscores", scores, work, qu, qv, k, p)
	if q.unfused || T > maxGridYZ || rp.Heads > maxGridYZ {
		gpu.RelPosScoresSeq(q, scores, work, qu, qv, k, p, rp)
		return
	}
	warps := (T + relPosCols - 1) / relPosCols
	q.launch("relpos_scores_f32", [3]uint32{uint32((warps + 3) / 4), uint32(T), uint32(rp.Heads)}, blk128, 0,
		q.t(scores), ld(scores), q.t(qu), ld(qu), q.t(qv), ld(qv), q.t(k), ld(k), q.t(p), ld(p),
		i(T), i(rp.HeadDim), f(rp.Scale), b2i(rp.Round))
}

// HeadsMatMul implements gpu.HeadsMultiplier: one heads_matmul_f32 launch,
// every head's product on matmul_r8_f32's warp tiles (the bits of the
// per-head MatMul, which on F32 operands runs the FMA kernels, all in one
// order). Products of no terms and shapes past the grid's limits run the
// sequence.
func (q *Queue) HeadsMatMul(o, probs, vt gpu.Tensor, heads int) {
	if heads < 1 || o.Cols%heads != 0 || probs.Rows != heads*o.Rows || vt.Rows != o.Cols || vt.Cols != probs.Cols {
		panic(fmt.Sprintf("cuda: heads matmul %v from probs %v and vt %v, %d heads", o, probs, vt, heads))
	}
	wantF32("headsmatmul", o, probs, vt)
	T, L, hd := o.Rows, probs.Cols, o.Cols/heads
	if T == 0 || hd == 0 {
		return
	}
	if q.unfused || L == 0 || (T+7)/8 > maxGridYZ || heads > maxGridYZ {
		gpu.HeadsMatMulSeq(q, o, probs, vt, heads)
		return
	}
	tiles := (hd + 3) / 4
	q.launch("heads_matmul_f32", [3]uint32{uint32((tiles + 3) / 4), uint32((T + 7) / 8), uint32(heads)}, blk128, 0,
		q.t(o), ld(o), q.t(probs), ld(probs), q.t(vt), ld(vt), i(T), i(L), i(hd))
}
