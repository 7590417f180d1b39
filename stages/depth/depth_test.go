package depth

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

const fixtures = "../../testdata/lfm2-audio-tiny/"

var fixtureCases = []string{"case1_question_16k", "case2_tone_noise_24k", "case3_text_only", "case4_two_turn"}

// openFixture opens the fixture safetensors file name, closed when the
// test ends.
func openFixture(t testing.TB, name string) *safetensors.File {
	t.Helper()
	f, err := safetensors.Open(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fixtureModel reads the fixture's config and opens its weights.
func fixtureModel(t testing.TB) (*config.Audio, *safetensors.File) {
	t.Helper()
	cfg, err := config.ReadAudio(fixtures + "config.json")
	if err != nil {
		t.Fatal(err)
	}
	return cfg, openFixture(t, "model.safetensors")
}

func load(t testing.TB) (*cpu.Device, *Depth, *config.Audio) {
	t.Helper()
	dev := cpu.New(0)
	t.Cleanup(func() { dev.Close() })
	d, cfg := loadOn(t, dev)
	return dev, d, cfg
}

// loadOn binds the fixture's depthformer on dev.
func loadOn(t testing.TB, dev gpu.Device) (*Depth, *config.Audio) {
	t.Helper()
	cfg, f := fixtureModel(t)
	b := weights.New(dev, f)
	d, err := Load(b, cfg.Depthformer, cfg.Codebooks, codebookSize(t), cfg.LFM.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return d, cfg
}

// codebookSize returns the fixture codec's codebook size (its quantizer's
// bins), which is also end-of-audio.
func codebookSize(t testing.TB) int {
	t.Helper()
	codec, err := mimi.LoadConfig(fixtures + "mimi_config.json")
	if err != nil {
		t.Fatal(err)
	}
	return codec.Quantizer.Bins
}

func ints(t testing.TB, f *safetensors.File, name string) []int64 {
	v, err := f.Tensor(name).Int64s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func floats(t testing.TB, f *safetensors.File, name string) []float32 {
	v, err := f.Tensor(name).Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// stepCodes returns the reference's C codes of step s.
func stepCodes(codes []int64, s, C int) []int {
	ref := make([]int, C)
	for i := range ref {
		ref[i] = int(codes[s*C+i])
	}
	return ref
}

// teacher is a Picker that records our greedy pick and margin and feeds the
// reference's code onward.
type teacher struct {
	ref    []int // the reference's codes of the frame
	got    []int
	margin []float64
	logits [][]float32
}

func (tc *teacher) pick(_, i int, l []float32) int {
	tc.got[i] = numcmp.Argmax(l)
	tc.margin[i] = numcmp.Margin(l)
	tc.logits[i] = slices.Clone(l)
	return tc.ref[i]
}

func frame(t testing.TB, dev gpu.Device, d *Depth, prec nn.Precision, hidden []float32, ref []int) *teacher {
	c := nn.NewCtx(dev, dev.NewQueue("test"), prec)
	h := c.Tmp(1, len(hidden))
	c.Q.Write(h, hidden)
	C := d.Codebooks
	tc := &teacher{ref: ref, got: make([]int, C), margin: make([]float64, C), logits: make([][]float32, C)}
	if _, err := d.Frame(c, h, tc.pick); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestGreedyCodes: given the reference's own backbone row for every
// recorded audio step, our greedy codes equal the reference's; every
// disagreement is listed with both margins and must be at a pick the
// reference won by at most 2 bf16 ulps of its top logit (parity's rule).
func TestGreedyCodes(t *testing.T) {
	dev, d, cfg := load(t)
	H, C := cfg.LFM.HiddenSize, cfg.Codebooks
	eoa := codebookSize(t)
	for _, name := range fixtureCases {
		t.Run(name, func(t *testing.T) {
			f := openFixture(t, name+".safetensors")
			mod := ints(t, f, "step_modality")
			hidden := floats(t, f, "step_hidden")
			codes := ints(t, f, "step_codes")
			margins := floats(t, f, "step_audio_margin")
			agree, total := 0, 0
			for s, m := range mod {
				if m != 3 {
					continue
				}
				ref := stepCodes(codes, s, C)
				if ref[0] == eoa { // the reference forced the whole frame
					continue
				}
				tc := frame(t, dev, d, nn.BF16, hidden[s*H:(s+1)*H], ref)
				for i := 0; i < C; i++ {
					total++
					if tc.got[i] == ref[i] {
						agree++
						continue
					}
					// One bf16 ulp at the reference's top logit, which our
					// logit of its pick equals up to noise.
					top := math.Abs(float64(tc.logits[i][ref[i]]))
					ulp := math.Ldexp(1, math.Ilogb(top)-7)
					rm := float64(margins[s*C+i])
					t.Logf("step %d codebook %d: ours %d (margin %.4g), reference %d (margin %.4g = %.3g ulps)", s, i, tc.got[i], tc.margin[i], ref[i], rm, rm/ulp)
					if rm > 2*ulp {
						t.Errorf("step %d codebook %d: miss where the reference won by %.3g ulps (> 2)", s, i, rm/ulp)
					}
				}
			}
			t.Logf("greedy codes agree on %d of %d", agree, total)
			if agree < total-total/100 {
				t.Errorf("only %d of %d codes agree", agree, total)
			}
		})
	}
}

// TestBatchIndependence: a frame computed for a batch of rows gives each
// row the codes and logits it gets alone. On CUDA a row alone runs each
// block as one fused kernel (gpu.BlockFuser) and a batch as the op
// sequence: the two agree bit for bit.
func TestBatchIndependence(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		d, cfg := loadOn(t, dev)
		H := cfg.LFM.HiddenSize
		hidden := floats(t, openFixture(t, "case1_question_16k.safetensors"), "step_hidden")
		rows := []int{7, 8, 20}
		c := nn.NewCtx(dev, dev.NewQueue("test"), nn.BF16)
		h := c.Tmp(len(rows), H)
		for r, s := range rows {
			c.Q.Write(h.Row(r), hidden[s*H:(s+1)*H])
		}
		batchLogits := make([][]float32, len(rows)*d.Codebooks)
		codes, err := d.Frame(c, h, func(r, i int, l []float32) int {
			batchLogits[r*d.Codebooks+i] = slices.Clone(l)
			return numcmp.Argmax(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		c1 := nn.NewCtx(dev, dev.NewQueue("alone"), nn.BF16)
		for r, s := range rows {
			c1.A.Reset()
			h1 := c1.Tmp(1, H)
			c1.Q.Write(h1, hidden[s*H:(s+1)*H])
			var alone [][]float32
			one, err := d.Frame(c1, h1, func(_, i int, l []float32) int {
				alone = append(alone, slices.Clone(l))
				return numcmp.Argmax(l)
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(one[0], codes[r]) {
				t.Errorf("row %d: batch codes %v, alone %v", r, codes[r], one[0])
			}
			for i := range alone {
				if !slices.Equal(alone[i], batchLogits[r*d.Codebooks+i]) {
					t.Errorf("row %d codebook %d: logits differ between batch and alone", r, i)
				}
			}
		}
	})
}

func TestInvFreq(t *testing.T) {
	got := nn.RoPEInvFreq(1e6, 32)
	for j, v := range got {
		want := 1 / math.Pow(1e6, float64(2*j)/32)
		if math.Abs(float64(v)-want) > want*1e-6 {
			t.Errorf("invfreq[%d] = %v, want %v", j, v, want)
		}
	}
	_ = fmt.Sprint()
}

// TestFlashAttentionLogitsBitExact: fed the reference's own backbone rows,
// the depthformer's bf16 logits equal the reference's stored ones bit for
// bit in almost every evaluation once attention rounds its probabilities
// as the reference's flash kernel does (FlashAttention-2 through torch's
// SDPA, head size 4 padded to 8). Over the fixtures' 64 stored evaluations
// (4 cases × 2 steps × 8 codebooks, 131136 logits): with fp32
// probabilities 85242 logits differ, in 57 evaluations; with the flash
// rounding 680, in 8, six of which differ in one logit (a logit product
// summed in another order) and two in the logits of one codebook after an
// activation rounds the other way.
func TestFlashAttentionLogitsBitExact(t *testing.T) {
	dev, d, cfg := load(t)
	H, C := cfg.LFM.HiddenSize, cfg.Codebooks
	type count struct{ logits, evals, n int }
	run := func(flash bool) count {
		d.FlashAttention = flash
		defer func() { d.FlashAttention = true }()
		var c count
		for _, name := range fixtureCases {
			f := openFixture(t, name+".safetensors")
			hidden := floats(t, f, "step_hidden")
			codes := ints(t, f, "step_codes")
			idx := ints(t, f, "audio_logits_step_idx")
			stored := floats(t, f, "audio_logits")
			for k, s := range idx {
				tc := frame(t, dev, d, nn.BF16, hidden[int(s)*H:(int(s)+1)*H], stepCodes(codes, int(s), C))
				for i := range C {
					want := stored[(k*C+i)*d.Vocab : (k*C+i+1)*d.Vocab]
					differ := 0
					for j, v := range tc.logits[i] {
						if math.Float32bits(v) != math.Float32bits(want[j]) {
							differ++
						}
					}
					c.logits += differ
					c.n += d.Vocab
					if differ > 0 {
						c.evals++
					}
				}
			}
		}
		return c
	}
	before, after := run(false), run(true)
	t.Logf("logits differing from the reference: fp32 probabilities %d of %d (%d evaluations of 64), flash rounding %d (%d evaluations)",
		before.logits, before.n, before.evals, after.logits, after.evals)
	if after.logits > before.n/100 || after.evals > 10 {
		t.Errorf("with the flash rounding %d logits in %d evaluations differ: want at most 1%% of %d in 10", after.logits, after.evals, after.n)
	}
	if before.logits < before.n/2 {
		t.Errorf("with fp32 probabilities only %d of %d logits differ: the comparison no longer tells the modes apart", before.logits, before.n)
	}
}

// TestLoadCodebookSize: the tables' size comes from the codec's codebook
// size (one more entry: end-of-audio), so the fixture's 2048-code tables
// bind with 2048 and refuse any other size, naming the table.
func TestLoadCodebookSize(t *testing.T) {
	cfg, f := fixtureModel(t)
	dev := cpu.New(1)
	defer dev.Close()
	if got := VocabSize(2048); got != 2049 {
		t.Errorf("VocabSize(2048) = %d, want 2049 (the released models' codebooks)", got)
	}
	for _, tc := range []struct {
		size    int
		wantErr string
	}{
		{codebookSize(t), ""},
		{1000, `tensor "depth_embeddings.0.embedding.weight" has shape [2049 128], want [1001 128]`},
		{4096, "want [4097 128]"},
		{0, "0 codes"},
		{-1, "-1 codes"},
	} {
		b := weights.New(dev, f)
		d, err := Load(b, cfg.Depthformer, cfg.Codebooks, tc.size, cfg.LFM.HiddenSize)
		if err == nil {
			err = b.Err()
		}
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("codebook size %d: %v", tc.size, err)
		case tc.wantErr == "" && d.Vocab != tc.size+1:
			t.Errorf("codebook size %d: vocabulary %d, want %d", tc.size, d.Vocab, tc.size+1)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("codebook size %d: err = %v, want one containing %q", tc.size, err, tc.wantErr)
		}
	}
}

// TestFrameSampledEqualsHostPicks: the frame sampled on the device gives
// the codes of the host-picked frame whose picker runs gpu.SampleHost on
// the same rows (same draws, same histories), bit for bit, for a batch
// mixing the audio default (top-k 4), a penalised full-vocabulary draw,
// greedy and top-p — on every device.
// TestPaddedRows: the buckets FrameSampled runs a batch at.
func TestPaddedRows(t *testing.T) {
	for _, c := range []struct{ b, want int }{{1, 1}, {5, 5}, {8, 8}, {9, 16}, {16, 16}, {17, 24}, {63, 64}, {64, 64}, {65, 96}, {200, 224}, {256, 256}, {257, 288}} {
		if got := PaddedRows(c.b); got != c.want {
			t.Errorf("PaddedRows(%d) = %d, want %d", c.b, got, c.want)
		}
	}
	buckets := map[int]bool{}
	for b := 1; b <= 256; b++ {
		p := PaddedRows(b)
		if limit := map[bool]int{true: 8, false: 32}[b <= 64]; p < b || p-b >= limit {
			t.Errorf("PaddedRows(%d) = %d: short, or %d rows of padding or more", b, p, limit)
		}
		buckets[p] = true
	}
	if len(buckets) != 21 {
		t.Errorf("%d buckets up to 256 rows, want 21", len(buckets))
	}
}

// TestFrameSampledEqualsHostPicks: device picks equal host picks of the
// same rows, for a batch run as it is and one padded to its bucket.
func TestFrameSampledEqualsHostPicks(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		d, cfg := loadOn(t, dev)
		H, C := cfg.LFM.HiddenSize, d.Codebooks
		hidden := floats(t, openFixture(t, "case1_question_16k.safetensors"), "step_hidden")
		kinds := []gpu.SampleRow{
			{Temperature: 1, TopK: 4},
			{Temperature: 1.3, Penalty: 1.4},
			{},
			{Temperature: 0.8, TopK: 64, TopP: 0.7},
			{Temperature: 1, TopK: 4, Penalty: 1.2},
		}
		rng := rand.New(rand.NewPCG(5, 6))
		// Frames of 5 rows (run as they are) and of 11 (padded to 16).
		for frame := 0; frame < 4; frame++ {
			steps := []int{3, 7, 8, 20, 11}
			if frame >= 2 {
				steps = append(steps, 1, 2, 4, 5, 6, 9)
			}
			kinds := kinds
			for len(kinds) < len(steps) {
				kinds = append(kinds, kinds[len(kinds)%5])
			}
			rows := make([][]gpu.SampleRow, C)
			for i := range rows {
				rows[i] = make([]gpu.SampleRow, len(steps))
				for r := range steps {
					row := kinds[r]
					if row.Penalty != 0 {
						for k := 0; k < 12; k++ {
							row.History = append(row.History, int32(rng.IntN(d.Vocab)))
						}
					}
					if !row.Greedy() {
						row.U = rng.Float64()
					}
					rows[i][r] = row
				}
			}
			c := nn.NewCtx(dev, dev.NewQueue("test"), nn.BF16)
			h := c.Tmp(len(steps), H)
			for r, s := range steps {
				c.Q.Write(h.Row(r), hidden[((s+frame)%20)*H:((s+frame)%20+1)*H])
			}
			got, err := d.FrameSampled(c, h, rows)
			if err != nil {
				t.Fatal(err)
			}
			var s gpu.SampleScratch
			want, err := d.Frame(c, h, func(r, i int, l []float32) int { return gpu.SampleHost(l, rows[i][r], &s) })
			if err != nil {
				t.Fatal(err)
			}
			for r := range steps {
				if !slices.Equal(got[r], want[r]) {
					t.Errorf("frame %d row %d (%+v): device picks %v, host %v", frame, r, kinds[r], got[r], want[r])
				}
			}
		}
	})
}
