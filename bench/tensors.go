package bench

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// Dist is a distribution tensor values are drawn from.
type Dist uint8

// Distributions. Normal, Uniform and LogNormal values are quantiles of the
// distribution picked by a 16-bit random index: 65536 equally likely values
// (a normal's reach ±4.3σ), which is what makes drawing billions of them
// cheap.
const (
	Normal    Dist = iota + 1 // mean A, standard deviation B
	Uniform                   // on [A, B)
	LogNormal                 // exp of a normal with mean A, deviation B
	Const                     // every value A
	Arange                    // value i is A + i·B
)

// Init is how a tensor's values are made.
type Init struct {
	Dist Dist
	A, B float64
}

func (in Init) String() string {
	switch in.Dist {
	case Normal:
		return fmt.Sprintf("N(%g, %g²)", in.A, in.B)
	case Uniform:
		return fmt.Sprintf("U[%g, %g)", in.A, in.B)
	case LogNormal:
		return fmt.Sprintf("exp(N(%g, %g²))", in.A, in.B)
	case Const:
		return fmt.Sprintf("%g", in.A)
	case Arange:
		return fmt.Sprintf("%g + %g·i", in.A, in.B)
	}
	return fmt.Sprintf("Dist(%d)", in.Dist)
}

// TensorSpec is one tensor of a synthetic checkpoint.
type TensorSpec struct {
	Name  string
	Shape []int // PyTorch order
	DType safetensors.DType
	Init  Init
	// Buffer marks a registered buffer (BatchNorm statistics, codebook
	// offsets): stored in the file, not a parameter.
	Buffer bool
	// Tied marks a materialised copy of a tied parameter (not counted as a
	// parameter of its own).
	Tied bool
}

// Len returns the number of elements.
func (s TensorSpec) Len() int64 {
	n := int64(1)
	for _, d := range s.Shape {
		n *= int64(d)
	}
	return n
}

// Bytes returns the size of the tensor's data.
func (s TensorSpec) Bytes() int64 { return s.Len() * int64(dtypeSize(s.DType)) }

// dtypeSize returns the size of an element of the dtypes synthetic
// checkpoints use (BF16, F32, I64, F64), or 0.
func dtypeSize(dt safetensors.DType) int {
	switch dt {
	case safetensors.BF16:
		return 2
	case safetensors.F32:
		return 4
	case safetensors.I64, safetensors.F64:
		return 8
	}
	return 0
}

// Parameters returns the number of parameters among specs (buffers and
// materialised tied copies excluded), as PyTorch's parameters() counts them.
func Parameters(specs []TensorSpec) int64 {
	var n int64
	for _, s := range specs {
		if !s.Buffer && !s.Tied {
			n += s.Len()
		}
	}
	return n
}

// TotalBytes returns the data bytes of specs.
func TotalBytes(specs []TensorSpec) int64 {
	var n int64
	for _, s := range specs {
		n += s.Bytes()
	}
	return n
}

// WithPrefix returns the specs whose names start with one of prefixes.
func WithPrefix(specs []TensorSpec, prefixes ...string) []TensorSpec {
	var out []TensorSpec
	for _, s := range specs {
		for _, p := range prefixes {
			if strings.HasPrefix(s.Name, p) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// Initialisation scales of the embedding tables: those of the tiny
// reference fixtures (testdata/lfm2-audio-tiny/README.md), which keep the
// residual stream and the logits of order one to ten.
const (
	textEmbedStd  = 0.5
	audioEmbedStd = 0.35
	depthEmbedStd = 0.25
)

// specSet collects specs with the fixtures' initialisation rules: a ≥2-D
// weight N(0, 1/fan_in), a bias N(0, 0.05²), a norm weight 1 + N(0, 0.1²).
type specSet struct {
	dt    safetensors.DType
	specs []TensorSpec
}

func (s *specSet) add(name string, in Init, shape ...int) {
	s.specs = append(s.specs, TensorSpec{Name: name, Shape: shape, DType: s.dt, Init: in})
}

// weight adds a ≥2-D weight with N(0, 1/fan_in), fan_in = prod(shape[1:]).
func (s *specSet) weight(name string, shape ...int) {
	fan := 1
	for _, d := range shape[1:] {
		fan *= d
	}
	s.add(name, Init{Normal, 0, 1 / math.Sqrt(float64(fan))}, shape...)
}

func (s *specSet) bias(name string, n int) { s.add(name, Init{Normal, 0, 0.05}, n) }

func (s *specSet) norm(name string, n int) { s.add(name, Init{Normal, 1, 0.1}, n) }

// linear adds name.weight [out, in] and, with bias, name.bias [out].
func (s *specSet) linear(name string, out, in int, bias bool) {
	s.weight(name+".weight", out, in)
	if bias {
		s.bias(name+".bias", out)
	}
}

// layerNorm adds name.weight and name.bias.
func (s *specSet) layerNorm(name string, n int) {
	s.norm(name+".weight", n)
	s.bias(name+".bias", n)
}

func (s *specSet) buffer(name string, dt safetensors.DType, in Init, shape ...int) {
	s.specs = append(s.specs, TensorSpec{Name: name, Shape: shape, DType: dt, Init: in, Buffer: true})
}

// ModelTensors returns every tensor of model.safetensors for cfg (bf16, as
// released), in the released file's layout: the backbone lfm.*, the
// encoder conformer.*, the adapter audio_adapter.*, the audio embedding, the
// depthformer and its tables, and the buffers codebook_offsets and
// audio_loss_weights. The audio tables hold depth.VocabSize(codebookSize)
// entries per codebook: the codec's codebookSize codes (its quantizer's
// bins) and end-of-audio. With materializeTied, the tied depth to_logits
// tables are stored too (the released file holds them: 2.94 GB).
func ModelTensors(cfg *config.Audio, codebookSize int, materializeTied bool) ([]TensorSpec, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if codebookSize < 1 {
		return nil, fmt.Errorf("codebook size %d, want at least 1", codebookSize)
	}
	V := depth.VocabSize(codebookSize)
	s := &specSet{dt: safetensors.BF16}
	lfmTensors(s, &cfg.LFM)
	encoderTensors(s, cfg.Encoder, cfg.LFM.HiddenSize)
	H, CB := cfg.LFM.HiddenSize, cfg.Codebooks
	s.add("audio_embedding.embedding.weight", Init{Normal, 0, audioEmbedStd}, CB*V, H)
	s.norm("audio_embedding.embedding_norm.weight", H)
	if !cfg.TieAudioEmbeddings {
		s.weight("audio_embedding.to_logits.weight", CB*V, H)
	}
	d := cfg.Depthformer
	D, F := d.Dim, d.FFNDim()
	hd, kv := d.HeadDim(), d.KVHeads()*d.HeadDim()
	s.linear("depth_linear", CB*D, H, true)
	for i := 0; i < d.Layers; i++ {
		p := fmt.Sprintf("depthformer.layers.%d.", i)
		s.norm(p+"operator_norm.weight", D)
		s.norm(p+"ffn_norm.weight", D)
		s.weight(p+"operator.qkv_proj.weight", D+2*kv, D)
		s.weight(p+"operator.out_proj.weight", D, D)
		s.norm(p+"operator.bounded_attention.q_layernorm.weight", hd)
		s.norm(p+"operator.bounded_attention.k_layernorm.weight", hd)
		s.weight(p+"feed_forward.w1.weight", F, D)
		s.weight(p+"feed_forward.w3.weight", F, D)
		s.weight(p+"feed_forward.w2.weight", D, F)
	}
	for i := 0; i < CB; i++ {
		p := fmt.Sprintf("depth_embeddings.%d.", i)
		s.add(p+"embedding.weight", Init{Normal, 0, depthEmbedStd}, V, D)
		s.norm(p+"embedding_norm.weight", D)
		switch {
		case !d.Tie:
			s.weight(p+"to_logits.weight", V, D)
		case materializeTied:
			s.add(p+"to_logits.weight", Init{Normal, 0, depthEmbedStd}, V, D)
			s.specs[len(s.specs)-1].Tied = true
		}
	}
	s.buffer("codebook_offsets", safetensors.I64, Init{Arange, 0, float64(V)}, CB)
	s.buffer("audio_loss_weights", safetensors.BF16, Init{Const, 1, 0}, CB)
	return s.specs, nil
}

// lfmTensors adds the backbone (HF Lfm2Model names under lfm.).
func lfmTensors(s *specSet, c *config.LFM2) {
	H, F := c.HiddenSize, c.FFNDim()
	hd := c.HeadDim()
	s.add("lfm.embed_tokens.weight", Init{Normal, 0, textEmbedStd}, c.VocabSize, H)
	s.norm("lfm.embedding_norm.weight", H)
	for i, kind := range c.LayerTypes {
		p := fmt.Sprintf("lfm.layers.%d.", i)
		s.norm(p+"operator_norm.weight", H)
		s.norm(p+"ffn_norm.weight", H)
		s.weight(p+"feed_forward.w1.weight", F, H)
		s.weight(p+"feed_forward.w3.weight", F, H)
		s.weight(p+"feed_forward.w2.weight", H, F)
		if kind == config.LayerConv {
			s.linear(p+"conv.in_proj", 3*H, H, c.ConvBias)
			s.weight(p+"conv.conv.weight", H, 1, c.ConvLCache)
			if c.ConvBias {
				s.bias(p+"conv.conv.bias", H)
			}
			s.linear(p+"conv.out_proj", H, H, c.ConvBias)
			continue
		}
		s.weight(p+"self_attn.q_proj.weight", c.NumAttentionHeads*hd, H)
		s.weight(p+"self_attn.k_proj.weight", c.NumKeyValueHeads*hd, H)
		s.weight(p+"self_attn.v_proj.weight", c.NumKeyValueHeads*hd, H)
		s.weight(p+"self_attn.out_proj.weight", H, c.NumAttentionHeads*hd)
		s.norm(p+"self_attn.q_layernorm.weight", hd)
		s.norm(p+"self_attn.k_layernorm.weight", hd)
	}
}

// encoderTensors adds the FastConformer (NeMo names under conformer.) and
// the adapter.
func encoderTensors(s *specSet, e config.Encoder, hidden int) {
	d := e.DModel
	C := e.SubsamplingConvChannels
	if C == -1 {
		C = d
	}
	const k = 3 // dw_striding's kernel
	stages := bits.TrailingZeros(uint(e.SubsamplingFactor))
	w := e.FeatIn
	for range stages {
		w = (w+2-k)/2 + 1 // stride 2, padding 1
	}
	p := "conformer.pre_encode."
	s.weight(p+"conv.0.weight", C, 1, k, k)
	s.bias(p+"conv.0.bias", C)
	for i := range stages - 1 {
		dw, pw := fmt.Sprintf("%sconv.%d", p, 3*i+2), fmt.Sprintf("%sconv.%d", p, 3*i+3)
		s.weight(dw+".weight", C, 1, k, k)
		s.bias(dw+".bias", C)
		s.weight(pw+".weight", C, C, 1, 1)
		s.bias(pw+".bias", C)
	}
	s.linear(p+"out", d, C*w, true)
	ff := d * e.FFExpansionFactor
	hd := d / e.NHeads
	for i := 0; i < e.NLayers; i++ {
		p := fmt.Sprintf("conformer.layers.%d.", i)
		for _, n := range []string{"norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"} {
			s.layerNorm(p+n, d)
		}
		for _, f := range []string{"feed_forward1", "feed_forward2"} {
			s.linear(p+f+".linear1", ff, d, true)
			s.linear(p+f+".linear2", d, ff, true)
		}
		for _, n := range []string{"linear_q", "linear_k", "linear_v", "linear_out"} {
			s.linear(p+"self_attn."+n, d, d, true)
		}
		s.weight(p+"self_attn.linear_pos.weight", d, d)
		s.add(p+"self_attn.pos_bias_u", Init{Normal, 0, 0.1}, e.NHeads, hd)
		s.add(p+"self_attn.pos_bias_v", Init{Normal, 0, 0.1}, e.NHeads, hd)
		s.weight(p+"conv.pointwise_conv1.weight", 2*d, d, 1)
		s.bias(p+"conv.pointwise_conv1.bias", 2*d)
		s.weight(p+"conv.depthwise_conv.weight", d, 1, e.ConvKernelSize)
		s.bias(p+"conv.depthwise_conv.bias", d)
		s.layerNorm(p+"conv.batch_norm", d)
		s.buffer(p+"conv.batch_norm.running_mean", s.dt, Init{Normal, 0, 0.1}, d)
		s.buffer(p+"conv.batch_norm.running_var", s.dt, Init{LogNormal, 0, 0.2}, d)
		s.buffer(p+"conv.batch_norm.num_batches_tracked", safetensors.I64, Init{Const, 0, 0})
		s.weight(p+"conv.pointwise_conv2.weight", d, d, 1)
		s.bias(p+"conv.pointwise_conv2.bias", d)
	}
	out := d
	if e.FeatOut > 0 && e.FeatOut != d {
		s.linear("conformer.out_proj", e.FeatOut, d, true)
		out = e.FeatOut
	}
	s.layerNorm("audio_adapter.model.0", out)
	s.linear("audio_adapter.model.1", hidden, out, true)
	s.linear("audio_adapter.model.3", hidden, hidden, true)
}

// MimiTensors returns the decoding half of a Mimi checkpoint for cfg in
// moshi's state_dict names (float32, as released): the split RVQ's output
// projections and codebooks, the upsampling, the decoder transformer and
// the SEANet decoder. The encoder half, which decoding never reads, is left
// out.
func MimiTensors(cfg mimi.Config) ([]TensorSpec, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &specSet{dt: safetensors.F32}
	sc, qc, tc := cfg.SEANet, cfg.Quantizer, cfg.Transformer
	dim := sc.Dimension
	for _, part := range []struct {
		name string
		n    int
	}{{"rvq_first", qc.NQSemantic}, {"rvq_rest", qc.NQ - qc.NQSemantic}} {
		p := "quantizer." + part.name + "."
		s.weight(p+"output_proj.weight", qc.OutputDimension, qc.Dimension, 1)
		for i := 0; i < part.n; i++ {
			cb := fmt.Sprintf("%svq.layers.%d._codebook.", p, i)
			s.buffer(cb+"_initialized", safetensors.F32, Init{Const, 1, 0}, 1)
			s.buffer(cb+"cluster_usage", safetensors.F32, Init{Uniform, 0.5, 2}, qc.Bins)
			s.buffer(cb+"embedding_sum", safetensors.F32, Init{Normal, 0, 1}, qc.Bins, qc.Dimension)
		}
	}
	// The upsampling from the frame rate to the SEANet rate (a transposed
	// convolution of kernel 2u, stride u; fan-in in/groups·k/stride).
	if u := cfg.FrameSamples() / cfg.Hop(); u > 1 {
		k := 2 * u
		name := "upsample.convtr.convtr.convtr.weight"
		if cfg.UpsampleChannelWise == nil || *cfg.UpsampleChannelWise {
			s.add(name, Init{Normal, 0, 1 / math.Sqrt(2)}, dim, 1, k)
		} else {
			s.add(name, Init{Normal, 0, 1 / math.Sqrt(float64(2*dim))}, dim, dim, k)
		}
	}
	d := tc.DModel
	if tc.InputDimension != d {
		s.weight("decoder_transformer.input_proj.weight", d, tc.InputDimension)
	}
	if tc.OutputDimensions[0] != d {
		s.weight("decoder_transformer.output_projs.0.weight", tc.OutputDimensions[0], d)
	}
	for i := 0; i < tc.NumLayers; i++ {
		p := fmt.Sprintf("decoder_transformer.transformer.layers.%d.", i)
		s.weight(p+"self_attn.in_projs.0.weight", 3*d, d)
		s.weight(p+"self_attn.out_projs.0.weight", d, d)
		s.layerNorm(p+"norm1", d)
		s.layerNorm(p+"norm2", d)
		s.weight(p+"linear1.weight", tc.DimFeedforward, d)
		s.weight(p+"linear2.weight", d, tc.DimFeedforward)
		if tc.LayerScale != nil {
			s.add(p+"layer_scale_1.scale", Init{Uniform, 0.2, 0.6}, d)
			s.add(p+"layer_scale_2.scale", Init{Uniform, 0.2, 0.6}, d)
		}
	}
	// SEANet decoder, in moshi's nn.Sequential indices: conv, then per
	// ratio ELU + transposed conv and the residual blocks, then ELU + conv.
	mult := 1 << len(sc.Ratios)
	conv := func(name string, cout, cin, k int) {
		s.weight(name+".weight", cout, cin, k)
		s.bias(name+".bias", cout)
	}
	conv("decoder.model.0.conv.conv", mult*sc.NFilters, dim, sc.KernelSize)
	idx := 1
	for _, r := range sc.Ratios {
		ch := mult * sc.NFilters / 2
		name := fmt.Sprintf("decoder.model.%d.convtr.convtr", idx+1)
		s.add(name+".weight", Init{Normal, 0, 1 / math.Sqrt(float64(mult*sc.NFilters*2))}, mult*sc.NFilters, ch, 2*r)
		s.bias(name+".bias", ch)
		idx += 2
		for j := 0; j < sc.NResidualLayers; j++ {
			p := fmt.Sprintf("decoder.model.%d.", idx)
			conv(p+"block.1.conv.conv", ch/sc.Compress, ch, sc.ResidualKernelSize)
			conv(p+"block.3.conv.conv", ch, ch/sc.Compress, 1)
			if !sc.TrueSkip {
				conv(p+"shortcut.conv.conv", ch, ch, 1)
			}
			idx++
		}
		mult /= 2
	}
	conv(fmt.Sprintf("decoder.model.%d.conv.conv", idx+1), sc.Channels, sc.NFilters, sc.LastKernelSize)
	return s.specs, nil
}
