package cuda

import (
	"fmt"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// normFuseMaxK bounds the row a fused norm keeps in shared memory (48 KiB
// a block without opting in, less the kernels' own few words).
const normFuseMaxK = 12000

// NormMatMul implements gpu.NormFuser: for one row with BF16 weights, one
// kernel (kernels.cu: GEMV_NORM) normalises x in every block — rmsnorm_f32's
// floats, in its order — and runs the one-row product of gemvVariant from
// there, block 0 writing h; otherwise the norm and the product launch
// separately. The bits are the same either way (TestNormFusedEqualsSeparate).
func (q *Queue) NormMatMul(dst, h, x gpu.Tensor, n gpu.RowNorm, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	sameShape("normmatmul", h, x)
	if w.Cols != K || dst.Rows != M || dst.Cols != N || (!bias.IsNil() && bias.Len() < N) ||
		(!n.W.IsNil() && (n.W.Len() < K || dtCode(n.W.DType()) == 0)) {
		panic(fmt.Sprintf("cuda: normmatmul %v · %vᵀ -> %v (bias %v, norm weight %v)", x, w, dst, bias, n.W))
	}
	wantF32("normmatmul", dst, h, x)
	if M != 1 || K == 0 || K > normFuseMaxK || N == 0 || w.DType() != gpu.BF16 || q.d.mmaMatMul || q.tileForce || q.unfused ||
		q.ptr(w)%16 != 0 || w.Stride%8 != 0 || h.Buf == x.Buf || dst.Buf == h.Buf || dst.Buf == x.Buf {
		gpu.NormRows(q, h, x, n)
		q.MatMul(dst, h, w, bias)
		return
	}
	// The one-row kernel's variant with four chunks in flight (the eight-
	// chunk ones hold too many registers through the norm: measured slower).
	name, rows := gemvVariant(N, K)
	name = strings.Replace(strings.Replace(name, "u8", "u4", 1), "gemv_", "gemvn_", 1)
	if name == "gemvn_bf16" {
		name = "gemvn_bf16_c4u4"
	}
	q.launchEpi(epiProduct, dst, name, [3]uint32{uint32((N + rows - 1) / rows), 1, 1}, blk128, 4*K,
		q.t(dst), q.t(h), q.t(x), i(K), f(n.Eps), b2i(n.Round), q.t(n.W), p(dtCode(n.W.DType())), b2i(n.RoundW && !n.W.IsNil()),
		q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(N))
}

// HeadNormRoPE implements gpu.NormFuser: one kernel (kernels.cu:
// headnorm_rope_f32) per (row, head) block normalises the head as
// rmsnorm_f32 does and rotates it as rope_f32 does, reading src and
// writing dst — a copy, a norm and a rotation in one launch, the same
// floats.
func (q *Queue) HeadNormRoPE(dst, src gpu.Tensor, n gpu.RowNorm, rp gpu.RoPEParams, round bool) {
	hd := rp.HeadDim
	if hd <= 0 || hd%2 != 0 || dst.Cols%hd != 0 || len(rp.InvFreq) != hd/2 || len(rp.Pos) != dst.Rows ||
		dst.Rows != src.Rows || dst.Cols != src.Cols || (!n.W.IsNil() && (n.W.Len() < hd || dtCode(n.W.DType()) == 0)) {
		panic(fmt.Sprintf("cuda: head norm-rope %v from %v, head %d, invfreq %d, pos %d, weight %v", dst, src, hd, len(rp.InvFreq), len(rp.Pos), n.W))
	}
	wantF32("headnormrope", dst, src)
	if dst.Rows == 0 {
		return
	}
	if q.unfused || 4*hd > 4*normFuseMaxK || (dst.Buf == src.Buf && !sameView(dst, src)) {
		gpu.HeadNormRoPESeq(q, dst, src, n, rp, round)
		return
	}
	heads := dst.Cols / hd
	invf := q.constant(rp.InvFreq)
	po := q.put(bytesOf(rp.Pos))
	q.launch("headnorm_rope_f32", [3]uint32{uint32(dst.Rows * heads), 1, 1}, blk128, 4*hd,
		q.t(dst), ld(dst), q.t(src), ld(src), i(heads), i(hd), f(n.Eps), b2i(n.Round), q.t(n.W), p(dtCode(n.W.DType())),
		b2i(n.RoundW && !n.W.IsNil()), b2i(rp.Style == gpu.Interleaved), invf, upload(po), b2i(rp.BF16), b2i(round))
}
