package conformer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// TestRelShift checks the strided view against rel_shift done the
// reference's way (pad one zero column on the left, view [2T, T], drop the
// first row, view [T, 2T−1], keep [:, :T]) and against the closed form
// bd[i, T−1−i+j].
func TestRelShift(t *testing.T) {
	dev := newDevice(t)
	c := nn.NewCtx(dev, dev.NewQueue("test"), nn.F32)
	rng := rand.New(rand.NewPCG(5, 6))
	for T := 1; T <= 9; T++ {
		P := 2*T - 1
		bd := make([]float32, T*P)
		for i := range bd {
			bd[i] = float32(rng.NormFloat64())
		}
		padded := make([]float32, T*(P+1))
		for i := range T {
			copy(padded[i*(P+1)+1:], bd[i*P:(i+1)*P])
		}
		dropped := padded[T:] // [T, P] after dropping the first row of [P+1, T]
		want := make([]float32, T*T)
		for i := range T {
			copy(want[i*T:(i+1)*T], dropped[i*P:i*P+T])
			for j := range T {
				if closed := bd[i*P+T-1-i+j]; want[i*T+j] != closed {
					t.Fatalf("T=%d: the reference rel_shift gives %g at (%d,%d), the closed form %g", T, want[i*T+j], i, j, closed)
				}
			}
		}
		got := c.Tmp(T, T)
		c.Q.Copy(got, gpu.RelShift(upload(c, bd, T, P)))
		if g := download(t, c, got); !slices.Equal(g, want) {
			t.Errorf("T=%d: rel_shift view\n%v\nwant\n%v", T, g, want)
		}
	}
}

// TestPosEnc checks the positional table against the rows the reference
// computed in fp32 on CUDA (conformer-ref) at d_model 64 and 512, and the
// rows a clip of T frames uses.
func TestPosEnc(t *testing.T) {
	ref := openFile(t, refFile)
	ts, err := ref.Lookup("pe_positions")
	if err != nil {
		t.Fatal(err)
	}
	positions, err := ts.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000 // pos_emb_max_len: the reference table's positions 4999 … −4999
	for _, d := range []int{64, 512} {
		t.Run(fmt.Sprintf("d%d", d), func(t *testing.T) {
			want, _ := values(t, ref, fmt.Sprintf("pe%d", d))
			table := relPositions(n, d)
			var got []float32
			for _, p := range positions {
				r := n - 1 - int(p)
				got = append(got, table[r*d:(r+1)*d]...)
			}
			// Go rounds sin, cos and exp correctly (½ ulp) from the same fp32
			// arguments; CUDA's expf, sinf and cosf are within 2 ulp (CUDA C
			// Programming Guide, mathematical functions). So div may differ
			// by 2.5 ulp ≤ 2.5·2⁻²³·div, the fp32 angle pos·div by that times
			// |pos| plus its own rounding (2⁻²³·|pos|·div), and the result
			// by 2.5 ulp ≤ 2.5·2⁻²⁴ on top:
			// |Δ| ≤ 2.5·2⁻²⁴ + 7·2⁻²⁴·|pos|·div.
			worst := 0.0
			for k, p := range positions {
				for i := range d {
					div := math.Exp(float64(2*(i/2)) * -math.Log(10000) / float64(d))
					bound := (2.5 + 7*math.Abs(float64(p))*div) / (1 << 24)
					diff := math.Abs(float64(got[k*d+i]) - float64(want[k*d+i]))
					worst = max(worst, diff/bound)
					if diff > bound {
						t.Errorf("position %d column %d: %g, reference %g", p, i, got[k*d+i], want[k*d+i])
					}
				}
			}
			equal, bf16Equal := 0, 0
			for i := range got {
				if got[i] == want[i] {
					equal++
				}
				if gpu.RoundBF16(got[i]) == gpu.RoundBF16(want[i]) {
					bf16Equal++
				}
			}
			t.Logf("%d of %d values equal the reference's (%d after rounding to bf16); worst difference %.2f of its bound",
				equal, len(got), bf16Equal, worst)
		})
	}
	// rows(T) is the table's middle: positions T−1 … −(T−1), row by row, and
	// growing the table does not change it.
	p := posTable{d: 6}
	short := slices.Clone(p.rows(3))
	_ = p.rows(200)
	if !slices.Equal(short, p.rows(3)) {
		t.Errorf("rows(3) changed after the table grew")
	}
	full := relPositions(3, 6)
	if !slices.Equal(short, full) {
		t.Errorf("rows(3) = %v, want %v", short, full)
	}
	if zero := short[2*6 : 3*6]; !slices.Equal(zero, []float32{0, 1, 0, 1, 0, 1}) {
		t.Errorf("position 0's row = %v, want sin 0 and cos 0 interleaved", zero)
	}
	for i := range 6 { // position 2 vs −2: sin is odd, cos even
		a, b := short[i], short[4*6+i]
		if (i%2 == 0 && a != -b) || (i%2 == 1 && a != b) {
			t.Errorf("column %d: position 2 gives %g, position −2 %g", i, a, b)
		}
	}
}

// TestOutLen checks the subsampling length rule against ⌈T/factor⌉
// (liquid-audio's mel2emb_len for factor 8) and against the frames the
// encoder returns.
func TestOutLen(t *testing.T) {
	for _, factor := range []int{2, 4, 8, 16} {
		stages := 0
		for 1<<stages < factor {
			stages++
		}
		s := Subsampling{Widths: make([]int, stages+1)}
		for T := 1; T <= 2000; T++ {
			if got, want := s.OutLen(T), (T+factor-1)/factor; got != want {
				t.Fatalf("factor %d: OutLen(%d) = %d, want %d", factor, T, got, want)
			}
		}
	}
	// The reference's worked example: 4 s at 16 kHz is 401 mel frames, 51
	// encoder frames.
	dev := newDevice(t)
	e := loadFixture(t, dev)
	if got := e.OutLen(401); got != 51 {
		t.Errorf("OutLen(401) = %d, want 51", got)
	}
	for _, frames := range []int{1, 8, 9, 401} {
		enc, _ := run(t, e, dev, nn.BF16, make([]float32, frames*e.Cfg.FeatIn), frames)
		if got := len(enc) / e.FeatOut; got != e.OutLen(frames) {
			t.Errorf("%d mel frames: %d encoder frames, want %d", frames, got, e.OutLen(frames))
		}
	}
}

// TestLoadErrors checks that configurations this package cannot run and
// bad checkpoints are refused with errors that name the problem.
func TestLoadErrors(t *testing.T) {
	dev := newDevice(t)
	good := tinyConfig()
	const hidden = 28
	tensors := randomTensors(good, hidden, 9)
	without := func(name string) []*safetensors.Tensor {
		var out []*safetensors.Tensor
		for _, ts := range tensors {
			if ts.Name != name {
				out = append(out, ts)
			}
		}
		return out
	}
	reshaped := func(name string, shape ...int) []*safetensors.Tensor {
		out := slices.Clone(tensors)
		for i, ts := range out {
			if ts.Name == name {
				c := *ts
				c.Shape = shape
				out[i] = &c
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		edit    func(*config.Encoder)
		hidden  int
		tensors []*safetensors.Tensor
		want    string
	}{
		{name: "ok"},
		{name: "limited attention", edit: func(c *config.Encoder) { c.AttContextSize = []int{70, 13} }, want: "att_context_size"},
		{name: "striding", edit: func(c *config.Encoder) { c.Subsampling = "striding" }, want: "subsampling"},
		{name: "factor 6", edit: func(c *config.Encoder) { c.SubsamplingFactor = 6 }, want: "×6"},
		{name: "causal downsampling", edit: func(c *config.Encoder) { c.CausalDownsampling = true }, want: "causal_downsampling"},
		{name: "abs_pos", edit: func(c *config.Encoder) { c.SelfAttentionModel = "abs_pos" }, want: "self_attention_model"},
		{name: "layer_norm conv", edit: func(c *config.Encoder) { c.ConvNormType = "layer_norm" }, want: "conv_norm_type"},
		{name: "even kernel", edit: func(c *config.Encoder) { c.ConvKernelSize, c.ConvContextSize = 4, nil }, want: "conv_kernel_size 4"},
		{name: "bad context", edit: func(c *config.Encoder) { c.ConvContextSize = []int{2, 1} }, want: "conv_context_size"},
		{name: "heads", edit: func(c *config.Encoder) { c.NHeads = 5 }, want: "n_heads"},
		{name: "channels", edit: func(c *config.Encoder) { c.SubsamplingConvChannels = 0 }, want: "subsampling_conv_channels"},
		{name: "hidden", hidden: -1, want: "adapter width"},
		{name: "missing tensor", tensors: without("conformer.layers.1.conv.batch_norm.running_var"), want: "conformer.layers.1.conv.batch_norm.running_var"},
		{name: "missing adapter", tensors: without("audio_adapter.model.3.bias"), want: "audio_adapter.model.3.bias"},
		{name: "wrong shape", tensors: reshaped("conformer.layers.0.self_attn.pos_bias_u", 48), want: "conformer.layers.0.self_attn.pos_bias_u"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			cfg.AttContextSize = slices.Clone(good.AttContextSize)
			cfg.ConvContextSize = slices.Clone(good.ConvContextSize)
			if tc.edit != nil {
				tc.edit(&cfg)
			}
			h := hidden
			if tc.hidden != 0 {
				h = tc.hidden
			}
			ts := tensors
			if tc.tensors != nil {
				ts = tc.tensors
			}
			b := weights.New(dev, checkpoint(t, ts))
			e, err := Load(b, cfg, h)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Load: %v", err)
			case tc.want == "":
				if un := b.Unexpected(); len(un) > 0 {
					t.Errorf("tensors neither bound nor skipped: %v", un)
				}
				if e.FeatOut != cfg.FeatOut || len(e.Layers) != cfg.NLayers || e.Sub.Widths[len(e.Sub.Widths)-1] != 5 {
					t.Errorf("loaded feat_out %d, %d layers, widths %v", e.FeatOut, len(e.Layers), e.Sub.Widths)
				}
			case err == nil:
				t.Fatalf("Load succeeded, want an error about %q", tc.want)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// TestForwardPanicsOnBadMel checks that a mel of the wrong width is caught
// with a message naming the expected shape.
func TestForwardPanicsOnBadMel(t *testing.T) {
	dev := newDevice(t)
	e := loadFixture(t, dev)
	c := nn.NewCtx(dev, dev.NewQueue("test"), nn.BF16)
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "128") {
			t.Errorf("recovered %v, want a panic naming feat_in 128", r)
		}
	}()
	e.Forward(c, c.Tmp(10, 127))
}
