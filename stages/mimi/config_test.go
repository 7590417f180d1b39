package mimi

import (
	"os"
	"strings"
	"testing"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Hop() != 960 || c.FrameSamples() != 1920 {
		t.Errorf("hop %d, frame %d samples; want 960, 1920", c.Hop(), c.FrameSamples())
	}
	if u, _ := c.upsampleStride(); u != 2 || !c.channelWise() {
		t.Errorf("upsample ×%d channel-wise %v, want ×2 depthwise", u, c.channelWise())
	}
}

func TestFixtureConfig(t *testing.T) {
	c, err := LoadConfig(fixtureDir + "/" + ConfigName)
	if err != nil {
		t.Fatal(err)
	}
	if c.SEANet.NFilters != 2 || c.SEANet.Dimension != 64 || c.Quantizer.Dimension != 8 ||
		c.Transformer.NumLayers != 2 || c.Transformer.DimFeedforward != 64 || *c.Transformer.Context != 250 {
		t.Errorf("fixture config not applied: %+v", c)
	}
	// Keys the file leaves out keep the official values.
	if c.Quantizer.NQSemantic != 1 || !c.channelWise() {
		t.Errorf("defaults lost: n_q_semantic %d, channel-wise %v", c.Quantizer.NQSemantic, c.channelWise())
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		json, want string
	}{
		{`{"seanet_kwargs": {"norm": "weight_norm"}}`, "seanet_kwargs.norm"},
		{`{"seanet_kwargs": {"ratios": []}}`, "seanet_kwargs.ratios"},
		{`{"seanet_kwargs": {"ratios": [8, 0]}}`, "seanet_kwargs.ratios[1]"},
		{`{"seanet_kwargs": {"activation": "GELU"}}`, "seanet_kwargs.activation"},
		{`{"seanet_kwargs": {"pad_mode": "reflect"}}`, "seanet_kwargs.pad_mode"},
		{`{"causal": false}`, "causal"},
		{`{"quantizer_kwargs": {"n_q": 1}}`, "quantizer_kwargs.n_q"},
		{`{"quantizer_kwargs": {"n_q": 4}}`, "num_codebooks_active"},
		{`{"quantizer_kwargs": {"output_dimension": 256}}`, "output_dimension"},
		{`{"transformer_kwargs": {"num_heads": 7}}`, "not a multiple of num_heads"},
		{`{"transformer_kwargs": {"context": 0}}`, "transformer_kwargs.context"},
		{`{"transformer_kwargs": {"gating": "swiglu"}}`, "transformer_kwargs.gating"},
		{`{"transformer_kwargs": {"positional_embedding": "sin"}}`, "positional_embedding"},
		{`{"transformer_kwargs": {"output_dimensions": [512, 512]}}`, "output_dimensions"},
		{`{"frame_rate": 11}`, "not an integer"},
		{`{"resample_method": "interpolate"}`, "resample_method"},
		{`{"num_codebooks_active": 33}`, "num_codebooks_active"},
		{`{"num_codebooks_active": 1}`, "num_codebooks_active"},
		{`{"sample_rate": "24k"}`, "mimi config"},
		{`[`, "mimi config"},
	} {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%s) = %v, want an error naming %q", tc.json, err, tc.want)
		}
	}
}

// TestConfigSizeBounds: sizes each within its own range can still multiply
// into an absurd decoder; the whole is bounded before New allocates any of
// it (the codebook table alone is active codebooks × bins × dimension).
func TestConfigSizeBounds(t *testing.T) {
	def := DefaultConfig()
	p, s := def.sizes()
	t.Logf("the official decoder: %d parameters, %d state values per stream", p, s)
	if p < 10_000_000 || p > MaxDecoderParams/4 || s < 1 || s > MaxStreamState/8 {
		t.Errorf("the official decoder: %d parameters, %d state values; want well inside %d and %d", p, s, MaxDecoderParams, MaxStreamState)
	}
	for _, tc := range []struct {
		json, want string
	}{
		{`{"quantizer_kwargs": {"bins": 1048576, "dimension": 65536}}`, "parameters, more than the limit 268435456"},
		{`{"seanet_kwargs": {"n_filters": 4096}}`, "parameters, more than the limit 268435456"},
		{`{"transformer_kwargs": {"num_layers": 1024, "dim_feedforward": 1048576}}`, "parameters, more than the limit 268435456"},
		{`{"transformer_kwargs": {"context": 1048576}}`, "state values per stream, more than the limit 67108864"},
		{`{"seanet_kwargs": {"dilation_base": 16, "n_residual_layers": 1000}}`, "seanet_kwargs.dilation_base^(n_residual_layers-1) exceeds 65536"},
		{`{"seanet_kwargs": {"n_residual_layers": 2000}}`, "seanet_kwargs.n_residual_layers = 2000, want 0..1024"},
	} {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%s) = %v, want an error containing %q", tc.json, err, tc.want)
		}
	}
}

// FuzzParseConfig: any input gives a valid config or an error, never a
// panic, and an accepted config has a usable frame size.
func FuzzParseConfig(f *testing.F) {
	if data, err := os.ReadFile(fixtureDir + "/" + ConfigName); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"seanet_kwargs": {"ratios": [3, 2], "n_filters": 3}, "frame_rate": 2, "sample_rate": 24}`))
	f.Add([]byte(`{"transformer_kwargs": {"context": null, "layer_scale": null}}`))
	f.Add([]byte(`{"quantizer_kwargs": {"bins": 1048576, "dimension": 65536}}`))
	f.Add([]byte(`{"seanet_kwargs": {"dilation_base": 16, "n_residual_layers": 1000}}`))
	f.Add([]byte(`{"transformer_kwargs": {"context": 1048576}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if c.FrameSamples() < 1 || c.Hop() < 1 {
			t.Fatalf("accepted config with frame %d samples, hop %d", c.FrameSamples(), c.Hop())
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails validation: %v", err)
		}
		if p, s := c.sizes(); p > MaxDecoderParams || s > MaxStreamState {
			t.Fatalf("accepted config of %d parameters, %d state values", p, s)
		}
	})
}
