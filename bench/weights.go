package bench

import (
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
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
	body, head := BackboneBytes(m.Backbone)
	return WeightBytes{Backbone: body, TextHead: head, DepthFrame: DepthFrameBytes(m.Depth)}
}

// BackboneBytes returns the weight bytes of one backbone step without the
// text head (every layer and the final norm) and of the text head (the
// tied embedding table).
func BackboneBytes(bb *lfm2.Model) (body, head int64) {
	body = tensorBytes(bb.Norm)
	for _, b := range bb.Blocks {
		body += tensorBytes(b.OpNorm, b.FFNNorm, b.W1, b.W2, b.W3)
		if c := b.Conv; c != nil {
			body += tensorBytes(c.InProj, c.InProjB, c.Conv, c.ConvB, c.OutProj, c.OutProjB)
		}
		if a := b.Attn; a != nil {
			body += tensorBytes(a.QKV, a.Out, a.QNorm, a.KNorm)
		}
	}
	return body, tensorBytes(bb.Embed)
}

// DepthFrameBytes returns the weight bytes of one depthformer frame:
// depth_linear, then for each codebook every layer and that codebook's
// norm and logits table.
func DepthFrameBytes(d *depth.Depth) int64 {
	var layers int64
	for _, l := range d.Layers {
		layers += tensorBytes(l.OpNorm, l.FFNNorm, l.QKV, l.Out, l.QNorm, l.KNorm, l.W1, l.W2, l.W3)
	}
	n := tensorBytes(d.Linear, d.LinearB) + int64(d.Codebooks)*layers
	for i := 0; i < d.Codebooks; i++ {
		n += tensorBytes(d.EmbNorm[i], d.ToLogits[i])
	}
	return n
}
