package lfm2

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// promptRows is a prompt long enough for a GPU's prompt products (the
// CUDA backend hands 32 rows or more to cuBLAS).
const promptRows = 70

// TestPromptRowsWithinTolerance: a prefill of N rows then k steps against
// one prefill of N+k rows, with N+k past the prompt products' threshold.
// Where the queue has no prompt products (the CPU) they are equal bit for
// bit. Where it has (CUDA: cuBLAS, whose sums run in another order than
// the steps' products), each product differs from the steps' within fp32
// accumulation error, which the bf16 roundings after it mostly absorb;
// the rows must stay within what the bf16 roundings themselves do to the
// same rows — the distance between the BF16 and the F32 run of the whole
// prefill, the yardstick of every tolerance here (the reference's own
// bf16-vs-float64 distance, measured on these rows).
func TestPromptRowsWithinTolerance(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		tm := loadTestModelOn(t, dev)
		H := tm.cfg.LFM.HiddenSize
		const k = 6
		N := promptRows - k
		c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
		x, _ := randomRows(tm.dev, c.Q, N+k, H, 7)
		whole, got, _ := prefillAndSteps(t, tm, c, x, N)
		_, prompt := c.Q.(gpu.PromptMatMuler)
		if !prompt {
			if !slices.Equal(got, whole) {
				t.Errorf("without prompt products: prefill %d + %d steps differs from prefill %d", N, k, N+k)
			}
			return
		}
		c32 := nn.NewCtx(tm.dev, tm.dev.NewQueue("test-f32"), nn.F32)
		x32, _ := randomRows(tm.dev, c32.Q, N+k, H, 7)
		exact := read(t, c32, tm.m.Forward(c32, x32, []Seq{{Cache: tm.m.NewCache(tm.dev), Rows: N + k}}))
		yard := numcmp.Compare(whole, exact).MaxAbs
		d := numcmp.Compare(got, whole)
		t.Logf("prefill %d + %d steps vs prefill %d: %v; BF16 vs F32 run of the prefill: max|Δ| %.4g", N, k, N+k, d, yard)
		if d.MaxAbs > yard {
			t.Errorf("prompt products: max|Δ| %.4g beyond the bf16 roundings' own %.4g", d.MaxAbs, yard)
		}
		// The prompt's own rows (the first N) come from the same products
		// in both runs only where their prompt products had the same rows:
		// here they did not (N against N+k), so they too are compared
		// within the yardstick above. A replay of the same prefill gives
		// the same bits (the vendor GEMM is deterministic for a shape).
		again := read(t, c, tm.m.Forward(c, x, []Seq{{Cache: tm.m.NewCache(tm.dev), Rows: N + k}}))
		if i := gputest.FirstDiff(again, whole); i >= 0 {
			t.Errorf("the same prefill twice differs at %d: %g then %g", i, whole[i], again[i])
		}
	})
}

// TestDecodeRowsBesidePrompt: decode rows stepped in one batch with
// another session's long prompt chunk equal their separate steps bit for
// bit (decode rows never take the prompt products), and the chunk equals
// its own separate prefill (the same rows of one prompt run, so the same
// products).
func TestDecodeRowsBesidePrompt(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		batchEqualsSeparate(t, loadTestModelOn(t, dev), []int{5, 9, 3}, []int{1, promptRows, 1})
	})
}
