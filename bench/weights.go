package bench

import (
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// WeightBytes is what one step of the generation loop reads from memory:
// every weight it multiplies by, once (activations and the KV cache are
// small beside them at these context lengths).
type WeightBytes struct {
	// Backbone is every backbone layer and the final norm: an audio step.
	Backbone int64 `json:"backbone"`
	// TextHead is the tied embedding table used as the text head: a text
	// step reads Backbone + TextHead.
	TextHead int64 `json:"text_head"`
	// DepthFrame is one depthformer frame: depth_linear, then for each
	// codebook every depthformer layer and that codebook's logits table.
	DepthFrame int64 `json:"depth_frame"`
}

// AudioFrame returns the bytes of an audio step plus its depthformer frame.
func (w WeightBytes) AudioFrame() int64 { return w.Backbone + w.DepthFrame }

// TextStep returns the bytes of a text step.
func (w WeightBytes) TextStep() int64 { return w.Backbone + w.TextHead }

func tensorBytes(ts ...gpu.Tensor) int64 {
	var n int64
	for _, t := range ts {
		if !t.IsNil() {
			n += int64(t.Len()) * int64(t.DType().Size())
		}
	}
	return n
}

// ModelWeightBytes counts the weight bytes the loop reads for m.
func ModelWeightBytes(m *lfm2audio.Model) WeightBytes {
	var w WeightBytes
	bb := m.Backbone
	w.Backbone = tensorBytes(bb.Norm)
	for _, b := range bb.Blocks {
		w.Backbone += tensorBytes(b.OpNorm, b.FFNNorm, b.W1, b.W2, b.W3)
		if c := b.Conv; c != nil {
			w.Backbone += tensorBytes(c.InProj, c.InProjB, c.Conv, c.ConvB, c.OutProj, c.OutProjB)
		}
		if a := b.Attn; a != nil {
			w.Backbone += tensorBytes(a.Q, a.K, a.V, a.Out, a.QNorm, a.KNorm)
		}
	}
	w.TextHead = tensorBytes(bb.Embed)
	d := m.Depth
	var layers int64
	for _, l := range d.Layers {
		layers += tensorBytes(l.OpNorm, l.FFNNorm, l.QKV, l.Out, l.QNorm, l.KNorm, l.W1, l.W2, l.W3)
	}
	w.DepthFrame = tensorBytes(d.Linear, d.LinearB) + int64(d.Codebooks)*layers
	for i := 0; i < d.Codebooks; i++ {
		w.DepthFrame += tensorBytes(d.EmbNorm[i], d.ToLogits[i])
	}
	return w
}
