// Package depth is LFM2-Audio's audio head, the "depthformer": an
// RQ-transformer that turns one backbone output row into the frame's 8
// codebook codes, one codebook after another. Codebook i's input is
// depth_linear(h)[i] plus the embedding of codebook i−1's code; six
// pre-norm blocks (GQA attention over the frame's positions 0..7 with
// interleaved-pair RoPE θ=1e6, SwiGLU) run on that single position with a
// per-frame KV cache; codebook i's logits are its tied embedding table
// applied to its embedding_norm of the output.
//
// Numerics follow liquid-audio's model/transformer.py in bf16: its RMSNorm
// multiplies the fp32 normalised value by the weight and then rounds (unlike
// LFM2's), RoPE runs in fp32 (complex64) and rounds once, and every Linear,
// residual add and logit is rounded to bf16.
package depth

import (
	"fmt"
	"slices"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// VocabSize returns the size of each codebook's vocabulary for a codec of
// codebookSize codes per codebook: the codec's codes 0..codebookSize−1 and
// end-of-audio, which is codebookSize itself (liquid-audio: 2048 Mimi
// codes and 2048 = end-of-audio, 2049 entries). It is the one place the
// "+1" lives; the end-of-audio code is the codec's codebook size
// (lfm2audio.Special.EOA).
func VocabSize(codebookSize int) int { return codebookSize + 1 }

// Depth is the depthformer with its input projection and codebook tables.
type Depth struct {
	Cfg       config.Depthformer
	Codebooks int
	// Vocab is each codebook's vocabulary: VocabSize of the codec's
	// codebook size (Load's codebookSize).
	Vocab    int
	Linear   gpu.Tensor // depth_linear [codebooks·dim, hidden]
	LinearB  gpu.Tensor // [1, codebooks·dim]
	Layers   []Layer
	Emb      []gpu.Tensor // depth_embeddings.i.embedding [Vocab, dim]
	EmbNorm  []gpu.Tensor // depth_embeddings.i.embedding_norm [1, dim]
	ToLogits []gpu.Tensor // depth_embeddings.i.to_logits, or Emb[i] when tied
	InvFreq  []float32    // fp32, as precompute_freqs_cis
	// FlashAttention says the reference's attention runs in flash kernels,
	// which round the unnormalised probabilities to bf16 before the product
	// with the values (gpu.AttnParams.ProbBF16): BF16 mode then does too.
	// torch's SDPA picks FlashAttention-2 for liquid-audio's depthformer
	// at every head size up to 256 (it pads the head to a multiple of 8;
	// cuDNN's kernel needs one). Load sets it.
	FlashAttention bool
}

// Layer is one StandardBlock(MHA).
type Layer struct {
	OpNorm, FFNNorm gpu.Tensor
	QKV, Out        gpu.Tensor
	QNorm, KNorm    gpu.Tensor
	W1, W3, W2      gpu.Tensor
}

// Load binds the depthformer (depthformer.*, depth_linear.*,
// depth_embeddings.*) from the model root binder b, for codebooks
// codebooks of a codec with codebookSize codes each (its quantizer's bins:
// the tables hold VocabSize(codebookSize) entries). An absent tied
// to_logits falls back to the embedding table.
func Load(b *weights.Binder, cfg config.Depthformer, codebooks, codebookSize, hidden int) (*Depth, error) {
	if cfg.Layers < 1 || codebooks < 1 || codebookSize < 1 {
		return nil, fmt.Errorf("depthformer: %d layers, %d codebooks of %d codes", cfg.Layers, codebooks, codebookSize)
	}
	D, F := cfg.Dim, cfg.FFNDim()
	hd, kv := cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	V := VocabSize(codebookSize)
	d := &Depth{Cfg: cfg, Codebooks: codebooks, Vocab: V,
		Linear:         b.Tensor("depth_linear.weight", codebooks*D, hidden),
		LinearB:        b.Tensor("depth_linear.bias", codebooks*D),
		InvFreq:        nn.RoPEInvFreq(cfg.RoPETheta(), hd), // precompute_freqs_cis, fp32
		FlashAttention: true,
	}
	for i := 0; i < cfg.Layers; i++ {
		lb := b.Subf("depthformer.layers.%d", i)
		d.Layers = append(d.Layers, Layer{
			OpNorm:  lb.Tensor("operator_norm.weight", D),
			FFNNorm: lb.Tensor("ffn_norm.weight", D),
			QKV:     lb.Tensor("operator.qkv_proj.weight", D+2*kv, D),
			Out:     lb.Tensor("operator.out_proj.weight", D, D),
			QNorm:   lb.Tensor("operator.bounded_attention.q_layernorm.weight", hd),
			KNorm:   lb.Tensor("operator.bounded_attention.k_layernorm.weight", hd),
			W1:      lb.Tensor("feed_forward.w1.weight", F, D),
			W3:      lb.Tensor("feed_forward.w3.weight", F, D),
			W2:      lb.Tensor("feed_forward.w2.weight", D, F),
		})
	}
	for i := 0; i < codebooks; i++ {
		eb := b.Subf("depth_embeddings.%d", i)
		emb := eb.Tensor("embedding.weight", V, D)
		d.Emb = append(d.Emb, emb)
		d.EmbNorm = append(d.EmbNorm, eb.Tensor("embedding_norm.weight", D))
		if cfg.Tie {
			// Tied: the file may or may not materialise to_logits.
			if t, ok := eb.Optional("to_logits.weight", V, D); ok {
				emb = t
			}
		} else {
			emb = eb.Tensor("to_logits.weight", V, D)
		}
		d.ToLogits = append(d.ToLogits, emb)
	}
	return d, nil
}

// Picker chooses codebook i's code for batch row r from its bf16 logits
// (len d.Vocab). What it returns is fed to the next codebook.
type Picker func(r, codebook int, logits []float32) int

// Frame computes one audio frame for every row of h [B, hidden] (backbone
// outputs of B sessions), picking on the host: each codebook's logits are
// read back and pick chooses (for teacher forcing and for recording the
// logits). codes[r] holds the row's Codebooks codes. Rows are independent:
// a row's codes do not depend on the other rows of the batch.
func (d *Depth) Frame(c *nn.Ctx, h gpu.Tensor, pick Picker) ([][]int, error) {
	B, V := h.Rows, d.Vocab
	codes := newCodes(B, d.Codebooks)
	host := make([]float32, B*V)
	ids := make([]int32, B)
	err := d.frame(c, h, func(i int, logits, prev gpu.Tensor) error {
		if err := c.Q.Read(host, logits); err != nil {
			return err
		}
		for r := 0; r < B; r++ {
			code := pick(r, i, host[r*V:(r+1)*V])
			if code < 0 || code >= V {
				return fmt.Errorf("depth: picker chose code %d for codebook %d", code, i)
			}
			codes[r][i] = code
			ids[r] = int32(code)
		}
		if i+1 < d.Codebooks {
			c.Q.Embed(prev, d.Emb[i], ids)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return codes, nil
}

// FrameSampled is Frame with the picks made on the device by
// gpu.Queue.Sample: rows[i][r] samples codebook i of batch row r (its U
// drawn beforehand, in the order of the picks; its History the codebook's
// earlier codes), and each pick feeds the next codebook from device memory
// (EmbedIDs). The frame reads nothing back but its codes at the end, so a
// device records it as one batch (one graph). The codes equal Frame's with
// a Picker that calls gpu.SampleHost on the same rows, bit for bit.
func (d *Depth) FrameSampled(c *nn.Ctx, h gpu.Tensor, rows [][]gpu.SampleRow) ([][]int, error) {
	B, C := h.Rows, d.Codebooks
	if len(rows) != C {
		return nil, fmt.Errorf("depth: sampling rows for %d codebooks, want %d", len(rows), C)
	}
	for i := range rows {
		if len(rows[i]) != B {
			return nil, fmt.Errorf("depth: codebook %d: sampling rows for %d sessions, want %d", i, len(rows[i]), B)
		}
	}
	// The batch runs padded to a bucket of rows (zero rows, greedy picks,
	// dropped), so that a device replays one recorded frame for every
	// batch size of a bucket; rows are independent, so the real rows'
	// codes are those of the unpadded batch.
	Bp := PaddedRows(B)
	if Bp > B {
		hp := c.Tmp(Bp, h.Cols)
		c.Q.Copy(hp.Slice(0, B), h)
		c.Q.Fill(hp.Slice(B, Bp), 0)
		h = hp
		padded := make([][]gpu.SampleRow, C)
		for i := range rows {
			padded[i] = append(slices.Clip(rows[i]), make([]gpu.SampleRow, Bp-B)...)
		}
		rows = padded
	}
	ids := c.A.GetI32(Bp, C)
	err := d.frame(c, h, func(i int, logits, prev gpu.Tensor) error {
		col := ids.ColSlice(i, i+1)
		c.Q.Sample(col, logits, rows[i])
		if i+1 < C {
			c.Q.EmbedIDs(prev, d.Emb[i], col)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	host := make([]int32, B*C)
	if err := c.Q.ReadInt(host, ids.Slice(0, B)); err != nil {
		return nil, err
	}
	codes := newCodes(B, C)
	for r := range codes {
		for i := range codes[r] {
			code := int(host[r*C+i])
			if code < 0 || code >= d.Vocab {
				return nil, fmt.Errorf("depth: device picked code %d for codebook %d", code, i)
			}
			codes[r][i] = code
		}
	}
	return codes, nil
}

// PaddedRows is the batch size FrameSampled runs B rows at: B itself up
// to 8, then the next multiple of 8 up to 64, then of 32. At 256 sessions
// on an H200 the depthformer saw nearly every batch size from 1 to 256,
// and a graph recorded for each (evicting one another: 828 rebuilt in a
// run); 21 buckets reach 256 rows, fewer than 8 rows of padding up to 64 and
// fewer than 32 beyond.
func PaddedRows(B int) int {
	switch {
	case B <= 8:
		return B
	case B <= 64:
		return (B + 7) &^ 7
	}
	return (B + 31) &^ 31
}

func newCodes(B, C int) [][]int {
	codes := make([][]int, B)
	for r := range codes {
		codes[r] = make([]int, C)
	}
	return codes
}

// frame runs the network over the frame's codebooks; after codebook i's
// bf16 logits [B, Vocab] are computed, pick chooses the codes and (except
// after the last) writes their embeddings into prev [B, dim].
func (d *Depth) frame(c *nn.Ctx, h gpu.Tensor, pick func(i int, logits, prev gpu.Tensor) error) error {
	B, D, C, V := h.Rows, d.Cfg.Dim, d.Codebooks, d.Vocab
	hd := d.Cfg.HeadDim()
	kvd := d.Cfg.KVHeads() * hd
	in := c.Tmp(B, C*D)
	c.Q.MatMul(in, h, d.Linear, d.LinearB)
	c.Round(in)
	// Per-layer KV caches of the frame, one row per codebook position with
	// the B sessions side by side in it ([C, B·kvd]: session r's heads are
	// KV heads r·KVH … r·KVH+KVH−1), so that one Attention over B·H query
	// heads serves every session: query head r·H+h of the row [1, B·D]
	// reads KV head (r·H+h)/(H/KVH) = r·KVH + h/(H/KVH), its own session's.
	kc, vc := make([]gpu.Tensor, len(d.Layers)), make([]gpu.Tensor, len(d.Layers))
	for l := range d.Layers {
		kc[l], vc[l] = c.Tmp(C, B*kvd), c.Tmp(C, B*kvd)
	}
	x := c.Tmp(B, D)
	prev := c.Tmp(B, D)
	logits := c.Tmp(B, V)
	n := c.Tmp(B, D)
	for i := 0; i < C; i++ {
		if i == 0 {
			c.Q.Copy(x, in.ColSlice(0, D))
		} else {
			c.Q.Add(x, in.ColSlice(i*D, (i+1)*D), prev)
			c.Round(x)
		}
		for l := range d.Layers {
			d.block(c, l, x, kc[l], vc[l], i)
		}
		// get_logits: to_logits(embedding_norm(out)).
		c.NormLinear(logits, n, x, d.norm(c, d.EmbNorm[i]), d.ToLogits[i], gpu.Tensor{})
		if err := pick(i, logits, prev); err != nil {
			return err
		}
	}
	return nil
}

// norm is transformer.py's RMSNorm: (norm(x.float()) · w).type_as(x) —
// the weight's product of the unrounded fp32 norm, rounded once.
func (d *Depth) norm(c *nn.Ctx, w gpu.Tensor) gpu.RowNorm {
	return gpu.RowNorm{Eps: float32(d.Cfg.NormEps()), W: w, RoundW: c.P == nn.BF16}
}

// block runs StandardBlock l on x [B, D] in place, for codebook position
// pos, appending to the frame's caches (gpu.Block: one launch on a GPU
// that fuses it).
func (d *Depth) block(c *nn.Ctx, l int, x, kc, vc gpu.Tensor, pos int) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	L := &d.Layers[l]
	hd := d.Cfg.HeadDim()
	bf16 := c.P == nn.BF16
	gpu.RunBlock(c.Q, gpu.Block{
		X: x, OpNorm: d.norm(c, L.OpNorm), FFNNorm: d.norm(c, L.FFNNorm), QNorm: d.norm(c, L.QNorm), KNorm: d.norm(c, L.KNorm),
		QKV: L.QKV, Out: L.Out, W1: L.W1, W3: L.W3, W2: L.W2,
		RoPE:  gpu.RoPEParams{Style: gpu.Interleaved, InvFreq: d.InvFreq},
		Heads: d.Cfg.Heads(), KVHeads: d.Cfg.KVHeads(), HeadDim: hd, Scale: gpu.AttnScale(hd),
		ProbBF16: bf16 && d.FlashAttention, K: kc, V: vc, Pos: pos, Round: bf16,
	}, c.Tmp)
}
