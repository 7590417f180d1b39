package mimi

import (
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// transformer is moshi's ProjectedTransformer around a StreamingTransformer
// of pre-norm layers: x += ls1·out_proj(attn(norm1(x))); x += ls2 ·
// linear2(gelu(linear1(norm2(x)))). Attention is causal with a context
// window, RoPE rotates interleaved pairs, no projection has a bias.
type transformer struct {
	d, heads, headDim, ff int
	context               int // 0: unlimited
	invFreq               []float32
	inProj, outProj       gpu.Tensor // optional ProjectedTransformer projections
	layers                []*trLayer
}

type trLayer struct {
	norm1W, norm1B, norm2W, norm2B gpu.Tensor
	qkv, out                       gpu.Tensor // [3d, d], [d, d]
	lin1, lin2                     gpu.Tensor // [ff, d], [d, ff]
	scale1, scale2                 gpu.Tensor // LayerScale [1, d], or nil
}

// layerNormEps is nn.LayerNorm's eps in moshi's create_norm_fn.
const layerNormEps = 1e-5

func newTransformer(wb *weights.Binder, cfg *TransformerConfig) *transformer {
	t := &transformer{
		d: cfg.DModel, heads: cfg.NumHeads, headDim: cfg.DModel / cfg.NumHeads, ff: cfg.DimFeedforward,
	}
	if cfg.Context != nil {
		t.context = *cfg.Context
	}
	if cfg.PositionalEmbedding == "rope" {
		// moshi's apply_rope: freqs = exp(arange(D/2) · (−ln(max_period)·2/D))
		// in float32.
		c := float32(-math.Log(cfg.MaxPeriod) * 2 / float64(t.headDim))
		t.invFreq = make([]float32, t.headDim/2)
		for j := range t.invFreq {
			t.invFreq[j] = float32(math.Exp(float64(float32(j) * c)))
		}
	}
	if cfg.InputDimension != t.d {
		t.inProj = wb.Tensor("input_proj.weight", t.d, cfg.InputDimension)
	}
	if od := cfg.OutputDimensions[0]; od != t.d {
		t.outProj = wb.Tensor("output_projs.0.weight", od, t.d)
	}
	d, ff := t.d, t.ff
	for i := 0; i < cfg.NumLayers; i++ {
		lb := wb.Subf("transformer.layers.%d", i)
		l := &trLayer{
			norm1W: lb.Tensor("norm1.weight", d),
			norm1B: lb.Tensor("norm1.bias", d),
			norm2W: lb.Tensor("norm2.weight", d),
			norm2B: lb.Tensor("norm2.bias", d),
			lin1:   lb.Tensor("linear1.weight", ff, d),
			lin2:   lb.Tensor("linear2.weight", d, ff),
		}
		// moshi's module names, or the fused names of older checkpoints
		// that its load hook renames (in_proj_weight, out_proj.weight).
		if lb.Has("self_attn.in_proj_weight") {
			l.qkv = lb.Tensor("self_attn.in_proj_weight", 3*d, d)
		} else {
			l.qkv = lb.Tensor("self_attn.in_projs.0.weight", 3*d, d)
		}
		if lb.Has("self_attn.out_proj.weight") {
			l.out = lb.Tensor("self_attn.out_proj.weight", d, d)
		} else {
			l.out = lb.Tensor("self_attn.out_projs.0.weight", d, d)
		}
		if cfg.LayerScale != nil {
			l.scale1 = lb.Tensor("layer_scale_1.scale", d)
			l.scale2 = lb.Tensor("layer_scale_2.scale", d)
		}
		t.layers = append(t.layers, l)
	}
	return t
}

// forward runs the transformer over x [T, inputDim] and returns [T, outDim].
// Every stream's rows go through the projections, norms and activations
// together; each stream's queries attend over its own keys, every stream's
// in one AttentionSeqs.
func (t *transformer) forward(dc *Decoder, b *batch, x gpu.Tensor) gpu.Tensor {
	q, a := dc.q, dc.arena
	T, d := x.Rows, t.d
	h := x
	if !t.inProj.IsNil() {
		h = a.Get(T, d)
		q.MatMul(h, x, t.inProj, gpu.Tensor{})
	} else {
		h = a.Get(T, d)
		q.Copy(h, x)
	}
	pos := b.positions(T, dc.upStride)
	nrm := a.Get(T, d)
	qkv := a.Get(T, 3*d)
	att := a.Get(T, d)
	upd := a.Get(T, d)
	ffh := a.Get(T, t.ff)
	for i, l := range t.layers {
		// Self-attention block.
		q.LayerNorm(nrm, h, l.norm1W, l.norm1B, layerNormEps)
		q.MatMul(qkv, nrm, l.qkv, gpu.Tensor{})
		qh, kh, vh := qkv.ColSlice(0, d), qkv.ColSlice(d, 2*d), qkv.ColSlice(2*d, 3*d)
		if t.invFreq != nil {
			rp := gpu.RoPEParams{Style: gpu.Interleaved, HeadDim: t.headDim, InvFreq: t.invFreq, Pos: pos}
			q.RoPE(qh, rp)
			q.RoPE(kh, rp)
		}
		seqs := b.appendKV(dc, t, i, kh, vh)
		gpu.AttentionSeqs(q, att, qh, gpu.AttnParams{
			Heads: t.heads, KVHeads: t.heads, HeadDim: t.headDim,
			Scale:  float32(1 / math.Sqrt(float64(t.headDim))),
			Causal: true,
			Window: t.context,
		}, seqs)
		q.MatMul(upd, att, l.out, gpu.Tensor{})
		if !l.scale1.IsNil() {
			q.MulRow(upd, upd, l.scale1)
		}
		q.Add(h, h, upd)
		// Feed-forward block.
		q.LayerNorm(nrm, h, l.norm2W, l.norm2B, layerNormEps)
		q.MatMul(ffh, nrm, l.lin1, gpu.Tensor{})
		q.Act(ffh, ffh, gpu.GELU)
		q.MatMul(upd, ffh, l.lin2, gpu.Tensor{})
		if !l.scale2.IsNil() {
			q.MulRow(upd, upd, l.scale2)
		}
		q.Add(h, h, upd)
	}
	if t.outProj.IsNil() {
		return h
	}
	y := a.Get(T, t.outProj.Rows)
	q.MatMul(y, h, t.outProj, gpu.Tensor{})
	return y
}

// keep returns how many of the cached rows a call needs before its first
// row: the context−1 newest (the oldest a query of the call can see), or
// all of them when the context is unlimited.
func (t *transformer) keep(cached int) int {
	if t.context == 0 {
		return cached
	}
	return min(cached, t.context-1)
}
