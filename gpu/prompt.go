package gpu

// PromptMatMuler is a Queue with a faster product for a prompt's many rows
// (on a GPU: a vendor GEMM on the tensor cores, where the backend's own
// products keep the one summation order that makes every row independent
// of the batch it is computed in).
//
// MatMulPrompt computes dst[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[1,N]) as MatMul
// does, for x whose values are bfloat16 (the caller rounded them: a bf16
// network's activations) and w BF16; a backend may read x as bf16. Each
// output is the fp32-accumulated sum of the same terms as MatMul's, but in
// an order that may depend on M: a row is not bit-identical to the row
// MatMul gives, nor to itself in a batch of another size, only within fp32
// accumulation error (about K·2⁻²⁴·Σ|x·w|). So it is for the rows of a
// prompt (prefill), whose later steps need only agree within the stated
// tolerance, never for decode rows, which must not depend on their batch.
// Where the backend's fast product does not apply (few rows, other dtypes)
// MatMulPrompt runs MatMul.
type PromptMatMuler interface {
	MatMulPrompt(dst, x, w, bias Tensor)
}

// MatMulPrompt runs q's prompt product (PromptMatMuler) or MatMul where q
// has none (the CPU backend: every row then equals its decode row, bit for
// bit).
func MatMulPrompt(q Queue, dst, x, w, bias Tensor) {
	if p, ok := q.(PromptMatMuler); ok {
		p.MatMulPrompt(dst, x, w, bias)
		return
	}
	q.MatMul(dst, x, w, bias)
}

// NormMatMulPrompt is NormMatMul for a prompt's rows: h = NormRows(x), then
// dst = MatMulPrompt(h, w, bias).
func NormMatMulPrompt(q Queue, dst, h, x Tensor, n RowNorm, w, bias Tensor) {
	if _, ok := q.(PromptMatMuler); !ok {
		NormMatMul(q, dst, h, x, n, w, bias)
		return
	}
	NormRows(q, h, x, n)
	MatMulPrompt(q, dst, h, w, bias)
}

// NormGLUPrompt is NormGLUSeq with the prompt products (MatMulPrompt): the
// same rounding points, the products' sums in the prompt product's order.
// On a queue without prompt products it is NormGLU.
func NormGLUPrompt(q Queue, dst, a, h, x Tensor, n RowNorm, w1, w3 Tensor, round bool) {
	if _, ok := q.(PromptMatMuler); !ok {
		NormGLU(q, dst, a, h, x, n, w1, w3, round)
		return
	}
	checkNormGLU(dst, a, h, x, w1, w3)
	normGLUSeq(q, dst, a, h, x, n, w1, w3, round, true)
}
