package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// gpu.RunBlock (a fused block where the queue has one) against
// gpu.BlockSeq on the same queue, bit for bit: the block's output row and
// both caches (the rows at Pos written, the others left alone). Every op of
// the sequence has its own float64 replay here; a block's intermediates
// are not outputs of the op, so a whole-block float64 bound would have to
// let every bf16 rounding point flip (it came out at 1e10 for a 128-wide
// block: useless). Backends that fuse the block check its phases against a
// float64 replay themselves, from the intermediates they can read (package
// cuda: TestStdBlockPhasesReplay). On a queue without a fused block both
// runs are the sequence: the check then holds only the sequence's
// determinism.

// blockShape is a block check's shape: width, heads, KV heads, head size,
// feed-forward width, position, RoPE style and precision.
type blockShape struct {
	D, H, KVH, hd, F, pos int
	style                 gpu.RoPEStyle
	ropeBF16              bool
}

// blockCases are the block checks' shapes: the depthformer's layout at a
// small width (four heads of 4 to a 16-row tile), ragged widths, heads
// wider than a tile and not dividing it, rotate-half RoPE in bf16, the
// first and later positions, and a cache of 41 keys.
var blockCases = []blockShape{
	{128, 32, 8, 4, 352, 5, gpu.Interleaved, false},
	{128, 4, 1, 32, 352, 3, gpu.Interleaved, false},
	{200, 2, 2, 64, 136, 0, gpu.RotateHalf, true},
	{112, 5, 1, 24, 40, 2, gpu.Interleaved, false},
	{64, 2, 1, 32, 48, 40, gpu.Interleaved, false},
}

// The cases take turns with their weights at their buffers' first row and
// one row down (package cuda fuses the first on its weights' tiled copies,
// the second on their rows; its TestStdBlockEqualsSeq runs every shape
// both ways).
func checkBlock(h *harness) {
	for i, c := range blockCases {
		blockCase(h, c, i%2)
	}
}

// blockCase checks one shape with its weights top rows down their buffers.
func blockCase(h *harness, c blockShape, top int) {
	hq, kvd := c.H*c.hd, c.KVH*c.hd
	name := fmt.Sprintf("D=%d/heads=%d/%d/hd=%d/F=%d/pos=%d/ropebf16=%v/weights@row%d", c.D, c.H, c.KVH, c.hd, c.F, c.pos, c.ropeBF16, top)
	wt := func(rows, cols int) operand {
		h.top = top + 1
		defer func() { h.top = 0 }()
		return h.weight(gpu.BF16, rows, cols, false, float32(1/math.Sqrt(float64(cols))))
	}
	nw := func(n int) operand { // norm weights near 1
		v := h.values(n, 0.3)
		for i := range v {
			v[i] = gpu.RoundBF16(1 + v[i])
		}
		return h.load(gpu.BF16, 1, n, false, v, nil)
	}
	qkv, out, w1, w3, w2 := wt(hq+2*kvd, c.D), wt(c.D, hq), wt(c.F, c.D), wt(c.F, c.D), wt(c.D, c.F)
	opn, ffn, qn, kn := nw(c.D), nw(c.D), nw(c.hd), nw(c.hd)
	invf := make([]float32, c.hd/2)
	for j := range invf {
		invf[j] = float32(math.Pow(1e6, -2*float64(j)/float64(c.hd)))
	}
	rows := c.pos + 2 // a row past Pos, which the block must leave alone
	kv, vv := h.bf16Values(rows*kvd, 1), h.bf16Values(rows*kvd, 1)
	k, v := h.input(rows, kvd, false, kv), h.input(rows, kvd, false, vv)
	xv := h.bf16Values(c.D, 2)
	x := h.input(1, c.D, false, xv)
	b := gpu.Block{
		X: x.view, QKV: qkv.view, Out: out.view, W1: w1.view, W3: w3.view, W2: w2.view,
		OpNorm:  gpu.RowNorm{Eps: 1e-5, W: opn.view, RoundW: true},
		FFNNorm: gpu.RowNorm{Eps: 1e-5, W: ffn.view, RoundW: true},
		QNorm:   gpu.RowNorm{Eps: 1e-5, W: qn.view, RoundW: true},
		KNorm:   gpu.RowNorm{Eps: 0.5, W: kn.view, RoundW: true},
		RoPE:    gpu.RoPEParams{Style: c.style, InvFreq: invf, BF16: c.ropeBF16},
		Heads:   c.H, KVHeads: c.KVH, HeadDim: c.hd, Scale: gpu.AttnScale(c.hd), ProbBF16: true,
		K: k.view, V: v.view, Pos: c.pos, Round: true,
	}
	tmp := func(r, cols int) gpu.Tensor {
		t := h.dev.Alloc(gpu.F32, r, cols)
		h.owned = append(h.owned, t)
		return t
	}
	gpu.BlockSeq(h.q, b, tmp)
	var want [3][]float64
	for j, o := range []operand{x, k, v} {
		got, err := h.readView(o)
		if err != nil {
			h.fail(name, "%v", err)
			return
		}
		want[j] = make([]float64, len(got))
		for i, g := range got {
			want[j][i] = float64(g)
		}
	}
	// The same inputs again, through RunBlock.
	h.q.Write(x.view, xv)
	h.q.Write(k.view, kv)
	h.q.Write(v.view, vv)
	gpu.RunBlock(h.q, b, tmp)
	h.verify(name+"/k", k, want[1], nil)
	h.verify(name+"/v", v, want[2], nil)
	h.verify(name+"/x", x, want[0], nil, qkv, out, w1, w3, w2)
}
