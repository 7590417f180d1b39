// Package conformer is LFM2-Audio's audio encoder: NeMo's FastConformer
// (dw_striding subsampling, Transformer-XL relative-position self-attention,
// a convolution module with BatchNorm, macaron feed-forwards) followed by
// the audio adapter, the MLP that maps each encoder frame into the
// backbone's embedding space. It follows liquid-audio's
// model/conformer/{encoder,modules,mha,subsampling}.py and model/mlp.py for
// one clip at a time (batch 1, no padding, so every mask is all-visible);
// EncodeBatch runs several such clips at once, each exactly as alone.
//
// # Numerics
//
// In nn.BF16 mode every activation the bf16 reference stores is rounded to
// bf16 where the reference rounds it; arithmetic inside an op stays fp32,
// as PyTorch's CUDA kernels accumulate. The rounding points follow which
// CUDA kernel PyTorch 2.11 picks for each module in bf16:
//
//   - nn.Linear (cuBLAS addmm, bias in the epilogue or as beta·C): one
//     rounding of x·wᵀ + b.
//   - Non-depthwise convolutions (pre_encode conv.0 and the 1×1 pointwise
//     convolutions) run on cuDNN, and ConvNd then adds the bias with a
//     separate output.add_(bias): the convolution is rounded, then the sum.
//   - Depthwise convolutions (pre_encode conv.2/5/…, the conv module's
//     depthwise_conv) run on PyTorch's own depthwise kernel, which starts
//     its fp32 accumulator at the bias: one rounding.
//   - BatchNorm1d in bf16 is not given to cuDNN (bf16 is excluded), so the
//     native kernel computes bf16(γ·(x − mean)·rsqrt(var + eps) + β) in
//     fp32 with fp32 statistics; Load folds it into −mean, γ·invstd and β.
//   - Elementwise ops (residual adds, the 0.5 macaron scale, SiLU, GLU,
//     GELU, q + pos_bias) and LayerNorm, softmax and every matmul each
//     round their bf16 output once.
//   - The relative positional table is computed in fp32 and cast to bf16
//     with the model.
//
// nn.F32 keeps every activation in float32.
package conformer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// normEps is the epsilon of every LayerNorm and of the BatchNorm (the
// PyTorch defaults the reference keeps).
const normEps = 1e-5

// Encoder is the conformer encoder and the audio adapter. Its weights are
// read-only after Load, so goroutines may share one, each running its own
// nn.Ctx.
type Encoder struct {
	Cfg     config.Encoder
	DModel  int // d_model
	FeatOut int // width of the encoder output (d_model unless feat_out differs)
	Heads   int
	HeadDim int
	Hidden  int // the adapter's output width (the backbone's hidden size)

	Sub     Subsampling
	Layers  []Layer
	OutProj Linear // optional out_proj (only when feat_out ≠ d_model)
	Adapter Adapter

	pe posTable
}

// Linear is an nn.Linear: W [out, in], B [1, out] (B may be nil).
type Linear struct{ W, B gpu.Tensor }

// Norm is an nn.LayerNorm's affine parameters, [1, n] each.
type Norm struct{ W, B gpu.Tensor }

// Layer is one ConformerLayer.
type Layer struct {
	NormFF1, NormAtt, NormConv, NormFF2, NormOut Norm
	FF1, FF2                                     FeedForward
	Attn                                         Attention
	Conv                                         ConvModule
}

// FeedForward is ConformerFeedForward: Linear → SiLU → Linear.
type FeedForward struct{ Linear1, Linear2 Linear }

// Attention is RelPositionMultiHeadAttention.
type Attention struct {
	Q, K, V, Out Linear
	Pos          gpu.Tensor // linear_pos.weight [d, d], no bias
	BiasU, BiasV gpu.Tensor // pos_bias_u/v as [1, heads·head_dim]
}

// ConvModule is ConformerConvolution: pointwise conv → GLU → depthwise
// conv → BatchNorm → SiLU → pointwise conv.
type ConvModule struct {
	PW1, PW2 Linear     // the 1×1 convolutions as [out, in] matrices
	DW, DWB  gpu.Tensor // depthwise weight [d, kernel], bias [1, d]
	Kernel   int
	PadLeft  int // conv_context_size[0]
	// BatchNorm folded at load: y = (x + NegMean) ⊙ Scale + Shift, with
	// Scale = γ·rsqrt(running_var + eps) in fp32 ([1, d] F32 each).
	NegMean, Scale, Shift gpu.Tensor
}

// Adapter is the audio adapter MLP: LayerNorm → Linear → GELU → Linear.
type Adapter struct {
	Norm             Norm
	Linear1, Linear2 Linear
}

// Load binds the encoder (conformer.*) and the adapter (audio_adapter.*)
// from b, a binder at the checkpoint's root, sized by cfg; hidden is the
// backbone's hidden size (the adapter's width). BatchNorm statistics are
// folded into per-channel constants; num_batches_tracked is skipped. A
// configuration this package cannot run, or any missing or misshapen tensor,
// is an error.
func Load(b *weights.Binder, cfg config.Encoder, hidden int) (*Encoder, error) {
	if err := checkConfig(cfg, hidden); err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	d := cfg.DModel
	e := &Encoder{
		Cfg: cfg, DModel: d, FeatOut: d, Heads: cfg.NHeads, HeadDim: d / cfg.NHeads, Hidden: hidden,
		pe: posTable{d: d},
	}
	dev := b.Device()
	cb := b.Sub("conformer")
	var err error
	if e.Sub, err = loadSubsampling(cb.Sub("pre_encode"), cfg); err != nil {
		return nil, err
	}
	ff := d * cfg.FFExpansionFactor
	k := cfg.ConvKernelSize
	padLeft := (k - 1) / 2
	if len(cfg.ConvContextSize) == 2 {
		padLeft = cfg.ConvContextSize[0]
	}
	for i := range cfg.NLayers {
		lb := cb.Subf("layers.%d", i)
		l := Layer{
			NormFF1:  loadNorm(lb, "norm_feed_forward1", d),
			NormAtt:  loadNorm(lb, "norm_self_att", d),
			NormConv: loadNorm(lb, "norm_conv", d),
			NormFF2:  loadNorm(lb, "norm_feed_forward2", d),
			NormOut:  loadNorm(lb, "norm_out", d),
			FF1:      loadFF(lb.Sub("feed_forward1"), d, ff),
			FF2:      loadFF(lb.Sub("feed_forward2"), d, ff),
		}
		ab := lb.Sub("self_attn")
		l.Attn = Attention{
			Q:     loadLinear(ab, "linear_q", d, d),
			K:     loadLinear(ab, "linear_k", d, d),
			V:     loadLinear(ab, "linear_v", d, d),
			Out:   loadLinear(ab, "linear_out", d, d),
			Pos:   ab.Tensor("linear_pos.weight", d, d),
			BiasU: ab.Tensor("pos_bias_u", e.Heads, e.HeadDim).Reshape(1, d),
			BiasV: ab.Tensor("pos_bias_v", e.Heads, e.HeadDim).Reshape(1, d),
		}
		vb := lb.Sub("conv")
		cm := ConvModule{
			PW1:     Linear{vb.Tensor("pointwise_conv1.weight", 2*d, d, 1), vb.Tensor("pointwise_conv1.bias", 2*d)},
			PW2:     Linear{vb.Tensor("pointwise_conv2.weight", d, d, 1), vb.Tensor("pointwise_conv2.bias", d)},
			DW:      vb.Tensor("depthwise_conv.weight", d, 1, k),
			DWB:     vb.Tensor("depthwise_conv.bias", d),
			Kernel:  k,
			PadLeft: padLeft,
		}
		if cm.NegMean, cm.Scale, cm.Shift, err = loadBatchNorm(vb.Sub("batch_norm"), dev, d); err != nil {
			return nil, err
		}
		l.Conv = cm
		e.Layers = append(e.Layers, l)
	}
	if cfg.FeatOut > 0 && cfg.FeatOut != d {
		e.OutProj = loadLinear(cb, "out_proj", cfg.FeatOut, d)
		e.FeatOut = cfg.FeatOut
	}
	ab := b.Sub("audio_adapter")
	e.Adapter = Adapter{
		Norm:    loadNorm(ab, "model.0", e.FeatOut),
		Linear1: loadLinear(ab, "model.1", hidden, e.FeatOut),
		Linear2: loadLinear(ab, "model.3", hidden, hidden),
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return e, nil
}

// checkConfig refuses what the reference's ConformerEncoder would build
// differently from what this package computes.
func checkConfig(cfg config.Encoder, hidden int) error {
	var errs []error
	if cfg.FeatIn <= 0 || cfg.NLayers <= 0 || cfg.DModel <= 0 || cfg.NHeads <= 0 || cfg.DModel%cfg.NHeads != 0 {
		errs = append(errs, fmt.Errorf("feat_in %d, n_layers %d, d_model %d, n_heads %d: sizes must be positive and n_heads must divide d_model",
			cfg.FeatIn, cfg.NLayers, cfg.DModel, cfg.NHeads))
	}
	if cfg.FFExpansionFactor <= 0 {
		errs = append(errs, fmt.Errorf("ff_expansion_factor %d must be positive", cfg.FFExpansionFactor))
	}
	if hidden <= 0 {
		errs = append(errs, fmt.Errorf("adapter width %d must be positive", hidden))
	}
	f := cfg.SubsamplingFactor
	if cfg.Subsampling != "dw_striding" || f < 2 || bits.OnesCount(uint(f)) != 1 {
		errs = append(errs, fmt.Errorf("subsampling %q ×%d is not supported (dw_striding by a power of two is)", cfg.Subsampling, f))
	}
	if cfg.CausalDownsampling {
		errs = append(errs, errors.New("causal_downsampling is not supported"))
	}
	if c := cfg.SubsamplingConvChannels; c == 0 || c < -1 {
		errs = append(errs, fmt.Errorf("subsampling_conv_channels %d must be positive (or -1 for d_model)", c))
	}
	if cfg.SelfAttentionModel != "rel_pos" {
		errs = append(errs, fmt.Errorf("self_attention_model %q is not supported (rel_pos is)", cfg.SelfAttentionModel))
	}
	if len(cfg.AttContextSize) != 0 && !slices.Equal(cfg.AttContextSize, []int{-1, -1}) {
		errs = append(errs, fmt.Errorf("att_context_size %v is not supported (full context [-1, -1] is)", cfg.AttContextSize))
	}
	if cfg.ConvNormType != "batch_norm" {
		errs = append(errs, fmt.Errorf("conv_norm_type %q is not supported (batch_norm is)", cfg.ConvNormType))
	}
	k := cfg.ConvKernelSize
	switch cc := cfg.ConvContextSize; {
	case k < 1:
		errs = append(errs, fmt.Errorf("conv_kernel_size %d must be positive", k))
	case cc == nil && k%2 != 1:
		errs = append(errs, fmt.Errorf("conv_kernel_size %d must be odd without conv_context_size", k))
	case cc != nil && (len(cc) != 2 || cc[0] < 0 || cc[1] < 0 || cc[0]+cc[1] != k-1):
		errs = append(errs, fmt.Errorf("conv_context_size %v must be two sizes summing to conv_kernel_size−1 = %d", cc, k-1))
	}
	return errors.Join(errs...)
}

func loadLinear(b *weights.Binder, name string, out, in int) Linear {
	return Linear{W: b.Tensor(name+".weight", out, in), B: b.Tensor(name+".bias", out)}
}

func loadNorm(b *weights.Binder, name string, n int) Norm {
	return Norm{W: b.Tensor(name+".weight", n), B: b.Tensor(name+".bias", n)}
}

func loadFF(b *weights.Binder, d, ff int) FeedForward {
	return FeedForward{Linear1: loadLinear(b, "linear1", ff, d), Linear2: loadLinear(b, "linear2", d, ff)}
}

// loadBatchNorm folds BatchNorm1d's eval-mode statistics the way PyTorch's
// native CUDA kernel (batch_norm_elementwise) uses them: mean is the bf16
// running_mean widened to fp32, invstd = rsqrt(float(running_var) + eps) in
// fp32, and each element is γ·(x − mean)·invstd + β. Here γ·invstd is one
// fp32 constant; the reference's separate fp32 products differ from it by
// at most an fp32 rounding, far below the bf16 output rounding.
func loadBatchNorm(b *weights.Binder, dev gpu.Device, n int) (negMean, scale, shift gpu.Tensor, err error) {
	gamma := b.Values("weight", n)
	beta := b.Values("bias", n)
	mean := b.Values("running_mean", n)
	variance := b.Values("running_var", n)
	b.Skip("num_batches_tracked")
	nm, sc := make([]float32, n), make([]float32, n)
	for i := range n {
		nm[i] = -mean[i]
		invstd := float32(1 / math.Sqrt(float64(variance[i]+float32(normEps))))
		sc[i] = gamma[i] * invstd
	}
	if negMean, err = loadF32(dev, nm); err != nil {
		return
	}
	if scale, err = loadF32(dev, sc); err != nil {
		return
	}
	shift, err = loadF32(dev, beta)
	return
}

// loadF32 makes host values a [1, len(v)] F32 device tensor.
func loadF32(dev gpu.Device, v []float32) (gpu.Tensor, error) {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	t, err := dev.Load(gpu.F32, 1, len(v), data)
	if err != nil {
		return gpu.Tensor{}, fmt.Errorf("conformer: load constants: %w", err)
	}
	return t, nil
}

// OutLen returns the number of encoder frames for tMel mel frames: the
// subsampling's length rule, ⌈tMel/factor⌉ (liquid-audio's mel2emb_len for
// factor 8).
func (e *Encoder) OutLen(tMel int) int { return e.Sub.OutLen(tMel) }

// Forward encodes one clip's log-mel features mel [T_mel, feat_in] (time
// major: the transpose of the reference's [feat_in, T_mel] input) and
// returns the adapter's output [OutLen(T_mel), hidden], the rows that
// become the prompt's audio-in embeddings. The result lives in c's arena.
// A mel of the wrong width or with no frames is a programmer error (the
// log-mel stage fixes both) and panics.
func (e *Encoder) Forward(c *nn.Ctx, mel gpu.Tensor) gpu.Tensor {
	return e.Adapt(c, e.Encode(c, mel))
}

// Encode runs the conformer alone: mel [T_mel, feat_in] → the encoder
// output [OutLen(T_mel), FeatOut] (what the reference's ConformerEncoder
// returns, transposed), in c's arena. It is EncodeBatch of one clip.
func (e *Encoder) Encode(c *nn.Ctx, mel gpu.Tensor) gpu.Tensor {
	if mel.Rows < 1 || mel.Cols != e.Cfg.FeatIn {
		panic(fmt.Sprintf("conformer: mel %v, want [T ≥ 1, %d]", mel, e.Cfg.FeatIn))
	}
	return e.EncodeBatch(c, mel, []int{mel.Rows})
}

// EncodeBatch encodes several clips at once: mels [Σ frames, feat_in]
// holds their log-mel rows one clip after another, frames[i] rows for
// clip i. It returns the encoder output of every clip in the same order,
// [Σ OutLen(frames[i]), FeatOut] in c's arena, clip i's OutLen(frames[i])
// rows exactly, bit for bit, what Encode gives for that clip alone (the
// reference runs one unpadded clip at a time: no clip sees another).
//
// The work that treats rows independently — every product (linears, the
// positional projection), norm, activation, residual and rounding — runs
// once over all clips' rows; by the gpu.Queue contract a row's result
// does not depend on the rows beside it, so this is exact. What mixes
// rows within a clip runs on each clip's rows alone: the subsampling's
// 3×3 convolutions, the conv module's depthwise convolution, and the
// attention core (scores, rel_shift, softmax, the weighted sum). Adapt is
// row-wise too: call it once on the result.
//
// frames must be non-empty, each at least 1, summing to mels.Rows, and
// mels must be feat_in wide; anything else panics (a programmer error).
func (e *Encoder) EncodeBatch(c *nn.Ctx, mels gpu.Tensor, frames []int) gpu.Tensor {
	in := layout(frames)
	if len(frames) == 0 || slices.Min(frames) < 1 || in.rows != mels.Rows || mels.Cols != e.Cfg.FeatIn {
		panic(fmt.Sprintf("conformer: mels %v for clips of %v frames, want [Σ frames, %d] with every clip ≥ 1 frame", mels, frames, e.Cfg.FeatIn))
	}
	lens := make([]int, len(frames))
	for i, n := range frames {
		lens[i] = e.OutLen(n)
	}
	l := layout(lens)
	out := c.Tmp(l.rows, e.FeatOut)
	mark := c.A.Mark()
	defer c.A.Release(mark)

	// ChatState casts the fp32 mel to the model's dtype before the encoder.
	x0 := c.Tmp(mels.Rows, mels.Cols)
	c.Q.Copy(x0, mels)
	c.Round(x0)
	x := out
	if !e.OutProj.W.IsNil() {
		x = c.Tmp(l.rows, e.DModel)
	}
	e.Sub.forward(c, x, x0, in)
	if e.Cfg.XScaling { // RelPositionalEncoding: x = x * xscale
		c.Q.Scale(x, x, float32(math.Sqrt(float64(e.DModel))))
		c.Round(x)
	}
	// The positional rows of the longest clip: a clip of T frames uses
	// their middle 2T−1 rows (posTable's rows do not depend on the table's
	// size).
	pos := c.Tmp(2*l.max-1, e.DModel)
	c.Q.Write(pos, e.pe.rows(l.max))
	c.Round(pos) // the pe buffer is cast to bf16 with the model
	for i := range e.Layers {
		e.layer(c, &e.Layers[i], x, pos, l)
	}
	if !e.OutProj.W.IsNil() {
		linear(c, out, x, e.OutProj)
	}
	return out
}

// Adapt runs the audio adapter on encoder frames enc [T, FeatOut] and
// returns [T, hidden] in c's arena. Every op of it is row-wise: the rows
// of several clips (EncodeBatch's output) may go through it at once.
func (e *Encoder) Adapt(c *nn.Ctx, enc gpu.Tensor) gpu.Tensor {
	if enc.Cols != e.FeatOut {
		panic(fmt.Sprintf("conformer: adapter input %v, want %d columns", enc, e.FeatOut))
	}
	T := enc.Rows
	a := &e.Adapter
	out := c.Tmp(T, e.Hidden)
	mark := c.A.Mark()
	defer c.A.Release(mark)
	n := c.Tmp(T, e.FeatOut)
	layerNorm(c, n, enc, a.Norm)
	h := c.Tmp(T, e.Hidden)
	linear(c, h, n, a.Linear1)
	act(c, h, gpu.GELU)
	linear(c, out, h, a.Linear2)
	return out
}

// layer runs ConformerLayer.forward in place on the residual stream x
// [Σ T, d] of the clips l; pos holds the positional rows [2·l.max−1, d].
func (e *Encoder) layer(c *nn.Ctx, ly *Layer, x, pos gpu.Tensor, l clips) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	N, d := x.Rows, x.Cols
	xn := c.Tmp(N, d)
	y := c.Tmp(N, d)

	// residual = residual + dropout(ff1(norm(x))) * fc_factor
	layerNorm(c, xn, x, ly.NormFF1)
	e.feedForward(c, y, xn, &ly.FF1)
	halfResidual(c, x, y)

	// residual = residual + dropout(self_attn(norm(residual)))
	layerNorm(c, xn, x, ly.NormAtt)
	e.attention(c, y, xn, pos, l, &ly.Attn)
	residual(c, x, y)

	// residual = residual + dropout(conv(norm(residual)))
	layerNorm(c, xn, x, ly.NormConv)
	ly.Conv.forward(c, y, xn, l)
	residual(c, x, y)

	// residual = residual + dropout(ff2(norm(residual))) * fc_factor
	layerNorm(c, xn, x, ly.NormFF2)
	e.feedForward(c, y, xn, &ly.FF2)
	halfResidual(c, x, y)

	// x = norm_out(residual)
	layerNorm(c, x, x, ly.NormOut)
}

// feedForward is ConformerFeedForward: dst = linear2(silu(linear1(x))).
func (e *Encoder) feedForward(c *nn.Ctx, dst, x gpu.Tensor, f *FeedForward) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	h := c.Tmp(x.Rows, f.Linear1.W.Rows) // [T, d] -> [T, d_ff]
	linear(c, h, x, f.Linear1)
	act(c, h, gpu.SiLU)
	linear(c, dst, h, f.Linear2) // [T, d_ff] -> [T, d]
}

// attention is RelPositionMultiHeadAttention.forward without a mask (each
// clip unpadded with full context) over the clips l of x [Σ T, d]: per
// clip and head, scores = ((q+u)·kᵀ + rel_shift((q+v)·pᵀ)[:, :T]) /
// √head_dim, dst = linear_out(softmax(scores)·v). The projections, the
// bias adds and vᵀ run once for all clips; pos [2·l.max−1, d] is
// projected once and clip T takes the middle 2T−1 rows of the product.
func (e *Encoder) attention(c *nn.Ctx, dst, x, pos gpu.Tensor, l clips, a *Attention) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	N, d := x.Rows, x.Cols
	P := pos.Rows // 2·l.max − 1
	q, k, v := c.Tmp(N, d), c.Tmp(N, d), c.Tmp(N, d)
	linear(c, q, x, a.Q)
	linear(c, k, x, a.K)
	linear(c, v, x, a.V)
	p := c.Tmp(P, d) // linear_pos(pos_emb), no bias
	c.Q.MatMul(p, pos, a.Pos, gpu.Tensor{})
	c.Round(p)
	qu, qv := c.Tmp(N, d), c.Tmp(N, d) // q + pos_bias_u, q + pos_bias_v
	c.Q.AddRow(qu, q, a.BiasU)
	c.Round(qu)
	c.Q.AddRow(qv, q, a.BiasV)
	c.Round(qv)
	vt := c.Tmp(d, N) // vᵀ: clip i's columns, head h's rows are the right operand of probs·v
	c.Q.Transpose(vt, v)
	o := c.Tmp(N, d)
	for i, T := range l.n {
		e.clipAttention(c, l.view(o, i), l.view(qu, i), l.view(qv, i), l.view(k, i),
			vt.ColSlice(l.off[i], l.off[i]+T), p.Slice(l.max-T, l.max+T-1))
	}
	c.Round(o)
	linear(c, dst, o, a.Out)
}

// clipAttention is the attention core of one clip of T rows: o [T, d]
// from qu, qv, k [T, d], vt [d, T] and its projected positions p
// [2T−1, d]. Every head's scores lie in one [heads·T, T] matrix, so that
// the row-wise softmax and its rounding run once for all heads; the
// scores (per head the two products, rel_shift and the sum, then the
// scale, with their roundings) and the products with v are one op each
// for all heads where the queue fuses them (gpu.RelPosScores,
// gpu.HeadsMatMul), the same floats as their per-head op sequences.
func (e *Encoder) clipAttention(c *nn.Ctx, o, qu, qv, k, vt, p gpu.Tensor) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	T, hd := qu.Rows, e.HeadDim
	// scores / s_d_k: PyTorch multiplies by the fp32 reciprocal of a CPU
	// scalar divisor.
	scale := 1 / float32(math.Sqrt(float64(hd)))
	ac, bd := c.Tmp(e.Heads*T, T), c.Tmp(T, p.Rows)
	gpu.RelPosScores(c.Q, ac, bd, qu, qv, k, p,
		gpu.RelPosParams{Heads: e.Heads, HeadDim: hd, Scale: scale, Round: c.P == nn.BF16})
	c.Q.Softmax(ac)
	c.Round(ac)
	gpu.HeadsMatMul(c.Q, o, ac, vt, e.Heads) // probs·v [T, d]
}

// forward is ConformerConvolution.forward in time-major layout over the
// clips l of x: dst = pointwise_conv2(silu(batch_norm(depthwise_conv(
// glu(pointwise_conv1(x)))))). Only the depthwise convolution runs per
// clip.
func (m *ConvModule) forward(c *nn.Ctx, dst, x gpu.Tensor, l clips) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	N, d := x.Rows, x.Cols
	a := c.Tmp(N, 2*d)
	cudnnConv1x1(c, a, x, m.PW1) // [T, d] -> [T, 2d]
	g := c.Tmp(N, d)
	c.Q.GLU(g, a) // first half ⊙ sigmoid(second half)
	c.Round(g)
	y := c.Tmp(N, d)
	m.depthwise(c, y, g, l)
	m.batchNorm(c, y)
	act(c, y, gpu.SiLU)
	cudnnConv1x1(c, dst, y, m.PW2) // [T, d] -> [T, d]
}

// depthwise is depthwise_conv: a per-channel convolution along time with
// conv_context_size zero rows each side of every clip; PyTorch's
// depthwise kernel sums from the bias, one rounding.
func (m *ConvModule) depthwise(c *nn.Ctx, dst, x gpu.Tensor, l clips) {
	p := gpu.ConvParams{K: m.Kernel, Stride: 1, Dilation: 1, Groups: x.Cols, PadLeft: m.PadLeft}
	for i := range l.n {
		c.Q.Conv1D(l.view(dst, i), l.view(x, i), m.DW, m.DWB, p)
	}
	c.Round(dst)
}

// batchNorm is BatchNorm1d in eval mode, in place: (x − mean)·γ·invstd + β
// in fp32, rounded once.
func (m *ConvModule) batchNorm(c *nn.Ctx, x gpu.Tensor) {
	c.Q.AddRow(x, x, m.NegMean)
	c.Q.MulRow(x, x, m.Scale)
	c.Q.AddRow(x, x, m.Shift)
	c.Round(x)
}

// linear is an nn.Linear: dst = x·wᵀ + b, rounded once.
func linear(c *nn.Ctx, dst, x gpu.Tensor, l Linear) {
	c.Q.MatMul(dst, x, l.W, l.B)
	c.Round(dst)
}

// cudnnConv1x1 is a 1×1 Conv1d on cuDNN: the convolution is rounded, then
// ConvNd's separate bias add.
func cudnnConv1x1(c *nn.Ctx, dst, x gpu.Tensor, l Linear) {
	c.Q.MatMul(dst, x, l.W, gpu.Tensor{})
	c.Round(dst)
	c.Q.AddRow(dst, dst, l.B)
	c.Round(dst)
}

func layerNorm(c *nn.Ctx, dst, x gpu.Tensor, n Norm) {
	c.Q.LayerNorm(dst, x, n.W, n.B, normEps)
	c.Round(dst)
}

func act(c *nn.Ctx, x gpu.Tensor, f gpu.Activation) {
	c.Q.Act(x, x, f)
	c.Round(x)
}

// residual is a residual connection, x += y, rounded.
func residual(c *nn.Ctx, x, y gpu.Tensor) {
	c.Q.Add(x, x, y)
	c.Round(x)
}

// halfResidual is the macaron feed-forward's residual, x += y·0.5, with
// both the product and the sum rounded.
func halfResidual(c *nn.Ctx, x, y gpu.Tensor) {
	c.Q.Scale(y, y, 0.5)
	c.Round(y)
	residual(c, x, y)
}
