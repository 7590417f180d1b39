package gpu

import (
	"fmt"
	"math"
)

// Block is one pre-norm transformer block (liquid-audio's StandardBlock:
// grouped-query attention with per-head q/k norms and RoPE, then a SwiGLU
// feed-forward) run on the rows of X in place, at position Pos of every
// row's keys and values:
//
//	h = OpNorm(X); qkv = h·QKVᵀ = [q | k | v] (Heads, KVHeads, KVHeads heads)
//	q = RoPE(QNorm(q)); K[Pos] = RoPE(KNorm(k)); V[Pos] = v (per head)
//	o = causal Attention(q, K[0…Pos], V[0…Pos]); a = o·Outᵀ + X
//	h = FFNNorm(a); X = ((h·W3ᵀ) ⊙ silu(h·W1ᵀ))·W2ᵀ + a
//
// with every product, rotation, attention output, GLU factor and residual
// sum rounded to bfloat16 when Round (nn.BF16's rounding points). The rows
// are independent sessions: row r's keys and values are the KVHeads heads
// r·KVHeads … of K's and V's rows ([≥ Pos+1, B·KVHeads·HeadDim]), and
// the attention runs over one row of B·Heads query heads, as the
// depthformer lays its frame's caches out.
type Block struct {
	X                             Tensor // [B, D], updated in place
	OpNorm, FFNNorm, QNorm, KNorm RowNorm
	QKV                           Tensor // [(Heads + 2·KVHeads)·HeadDim, D]
	Out                           Tensor // [D, Heads·HeadDim]
	W1, W3                        Tensor // [F, D]
	W2                            Tensor // [D, F]
	// RoPE's Style, InvFreq and BF16 rotate q and k (its Pos and HeadDim
	// are Block's).
	RoPE RoPEParams
	// Heads, KVHeads, HeadDim and Scale are one row's; ProbBF16 as in
	// AttnParams.
	Heads, KVHeads, HeadDim int
	Scale                   float32
	ProbBF16                bool
	K, V                    Tensor
	Pos                     int
	Round                   bool
}

// BlockFuser is a Queue that runs a whole Block as one op (one kernel
// launch on a GPU where there would be seven). FuseBlock gives exactly the
// floats of BlockSeq, or does nothing and reports false where it cannot
// take b (its shapes, dtypes or rows); the caller then runs BlockSeq.
type BlockFuser interface {
	FuseBlock(b Block) bool
}

// RunBlock runs b: fused where q can (BlockFuser), else as BlockSeq with
// temporaries from tmp (F32 scratch of [rows, cols], its contents any).
func RunBlock(q Queue, b Block, tmp func(rows, cols int) Tensor) {
	b.check()
	if f, ok := q.(BlockFuser); ok && f.FuseBlock(b) {
		return
	}
	BlockSeq(q, b, tmp)
}

// Dims returns b's model width D, query columns Heads·HeadDim, key/value
// columns KVHeads·HeadDim and feed-forward width F.
func (b Block) Dims() (D, hq, kvd, F int) {
	return b.X.Cols, b.Heads * b.HeadDim, b.KVHeads * b.HeadDim, b.W1.Rows
}

func (b Block) check() {
	B, D := b.X.Rows, b.X.Cols
	_, hq, kvd, F := b.Dims()
	ok := b.HeadDim > 0 && b.KVHeads > 0 && b.Heads%b.KVHeads == 0 && b.Pos >= 0 &&
		b.QKV.Rows == hq+2*kvd && b.QKV.Cols == D && b.Out.Rows == D && b.Out.Cols == hq &&
		b.W3.Rows == F && b.W1.Cols == D && b.W3.Cols == D && b.W2.Rows == D && b.W2.Cols == F &&
		b.K.Rows > b.Pos && b.V.Rows > b.Pos && b.K.Cols == B*kvd && b.V.Cols == B*kvd &&
		len(b.RoPE.InvFreq) == b.HeadDim/2
	if !ok {
		panic(fmt.Sprintf("gpu: block x %v qkv %v out %v w1 %v w3 %v w2 %v k %v v %v, heads %d/%d of %d, pos %d",
			b.X, b.QKV, b.Out, b.W1, b.W3, b.W2, b.K, b.V, b.Heads, b.KVHeads, b.HeadDim, b.Pos))
	}
}

// BlockSeq runs b as the sequence of ops it stands for (what RunBlock runs
// on queues without a fused block).
func BlockSeq(q Queue, b Block, tmp func(rows, cols int) Tensor) {
	x := b.X
	B, D := x.Rows, x.Cols
	_, hq, kvd, _ := b.Dims()
	round := func(t Tensor) {
		if b.Round {
			q.RoundBF16(t)
		}
	}
	h := tmp(B, D)
	qkv := tmp(B, hq+2*kvd)
	NormMatMul(q, qkv, h, x, b.OpNorm, b.QKV, Tensor{})
	round(qkv)
	// k and v go straight to the caches' row Pos (the B rows' [B, kvd]
	// are that row's [1, B·kvd]); q stays in qkv for one row and goes to a
	// contiguous tensor for several (the attention reads it as one row of
	// B·Heads heads). Each q/k head: its norm, then the fp32 rotation,
	// rounded; v copied (one PrepHeads: one launch on a GPU).
	qt := qkv.ColSlice(0, hq)
	if B > 1 {
		qt = tmp(B, hq)
	}
	k, v := b.K.Row(b.Pos).Reshape(B, kvd), b.V.Row(b.Pos).Reshape(B, kvd)
	pos := make([]int32, B)
	for r := range pos {
		pos[r] = int32(b.Pos)
	}
	rp := b.RoPE
	rp.HeadDim, rp.Pos = b.HeadDim, pos
	PrepHeads(q, rp, b.Round,
		HeadPrep{Dst: qt, Src: qkv.ColSlice(0, hq), Norm: b.QNorm},
		HeadPrep{Dst: k, Src: qkv.ColSlice(hq, hq+kvd), Norm: b.KNorm},
		HeadPrep{Dst: v, Src: qkv.ColSlice(hq+kvd, hq+2*kvd), Copy: true})
	o := tmp(B, hq)
	q.Attention(o.Reshape(1, B*hq), qt.Reshape(1, B*hq), b.K.Slice(0, b.Pos+1), b.V.Slice(0, b.Pos+1), AttnParams{
		Heads: B * b.Heads, KVHeads: B * b.KVHeads, HeadDim: b.HeadDim, Scale: b.Scale,
		QPos0: b.Pos, Causal: true, ProbBF16: b.ProbBF16,
	})
	round(o)
	a := tmp(B, D)
	q.MatMul(a, o, b.Out, Tensor{})
	round(a)
	q.Add(a, a, x) // h += x
	round(a)
	F := b.W1.Rows
	g1, g3 := tmp(B, F), tmp(B, F)
	// g3 = (h·W3ᵀ) ⊙ silu(h·W1ᵀ) after the FFN norm (NormGLU), and the
	// down projection straight into x, then x + a (the same floats, in the
	// order a backend folds into products).
	NormGLU(q, g3, g1, h, a, b.FFNNorm, b.W1, b.W3, b.Round)
	q.MatMul(x, g3, b.W2, Tensor{})
	round(x)
	q.Add(x, x, a)
	round(x)
}

// AttnScale is the attention's usual scale, 1/√headDim, as a float32.
func AttnScale(headDim int) float32 { return float32(1 / math.Sqrt(float64(headDim))) }
