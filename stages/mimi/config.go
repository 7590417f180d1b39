package mimi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
)

// NumCodebooks is the number of codebooks LFM2-Audio emits per frame and
// Mimi decodes by default (moshi's get_mimi: set_num_codebooks(8)).
const NumCodebooks = 8

// Config is a Mimi model's construction arguments in the layout of moshi's
// loaders.get_mimi (the kwargs dictionaries plus the MimiModel arguments), as
// written to mimi_config.json next to the fixture weights. Keys a file omits
// keep the official defaults (DefaultConfig).
type Config struct {
	SEANet      SEANetConfig      `json:"seanet_kwargs"`
	Quantizer   QuantizerConfig   `json:"quantizer_kwargs"`
	Transformer TransformerConfig `json:"transformer_kwargs"`
	SampleRate  int               `json:"sample_rate"`
	FrameRate   float64           `json:"frame_rate"`
	// ResampleMethod converts between the SEANet frame rate and FrameRate:
	// only "conv" (a learnt transposed convolution) is supported when the
	// two differ.
	ResampleMethod string `json:"resample_method"`
	// UpsampleChannelWise is MimiModel's upsample_channel_wise_bug (default
	// true): the upsampling transposed convolution is depthwise.
	UpsampleChannelWise *bool `json:"upsample_channel_wise_bug,omitempty"`
	Causal              bool  `json:"causal"`
	// NumCodebooksActive is the number of codebooks decoded per frame: the
	// semantic ones, then the first acoustic ones (moshi's
	// set_num_codebooks). A model emitting K codes per frame decodes with K.
	NumCodebooksActive int `json:"num_codebooks_active"`
}

// SEANetConfig is moshi's _seanet_kwargs (the decoder reads the same
// arguments as the encoder).
type SEANetConfig struct {
	Channels               int     `json:"channels"`
	Dimension              int     `json:"dimension"`
	Causal                 bool    `json:"causal"`
	NFilters               int     `json:"n_filters"`
	NResidualLayers        int     `json:"n_residual_layers"`
	Activation             string  `json:"activation"`
	Compress               int     `json:"compress"`
	DilationBase           int     `json:"dilation_base"`
	DisableNormOuterBlocks int     `json:"disable_norm_outer_blocks"`
	KernelSize             int     `json:"kernel_size"`
	ResidualKernelSize     int     `json:"residual_kernel_size"`
	LastKernelSize         int     `json:"last_kernel_size"`
	Norm                   string  `json:"norm"`
	PadMode                string  `json:"pad_mode"`
	Ratios                 []int   `json:"ratios"`
	TrueSkip               bool    `json:"true_skip"`
	FinalActivation        *string `json:"final_activation,omitempty"`
}

// QuantizerConfig is moshi's _quantizer_kwargs for the
// SplitResidualVectorQuantizer.
type QuantizerConfig struct {
	Dimension       int `json:"dimension"`
	NQ              int `json:"n_q"`
	Bins            int `json:"bins"`
	InputDimension  int `json:"input_dimension"`
	OutputDimension int `json:"output_dimension"`
	// NQSemantic is the number of codebooks of rvq_first (default 1).
	NQSemantic int `json:"n_q_semantic"`
}

// TransformerConfig is moshi's _transformer_kwargs for the
// ProjectedTransformer that follows the upsampling.
type TransformerConfig struct {
	DModel     int      `json:"d_model"`
	NumHeads   int      `json:"num_heads"`
	NumLayers  int      `json:"num_layers"`
	Causal     bool     `json:"causal"`
	LayerScale *float64 `json:"layer_scale"` // null: no LayerScale
	// Context is the attention span in steps (a query sees keys with
	// 0 ≤ pos_q − pos_k < Context); null means unlimited.
	Context             *int    `json:"context"`
	ConvLayout          bool    `json:"conv_layout"`
	MaxPeriod           float64 `json:"max_period"`
	Gating              string  `json:"gating"`
	Norm                string  `json:"norm"`
	PositionalEmbedding string  `json:"positional_embedding"`
	DimFeedforward      int     `json:"dim_feedforward"`
	InputDimension      int     `json:"input_dimension"`
	OutputDimensions    []int   `json:"output_dimensions"`
}

// DefaultConfig returns the official Mimi configuration
// (moshi.models.loaders.get_mimi with 8 active codebooks).
func DefaultConfig() Config {
	layerScale, context := 0.01, 250
	channelWise := true
	return Config{
		SEANet: SEANetConfig{
			Channels: 1, Dimension: 512, Causal: true, NFilters: 64, NResidualLayers: 1,
			Activation: "ELU", Compress: 2, DilationBase: 2, KernelSize: 7,
			ResidualKernelSize: 3, LastKernelSize: 3, Norm: "none", PadMode: "constant",
			Ratios: []int{8, 6, 5, 4}, TrueSkip: true,
		},
		Quantizer: QuantizerConfig{
			Dimension: 256, NQ: 32, Bins: 2048, InputDimension: 512, OutputDimension: 512, NQSemantic: 1,
		},
		Transformer: TransformerConfig{
			DModel: 512, NumHeads: 8, NumLayers: 8, Causal: true, LayerScale: &layerScale,
			Context: &context, ConvLayout: true, MaxPeriod: 10000, Gating: "none",
			Norm: "layer_norm", PositionalEmbedding: "rope", DimFeedforward: 2048,
			InputDimension: 512, OutputDimensions: []int{512},
		},
		SampleRate:          24000,
		FrameRate:           12.5,
		ResampleMethod:      "conv",
		UpsampleChannelWise: &channelWise,
		Causal:              true,
		NumCodebooksActive:  NumCodebooks,
	}
}

// ParseConfig reads a mimi_config.json over the defaults and validates the
// result. Unknown keys (such as the fixture's notes) are ignored.
func ParseConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	if err := json.Unmarshal(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("mimi config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// LoadConfig reads and validates a mimi_config.json file.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("mimi config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Limits on sizes, so that a hostile config cannot ask for absurd memory.
// Each field has its own range, far above the official model's; since
// fields in range can still multiply into an absurd decoder, the whole is
// bounded too (MaxDecoderParams, MaxStreamState), before New allocates any
// of it.
const (
	maxDim      = 1 << 16
	maxKernel   = 1 << 10
	maxLayers   = 1 << 10
	maxBins     = 1 << 20
	maxRatios   = 16
	maxHopSize  = 1 << 20
	maxDilation = 1 << 16 // the residual blocks' largest dilation (official: 1)

	// MaxDecoderParams bounds the values New allocates for the decoder's
	// weights (codebook table, convolutions, transformer): 2^28, a GiB of
	// float32, six times the official decoder's 45 million.
	MaxDecoderParams = 1 << 28
	// MaxStreamState bounds a stream's state values (convolution histories
	// and the transformer's keys and values at its full context): 2^26, 256
	// MiB of float32; the official decoder's is about two million.
	MaxStreamState = 1 << 26
)

// Validate checks that the configuration describes a Mimi decoder this
// package can run, naming the first field that does not.
func (c *Config) Validate() error {
	s, q, t := &c.SEANet, &c.Quantizer, &c.Transformer
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	inRange := func(name string, v, lo, hi int) bool {
		if v < lo || v > hi {
			bad("%s = %d, want %d..%d", name, v, lo, hi)
			return false
		}
		return true
	}

	inRange("seanet_kwargs.channels", s.Channels, 1, 1)
	inRange("seanet_kwargs.dimension", s.Dimension, 1, maxDim)
	inRange("seanet_kwargs.n_filters", s.NFilters, 1, maxDim)
	inRange("seanet_kwargs.n_residual_layers", s.NResidualLayers, 0, maxLayers)
	inRange("seanet_kwargs.compress", s.Compress, 1, maxDim)
	if inRange("seanet_kwargs.dilation_base", s.DilationBase, 1, 16) && s.NResidualLayers >= 1 && s.NResidualLayers <= maxLayers {
		dil := 1
		for range s.NResidualLayers - 1 {
			if dil *= s.DilationBase; dil > maxDilation {
				bad("seanet_kwargs.dilation_base^(n_residual_layers-1) exceeds %d", maxDilation)
				break
			}
		}
	}
	inRange("seanet_kwargs.kernel_size", s.KernelSize, 1, maxKernel)
	inRange("seanet_kwargs.residual_kernel_size", s.ResidualKernelSize, 1, maxKernel)
	inRange("seanet_kwargs.last_kernel_size", s.LastKernelSize, 1, maxKernel)
	if !s.Causal || !c.Causal {
		bad("causal = false: only the causal (streaming) Mimi is supported")
	}
	if s.Activation != "ELU" {
		bad("seanet_kwargs.activation = %q, want \"ELU\"", s.Activation)
	}
	if s.Norm != "none" {
		bad("seanet_kwargs.norm = %q, want \"none\" (inference weights have weight norm folded in)", s.Norm)
	}
	if s.PadMode != "constant" && s.PadMode != "replicate" {
		bad("seanet_kwargs.pad_mode = %q, want \"constant\" or \"replicate\"", s.PadMode)
	}
	if s.FinalActivation != nil {
		bad("seanet_kwargs.final_activation = %q is not supported", *s.FinalActivation)
	}
	if len(s.Ratios) == 0 || len(s.Ratios) > maxRatios {
		bad("seanet_kwargs.ratios has %d entries, want 1..%d", len(s.Ratios), maxRatios)
	}
	hop := 1
	for i, r := range s.Ratios {
		if r < 1 || r > maxKernel {
			bad("seanet_kwargs.ratios[%d] = %d, want 1..%d", i, r, maxKernel)
			hop = 0
			break
		}
		hop *= r
		if hop > maxHopSize {
			bad("seanet_kwargs.ratios: hop %d exceeds %d", hop, maxHopSize)
			hop = 0
			break
		}
	}
	if s.NFilters >= 1 && s.NFilters <= maxDim && len(s.Ratios) <= maxRatios {
		if w := s.NFilters << len(s.Ratios); w > maxDim {
			bad("seanet_kwargs.n_filters·2^len(ratios) = %d exceeds %d", w, maxDim)
		}
		// Every residual block narrows its branch by compress; the
		// narrowest block has n_filters channels.
		if s.Compress >= 1 && s.NFilters/s.Compress < 1 {
			bad("seanet_kwargs.compress = %d leaves no channels in the residual blocks of width %d", s.Compress, s.NFilters)
		}
	}

	inRange("quantizer_kwargs.dimension", q.Dimension, 1, maxDim)
	inRange("quantizer_kwargs.bins", q.Bins, 1, maxBins)
	inRange("quantizer_kwargs.n_q", q.NQ, 2, maxLayers)
	inRange("quantizer_kwargs.n_q_semantic", q.NQSemantic, 1, q.NQ-1)
	inRange("num_codebooks_active", c.NumCodebooksActive, q.NQSemantic+1, q.NQ)
	if q.OutputDimension != s.Dimension {
		bad("quantizer_kwargs.output_dimension = %d, want seanet dimension %d", q.OutputDimension, s.Dimension)
	}

	inRange("transformer_kwargs.d_model", t.DModel, 1, maxDim)
	inRange("transformer_kwargs.num_heads", t.NumHeads, 1, maxDim)
	inRange("transformer_kwargs.num_layers", t.NumLayers, 0, maxLayers)
	inRange("transformer_kwargs.dim_feedforward", t.DimFeedforward, 1, 16*maxDim)
	if t.NumHeads > 0 && t.DModel%t.NumHeads != 0 {
		bad("transformer_kwargs.d_model = %d is not a multiple of num_heads = %d", t.DModel, t.NumHeads)
	}
	if !t.Causal {
		bad("transformer_kwargs.causal = false: only the causal transformer streams")
	}
	if t.Context != nil && (*t.Context < 1 || *t.Context > 1<<20) {
		bad("transformer_kwargs.context = %d, want 1..%d or null", *t.Context, 1<<20)
	}
	if t.Norm != "layer_norm" {
		bad("transformer_kwargs.norm = %q, want \"layer_norm\"", t.Norm)
	}
	if t.Gating != "none" {
		bad("transformer_kwargs.gating = %q, want \"none\"", t.Gating)
	}
	switch t.PositionalEmbedding {
	case "rope":
		if t.NumHeads > 0 && (t.DModel/t.NumHeads)%2 != 0 {
			bad("transformer_kwargs: head dimension %d must be even for RoPE", t.DModel/t.NumHeads)
		}
		if !(t.MaxPeriod > 0) || math.IsInf(t.MaxPeriod, 0) {
			bad("transformer_kwargs.max_period = %v, want > 0", t.MaxPeriod)
		}
	case "none":
	default:
		bad("transformer_kwargs.positional_embedding = %q, want \"rope\" or \"none\"", t.PositionalEmbedding)
	}
	if t.InputDimension != s.Dimension {
		bad("transformer_kwargs.input_dimension = %d, want seanet dimension %d", t.InputDimension, s.Dimension)
	}
	if len(t.OutputDimensions) != 1 || t.OutputDimensions[0] != s.Dimension {
		bad("transformer_kwargs.output_dimensions = %v, want [%d]", t.OutputDimensions, s.Dimension)
	}

	if c.SampleRate < 1 || c.SampleRate > 1<<24 {
		bad("sample_rate = %d, want 1..%d", c.SampleRate, 1<<24)
	}
	if !(c.FrameRate > 0) || math.IsInf(c.FrameRate, 0) {
		bad("frame_rate = %v, want > 0", c.FrameRate)
	}
	if len(errs) == 0 && hop > 0 {
		if _, err := c.upsampleStride(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		params, state := c.sizes()
		if params > MaxDecoderParams {
			bad("the configuration sizes a decoder of %d parameters, more than the limit %d", params, MaxDecoderParams)
		}
		if state > MaxStreamState {
			bad("the configuration sizes %d state values per stream, more than the limit %d", state, MaxStreamState)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("mimi config: %w", errors.Join(errs...))
	}
	return nil
}

// sizes returns the number of weight values New allocates for c and the
// number of state values a stream holds (at the transformer's full context;
// an unlimited context counts nothing). c must be valid apart from these
// totals: every field in its range.
func (c *Config) sizes() (params, state int64) {
	s, q, t := &c.SEANet, &c.Quantizer, &c.Transformer
	n := func(v int) int64 { return int64(v) }
	// The quantizer's codebook table and output projections.
	params += n(c.NumCodebooksActive)*n(q.Bins)*n(q.Dimension) + 2*n(q.OutputDimension)*n(q.Dimension)
	// The upsampling transposed convolution: kernel 2u, stride u.
	dim := n(s.Dimension)
	if u, err := c.upsampleStride(); err == nil && u > 1 {
		if c.channelWise() {
			params += 2 * n(u) * dim
		} else {
			params += 2 * n(u) * dim * dim
		}
		state += 2 * n(u) * dim
	}
	// The transformer and its projections.
	d, ff := n(t.DModel), n(t.DimFeedforward)
	params += n(t.NumLayers)*(4*d*d+2*d*ff+6*d) + 2*d*dim
	if t.Context != nil {
		state += n(t.NumLayers) * 2 * n(*t.Context) * d
	}
	// The SEANet decoder.
	conv := func(cin, cout, k, dil int64) {
		params += cout*k*cin + cout
		state += (k - 1) * dil * cin
	}
	nf := n(s.NFilters)
	mult := int64(1) << len(s.Ratios)
	conv(dim, mult*nf, n(s.KernelSize), 1)
	for _, r := range s.Ratios {
		cin := mult * nf
		ch := cin / 2
		params += 2*n(r)*ch*cin + ch // transposed convolution: kernel 2r, stride r
		state += 2 * n(r) * ch
		hidden := ch / n(s.Compress)
		dil := int64(1)
		for range s.NResidualLayers {
			conv(ch, hidden, n(s.ResidualKernelSize), dil)
			conv(hidden, ch, 1, 1)
			if !s.TrueSkip {
				conv(ch, ch, 1, 1)
			}
			dil *= n(s.DilationBase)
		}
		mult /= 2
	}
	conv(nf, n(s.Channels), n(s.LastKernelSize), 1)
	return params, state
}

// Hop returns the SEANet decoder's upsampling factor (the product of the
// ratios): output samples per latent step.
func (c *Config) Hop() int {
	h := 1
	for _, r := range c.SEANet.Ratios {
		h *= r
	}
	return h
}

// upsampleStride returns the factor between the frame rate and the SEANet
// frame rate (1 when they are equal and no resampling happens).
func (c *Config) upsampleStride() (int, error) {
	enc := float64(c.SampleRate) / float64(c.Hop())
	if enc == c.FrameRate {
		return 1, nil
	}
	if c.ResampleMethod != "conv" {
		return 0, fmt.Errorf("mimi config: resample_method = %q, want \"conv\"", c.ResampleMethod)
	}
	r := enc / c.FrameRate
	if r < 1 || r != math.Trunc(r) || r > maxKernel {
		return 0, fmt.Errorf("mimi config: SEANet frame rate %v / frame_rate %v = %v is not an integer ≥ 1", enc, c.FrameRate, r)
	}
	return int(r), nil
}

// FrameSamples returns the number of output samples per frame of codes
// (1920 for the official 24 kHz, 12.5 Hz model).
func (c *Config) FrameSamples() int {
	u, err := c.upsampleStride()
	if err != nil {
		return 0
	}
	return u * c.Hop()
}

func (c *Config) channelWise() bool { return c.UpsampleChannelWise == nil || *c.UpsampleChannelWise }
