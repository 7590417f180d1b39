package cuda

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// A whole transformer block in one launch (gpu.BlockFuser).
//
// A one-session depthformer frame is 8 codebooks × 6 blocks, and each
// block as ops is seven dependent kernels (the fused norm and qkv
// product, the heads' norms and rotations, the attention, the out
// product, the fused norm and w1, w3 with the GLU, w2): ≈ 340 of a frame's
// ≈ 370 launches, 5–7 µs each on an H200 while their weights take
// 0.5–1.5 µs of HBM time. std_block_f32 (kernels.cu) runs the block's five
// dependent phases in one grid of at most one block per multiprocessor,
// separated by grid-wide barriers on a counter in device memory, each
// phase computing what the op sequence computes through the same device
// functions, so the floats are the sequence's bit for bit.
//
// A grid barrier needs the whole grid resident at once. One grid of at
// most one 512-thread block per multiprocessor is (the kernel's launch
// bounds keep it to one multiprocessor's registers); but two such grids
// on two streams could each hold part of the GPU and wait for the rest.
// So one queue of a device fuses blocks as one grid: the first to ask (the
// engine's depthformer); any other runs the sequence.
//
// By default, though, the kernel is launched a phase at a time: five
// launches a block, programmatically dependent (launch.go), the launch
// boundary in place of the barrier — the same floats. On the H200, with
// the weights' tiled copies, that measured faster than the barriers
// (BenchmarkStdBlock 36.7 against 38.6 µs a block; a one-session frame
// 2.14–2.15 against 2.29 ms; docs/performance.md), and it needs no owner:
// any queue may fuse. Options.GridBlock (OMNIPIPE_CUDA_BLOCK=grid) keeps
// the one grid. The emulator runs a grid's blocks one after another, so
// there each phase is always a launch of its own.
//
// The fused block is not the default (Options.FusedBlock,
// OMNIPIPE_CUDA_BLOCK=phased, turns it on): once the op sequence's kernels
// had their fused norms, the fused SwiGLU and the exact-bf16 fast path,
// the sequence measured faster on the H200 (BenchmarkStdBlock 31.9–32.5
// against 35.3–35.7 µs a block; a one-session frame 1.77–1.80 against
// 1.88–1.92 ms, 2026-12-02). It stays, bit for bit the sequence's, for
// the A/B and for GPUs where the launches cost more.
//
// A phase's launch takes the kernel of that phase alone
// (std_block(t)_f32_p<n>: only its code, only its registers);
// Options.OneKernelBlock (OMNIPIPE_CUDA_BLOCK=onekernel) launches the
// five-phase kernel for each phase instead, for the A/B.

// std_block_f32's shared memory: its static arrays are the products'
// class sums, one set per mmv_tile instantiation (one tile a pass: 8 KiB;
// two tiles, and the dual tile: 16 KiB each) and rms_inv's 8 floats,
// 40,992 bytes; its dynamic part is blockShm's. A block may use 48 KiB
// without opting in, so the dynamic part must stay within the rest, less
// a margin: a normalised row and a head of up to 1,912 floats (the
// depthformer's 1,024 + 32 take 44.3 KiB in all). Wider blocks run as
// their op sequence.
const (
	blockStaticShm = 40992
	blockMaxShm    = 48 << 10
	blockShmMargin = 512
	blockMaxHead   = 256
	blockThreads   = 512
	blockPhases    = 5 // kernels.cu SB_PHASES
)

// blockShm is std_block_f32's dynamic shared memory for b: a normalised
// row and one head, or attn_rows' q, reductions and parts and its scores
// and key rows (Pos + 1 each: the attention keeps them in shared memory).
func blockShm(b gpu.Block) int {
	D, hd := b.X.Cols, b.HeadDim
	return 4 * max(D+hd, hd+32+max(128, hd)+2*(b.Pos+1))
}

// blockUnfusable says why std_block_f32 cannot run b on q ("" when it can).
func (q *Queue) blockUnfusable(b gpu.Block) string {
	B, D := b.X.Rows, b.X.Cols
	_, _, kvd, F := b.Dims()
	switch {
	case q.d.noBlock || q.unfused:
		return "turned off"
	case !q.tensorCores() || q.tileForce || q.mmvForce != "":
		return "not the tensor-core products"
	case !b.Round:
		return "not bf16 rounding"
	case B != 1:
		return fmt.Sprintf("%d rows", B)
	case b.HeadDim > blockMaxHead || b.HeadDim%2 != 0 || F == 0:
		return fmt.Sprintf("heads of %d, feed-forward %d", b.HeadDim, F)
	case blockStaticShm+blockShm(b)+blockShmMargin > blockMaxShm:
		return fmt.Sprintf("width %d: %d bytes of shared memory", D, blockStaticShm+blockShm(b))
	case b.X.DType() != gpu.F32 || b.K.DType() != gpu.F32 || b.V.DType() != gpu.F32 || b.K.Cols != kvd:
		return "activations or caches not F32"
	}
	for _, w := range []gpu.Tensor{b.QKV, b.Out, b.W1, b.W3, b.W2} {
		if w.DType() != gpu.BF16 || q.ptr(w)%16 != 0 || w.Stride%8 != 0 {
			return fmt.Sprintf("weight %v not aligned BF16", w)
		}
	}
	for _, n := range []struct {
		n gpu.RowNorm
		k int
	}{{b.OpNorm, D}, {b.FFNNorm, D}, {b.QNorm, b.HeadDim}, {b.KNorm, b.HeadDim}} {
		if !n.n.W.IsNil() && (n.n.W.Len() < n.k || dtCode(n.n.W.DType()) == 0) {
			return fmt.Sprintf("norm weight %v for %d columns", n.n.W, n.k)
		}
	}
	if _, ok := q.d.fns["std_block_f32"]; !ok {
		return "no kernel"
	}
	if q.phased() {
		return "" // no grid barrier: any queue
	}
	if o := q.d.blockOwner.Load(); o != q && (o != nil || !q.d.blockOwner.CompareAndSwap(nil, q)) {
		return "another queue fuses this device's blocks as one grid"
	}
	return ""
}

// phased reports whether q launches std_block_f32 a phase at a time (the
// default, and always on the emulator) rather than as one grid.
func (q *Queue) phased() bool { return q.d.phasedBlock || q.d.drv != nil && q.d.drv.emulated }

// blockGrid is std_block_f32's grid for b: one block per work item of its
// largest phase, at most one per multiprocessor.
func (q *Queue) blockGrid(b gpu.Block) int {
	D, _, _, F := b.Dims()
	ur := b.HeadDim // kernels.cu's unit of phase 0: whole heads, whole tiles
	for ur%16 != 0 {
		ur += b.HeadDim
	}
	hpu := ur / b.HeadDim
	n := max((b.Heads+2*b.KVHeads+hpu-1)/hpu, b.Heads, (D+15)/16, (F+15)/16)
	return max(1, min(n, q.d.sms))
}

// FuseBlock implements gpu.BlockFuser: std_block_f32 a phase a launch
// (or, with Options.GridBlock, one launch) for a block of one row in bf16
// on the tensor cores; false, having done nothing, for anything else.
func (q *Queue) FuseBlock(b gpu.Block) bool {
	if q.blockUnfusable(b) != "" {
		return false
	}
	if !q.phased() {
		q.blockLaunch(b, 0, blockPhases)
		return true
	}
	for ph := 0; ph < blockPhases; ph++ { // the launch boundaries in place of the barriers
		q.blockLaunch(b, ph, ph+1)
	}
	return true
}

// blockScratch lays out std_block_f32's scratch for b: the offsets (in
// floats, 16-byte aligned) of qkv, q, o, a and g3, and the floats needed
// (the attention's scores stay in shared memory: blockShm).
func blockScratch(b gpu.Block) (offs [5]int, need int) {
	D, hq, kvd, F := b.Dims()
	for j, n := range [5]int{hq + 2*kvd, hq, hq, D, F} {
		offs[j] = need
		need += (n + 3) &^ 3
	}
	return offs, need
}

// blockLaunch records one launch of std_block_f32 for b's phases p0 …
// p1 − 1 (the scratch persists between launches).
func (q *Queue) blockLaunch(b gpu.Block, p0, p1 int) {
	D, _, _, F := b.Dims()
	H, hd := b.Heads, b.HeadDim
	offs, need := blockScratch(b)
	if q.blk == nil || q.blk.n < need {
		q.grow(&q.blk, gpu.F32, need)
	}
	if q.blkBar == nil {
		bar, err := q.d.alloc(gpu.I32, 2, nil) // grid_sync's count and generation, zeroed
		if err != nil {
			panic(fmt.Sprintf("cuda: block barrier: %v", err))
		}
		q.blkBar = bar
	}
	norm := func(n gpu.RowNorm) []arg {
		return []arg{q.t(n.W), p(dtCode(n.W.DType())), f(n.Eps), b2i(n.Round), b2i(n.RoundW && !n.W.IsNil())}
	}
	// The tiled instance where every weight has its tiled copy (tiled.go).
	name, ws := "std_blockt_f32", make([]arg, 0, 5)
	for _, w := range []gpu.Tensor{b.QKV, b.Out, b.W1, b.W3, b.W2} {
		a, ok := q.tiled(w)
		if !ok {
			name, ws = "std_block_f32", nil
			break
		}
		ws = append(ws, p(a))
	}
	if ws == nil {
		ws = []arg{q.t(b.QKV), q.t(b.Out), q.t(b.W1), q.t(b.W3), q.t(b.W2)}
	}
	args := []arg{q.t(b.X), i(D)}
	args = append(args, norm(b.OpNorm)...)
	args = append(args, ws[0], ld(b.QKV), i(H), i(b.KVHeads), i(hd))
	args = append(args, norm(b.QNorm)...)
	args = append(args, norm(b.KNorm)...)
	args = append(args, q.constant(b.RoPE.InvFreq), b2i(b.RoPE.Style == gpu.Interleaved), b2i(b.RoPE.BF16), i(b.Pos),
		q.t(b.K), ld(b.K), q.t(b.V), ld(b.V), f(b.Scale), b2i(b.ProbBF16), ws[1], ld(b.Out))
	args = append(args, norm(b.FFNNorm)...)
	args = append(args, ws[2], ld(b.W1), ws[3], ld(b.W3), i(F), ws[4], ld(b.W2))
	for _, o := range offs {
		args = append(args, q.t(gpu.Tensor{Buf: q.blk, Off: o, Rows: 1, Cols: 1, Stride: 1}))
	}
	args = append(args, q.t(gpu.Tensor{Buf: q.blkBar, Rows: 1, Cols: 2, Stride: 2}), i(p0), i(p1))
	if p1 == p0+1 && !q.d.oneKernelBlock {
		name = phaseKernel(name, p0)
	}
	shm := blockShm(b)
	q.launch(name, [3]uint32{uint32(q.blockGrid(b)), 1, 1}, [2]uint32{blockThreads, 1}, shm, args...)
}

// phaseKernel names the kernel of the block kernel name that holds phase
// ph alone.
func phaseKernel(name string, ph int) string { return fmt.Sprintf("%s_p%d", name, ph) }

// blockPhaseKernels lists the kernels of one phase each of both block
// kernels (kernels.cu: STD_BLOCK).
func blockPhaseKernels() []string {
	var ks []string
	for _, name := range []string{"std_block_f32", "std_blockt_f32"} {
		for ph := range blockPhases {
			ks = append(ks, phaseKernel(name, ph))
		}
	}
	return ks
}
