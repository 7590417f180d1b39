package cuda

import (
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
