package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// fakeBlock is a gpu.Block of rows rows and width D on fake tensors (the
// depthformer's head layout), for the fusion rules.
func fakeBlock(rows, D, hd, F int) gpu.Block {
	H, KVH := 32, 8
	if D/hd < H {
		H, KVH = D/hd, 1
	}
	hq, kvd := H*hd, KVH*hd
	nw := func(n int) gpu.RowNorm { return gpu.RowNorm{Eps: 1e-5, W: fakeTensor(gpu.BF16, 1, n), RoundW: true} }
	return gpu.Block{
		X: fakeTensor(gpu.F32, rows, D), OpNorm: nw(D), FFNNorm: nw(D), QNorm: nw(hd), KNorm: nw(hd),
		QKV: fakeTensor(gpu.BF16, hq+2*kvd, D), Out: fakeTensor(gpu.BF16, D, hq),
		W1: fakeTensor(gpu.BF16, F, D), W3: fakeTensor(gpu.BF16, F, D), W2: fakeTensor(gpu.BF16, D, F),
		RoPE:  gpu.RoPEParams{Style: gpu.Interleaved, InvFreq: make([]float32, hd/2)},
		Heads: H, KVHeads: KVH, HeadDim: hd, Scale: gpu.AttnScale(hd), ProbBF16: true,
		K: fakeTensor(gpu.F32, 8, rows*kvd), V: fakeTensor(gpu.F32, 8, rows*kvd), Pos: 3, Round: true,
	}
}

// TestBlockFusionRules: which blocks std_block_f32 takes — one row, bf16
// rounding, the tensor-core products, a width whose row and head fit its
// shared memory beside the static arrays — and that, launched as one grid
// (Options.GridBlock), one queue of a device takes them, a phase a launch
// any queue; the grid is one block per item of the largest phase, at most
// one per multiprocessor.
func TestBlockFusionRules(t *testing.T) {
	q := hostQueue()
	q.d.mmaMatMul = true
	depth := fakeBlock(1, 1024, 32, 2816)
	if why := q.blockUnfusable(depth); why != "" {
		t.Fatalf("the depthformer's block is refused: %s", why)
	}
	if n := blockStaticShm + blockShm(depth); n > blockMaxShm {
		t.Errorf("the depthformer's block needs %d bytes of shared memory", n)
	}
	if g := q.blockGrid(depth); g != 132 {
		t.Errorf("grid %d for 176 w1/w3 tiles on 132 multiprocessors, want 132", g)
	}
	if g := q.blockGrid(fakeBlock(1, 128, 32, 160)); g != 10 {
		t.Errorf("grid %d for a block of at most 10 items a phase, want 10", g)
	}
	noRound := depth
	noRound.Round = false
	for _, c := range []struct {
		name string
		b    gpu.Block
		why  string
	}{
		{"two rows", fakeBlock(2, 1024, 32, 2816), "rows"},
		{"fp32 rounding", noRound, "bf16"},
		{"width 2048", fakeBlock(1, 2048, 64, 5632), "shared memory"},
		{"odd head", fakeBlock(1, 1020, 15, 64), "heads"},
	} {
		if why := q.blockUnfusable(c.b); !strings.Contains(why, c.why) {
			t.Errorf("%s: refused for %q, want %q", c.name, why, c.why)
		}
	}
	fma := hostQueue()
	if why := fma.blockUnfusable(depth); !strings.Contains(why, "tensor-core") {
		t.Errorf("FMA products: refused for %q", why)
	}
	other := &Queue{d: q.d, name: "other"}
	q.d.phasedBlock = true
	if why := other.blockUnfusable(depth); why != "" {
		t.Errorf("a second queue of the device, a phase a launch: refused for %q", why)
	}
	q.d.phasedBlock = false // one grid: one queue
	if why := other.blockUnfusable(depth); !strings.Contains(why, "another queue") {
		t.Errorf("a second queue of the device: refused for %q, want another queue's", why)
	}
	if why := q.blockUnfusable(depth); why != "" {
		t.Errorf("the owner refused after a second queue asked: %s", why)
	}
}

// TestBlockPhaseKernels: a block a phase a launch takes the kernel of each
// phase alone by default and the five-phase kernel with
// Options.OneKernelBlock (on the weights' rows here: fake tensors have no
// tiled copies); one grid always takes the five-phase kernel.
func TestBlockPhaseKernels(t *testing.T) {
	for _, c := range []struct {
		name        string
		phased, one bool
		want        []string
	}{
		{"a kernel a phase", true, false, []string{"std_block_f32_p0", "std_block_f32_p1", "std_block_f32_p2", "std_block_f32_p3", "std_block_f32_p4"}},
		{"the five-phase kernel a phase", true, true, []string{"std_block_f32", "std_block_f32", "std_block_f32", "std_block_f32", "std_block_f32"}},
		{"one grid", false, false, []string{"std_block_f32"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := hostQueue()
			q.d.mmaMatMul, q.d.phasedBlock, q.d.oneKernelBlock = true, c.phased, c.one
			q.blk = &buffer{ptr: 1 << 41, dt: gpu.F32, n: 1 << 20}
			q.blkBar = &buffer{ptr: 1 << 42, dt: gpu.I32, n: 2}
			if !q.FuseBlock(fakeBlock(1, 1024, 32, 2816)) {
				t.Fatal("the depthformer's block was not fused")
			}
			if len(q.rec.cmds) != len(c.want) {
				t.Fatalf("%d launches, want %d", len(q.rec.cmds), len(c.want))
			}
			for j, cm := range q.rec.cmds {
				if cm.fn != q.d.fns[c.want[j]] {
					t.Errorf("launch %d: %s, want %s", j, q.d.fnNames[cm.fn], c.want[j])
				}
			}
		})
	}
}

// TestPrepAttentionRules: the op sequence of a depthformer block (one row,
// or a batch's rows as one row of their heads) prepares its heads inside
// its attention (prep_attention_f32, one launch where prep_heads_f32 and
// attention_f32 were two), and an attention the kernel does not take — a
// window, two query rows, paged keys — runs PrepHeads then Attention.
func TestPrepAttentionRules(t *testing.T) {
	tmp := func(r, c int) gpu.Tensor { return fakeTensor(gpu.F32, r, c) }
	names := func(q *Queue) []string {
		var out []string
		for _, cm := range q.rec.cmds {
			out = append(out, q.d.fnNames[cm.fn])
		}
		return out
	}
	for _, rows := range []int{1, 3} {
		q := hostQueue()
		gpu.BlockSeq(q, fakeBlock(rows, 1024, 32, 2816), tmp)
		got := names(q)
		if !slices.Contains(got, "prep_attention_f32") || slices.Contains(got, "prep_heads_f32") || slices.Contains(got, "attention_f32") {
			t.Errorf("%d rows: the block's launches %v, want prep_attention_f32 for its heads and attention", rows, got)
		}
	}
	b := fakeBlock(1, 1024, 32, 2816)
	hq, kvd := b.Heads*b.HeadDim, b.KVHeads*b.HeadDim
	qkv := fakeTensor(gpu.F32, 2, hq+2*kvd)
	items := func(r int) []gpu.HeadPrep {
		return []gpu.HeadPrep{
			{Dst: qkv.Slice(0, r).ColSlice(0, hq), Src: qkv.Slice(0, r).ColSlice(0, hq), Norm: b.QNorm},
			{Dst: b.K.Row(b.Pos).Reshape(r, kvd), Src: qkv.Slice(0, r).ColSlice(hq, hq+kvd), Norm: b.KNorm},
			{Dst: b.V.Row(b.Pos).Reshape(r, kvd), Src: qkv.Slice(0, r).ColSlice(hq+kvd, hq+2*kvd), Copy: true},
		}
	}
	rp := b.RoPE
	rp.HeadDim, rp.Pos = b.HeadDim, []int32{int32(b.Pos)}
	ap := gpu.AttnParams{Heads: b.Heads, KVHeads: b.KVHeads, HeadDim: b.HeadDim, Scale: b.Scale, QPos0: b.Pos, Causal: true, ProbBF16: true}
	for _, c := range []struct {
		name  string
		ap    func(gpu.AttnParams) gpu.AttnParams
		fused bool
	}{
		{"a decode row", func(a gpu.AttnParams) gpu.AttnParams { return a }, true},
		{"a window", func(a gpu.AttnParams) gpu.AttnParams { a.Window = 2; return a }, false},
		{"not causal", func(a gpu.AttnParams) gpu.AttnParams { a.Causal = false; return a }, false},
		{"keys past the row's position", func(a gpu.AttnParams) gpu.AttnParams { a.QPos0--; return a }, false},
	} {
		it := items(1)
		o := fakeTensor(gpu.F32, 1, hq)
		k, v := b.K.Slice(0, b.Pos+1), b.V.Slice(0, b.Pos+1)
		if got := prepAttnFits(rp, it, o, it[0].Dst, k, v, c.ap(ap)); got != c.fused {
			t.Errorf("%s: fused %v, want %v", c.name, got, c.fused)
		}
	}
	// Two query rows, paged keys, and a query that is not the prepared
	// heads' memory: the sequence.
	it := items(1)
	k, v := b.K.Slice(0, b.Pos+1), b.V.Slice(0, b.Pos+1)
	paged := ap
	paged.Blocks, paged.BlockRows, paged.Keys = fakeTensor(gpu.I32, 1, 8), 1, b.Pos+1
	for _, c := range []struct {
		name   string
		items  []gpu.HeadPrep
		qt     gpu.Tensor
		ap     gpu.AttnParams
		k, dst gpu.Tensor
	}{
		{"two query rows", it, fakeTensor(gpu.F32, 2, hq), ap, k, fakeTensor(gpu.F32, 2, hq)},
		{"paged keys", it, it[0].Dst, paged, k, fakeTensor(gpu.F32, 1, hq)},
		{"another query tensor", it, fakeTensor(gpu.F32, 1, hq), ap, k, fakeTensor(gpu.F32, 1, hq)},
		{"keys of another buffer", it, it[0].Dst, ap, fakeTensor(gpu.F32, b.Pos+1, kvd), fakeTensor(gpu.F32, 1, hq)},
	} {
		if prepAttnFits(rp, c.items, c.dst, c.qt, c.k, v, c.ap) {
			t.Errorf("%s: fused", c.name)
		}
	}
}
