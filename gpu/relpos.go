package gpu

import "fmt"

// The attention core of a Transformer-XL relative-position attention (the
// conformer encoder's RelPositionMultiHeadAttention) over one sequence of
// T rows, all heads at once. As op sequences they are a few products per
// head; a backend that implements the interfaces below runs each as one
// op (on CUDA one launch for all heads instead of three products and
// their elementwise ops per head). Either way the floats are the same: a
// fused op repeats each product's order of summation and every rounding
// of the sequence it stands for.

// RelPosParams describes RelPosScores: Heads heads of HeadDim columns,
// the scores' Scale, and whether each value the reference stores in
// bfloat16 is rounded (Round: a bf16 network; nn.Ctx.Round's decision).
type RelPosParams struct {
	Heads, HeadDim int
	Scale          float32
	Round          bool
}

// RelPosScorer is a Queue that computes RelPosScores in one op.
type RelPosScorer interface {
	// RelPosScores is RelPosScores's sequence; see there.
	RelPosScores(scores, work, qu, qv, k, p Tensor, rp RelPosParams)
}

// HeadsMultiplier is a Queue that computes HeadsMatMul in one op.
type HeadsMultiplier interface {
	// HeadsMatMul is HeadsMatMul's sequence; see there.
	HeadsMatMul(o, probs, vt Tensor, heads int)
}

// RelPosScores sets the attention scores of every head h of a sequence of
// T rows, scores [Heads·T, T] (head h's rows h·T … h·T+T−1), from the
// queries with each positional bias added, qu and qv [T, Heads·HeadDim],
// the keys k [T, Heads·HeadDim] and the projected relative positions p
// [2T−1, Heads·HeadDim] (row r holds relative position T−1−r): with R the
// bf16 rounding when rp.Round (else none) and x_h a head's columns,
//
//	scores[h·T+i, j] = R(R(R(qu_h[i]·k_h[j]) + R(qv_h[i]·p_h[T−1−i+j]))·Scale)
//
// each dot product summed as MatMul sums it. That is, per head, MatMul of
// qv_h and p_h into work [T, 2T−1] (rounded), MatMul of qu_h and k_h into
// the head's scores (rounded), their sum with work's relative shift
// (RelShift), rounded; then Scale of all the scores, rounded
// (RelPosScoresSeq). work is a contiguous F32 [T, 2T−1] tensor for that
// sequence: a RelPosScorer need not touch it. scores and work must not
// overlap each other or the inputs.
func RelPosScores(q Queue, scores, work, qu, qv, k, p Tensor, rp RelPosParams) {
	T, d := qu.Rows, rp.Heads*rp.HeadDim
	if rp.Heads < 1 || rp.HeadDim < 1 || T < 1 || qu.Cols != d || qv.Rows != T || qv.Cols != d || k.Rows != T || k.Cols != d ||
		p.Rows != 2*T-1 || p.Cols != d || scores.Rows != rp.Heads*T || scores.Cols != T ||
		work.Rows != T || work.Cols != 2*T-1 || !work.Contiguous() {
		panic(fmt.Sprintf("gpu: relpos scores %v (work %v) from qu %v qv %v k %v p %v, %d heads of %d",
			scores, work, qu, qv, k, p, rp.Heads, rp.HeadDim))
	}
	if f, ok := q.(RelPosScorer); ok {
		f.RelPosScores(scores, work, qu, qv, k, p, rp)
		return
	}
	RelPosScoresSeq(q, scores, work, qu, qv, k, p, rp)
}

// RelPosScoresSeq is RelPosScores as the sequence of ops it stands for
// (what a RelPosScorer runs where its fused kernel does not apply).
func RelPosScoresSeq(q Queue, scores, work, qu, qv, k, p Tensor, rp RelPosParams) {
	T, hd := qu.Rows, rp.HeadDim
	round := func(t Tensor) {
		if rp.Round {
			q.RoundBF16(t)
		}
	}
	for h := range rp.Heads {
		lo, hi := h*hd, (h+1)*hd
		ach := scores.Slice(h*T, (h+1)*T)
		q.MatMul(work, qv.ColSlice(lo, hi), p.ColSlice(lo, hi), Tensor{}) // matrix_bd [T, 2T−1]
		round(work)
		q.MatMul(ach, qu.ColSlice(lo, hi), k.ColSlice(lo, hi), Tensor{}) // matrix_ac [T, T]
		round(ach)
		q.Add(ach, ach, RelShift(work))
		round(ach)
	}
	q.Scale(scores, scores, rp.Scale)
	round(scores)
}

// RelShift is Transformer-XL's rel_shift followed by the [..., :T] slice,
// as a view of the contiguous [T, 2T−1] matrix bd: element (i, j) is
// bd[i, T−1−i+j], the score of relative position i−j (pos row T−1−(i−j)).
// In bd's buffer that is offset (T−1) + i·(2T−2) + j.
func RelShift(bd Tensor) Tensor {
	T := bd.Rows
	if bd.Cols != 2*T-1 || !bd.Contiguous() {
		panic(fmt.Sprintf("gpu: rel_shift of %v", bd))
	}
	v := bd
	v.Off += T - 1
	v.Cols = T
	v.Stride = max(2*T-2, T) // one row when T = 1: any stride ≥ Cols
	return v
}

// HeadsMatMul sets o [T, heads·hd] to every head's product with its
// values: o[:, h·hd … h·hd+hd−1] = probs_h · vt_hᵀ, with probs_h rows
// h·T … h·T+T−1 of probs [heads·T, L] and vt_h rows h·hd … h·hd+hd−1 of
// vt [heads·hd, L] (the values transposed), each a MatMul without bias
// (HeadsMatMulSeq). o must not overlap probs or vt.
func HeadsMatMul(q Queue, o, probs, vt Tensor, heads int) {
	if heads < 1 || o.Cols%heads != 0 || probs.Rows != heads*o.Rows || vt.Rows != o.Cols || vt.Cols != probs.Cols {
		panic(fmt.Sprintf("gpu: heads matmul %v from probs %v and vt %v, %d heads", o, probs, vt, heads))
	}
	if f, ok := q.(HeadsMultiplier); ok {
		f.HeadsMatMul(o, probs, vt, heads)
		return
	}
	HeadsMatMulSeq(q, o, probs, vt, heads)
}

// HeadsMatMulSeq is HeadsMatMul as one MatMul per head.
func HeadsMatMulSeq(q Queue, o, probs, vt Tensor, heads int) {
	T, hd := o.Rows, o.Cols/heads
	for h := range heads {
		lo, hi := h*hd, (h+1)*hd
		q.MatMul(o.ColSlice(lo, hi), probs.Slice(h*T, (h+1)*T), vt.Slice(lo, hi), Tensor{}) // probs·v [T, head_dim]
	}
}
