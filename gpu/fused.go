package gpu

import "fmt"

// RowNorm is an RMS normalisation of rows as the reference's norms run it:
// y = x / sqrt(mean(x²) + Eps), rounded to bfloat16 when Round; then, when
// W ([1, cols], any float dtype) is set, y = y ⊙ W, rounded when RoundW.
// Lfm2RMSNorm is {Round: true, W, RoundW: true}; liquid-audio's
// transformer.py RMSNorm is {W, RoundW: true}.
type RowNorm struct {
	Eps    float32
	Round  bool
	W      Tensor
	RoundW bool
}

// NormFuser is a Queue that runs a row norm inside the op that consumes it
// (one kernel where there would be two or more dependent ones). Each method
// gives exactly the floats of the op sequence it stands for (NormMatMul and
// PrepHeads below run that sequence on queues without it): fusing moves no
// rounding point and changes no order of a sum.
type NormFuser interface {
	// NormMatMul is NormRows(h, x, n) then MatMul(dst, h, w, bias).
	NormMatMul(dst, h, x Tensor, n RowNorm, w, bias Tensor)
	// PrepHeads is PrepHeads's sequence; see there.
	PrepHeads(rp RoPEParams, round bool, items []HeadPrep)
}

// HeadPrep is one tensor of an attention's inputs for PrepHeads: Dst =
// HeadNormRoPE of Src with Norm, or, for a Copy item, Dst = Src.
type HeadPrep struct {
	Dst, Src Tensor
	Norm     RowNorm
	Copy     bool
}

// PrepHeads runs HeadNormRoPE(it.Dst, it.Src, it.Norm, rp, round) — or
// Copy(it.Dst, it.Src) for a Copy item — for every item, as one op where
// q can (NormFuser: one launch for an attention's q, k and v). The items'
// rows are rp's; no item's Dst may overlap another item's Src or Dst.
func PrepHeads(q Queue, rp RoPEParams, round bool, items ...HeadPrep) {
	for _, it := range items {
		if it.Dst.Rows != it.Src.Rows || it.Dst.Cols != it.Src.Cols || (!it.Copy && (rp.HeadDim <= 0 || it.Dst.Cols%rp.HeadDim != 0)) {
			panic(fmt.Sprintf("gpu: prep heads %v from %v, head %d", it.Dst, it.Src, rp.HeadDim))
		}
	}
	if f, ok := q.(NormFuser); ok {
		f.PrepHeads(rp, round, items)
		return
	}
	PrepHeadsSeq(q, rp, round, items)
}

// PrepHeadsSeq is PrepHeads as the sequence of ops it stands for (what a
// NormFuser runs where its fused kernel does not apply).
func PrepHeadsSeq(q Queue, rp RoPEParams, round bool, items []HeadPrep) {
	for _, it := range items {
		if it.Copy {
			q.Copy(it.Dst, it.Src)
			continue
		}
		HeadNormRoPESeq(q, it.Dst, it.Src, it.Norm, rp, round)
	}
}

// NormRows sets dst to the normalised rows of x (n's norm, rounding and
// weight; dst may be x).
func NormRows(q Queue, dst, x Tensor, n RowNorm) {
	q.RMSNorm(dst, x, n.Eps)
	if n.Round {
		q.RoundBF16(dst)
	}
	if !n.W.IsNil() {
		q.MulRow(dst, dst, n.W)
		if n.RoundW {
			q.RoundBF16(dst)
		}
	}
}

// NormMatMul sets h to the normalised rows of x (NormRows) and dst =
// h·wᵀ + bias (MatMul), fused where q can (NormFuser). h is written either
// way, for later readers. h must not alias x; dst must not alias h or x.
func NormMatMul(q Queue, dst, h, x Tensor, n RowNorm, w, bias Tensor) {
	if f, ok := q.(NormFuser); ok {
		f.NormMatMul(dst, h, x, n, w, bias)
		return
	}
	NormRows(q, h, x, n)
	q.MatMul(dst, h, w, bias)
}

// HeadNormRoPE sets dst to src with every head (rp.HeadDim columns) of
// every row normalised on its own (n: a per-head q/k layernorm) and then
// rotated (RoPE with rp; a fp32 rotation rounded to bfloat16 afterwards
// when round): Copy(dst, src) where they differ, NormRows over the heads,
// RoPE, RoundBF16. src is the same view as dst or does not overlap it.
func HeadNormRoPE(q Queue, dst, src Tensor, n RowNorm, rp RoPEParams, round bool) {
	PrepHeads(q, rp, round, HeadPrep{Dst: dst, Src: src, Norm: n})
}

// HeadNormRoPESeq is HeadNormRoPE as the sequence of ops it stands for
// (what a NormFuser runs where its fused kernel does not apply).
func HeadNormRoPESeq(q Queue, dst, src Tensor, n RowNorm, rp RoPEParams, round bool) {
	if !SameView(dst, src) {
		q.Copy(dst, src)
	}
	heads := dst.Cols / rp.HeadDim
	if dst.Contiguous() {
		h := dst.Reshape(dst.Rows*heads, rp.HeadDim)
		NormRows(q, h, h, n)
	} else { // a strided view: its heads row by row
		for r := 0; r < dst.Rows; r++ {
			h := dst.Row(r).Reshape(heads, rp.HeadDim)
			NormRows(q, h, h, n)
		}
	}
	q.RoPE(dst, rp)
	if round {
		q.RoundBF16(dst)
	}
}

// SameView says a and b are the same view of the same buffer.
func SameView(a, b Tensor) bool {
	return a.Buf == b.Buf && a.Off == b.Off && a.Rows == b.Rows && a.Cols == b.Cols && a.Stride == b.Stride
}

// GLUFuser is a Queue that runs a SwiGLU feed-forward's gate and up
// products, with the row norm before them, as one op (one kernel on a GPU
// where there would be two). NormGLU gives exactly the floats of
// NormGLUSeq, or does nothing and reports false where it cannot take the
// shapes (the caller then runs NormGLUSeq).
type GLUFuser interface {
	NormGLU(dst, h, x Tensor, n RowNorm, w1, w3 Tensor, round bool) bool
}

// NormGLU sets h to the normalised rows of x (NormRows) and dst =
// (h·w3ᵀ) ⊙ silu(h·w1ᵀ), each product, the silu and the ⊙ rounded to
// bfloat16 when round — NormGLUSeq, fused where q can (GLUFuser). a is
// scratch of dst's shape for the sequence (its contents afterwards are
// unspecified). x, h, a and dst must not alias one another.
func NormGLU(q Queue, dst, a, h, x Tensor, n RowNorm, w1, w3 Tensor, round bool) {
	checkNormGLU(dst, a, h, x, w1, w3)
	if f, ok := q.(GLUFuser); ok && f.NormGLU(dst, h, x, n, w1, w3, round) {
		return
	}
	NormGLUSeq(q, dst, a, h, x, n, w1, w3, round)
}

// checkNormGLU panics unless the operands of a NormGLU fit one another.
func checkNormGLU(dst, a, h, x, w1, w3 Tensor) {
	M, K, F := x.Rows, x.Cols, w1.Rows
	if h.Rows != M || h.Cols != K || w1.Cols != K || w3.Rows != F || w3.Cols != K ||
		dst.Rows != M || dst.Cols != F || a.Rows != M || a.Cols != F {
		panic(fmt.Sprintf("gpu: norm glu %v -> %v (h %v, a %v) with w1 %v, w3 %v", x, dst, h, a, w1, w3))
	}
}

// NormGLUSeq is NormGLU as the sequence of ops it stands for: a = h·w1ᵀ
// after the norm (NormMatMul), rounded, silu, rounded; dst = h·w3ᵀ,
// rounded, dst ⊙ a, rounded.
func NormGLUSeq(q Queue, dst, a, h, x Tensor, n RowNorm, w1, w3 Tensor, round bool) {
	normGLUSeq(q, dst, a, h, x, n, w1, w3, round, false)
}

// normGLUSeq is NormGLUSeq with MatMul's products, or MatMulPrompt's when
// prompt.
func normGLUSeq(q Queue, dst, a, h, x Tensor, n RowNorm, w1, w3 Tensor, round, prompt bool) {
	rnd := func(t Tensor) {
		if round {
			q.RoundBF16(t)
		}
	}
	if prompt {
		NormRows(q, h, x, n)
		MatMulPrompt(q, a, h, w1, Tensor{})
	} else {
		NormMatMul(q, a, h, x, n, w1, Tensor{})
	}
	rnd(a)
	q.Act(a, a, SiLU)
	rnd(a)
	if prompt {
		MatMulPrompt(q, dst, h, w3, Tensor{})
	} else {
		q.MatMul(dst, h, w3, Tensor{})
	}
	rnd(dst)
	q.Mul(dst, dst, a)
	rnd(dst)
}
