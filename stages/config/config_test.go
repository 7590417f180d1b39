package config

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func TestFixtureConfig(t *testing.T) {
	c, err := ReadAudio("../../testdata/lfm2-audio-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.LFM.FFNDim(), 192; got != want {
		t.Errorf("FFNDim = %d, want %d", got, want)
	}
	want := []string{LayerConv, LayerAttention, LayerConv, LayerAttention}
	if strings.Join(c.LFM.LayerTypes, ",") != strings.Join(want, ",") {
		t.Errorf("layer types = %v, want %v", c.LFM.LayerTypes, want)
	}
	if c.LFM.HeadDim() != 6 || c.LFM.RopeTheta != 1e6 || !c.LFM.TiedEmbeddings() {
		t.Errorf("head dim %d theta %v tied %v", c.LFM.HeadDim(), c.LFM.RopeTheta, c.LFM.TiedEmbeddings())
	}
	if c.Depthformer.FFNDim() != 512 || c.Depthformer.HeadDim() != 4 {
		t.Errorf("depthformer ffn %d head %d", c.Depthformer.FFNDim(), c.Depthformer.HeadDim())
	}
	if c.Preprocessor.WinLength() != 400 || c.Preprocessor.HopLength() != 160 || c.Preprocessor.Preemphasis() != 0.97 {
		t.Errorf("preprocessor %+v", c.Preprocessor)
	}
}

func TestFFNRule(t *testing.T) {
	tests := []struct {
		json string
		want int
	}{
		// LFM2-1.2B: 12288 → 8192.
		{`{"hidden_size":2048,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":12288,"block_ffn_dim_multiplier":1.0,"block_multiple_of":256}`, 8192},
		// block_ff_dim wins over intermediate_size (Lfm2Config reads it first).
		{`{"hidden_size":24,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":192,"block_ff_dim":288,"block_multiple_of":64}`, 192},
		// Absent multiplier: Lfm2Config's default 1.0 applies, so rounding happens.
		{`{"hidden_size":8,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":100,"block_multiple_of":64}`, 128},
		// Explicit null: transformers skips the multiple_of rounding.
		{`{"hidden_size":8,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":100,"block_ffn_dim_multiplier":null,"block_multiple_of":64}`, 66},
		// Auto-adjust off.
		{`{"hidden_size":8,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":100,"block_auto_adjust_ff_dim":false}`, 100},
		// Detokenizer: 3328 → 2218 → 2304.
		{`{"hidden_size":512,"num_hidden_layers":1,"vocab_size":8,"full_attn_idxs":[],"intermediate_size":3328,"block_ffn_dim_multiplier":1.0,"block_multiple_of":256}`, 2304},
	}
	for _, tt := range tests {
		c, err := parseLFM2(tt.json)
		if err != nil {
			t.Fatalf("%s: %v", tt.json, err)
		}
		if got := c.FFNDim(); got != tt.want {
			t.Errorf("%s: FFNDim = %d, want %d", tt.json, got, tt.want)
		}
	}
	if got := (Depthformer{Dim: 1024}).FFNDim(); got != 2816 {
		t.Errorf("depthformer 1024: ffn %d, want 2816", got)
	}
}

func TestLayerTypeForms(t *testing.T) {
	a, err := parseLFM2(`{"hidden_size":8,"num_hidden_layers":4,"vocab_size":8,"intermediate_size":8,"num_attention_heads":2,"num_key_value_heads":1,"full_attn_idxs":[0,2]}`)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseLFM2(`{"hidden_size":8,"num_hidden_layers":4,"vocab_size":8,"intermediate_size":8,"num_attention_heads":2,"num_key_value_heads":1,"layer_types":["full_attention","conv","full_attention","conv"]}`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(a.LayerTypes, ",") != strings.Join(b.LayerTypes, ",") || a.AttentionLayers() != 2 {
		t.Errorf("full_attn_idxs gave %v, layer_types %v", a.LayerTypes, b.LayerTypes)
	}
}

func TestConfigErrors(t *testing.T) {
	base, err := os.ReadFile("../../testdata/lfm2-audio-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, from, to, want string
	}{
		{"unknown architecture", `"Lfm2AudioForConditionalGeneration"`, `"Qwen2AudioForConditionalGeneration"`, "omni-pipe runs Lfm2AudioForConditionalGeneration"},
		{"bad layer type", `"full_attn_idxs": [`, `"layer_types": ["conv","mamba","conv","conv"], "x": [`, `unknown type "mamba"`},
		{"heads", `"num_attention_heads": 4`, `"num_attention_heads": 5`, "attention heads"},
		{"subsampling", `"dw_striding"`, `"striding"`, "subsampling"},
		{"broken json", `{`, `[`, "config JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := strings.Replace(string(base), tt.from, tt.to, 1)
			_, err := ParseAudio([]byte(data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func parseLFM2(js string) (*LFM2, error) {
	var c LFM2
	if err := json.Unmarshal([]byte(js), &c); err != nil {
		return nil, err
	}
	return &c, c.Normalize()
}

const fixture = "../../testdata/lfm2-audio-tiny/config.json"

// edit returns the fixture config with each (from, to) replacement applied
// once; it fails the test if from is absent.
func edit(t testing.TB, base string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(base, pairs[i]) {
			t.Fatalf("fixture config lacks %q", pairs[i])
		}
		base = strings.Replace(base, pairs[i], pairs[i+1], 1)
	}
	return base
}

// TestConfigBounds: every size is bounded before anything is sized by it;
// the error names the field, the value and the range.
func TestConfigBounds(t *testing.T) {
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	base := string(data)
	many := strings.Repeat("0,", 2000) + "1"
	tests := []struct {
		from, to, want string
	}{
		{`"num_hidden_layers": 4`, `"num_hidden_layers": -1`, "lfm: num_hidden_layers = -1, want 1..1024"},
		{`"num_hidden_layers": 4`, `"num_hidden_layers": 1000000000`, "lfm: num_hidden_layers = 1000000000, want 1..1024"},
		{`"codebooks": 8`, `"codebooks": 1000000`, "codebooks = 1000000, want 1..64"},
		{`"codebooks": 8`, `"codebooks": 0`, "codebooks = 0, want 1..64"},
		{`"vocab_size": 992`, `"vocab_size": 8388608`, "lfm: vocab_size = 8388608, want 1..4194304"},
		{`"hidden_size": 24`, `"hidden_size": 131072`, "lfm: hidden_size = 131072, want 1..65536"},
		{`"block_ff_dim": 288`, `"block_ff_dim": 2000000000`, "lfm: block_ff_dim = 2000000000, want 1..1048576"},
		{`"num_key_value_heads": 2`, `"num_key_value_heads": -1`, "lfm: num_key_value_heads = -1, want 0..1024"},
		{`"num_attention_heads": 4`, `"num_attention_heads": 100000`, "lfm: num_attention_heads = 100000, want 0..1024"},
		{`"max_position_embeddings": 128000`, `"max_position_embeddings": -5`, "lfm: max_position_embeddings = -5, want 0..16777216"},
		{`"conv_L_cache": 3`, `"conv_L_cache": 100000`, "lfm: conv_L_cache = 100000, want 1..1024"},
		{`"block_ffn_dim_multiplier": 1.0`, `"block_ffn_dim_multiplier": 1e300`, "lfm: block_ffn_dim_multiplier = 1e+300, want (0, 16]"},
		{`"norm_eps": 1e-05`, `"norm_eps": -1`, "lfm: norm_eps = -1, want (0, 1]"},
		{`"full_attn_idxs": [`, `"full_attn_idxs": [` + many + `], "x": [`, "lfm: full_attn_idxs has 2001 entries, want at most 1024"},
		{`"interleaved_n_text": 6`, `"interleaved_n_text": 0`, "interleaved_n_text = 0, want 1..1024"},
		{`"layers": 2,`, `"layers": 5000,`, "depthformer.layers = 5000, want 1..1024"},
		{`"dim": 128`, `"dim": -128`, "depthformer.dim = -128, want 1..65536"},
		{`"n_layers": 2`, `"n_layers": 0`, "encoder.n_layers = 0, want 1..1024"},
		{`"d_model": 64`, `"d_model": 1048576`, "encoder.d_model = 1048576, want 1..65536"},
		{`"n_heads": 4`, `"n_heads": 0`, "encoder.n_heads = 0, want 1..1024"},
		{`"subsampling_conv_channels": 32`, `"subsampling_conv_channels": 1000000`, "encoder.subsampling_conv_channels (-1: d_model) = 1000000, want 1..65536"},
		{`"ff_expansion_factor": 4`, `"ff_expansion_factor": 1000`, "encoder.ff_expansion_factor = 1000, want 1..64"},
		{`"conv_kernel_size": 9`, `"conv_kernel_size": 100001`, "encoder.conv_kernel_size = 100001, want 1..1024"},
		{`"n_fft": 512`, `"n_fft": 1073741824`, "preprocessor.n_fft = 1073741824, want 1..16384"},
		{`"features": 128`, `"features": 100000`, "preprocessor.features = 100000, want 1..512"},
		{`"sample_rate": 16000`, `"sample_rate": 0`, "preprocessor.sample_rate = 0, want 1000..384000"},
		{`"window_size": 0.025`, `"window_size": 1e300`, "preprocessor.window_size = 1e+300, want (0, 1]"},
		{`"pad_to": 0`, `"pad_to": -1`, "preprocessor.pad_to = -1, want 0..65536"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := ParseAudio([]byte(edit(t, base, tt.from, tt.to)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// FuzzParseAudio: any config.json is accepted with every size in bounds or
// refused with an error, never a panic (nor an allocation it sizes).
func FuzzParseAudio(f *testing.F) {
	data, err := os.ReadFile(fixture)
	if err != nil {
		f.Fatal(err)
	}
	base := string(data)
	f.Add(data)
	for _, pair := range [][2]string{
		{`"num_hidden_layers": 4`, `"num_hidden_layers": -1`},
		{`"num_hidden_layers": 4`, `"num_hidden_layers": 1000000000`},
		{`"codebooks": 8`, `"codebooks": 1000000`},
		{`"num_key_value_heads": 2`, `"num_key_value_heads": 0`},
		{`"num_attention_heads": 4`, `"num_attention_heads": 0`},
		{`"n_heads": 4`, `"n_heads": 0`},
		{`"full_attn_idxs": [`, `"layer_types": ["conv","sliding_attention","conv","full_attention"], "x": [`},
		{`"block_ffn_dim_multiplier": 1.0`, `"block_ffn_dim_multiplier": null`},
		{`"window_stride": 0.01`, `"window_stride": 0`},
		{`"conv_context_size": null`, `"conv_context_size": [4, 4]`},
	} {
		f.Add([]byte(edit(f, base, pair[0], pair[1])))
	}
	f.Add([]byte(`{"architectures": ["Lfm2AudioForConditionalGeneration"]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseAudio(data)
		if err != nil {
			return
		}
		l := &c.LFM
		if l.NumHiddenLayers < 1 || l.NumHiddenLayers > MaxLayers || len(l.LayerTypes) != l.NumHiddenLayers ||
			l.HiddenSize < 1 || l.HiddenSize > MaxHidden || l.VocabSize < 1 || l.VocabSize > MaxVocab ||
			l.FFNDim() < 1 || l.FFNDim() > MaxFFN {
			t.Fatalf("accepted lfm section out of bounds: %+v", l)
		}
		if l.AttentionLayers() > 0 && (l.HeadDim() < 2 || l.HeadDim()*l.NumAttentionHeads != l.HiddenSize ||
			l.NumKeyValueHeads < 1 || l.NumAttentionHeads%l.NumKeyValueHeads != 0) {
			t.Fatalf("accepted attention shape: %d heads, %d kv heads, hidden %d", l.NumAttentionHeads, l.NumKeyValueHeads, l.HiddenSize)
		}
		if c.Codebooks < 1 || c.Codebooks > MaxCodebooks || c.Depthformer.Layers < 1 || c.Depthformer.Layers > MaxLayers ||
			c.Depthformer.HeadDim() < 2 || c.Encoder.NLayers < 1 || c.Encoder.NLayers > MaxLayers ||
			c.Encoder.DModel < 1 || c.Encoder.DModel > MaxHidden {
			t.Fatalf("accepted sizes out of bounds: %+v", c)
		}
		p := c.Preprocessor
		if p.NFFT < 1 || p.NFFT > MaxNFFT || p.WinLength() < 1 || p.WinLength() > p.NFFT || p.HopLength() < 1 {
			t.Fatalf("accepted preprocessor %+v", p)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("an accepted config fails validation again: %v", err)
		}
	})
}
