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
