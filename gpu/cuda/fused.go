package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// normFuseMaxK bounds the row a fused norm keeps in shared memory (48 KiB
// a block without opting in, less the kernels' own few words).
const normFuseMaxK = 12000

// NormMatMul implements gpu.NormFuser: for one row with BF16 weights, one
// kernel normalises x in every block — rmsnorm_f32's floats, in its order —
// and runs the one-row product from there, block 0 writing h: GEMV_NORM on
// the FMA kernels (gemvVariant's product), MMV_NORM on the tensor cores
// (up to mmvMaxN weight rows and mmvNormMaxK columns); otherwise the norm
// and the product launch separately. The bits are the same either way
// (TestNormFusedEqualsSeparate).
func (q *Queue) NormMatMul(dst, h, x gpu.Tensor, n gpu.RowNorm, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	sameShape("normmatmul", h, x)
	if w.Cols != K || dst.Rows != M || dst.Cols != N || (!bias.IsNil() && bias.Len() < N) ||
		(!n.W.IsNil() && (n.W.Len() < K || dtCode(n.W.DType()) == 0)) {
		panic(fmt.Sprintf("cuda: normmatmul %v · %vᵀ -> %v (bias %v, norm weight %v)", x, w, dst, bias, n.W))
	}
	wantF32("normmatmul", dst, h, x)
	name, block, rows := q.normMatMulKernel(M, K, N, w)
	if name == "" || h.Buf == x.Buf || dst.Buf == h.Buf || dst.Buf == x.Buf {
		gpu.NormRows(q, h, x, n)
		q.MatMul(dst, h, w, bias)
		return
	}
	wp := q.t(w)
	if tw, ok := q.tiled(w); ok && name == mmvNormDefault.name {
		name, wp = mmvNormTiled, p(tw)
	}
	q.launchEpi(epiProduct, dst, name, [3]uint32{q.normGrid(name, (N+rows-1)/rows), 1, 1}, block, 4*K,
		q.t(dst), q.t(h), q.t(x), i(K), f(n.Eps), b2i(n.Round), q.t(n.W), p(dtCode(n.W.DType())), b2i(n.RoundW && !n.W.IsNil()),
		wp, ld(w), q.t(bias), p(dtCode(bias.DType())), i(N))
}

// normGrid is the grid of fused-norm kernel name for its tiles: a block
// a tile where the GPU holds them all at once, where the kernel takes one
// tile a block (not of normGridKernels: the FMA kernels) or with
// Options.TilePerBlock; else as many blocks as the GPU holds, each
// normalising the row once and taking its tiles in turn (MMV_NORM_TILES)
// — a block a tile would normalise it again in every wave of blocks.
func (q *Queue) normGrid(name string, tiles int) uint32 {
	if n := q.d.resident[name]; n > 0 && n < tiles && !q.d.tilePerBlock {
		return uint32(n)
	}
	return uint32(tiles)
}

// mmvNormTiled is mmvNormDefault on weights in the tiled layout.
const mmvNormTiled = "mmvnt_bf16_w16"

// gemvnKernels names the FMA fused kernel by the one-row product's rows
// per warp (a table: NormMatMul runs a few times a layer).
var gemvnKernels = [5]string{1: "gemvn_bf16_c1u4", 2: "gemvn_bf16_c2u4", 4: "gemvn_bf16_c4u4"}

// normMatMulKernel returns the fused kernel for a product of M rows, K
// columns and N weight rows, its block and the weight rows a block
// covers, or "" where the norm and the
// product run apart: more than one row, a row beyond shared memory,
// non-BF16 or unaligned weights, and on the tensor cores a weight past
// the few-row kernels (mmvMaxN). The FMA kernel takes the one-row
// product's rows per warp with four chunks in flight (the eight-chunk
// variants hold too many registers through the norm: measured slower).
func (q *Queue) normMatMulKernel(M, K, N int, w gpu.Tensor) (name string, block [2]uint32, rows int) {
	if M != 1 || K == 0 || K > normFuseMaxK || N == 0 || w.DType() != gpu.BF16 || q.tileForce || q.unfused ||
		q.ptr(w)%16 != 0 || w.Stride%8 != 0 {
		return "", blk128, 0
	}
	if !q.tensorCores() {
		_, rows := gemvVariant(N, K)
		return gemvnKernels[rows/4], blk128, rows
	}
	v := mmvNormDefault
	switch {
	case strings.HasPrefix(q.mmvForce, "mmvn_"):
		v = mmvByName(q.mmvForce)
	case q.mmvForce != "" || K > mmvNormMaxK || N > mmvMaxN:
		return "", blk128, 0
	}
	return v.name, v.block(), 16 * v.nt
}

// headItemBytes is the size of kernels.cu's struct head_item.
const headItemBytes = 72

// PrepHeads implements gpu.NormFuser: one launch of prep_heads_f32 for all
// the items, one block per (item, row, head) — a copy, or the head's norm
// as rmsnorm_f32 computes it and its rotation as rope_f32 does, the same
// floats. The items' pointers travel in the launch's uploaded bytes, so a
// replayed graph whose destination rows move (a cache row a step) needs no
// node update. Items the kernel cannot take run as their op sequence.
func (q *Queue) PrepHeads(rp gpu.RoPEParams, round bool, items []gpu.HeadPrep) {
	hd := rp.HeadDim
	rows := -1
	for _, it := range items {
		wantF32("prepheads", it.Dst, it.Src)
		if rows >= 0 && it.Dst.Rows != rows {
			panic(fmt.Sprintf("cuda: prep heads: items of %d and %d rows", rows, it.Dst.Rows))
		}
		rows = it.Dst.Rows
		if !it.Copy && (!it.Norm.W.IsNil() && (it.Norm.W.Len() < hd || dtCode(it.Norm.W.DType()) == 0)) {
			panic(fmt.Sprintf("cuda: prep heads: norm weight %v for heads of %d", it.Norm.W, hd))
		}
	}
	if len(items) == 0 || rows == 0 {
		return
	}
	norms := false
	for _, it := range items {
		norms = norms || !it.Copy
	}
	if norms && (hd <= 0 || hd%2 != 0 || len(rp.InvFreq) != hd/2 || len(rp.Pos) != rows) {
		panic(fmt.Sprintf("cuda: prep heads: head %d, invfreq %d, pos %d for %d rows", hd, len(rp.InvFreq), len(rp.Pos), rows))
	}
	fuse := !q.unfused && hd > 0 && hd <= normFuseMaxK
	for i, it := range items {
		if it.Dst.Buf == it.Src.Buf && !gpu.SameView(it.Dst, it.Src) {
			fuse = false // a partial overlap: the blocks could race
		}
		if hd > 0 && it.Dst.Cols%hd != 0 {
			fuse = false // a copy item the kernel's whole heads would not cover
		}
		for j, o := range items {
			if i != j && (it.Dst.Buf == o.Src.Buf || it.Dst.Buf == o.Dst.Buf) && !disjointCols(it.Dst, o) {
				fuse = false
			}
		}
	}
	if !fuse {
		gpu.PrepHeadsSeq(q, rp, round, items)
		return
	}
	buf := make([]byte, headItemBytes*len(items))
	blocks := 0
	for i, it := range items {
		b := buf[i*headItemBytes:]
		heads := it.Dst.Cols / hd
		le := binary.LittleEndian
		le.PutUint64(b[0:], uint64(q.ptr(it.Dst)))
		le.PutUint64(b[8:], uint64(it.Dst.Stride))
		le.PutUint64(b[16:], uint64(q.ptr(it.Src)))
		le.PutUint64(b[24:], uint64(it.Src.Stride))
		le.PutUint64(b[32:], uint64(q.ptr(it.Norm.W)))
		le.PutUint32(b[40:], uint32(heads))
		le.PutUint32(b[44:], uint32(hd))
		le.PutUint32(b[48:], uint32(dtCode(it.Norm.W.DType())))
		le.PutUint32(b[52:], uint32(b01(it.Norm.Round)))
		le.PutUint32(b[56:], uint32(b01(it.Norm.RoundW && !it.Norm.W.IsNil())))
		le.PutUint32(b[60:], uint32(b01(it.Copy)))
		le.PutUint32(b[64:], uint32(blocks))
		le.PutUint32(b[68:], math.Float32bits(it.Norm.Eps))
		blocks += rows * heads
	}
	off := q.put(buf)
	var invf arg
	var pos int
	if norms {
		invf = q.constant(rp.InvFreq)
		pos = q.put(bytesOf(rp.Pos))
	} else {
		invf, pos = p(0), q.put(make([]byte, 4))
	}
	q.launch("prep_heads_f32", [3]uint32{uint32(blocks), 1, 1}, blk128, 4*hd,
		upload(off), i(len(items)), b2i(rp.Style == gpu.Interleaved), invf, upload(pos), b2i(rp.BF16), b2i(round))
}

// disjointCols says an item's destination and another item's tensors of
// the same buffer cover different columns of the same rows (q, k and v of
// one packed qkv) — the only sharing PrepHeads fuses.
func disjointCols(d gpu.Tensor, o gpu.HeadPrep) bool {
	for _, t := range []gpu.Tensor{o.Src, o.Dst} {
		if t.Buf != d.Buf {
			continue
		}
		if t.Stride != d.Stride || t.Rows != d.Rows {
			return false
		}
		// Same rows: column ranges [off, off+cols) mod stride must not meet.
		a0, b0 := d.Off%d.Stride, t.Off%t.Stride
		if d.Off-a0 != t.Off-b0 || (a0 < b0+t.Cols && b0 < a0+d.Cols) {
			return false
		}
	}
	return true
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

// NormGLU implements gpu.GLUFuser: for one row with BF16 weights on the
// tensor cores, one launch of mmvng_bf16_w16 (mmvngt_bf16_w16 where both
// weights have their tiled copies) normalises x as NormMatMul's kernel
// does and runs the gate's and the up product's 16-row tiles together
// (mmv_tile's dual tile, the one std_block_f32's feed-forward takes), with
// the sequence's roundings in its epilogue. false, having done nothing,
// where NormMatMul would not fuse the norm (more rows, wider rows,
// unaligned or non-BF16 weights, the FMA products, a forced variant).
func (q *Queue) NormGLU(dst, h, x gpu.Tensor, n gpu.RowNorm, w1, w3 gpu.Tensor, round bool) bool {
	M, K, N := x.Rows, x.Cols, w1.Rows
	if !q.tensorCores() || q.mmvForce != "" || w3.DType() != gpu.BF16 || q.ptr(w3)%16 != 0 || w3.Stride%8 != 0 ||
		h.Buf == x.Buf || dst.Buf == h.Buf || dst.Buf == x.Buf ||
		(!n.W.IsNil() && (n.W.Len() < K || dtCode(n.W.DType()) == 0)) {
		return false
	}
	if name, _, _ := q.normMatMulKernel(M, K, N, w1); name != mmvNormDefault.name {
		return false
	}
	wantF32("normglu", dst, h, x)
	name, w1p, w3p := "mmvng_bf16_w16", q.t(w1), q.t(w3)
	t1, ok1 := q.tiled(w1)
	t3, ok3 := q.tiled(w3)
	if ok1 && ok3 {
		name, w1p, w3p = "mmvngt_bf16_w16", p(t1), p(t3)
	}
	q.launch(name, [3]uint32{q.normGrid(name, (N+15)/16), 1, 1}, mmvNormDefault.block(), 4*K,
		q.t(dst), q.t(h), q.t(x), i(K), f(n.Eps), b2i(n.Round), q.t(n.W), p(dtCode(n.W.DType())), b2i(n.RoundW && !n.W.IsNil()),
		w1p, ld(w1), w3p, ld(w3), i(N), b2i(round), b2i(round), b2i(round))
	return true
}
