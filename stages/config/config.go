// Package config decodes the config.json files of LiquidAI's speech models
// into typed structs and derives the sizes their code computes rather than
// stores (the FFN auto-adjust rule, the depthformer's hard-coded heads).
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

// Architectures omni-pipe can run, by config.json `architectures` entry.
var Architectures = []string{"Lfm2AudioForConditionalGeneration"}

// Bounds on the sizes a config.json may give. Each is far above every
// released LFM2 and LFM2-Audio model (the largest, LFM2-Audio-1.5B, has 16
// backbone layers of width 2048 with an FFN of 8192, a 65536-token
// vocabulary, 8 codebooks, 17 encoder layers of width 512 and 6
// depthformer layers of width 1024), so that larger future models load;
// and each is low enough that a size within it cannot by itself make the
// loader allocate absurd memory: what the configuration sizes before the
// checkpoint's tensors are checked (layer lists, mel filters, RoPE tables)
// stays small, and the tensors themselves must then match the checkpoint
// (stages/weights binds nothing it does not find with the exact shape).
const (
	// MaxLayers bounds every layer count: backbone, encoder, depthformer.
	MaxLayers = 1024
	// MaxHidden bounds every model width: hidden_size, d_model, the
	// depthformer's dim, the encoder's subsampling channels.
	MaxHidden = 1 << 16
	// MaxFFN bounds FFN widths: intermediate_size (block_ff_dim), the FFN
	// width after the auto-adjust rule, block_multiple_of.
	MaxFFN = 1 << 20
	// MaxVocab bounds vocab_size (LFM2: 65536; the largest vocabularies in
	// use are about 2^18).
	MaxVocab = 1 << 22
	// MaxHeads bounds attention head counts.
	MaxHeads = 1024
	// MaxCodebooks bounds codebooks: audio codes per frame (LFM2-Audio: 8;
	// Mimi has 32 at most).
	MaxCodebooks = 64
	// MaxPositions bounds max_position_embeddings, sliding_window and the
	// encoder's pos_emb_max_len (LFM2: 128000).
	MaxPositions = 1 << 24
	// MaxKernel bounds convolution kernels (conv_L_cache, conv_kernel_size,
	// conv_context_size).
	MaxKernel = 1024
	// MaxInterleave bounds interleaved_n_text and interleaved_n_audio
	// (LFM2-Audio: 6 and 12).
	MaxInterleave = 1024
	// MaxExpansion bounds the encoder's ff_expansion_factor (4).
	MaxExpansion = 64
	// MaxFFNMultiplier bounds block_ffn_dim_multiplier (1.0).
	MaxFFNMultiplier = 16.0
	// MaxFeatures bounds the preprocessor's mel features (128).
	MaxFeatures = 512
	// MaxNFFT bounds n_fft (512): 16384 is a second at 16 kHz.
	MaxNFFT = 1 << 14
	// MinSampleRate and MaxSampleRate bound the preprocessor's rate (16000).
	MinSampleRate, MaxSampleRate = 1000, 384000
	// MaxPadTo bounds pad_to (0).
	MaxPadTo = 1 << 16
)

// sizeCheck collects out-of-bounds errors, each naming the field (with its
// section's prefix), the value and the allowed range.
type sizeCheck struct {
	prefix string
	errs   []error
}

func (s *sizeCheck) add(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf(s.prefix+format, args...))
}

// int checks lo ≤ v ≤ hi.
func (s *sizeCheck) int(field string, v, lo, hi int) bool {
	if v < lo || v > hi {
		s.add("%s = %d, want %d..%d", field, v, lo, hi)
		return false
	}
	return true
}

// float checks that v is finite and lo ≤ v ≤ hi (lo < v when open).
func (s *sizeCheck) float(field string, v, lo, hi float64, open bool) bool {
	ok := !math.IsNaN(v) && !math.IsInf(v, 0) && v <= hi && (v > lo || !open && v == lo)
	if !ok {
		lb := "["
		if open {
			lb = "("
		}
		s.add("%s = %v, want %s%v, %v]", field, v, lb, lo, hi)
	}
	return ok
}

func (s *sizeCheck) err() error { return errors.Join(s.errs...) }

// Audio is LFM2-Audio's config.json (LFM2.5-Audio shares it).
type Audio struct {
	Architectures          []string     `json:"architectures"`
	Codebooks              int          `json:"codebooks"`
	TieAudioEmbeddings     bool         `json:"tie_audio_embeddings"`
	SemanticCodebookFactor float64      `json:"semantic_codebook_factor"`
	CodebookWeight         string       `json:"codebook_weight"`
	InterleavedNText       int          `json:"interleaved_n_text"`
	InterleavedNAudio      int          `json:"interleaved_n_audio"`
	Preprocessor           Preprocessor `json:"preprocessor"`
	Encoder                Encoder      `json:"encoder"`
	LFM                    LFM2         `json:"lfm"`
	Depthformer            Depthformer  `json:"depthformer"`
}

// Preprocessor is NeMo's AudioToMelSpectrogramPreprocessor configuration.
type Preprocessor struct {
	SampleRate    int     `json:"sample_rate"`
	Normalize     string  `json:"normalize"`
	WindowSize    float64 `json:"window_size"`
	WindowStride  float64 `json:"window_stride"`
	Window        string  `json:"window"`
	Features      int     `json:"features"`
	NFFT          int     `json:"n_fft"`
	Log           bool    `json:"log"`
	FrameSplicing int     `json:"frame_splicing"`
	Dither        float64 `json:"dither"`
	PadTo         int     `json:"pad_to"`
	PadValue      float64 `json:"pad_value"`
	// Preemph is absent from released files; the class default 0.97 applies.
	Preemph *float64 `json:"preemph,omitempty"`
}

// Preemphasis returns the pre-emphasis coefficient (0.97 when absent).
func (p Preprocessor) Preemphasis() float64 {
	if p.Preemph == nil {
		return 0.97
	}
	return *p.Preemph
}

// WinLength returns the window length in samples, truncated as NeMo's
// int(window_size * sample_rate).
func (p Preprocessor) WinLength() int { return int(p.WindowSize * float64(p.SampleRate)) }

// HopLength returns the hop in samples, truncated as NeMo's
// int(window_stride * sample_rate).
func (p Preprocessor) HopLength() int { return int(p.WindowStride * float64(p.SampleRate)) }

// Encoder is the FastConformer encoder configuration (NeMo names).
type Encoder struct {
	FeatIn                  int     `json:"feat_in"`
	FeatOut                 int     `json:"feat_out"`
	NLayers                 int     `json:"n_layers"`
	DModel                  int     `json:"d_model"`
	Subsampling             string  `json:"subsampling"`
	SubsamplingFactor       int     `json:"subsampling_factor"`
	SubsamplingConvChannels int     `json:"subsampling_conv_channels"`
	CausalDownsampling      bool    `json:"causal_downsampling"`
	FFExpansionFactor       int     `json:"ff_expansion_factor"`
	SelfAttentionModel      string  `json:"self_attention_model"`
	NHeads                  int     `json:"n_heads"`
	AttContextSize          []int   `json:"att_context_size"`
	XScaling                bool    `json:"xscaling"`
	UntieBiases             bool    `json:"untie_biases"`
	PosEmbMaxLen            int     `json:"pos_emb_max_len"`
	ConvKernelSize          int     `json:"conv_kernel_size"`
	ConvNormType            string  `json:"conv_norm_type"`
	ConvContextSize         []int   `json:"conv_context_size"`
	Dropout                 float64 `json:"dropout"`
}

// Depthformer is the audio head's configuration. Head counts, RoPE θ and the
// FFN width are hard-coded in liquid-audio; see the methods.
type Depthformer struct {
	Layers int  `json:"layers"`
	Dim    int  `json:"dim"`
	Tie    bool `json:"tie"`
}

// Heads returns the query heads (32, hard-coded in liquid-audio's MHA).
func (d Depthformer) Heads() int { return 32 }

// KVHeads returns the key/value heads (8, hard-coded).
func (d Depthformer) KVHeads() int { return 8 }

// HeadDim returns Dim / Heads.
func (d Depthformer) HeadDim() int { return d.Dim / d.Heads() }

// FFNDim returns the SwiGLU width: 4·Dim auto-adjusted (×2/3, up to a
// multiple of 256), e.g. 1024 → 2816.
func (d Depthformer) FFNDim() int { return AdjustFF(4*d.Dim, 1.0, 256) }

// RoPETheta returns the depthformer's RoPE base (1e6).
func (d Depthformer) RoPETheta() float64 { return 1e6 }

// NormEps returns the depthformer's RMSNorm epsilon.
func (d Depthformer) NormEps() float64 { return 1e-5 }

// AdjustFF is LFM2's SwiGLU width rule (block_auto_adjust_ff_dim):
// int(2·ff/3), times the multiplier (truncated), rounded up to multipleOf.
func AdjustFF(ff int, multiplier float64, multipleOf int) int {
	h := int(2 * float64(ff) / 3)
	if multiplier != 0 {
		h = int(multiplier * float64(h))
	}
	if multipleOf > 0 {
		h = multipleOf * ((h + multipleOf - 1) / multipleOf)
	}
	return h
}

// Layer kinds of an LFM2 model.
const (
	LayerConv      = "conv"
	LayerAttention = "full_attention"
	LayerSliding   = "sliding_attention"
)

// LFM2 is a Hugging Face Lfm2Config (the backbone, and the LFM2.5
// detokenizer's network). Both the `layer_types` and the older
// `full_attn_idxs` forms are accepted; Normalize derives the other.
type LFM2 struct {
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	IntermediateSize      int     `json:"intermediate_size"`
	BlockFFDim            *int    `json:"block_ff_dim"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	NumKeyValueHeads      int     `json:"num_key_value_heads"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	NormEps               float64 `json:"norm_eps"`
	RopeTheta             float64 `json:"rope_theta"`
	RopeParameters        *struct {
		RopeTheta float64 `json:"rope_theta"`
		RopeType  string  `json:"rope_type"`
	} `json:"rope_parameters"`
	ConvBias              bool          `json:"conv_bias"`
	ConvLCache            int           `json:"conv_L_cache"`
	BlockMultipleOf       int           `json:"block_multiple_of"`
	BlockFFNDimMultiplier NullableFloat `json:"block_ffn_dim_multiplier"`
	BlockAutoAdjustFFDim  *bool         `json:"block_auto_adjust_ff_dim"`
	FullAttnIdxs          []int         `json:"full_attn_idxs"`
	LayerTypes            []string      `json:"layer_types"`
	SlidingWindow         int           `json:"sliding_window"`
	TieWordEmbeddings     *bool         `json:"tie_word_embeddings"`
	TieEmbedding          *bool         `json:"tie_embedding"`
	BOSTokenID            int           `json:"bos_token_id"`
	EOSTokenID            int           `json:"eos_token_id"`
	PadTokenID            int           `json:"pad_token_id"`
}

// Normalize fills derived and defaulted fields the way Lfm2Config.__init__
// does, then validates. It is idempotent.
func (c *LFM2) Normalize() error {
	if c.BlockFFDim != nil { // Lfm2Config reads block_ff_dim over intermediate_size
		c.IntermediateSize = *c.BlockFFDim
	}
	if c.RopeTheta == 0 && c.RopeParameters != nil {
		c.RopeTheta = c.RopeParameters.RopeTheta
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 1e6
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.ConvLCache == 0 {
		c.ConvLCache = 3
	}
	if c.BlockMultipleOf == 0 {
		c.BlockMultipleOf = 256
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	// The sizes are bounded before anything is sized by them.
	if err := c.checkSizes(); err != nil {
		return err
	}
	if len(c.LayerTypes) == 0 {
		idx := c.FullAttnIdxs
		if idx == nil {
			idx = make([]int, c.NumHiddenLayers)
			for i := range idx {
				idx[i] = i
			}
		}
		c.LayerTypes = make([]string, c.NumHiddenLayers)
		for i := range c.LayerTypes {
			c.LayerTypes[i] = LayerConv
			if slices.Contains(idx, i) {
				c.LayerTypes[i] = LayerAttention
			}
		}
	}
	var errs []error
	if len(c.LayerTypes) != c.NumHiddenLayers {
		errs = append(errs, fmt.Errorf("layer_types has %d entries for %d layers", len(c.LayerTypes), c.NumHiddenLayers))
	}
	for i, t := range c.LayerTypes {
		switch t {
		case LayerConv, LayerAttention:
		case LayerSliding:
			if c.SlidingWindow <= 0 {
				errs = append(errs, fmt.Errorf("layer %d is %s but sliding_window is %d", i, t, c.SlidingWindow))
			}
		default:
			errs = append(errs, fmt.Errorf("layer %d has unknown type %q (want %s, %s or %s)", i, t, LayerConv, LayerAttention, LayerSliding))
		}
	}
	for _, i := range c.FullAttnIdxs {
		if i < 0 || i >= c.NumHiddenLayers {
			errs = append(errs, fmt.Errorf("full_attn_idxs has %d outside %d layers", i, c.NumHiddenLayers))
		}
	}
	if c.AttentionLayers() > 0 {
		if c.NumAttentionHeads <= 0 || c.HiddenSize%c.NumAttentionHeads != 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
			errs = append(errs, fmt.Errorf("%d attention heads and %d kv heads do not divide hidden size %d", c.NumAttentionHeads, c.NumKeyValueHeads, c.HiddenSize))
		} else if c.HeadDim()%2 != 0 {
			errs = append(errs, fmt.Errorf("head dim %d is odd; RoPE needs pairs", c.HeadDim()))
		}
	}
	if c.ConvLCache < 1 {
		errs = append(errs, fmt.Errorf("conv_L_cache %d must be positive", c.ConvLCache))
	}
	return errors.Join(errs...)
}

// checkSizes bounds every size and count of the section (see MaxLayers
// and the other bounds).
func (c *LFM2) checkSizes() error {
	s := &sizeCheck{}
	s.int("vocab_size", c.VocabSize, 1, MaxVocab)
	s.int("hidden_size", c.HiddenSize, 1, MaxHidden)
	ff := "intermediate_size"
	if c.BlockFFDim != nil {
		ff = "block_ff_dim"
	}
	okFF := s.int(ff, c.IntermediateSize, 1, MaxFFN)
	s.int("num_hidden_layers", c.NumHiddenLayers, 1, MaxLayers)
	s.int("num_attention_heads", c.NumAttentionHeads, 0, MaxHeads)
	s.int("num_key_value_heads", c.NumKeyValueHeads, 0, MaxHeads)
	s.int("max_position_embeddings", c.MaxPositionEmbeddings, 0, MaxPositions)
	s.int("sliding_window", c.SlidingWindow, 0, MaxPositions)
	s.int("conv_L_cache", c.ConvLCache, 1, MaxKernel)
	okMult := s.int("block_multiple_of", c.BlockMultipleOf, 1, MaxFFN)
	if n := len(c.FullAttnIdxs); n > MaxLayers {
		s.add("full_attn_idxs has %d entries, want at most %d", n, MaxLayers)
	}
	if n := len(c.LayerTypes); n > MaxLayers {
		s.add("layer_types has %d entries, want at most %d", n, MaxLayers)
	}
	s.float("norm_eps", c.NormEps, 0, 1, true)
	s.float("rope_theta", c.RopeTheta, 0, 1e12, true)
	okMul := true
	if m := c.BlockFFNDimMultiplier; m.Set && !m.Null {
		okMul = s.float("block_ffn_dim_multiplier", m.V, 0, MaxFFNMultiplier, true)
	}
	if okFF && okMult && okMul {
		s.int("the FFN width (after block_auto_adjust_ff_dim)", c.FFNDim(), 1, MaxFFN)
	}
	return s.err()
}

// HeadDim returns hidden_size / num_attention_heads.
func (c *LFM2) HeadDim() int {
	if c.NumAttentionHeads == 0 {
		return 0
	}
	return c.HiddenSize / c.NumAttentionHeads
}

// FFNDim returns the SwiGLU width after the auto-adjust rule exactly as
// transformers' Lfm2MLP applies it: int(2·ff/3), and only when
// block_ffn_dim_multiplier is set, times it and rounded up to
// block_multiple_of.
func (c *LFM2) FFNDim() int {
	if c.BlockAutoAdjustFFDim != nil && !*c.BlockAutoAdjustFFDim {
		return c.IntermediateSize
	}
	if c.BlockFFNDimMultiplier.Null {
		return int(2 * float64(c.IntermediateSize) / 3)
	}
	mult := 1.0 // Lfm2Config's default when the key is absent
	if c.BlockFFNDimMultiplier.Set {
		mult = c.BlockFFNDimMultiplier.V
	}
	return AdjustFF(c.IntermediateSize, mult, c.BlockMultipleOf)
}

// NullableFloat is a JSON number that distinguishes an absent key (Set
// false), an explicit null (Null true) and a value.
type NullableFloat struct {
	Set, Null bool
	V         float64
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *NullableFloat) UnmarshalJSON(b []byte) error {
	n.Set = true
	if string(b) == "null" {
		n.Null = true
		return nil
	}
	return json.Unmarshal(b, &n.V)
}

// TiedEmbeddings reports whether the output head shares embed_tokens
// (true unless the config says otherwise).
func (c *LFM2) TiedEmbeddings() bool {
	if c.TieWordEmbeddings != nil {
		return *c.TieWordEmbeddings
	}
	if c.TieEmbedding != nil {
		return *c.TieEmbedding
	}
	return true
}

// AttentionLayers counts the layers that attend.
func (c *LFM2) AttentionLayers() int {
	n := 0
	for _, t := range c.LayerTypes {
		if t != LayerConv {
			n++
		}
	}
	return n
}

// ReadAudio reads and validates an LFM2-Audio config.json.
func ReadAudio(path string) (*Audio, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := ParseAudio(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseAudio decodes and validates an LFM2-Audio config.json.
func ParseAudio(data []byte) (*Audio, error) {
	var c Audio
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("config JSON: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the architecture and the sizes, normalising the LFM2
// section.
func (c *Audio) Validate() error {
	supported := false
	for _, a := range c.Architectures {
		if slices.Contains(Architectures, a) {
			supported = true
		}
	}
	if !supported {
		return fmt.Errorf("unsupported architecture %q: omni-pipe runs %s", c.Architectures, strings.Join(Architectures, ", "))
	}
	var errs []error
	if err := c.LFM.Normalize(); err != nil {
		errs = append(errs, fmt.Errorf("lfm: %w", err))
	}
	if err := c.checkSizes(); err != nil {
		errs = append(errs, err)
		// The checks below compute with the sizes.
		return errors.Join(errs...)
	}
	d := c.Depthformer
	if d.Dim%d.Heads() != 0 || d.HeadDim()%2 != 0 {
		errs = append(errs, fmt.Errorf("depthformer: dim %d must split into %d heads of even size", d.Dim, d.Heads()))
	}
	e := c.Encoder
	if e.DModel%e.NHeads != 0 {
		errs = append(errs, fmt.Errorf("encoder: d_model %d is not a multiple of n_heads %d", e.DModel, e.NHeads))
	}
	if e.Subsampling != "dw_striding" || e.SubsamplingFactor != 8 {
		errs = append(errs, fmt.Errorf("encoder: subsampling %q ×%d is not supported (dw_striding ×8 is)", e.Subsampling, e.SubsamplingFactor))
	}
	if e.SelfAttentionModel != "rel_pos" {
		errs = append(errs, fmt.Errorf("encoder: self_attention_model %q is not supported (rel_pos is)", e.SelfAttentionModel))
	}
	if e.ConvNormType != "batch_norm" {
		errs = append(errs, fmt.Errorf("encoder: conv_norm_type %q is not supported (batch_norm is)", e.ConvNormType))
	}
	if e.ConvKernelSize%2 != 1 && e.ConvContextSize == nil {
		errs = append(errs, fmt.Errorf("encoder: conv_kernel_size %d must be odd", e.ConvKernelSize))
	}
	if e.FeatIn != c.Preprocessor.Features {
		errs = append(errs, fmt.Errorf("encoder feat_in %d != preprocessor features %d", e.FeatIn, c.Preprocessor.Features))
	}
	p := c.Preprocessor
	if p.WinLength() <= 0 || p.WinLength() > p.NFFT || p.HopLength() <= 0 {
		errs = append(errs, fmt.Errorf("preprocessor: sample_rate %d, n_fft %d, window %d, hop %d", p.SampleRate, p.NFFT, p.WinLength(), p.HopLength()))
	}
	if p.Normalize != "per_feature" || p.Window != "hann" || !p.Log || p.FrameSplicing > 1 {
		errs = append(errs, fmt.Errorf("preprocessor: normalize %q, window %q, log %v, frame_splicing %d: only per_feature, hann, log, no splicing are supported",
			p.Normalize, p.Window, p.Log, p.FrameSplicing))
	}
	return errors.Join(errs...)
}

// checkSizes bounds the sizes and counts outside the LFM2 section (see
// MaxLayers and the other bounds).
func (c *Audio) checkSizes() error {
	s := &sizeCheck{}
	s.int("codebooks", c.Codebooks, 1, MaxCodebooks)
	s.int("interleaved_n_text", c.InterleavedNText, 1, MaxInterleave)
	s.int("interleaved_n_audio", c.InterleavedNAudio, 1, MaxInterleave)

	s.prefix = "depthformer."
	s.int("layers", c.Depthformer.Layers, 1, MaxLayers)
	s.int("dim", c.Depthformer.Dim, 1, MaxHidden)

	e := &c.Encoder
	s.prefix = "encoder."
	s.int("feat_in", e.FeatIn, 1, MaxFeatures)
	if e.FeatOut != -1 {
		s.int("feat_out (-1: d_model)", e.FeatOut, 0, MaxHidden)
	}
	s.int("n_layers", e.NLayers, 1, MaxLayers)
	s.int("d_model", e.DModel, 1, MaxHidden)
	s.int("n_heads", e.NHeads, 1, MaxHeads)
	if e.SubsamplingConvChannels != -1 {
		s.int("subsampling_conv_channels (-1: d_model)", e.SubsamplingConvChannels, 1, MaxHidden)
	}
	s.int("ff_expansion_factor", e.FFExpansionFactor, 1, MaxExpansion)
	s.int("conv_kernel_size", e.ConvKernelSize, 1, MaxKernel)
	s.int("pos_emb_max_len", e.PosEmbMaxLen, 0, MaxPositions)
	if n := len(e.ConvContextSize); n > 2 {
		s.add("conv_context_size has %d entries, want 2", n)
	} else {
		for i, v := range e.ConvContextSize {
			s.int(fmt.Sprintf("conv_context_size[%d]", i), v, 0, MaxKernel)
		}
	}
	if n := len(e.AttContextSize); n > 2 {
		s.add("att_context_size has %d entries, want 2", n)
	} else {
		for i, v := range e.AttContextSize {
			s.int(fmt.Sprintf("att_context_size[%d]", i), v, -1, MaxPositions)
		}
	}
	s.float("dropout", e.Dropout, 0, 1, false)

	p := &c.Preprocessor
	s.prefix = "preprocessor."
	s.int("sample_rate", p.SampleRate, MinSampleRate, MaxSampleRate)
	s.int("features", p.Features, 1, MaxFeatures)
	s.int("n_fft", p.NFFT, 1, MaxNFFT)
	s.float("window_size", p.WindowSize, 0, 1, true)
	s.float("window_stride", p.WindowStride, 0, 1, true)
	s.int("frame_splicing", p.FrameSplicing, 0, 1)
	s.int("pad_to", p.PadTo, 0, MaxPadTo)
	s.float("dither", p.Dither, 0, 1, false)
	s.float("pad_value", p.PadValue, -1e6, 1e6, false)
	if p.Preemph != nil {
		s.float("preemph", *p.Preemph, 0, 1, false)
	}
	return s.err()
}
