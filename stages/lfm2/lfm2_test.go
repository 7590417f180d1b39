package lfm2

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

func TestInvFreqMatchesReference(t *testing.T) {
	// manifest.json inv_freq_bf16 for head_dim 6, θ = 1e6.
	want := []float32{1.0, 0.010009765625, 0.00010013580322265625}
	if got := InvFreqBF16(1e6, 6); !slices.Equal(got, want) {
		t.Errorf("InvFreqBF16 = %v, want %v", got, want)
	}
}

func randomRows(dev gpu.Device, q gpu.Queue, rows, cols int, seed uint64) (gpu.Tensor, []float32) {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = gpu.RoundBF16(float32(r.NormFloat64()))
	}
	x := dev.Alloc(gpu.F32, rows, cols)
	q.Write(x, v)
	return x, v
}

// TestStepsEqualPrefill: a prefill of N rows then k single steps gives, bit
// for bit, the rows of one prefill of N+k, in both precisions.
func TestStepsEqualPrefill(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) { stepsEqualPrefill(t, loadTestModelOn(t, dev)) })
}

// stepsEqualPrefill: on every device, bit for bit — the products sum in an
// order that depends on K only and attention and the short convolution
// treat a row the same whether it comes in a prefill or a step.
func stepsEqualPrefill(t *testing.T, tm *testModel) {
	H := tm.cfg.LFM.HiddenSize
	const N, k = 11, 7
	for _, prec := range []nn.Precision{nn.BF16, nn.F32} {
		c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), prec)
		x, _ := randomRows(tm.dev, c.Q, N+k, H, 3)
		whole, got, cache := prefillAndSteps(t, tm, c, x, N)
		if !slices.Equal(got, whole) {
			t.Errorf("%v: prefill %d + %d steps differs from prefill %d", prec, N, k, N+k)
		}
		if cache.Len() != N+k {
			t.Errorf("cache holds %d positions, want %d", cache.Len(), N+k)
		}
	}
}

// prefillAndSteps returns the rows of one prefill of x's rows and those of
// a prefill of its first N rows followed by a single step for each of the
// others, with that second run's cache.
func prefillAndSteps(t testing.TB, tm *testModel, c *nn.Ctx, x gpu.Tensor, N int) (whole, stepped []float32, cache *Cache) {
	whole = read(t, c, tm.m.Forward(c, x, []Seq{{Cache: tm.m.NewCache(tm.dev), Rows: x.Rows}}))
	cache = tm.m.NewCache(tm.dev)
	stepped = read(t, c, tm.m.Forward(c, x.Slice(0, N), []Seq{{Cache: cache, Rows: N}}))
	for r := N; r < x.Rows; r++ {
		stepped = append(stepped, read(t, c, tm.m.Forward(c, x.Row(r), []Seq{{Cache: cache, Rows: 1}}))...)
	}
	return whole, stepped, cache
}

// TestBatchEqualsSeparate: three sessions at different positions stepped
// as one batch give the rows of three separate runs, bit for bit.
func TestBatchEqualsSeparate(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		// One decode step, a chunk of three, two.
		batchEqualsSeparate(t, loadTestModelOn(t, dev), []int{5, 13, 1}, []int{1, 3, 2})
	})
}

// batchEqualsSeparate: sessions with prompts of the given lengths, stepped
// as one batch by newRows[i] rows each, give each session's rows of its
// separate run, bit for bit.
func batchEqualsSeparate(t *testing.T, tm *testModel, prompts, newRows []int) {
	H := tm.cfg.LFM.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
	batched, separate := make([]*Cache, len(prompts)), make([]*Cache, len(prompts))
	for i, n := range prompts {
		x, _ := randomRows(tm.dev, c.Q, n, H, uint64(10+i))
		batched[i], separate[i] = tm.m.NewCache(tm.dev), tm.m.NewCache(tm.dev)
		tm.m.Forward(c, x, []Seq{{Cache: batched[i], Rows: n}})
		tm.m.Forward(c, x, []Seq{{Cache: separate[i], Rows: n}})
	}
	total := 0
	for _, n := range newRows {
		total += n
	}
	x, _ := randomRows(tm.dev, c.Q, total, H, 99)
	seqs := make([]Seq, len(prompts))
	for i := range seqs {
		seqs[i] = Seq{Cache: batched[i], Rows: newRows[i]}
	}
	got := read(t, c, tm.m.Forward(c, x, seqs))
	r0 := 0
	for i, n := range newRows {
		want := read(t, c, tm.m.Forward(c, x.Slice(r0, r0+n), []Seq{{Cache: separate[i], Rows: n}}))
		if j := gputest.FirstDiff(got[r0*H:(r0+n)*H], want); j >= 0 {
			t.Errorf("session %d (%d new rows) in a batch of %d sessions differs from its separate run at %d", i, n, len(prompts), j)
		}
		r0 += n
	}
}

// rewrite returns the fixture checkpoint with edit applied to its tensors.
func rewrite(t *testing.T, edit func([]*safetensors.Tensor) []*safetensors.Tensor) *safetensors.File {
	f, err := safetensors.Open(fixtures + "model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []*safetensors.Tensor
	for _, n := range f.Names() {
		tt := *f.Tensor(n)
		tt.Data = bytes.Clone(tt.Data)
		ts = append(ts, &tt)
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, edit(ts), nil); err != nil {
		t.Fatal(err)
	}
	out, err := safetensors.Parse(buf.Bytes(), "edited.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLoadErrors(t *testing.T) {
	tm := loadTestModel(t)
	tests := []struct {
		name string
		edit func([]*safetensors.Tensor) []*safetensors.Tensor
		want string
	}{
		{"missing", func(ts []*safetensors.Tensor) []*safetensors.Tensor {
			return slices.DeleteFunc(ts, func(t *safetensors.Tensor) bool { return t.Name == "lfm.layers.1.self_attn.k_proj.weight" })
		}, `missing tensor "lfm.layers.1.self_attn.k_proj.weight"`},
		{"shape", func(ts []*safetensors.Tensor) []*safetensors.Tensor {
			for _, t := range ts {
				if t.Name == "lfm.layers.0.feed_forward.w1.weight" {
					t.Shape = []int{t.Shape[1], t.Shape[0]}
				}
			}
			return ts
		}, `"lfm.layers.0.feed_forward.w1.weight" has shape [24 192], want [192 24]`},
		{"dtype", func(ts []*safetensors.Tensor) []*safetensors.Tensor {
			for _, t := range ts {
				if t.Name == "lfm.embedding_norm.weight" {
					t.DType = safetensors.I16
				}
			}
			return ts
		}, `"lfm.embedding_norm.weight" has dtype I16`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := rewrite(t, tt.edit)
			b := weights.New(tm.dev, f)
			_, err := Load(b.Sub("lfm"), tm.cfg.LFM)
			if err == nil {
				err = b.Err()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestSlidingWindowCache: with the attention layers made sliding (window
// 4), a prefill then single steps and chunks give one prefill's rows bit
// for bit, with KV blocks of 1, 2 and 3 positions, while each windowed
// layer keeps between passes only the blocks that hold its last window−1
// positions (the others go back to the pool); the window changes the
// output.
func TestSlidingWindowCache(t *testing.T) {
	tm := loadTestModel(t)
	cfg := tm.cfg.LFM
	cfg.LayerTypes = slices.Clone(cfg.LayerTypes)
	const window = 4
	cfg.SlidingWindow = window
	for i, k := range cfg.LayerTypes {
		if k != config.LayerConv {
			cfg.LayerTypes[i] = config.LayerSliding
		}
	}
	f, err := safetensors.Open(fixtures + "model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Load(weights.New(tm.dev, f).Sub("lfm"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	H := cfg.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.F32)
	const N = 23
	x, _ := randomRows(tm.dev, c.Q, N, H, 5)
	whole := read(t, c, m.Forward(c, x, []Seq{{Cache: m.NewCache(tm.dev), Rows: N}}))
	full := read(t, c, tm.m.Forward(c, x, []Seq{{Cache: tm.m.NewCache(tm.dev), Rows: N}}))
	if slices.Equal(whole, full) {
		t.Error("a window of 4 gives the rows of full attention")
	}
	for _, br := range []int{1, 2, 3} {
		// A model of its own per block size (the pool's size is fixed at
		// its first cache).
		mb, err := Load(weights.New(tm.dev, f).Sub("lfm"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		mb.KVBlockRows = br
		for _, chunk := range []int{1, 2, 5} {
			cache := mb.NewCache(tm.dev)
			var got []float32
			for lo := 0; lo < N; lo += chunk {
				hi := min(lo+chunk, N)
				got = append(got, read(t, c, mb.Forward(c, x.Slice(lo, hi), []Seq{{Cache: cache, Rows: hi - lo}}))...)
				// The first kept block is the one position hi−(window−1) is in.
				want := hi - max(0, hi-(window-1))/br*br
				for i, b := range mb.Blocks {
					if b.Attn != nil && cache.Held(i) != want {
						t.Fatalf("blocks of %d, chunk %d: after %d positions layer %d holds %d, want %d", br, chunk, hi, i, cache.Held(i), want)
					}
				}
			}
			if !slices.Equal(got, whole) {
				t.Errorf("blocks of %d: chunks of %d differ from the whole pass", br, chunk)
			}
			cache.Free()
			if st := mb.KVPool(tm.dev).Stats(); st.Free != st.Blocks {
				t.Errorf("blocks of %d: after Free %d of %d blocks are free", br, st.Free, st.Blocks)
			}
		}
	}
}
