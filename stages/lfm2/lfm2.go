// Package lfm2 is the generic Liquid network: a stack of LFM2 blocks
// (operator norm → gated short convolution or grouped-query attention →
// residual; FFN norm → SwiGLU → residual) with a final RMSNorm, configured
// entirely by an Lfm2Config (which layers attend, the conv kernel length,
// the attention window, the sizes). It is LFM2-Audio's backbone and
// LFM2.5-Audio's detokenizer network.
//
// The numerics follow transformers' modeling_lfm2 in bf16: with
// nn.BF16 every activation the reference stores in bf16 is rounded at the
// same point (Lfm2RMSNorm rounds the normalised value before the weight
// multiply; RoPE's cos/sin and products are bf16). The cached single-step
// short convolution is computed like the prefill's (one rounding of the
// fp32 sum): against the fixtures' transformers 5.17 traces this tracks the
// reference's step rows twice as closely as rounding each product, as
// transformers 4.x's slow path does.
package lfm2

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// Model is an LFM2 network.
type Model struct {
	Cfg    config.LFM2
	Embed  gpu.Tensor // embed_tokens [vocab, hidden]
	Blocks []Block
	Norm   gpu.Tensor // embedding_norm [1, hidden]
	// InvFreq holds RoPE's inverse frequencies as the reference uses them:
	// computed in fp32 and rounded to bf16 (from_pretrained casts the
	// buffer), one per pair of head dimensions.
	InvFreq []float32
	// FlashAttention says the reference's attention runs in flash kernels,
	// which round the unnormalised probabilities to bf16 before the product
	// with the values (gpu.AttnParams.ProbBF16): BF16 mode then does too.
	// transformers' sdpa attention passes no mask for an unpadded causal
	// batch, and torch's SDPA then picks cuDNN's fused flash kernel (head
	// sizes that are multiples of 8, on an H100/H200 with cuDNN ≥ 9.15) or
	// FlashAttention-2 (any head size up to 256). Load sets it.
	FlashAttention bool
	// KVBlockRows is the block size, in positions, of the model's KV pools
	// (KVPool); 0 means KVBlock. Set it before the first cache.
	KVBlockRows int

	poolMu sync.Mutex
	pools  map[gpu.Device]*KVPool
}

// Block is one LFM2 decoder layer; exactly one of Conv and Attn is set.
type Block struct {
	Kind    string // config.LayerConv, LayerAttention or LayerSliding
	OpNorm  gpu.Tensor
	FFNNorm gpu.Tensor
	Conv    *ShortConv
	Attn    *Attention
	W1, W3  gpu.Tensor // [ffn, hidden]
	W2      gpu.Tensor // [hidden, ffn]
}

// ShortConv is LFM2's gated short convolution: in_proj → B, C, x;
// y = out_proj(C ⊙ conv(B ⊙ x)).
type ShortConv struct {
	InProj, InProjB   gpu.Tensor // [3·hidden, hidden], bias optional
	Conv, ConvB       gpu.Tensor // depthwise [hidden, L], bias optional
	OutProj, OutProjB gpu.Tensor
	L                 int
}

// Attention is LFM2's grouped-query attention with per-head q/k RMSNorm.
type Attention struct {
	// QKV holds q_proj's, k_proj's and v_proj's rows one after another,
	// so that their products run as one (the same floats: each output
	// depends only on its own weight row).
	QKV, Out              gpu.Tensor
	QNorm, KNorm          gpu.Tensor // [1, head_dim]
	Heads, KVHeads, HeadD int
	Window                int // 0: full causal attention
}

// Load binds an LFM2 network's weights under b (the prefix of Lfm2Model's
// state dict, e.g. "lfm"). The config must be normalised.
func Load(b *weights.Binder, cfg config.LFM2) (*Model, error) {
	if err := cfg.Normalize(); err != nil {
		return nil, err
	}
	H, F := cfg.HiddenSize, cfg.FFNDim()
	m := &Model{Cfg: cfg, FlashAttention: true}
	m.Embed = b.Tensor("embed_tokens.weight", cfg.VocabSize, H)
	m.Norm = b.Tensor("embedding_norm.weight", H)
	hd := cfg.HeadDim()
	kv := cfg.NumKeyValueHeads * hd
	for i, kind := range cfg.LayerTypes {
		lb := b.Subf("layers.%d", i)
		blk := Block{
			Kind:    kind,
			OpNorm:  lb.Tensor("operator_norm.weight", H),
			FFNNorm: lb.Tensor("ffn_norm.weight", H),
			W1:      lb.Tensor("feed_forward.w1.weight", F, H),
			W3:      lb.Tensor("feed_forward.w3.weight", F, H),
			W2:      lb.Tensor("feed_forward.w2.weight", H, F),
		}
		if kind == config.LayerConv {
			L := cfg.ConvLCache
			c := &ShortConv{L: L,
				InProj:  lb.Tensor("conv.in_proj.weight", 3*H, H),
				Conv:    lb.Tensor("conv.conv.weight", H, 1, L),
				OutProj: lb.Tensor("conv.out_proj.weight", H, H),
			}
			if cfg.ConvBias {
				c.InProjB = lb.Tensor("conv.in_proj.bias", 3*H)
				c.ConvB = lb.Tensor("conv.conv.bias", H)
				c.OutProjB = lb.Tensor("conv.out_proj.bias", H)
			}
			blk.Conv = c
		} else {
			a := &Attention{
				QKV: lb.Rows([]string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
					[][]int{{cfg.NumAttentionHeads * hd, H}, {kv, H}, {kv, H}}),
				Out:     lb.Tensor("self_attn.out_proj.weight", H, cfg.NumAttentionHeads*hd),
				QNorm:   lb.Tensor("self_attn.q_layernorm.weight", hd),
				KNorm:   lb.Tensor("self_attn.k_layernorm.weight", hd),
				Heads:   cfg.NumAttentionHeads,
				KVHeads: cfg.NumKeyValueHeads,
				HeadD:   hd,
			}
			if kind == config.LayerSliding {
				a.Window = cfg.SlidingWindow
			}
			blk.Attn = a
		}
		m.Blocks = append(m.Blocks, blk)
	}
	m.InvFreq = InvFreqBF16(cfg.RopeTheta, hd)
	return m, nil
}

// InvFreqBF16 returns the default RoPE inverse frequencies
// 1/θ^(2j/d) computed in fp32 as transformers does, then rounded to bf16 as
// from_pretrained's dtype cast leaves them.
func InvFreqBF16(theta float64, headDim int) []float32 {
	out := nn.RoPEInvFreq(theta, headDim)
	for j, v := range out {
		out[j] = gpu.RoundBF16(v)
	}
	return out
}

// Cache is one sequence's recurrent state: the last L−1 conv inputs of each
// conv layer and, in blocks of its model's KVPool, the keys and values of
// each attention layer. A layer with a sliding window gives back the
// blocks that hold only positions no later position can see (all but the
// last Window−1), so its memory stays bounded however long the sequence
// grows.
type Cache struct {
	m    *Model
	dev  gpu.Device
	pool *KVPool
	pos  int
	conv []gpu.Tensor // per layer: [L−1, hidden] (conv layers)
	// tabs holds a block table per group of the pool (the attention layers
	// of one window share it); group[i] is layer i's.
	tabs  []*kvTable
	group []int
}

// NewCache returns an empty cache for m on dev; its keys and values go in
// m's pool on dev (KVPool).
func (m *Model) NewCache(dev gpu.Device) *Cache {
	n := len(m.Blocks)
	p := m.KVPool(dev)
	c := &Cache{m: m, dev: dev, pool: p,
		conv:  make([]gpu.Tensor, n),
		group: make([]int, n),
	}
	for _, g := range p.groups {
		gi := len(c.tabs)
		c.tabs = append(c.tabs, &kvTable{g: g})
		for _, li := range g.layers {
			c.group[li] = gi
		}
	}
	for i, b := range m.Blocks {
		if b.Conv != nil {
			c.conv[i] = dev.Alloc(gpu.F32, b.Conv.L-1, m.Cfg.HiddenSize)
		}
	}
	return c
}

// Len returns the number of positions the cache has seen.
func (c *Cache) Len() int { return c.pos }

// Held returns the number of positions whose keys and values layer i
// holds (0 for a conv layer): from the start of its first block to the
// last position seen. A windowed layer holds at least its last Window−1
// positions (what the next position can see), and less than a block more.
func (c *Cache) Held(i int) int {
	if c.m.Blocks[i].Attn == nil || c.tabs == nil {
		return 0
	}
	return c.pos - c.tabs[c.group[i]].first*c.pool.rows
}

// BlockRows returns the positions of one of the cache's KV blocks.
func (c *Cache) BlockRows() int { return c.pool.rows }

// Free releases the cache's device memory: its conv states, and its blocks
// back to the pool.
func (c *Cache) Free() {
	for i := range c.conv {
		if !c.conv[i].IsNil() {
			c.dev.Free(c.conv[i])
		}
	}
	for _, t := range c.tabs {
		c.pool.give(t.g, t.ids)
		if !t.dev.IsNil() {
			c.dev.Free(t.dev)
		}
	}
	c.conv, c.tabs = nil, nil
}

// blocksFor returns how many blocks a table of group g holds once grown
// to positions: every block up to them, for a windowed group at most the
// blocks a window and one block of new rows can span. (A pass of more new
// rows than a block takes the further blocks it spans while it runs and
// gives them back after it: the engine's prefill chunks are one block.)
func (p *KVPool) blocksFor(g *kvGroup, positions int) int {
	n := (positions + p.rows - 1) / p.rows
	if g.window > 0 {
		n = min(n, (g.window-1+p.rows+p.rows-1)/p.rows+1)
	}
	return n
}

// reserve gives every table the blocks up to position c.pos+n.
func (c *Cache) reserve(q gpu.Queue, n int) error {
	end := (c.pos + n + c.pool.rows - 1) / c.pool.rows // logical blocks needed
	for _, t := range c.tabs {
		if need := end - t.first - len(t.ids); need > 0 {
			ids, err := c.pool.take(q, t.g, t.ids, need)
			if err != nil {
				return err
			}
			t.ids, t.dirty = ids, true
		}
	}
	return nil
}

// Grow gives every full-attention layer blocks for positions positions in
// all (a windowed layer for its window and one block of new rows), so
// that the passes up to there take nothing from the pool: a turn's blocks
// are taken once, when it is admitted. It never gives blocks back. When
// the pool, at its limit, cannot give a table all its blocks, that table
// takes none and Grow returns an error wrapping ErrKVPoolFull.
func (c *Cache) Grow(q gpu.Queue, positions int) error {
	var errs []error
	for _, t := range c.tabs {
		if need := c.pool.blocksFor(t.g, positions) - len(t.ids); need > 0 {
			ids, err := c.pool.take(q, t.g, t.ids, need)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			t.ids, t.dirty = ids, true
		}
		if len(t.ids) > 0 {
			t.upload(q, c.dev) // the device table's memory too
		}
	}
	return errors.Join(errs...)
}

// Bytes returns the device memory the cache holds: conv states and its
// blocks' keys and values.
func (c *Cache) Bytes() int64 {
	var n int64
	for i, b := range c.m.Blocks {
		if b.Conv != nil && c.conv != nil {
			n += int64(c.conv[i].Len()) * 4
		}
	}
	for _, t := range c.tabs {
		n += int64(len(t.ids)) * t.g.bytes
	}
	return n
}

// BytesFor returns what a cache of m holds once grown (Grow) to
// positions: what a conversation of that length costs, its positions
// rounded up to whole blocks of the pool's size.
func (m *Model) BytesFor(positions int) int64 {
	var n int64
	rows := m.KVBlockRows
	if rows <= 0 {
		rows = KVBlock
	}
	p := &KVPool{rows: rows}
	for _, b := range m.Blocks {
		switch {
		case b.Conv != nil:
			n += int64(b.Conv.L-1) * int64(m.Cfg.HiddenSize) * 4
		case b.Attn != nil:
			g := &kvGroup{window: b.Attn.Window}
			n += int64(p.blocksFor(g, positions)) * int64(rows) * m.kvRowBytes(b.Attn)
		}
	}
	return n
}

// kvRowBytes is one position's keys and values in an attention layer's
// pool (fp32).
func (m *Model) kvRowBytes(a *Attention) int64 {
	return int64(2*a.KVHeads*a.HeadD) * 4
}

// trim gives back, in every windowed group, the blocks that hold only
// positions no later position can see (before the last Window−1).
func (c *Cache) trim() {
	for _, t := range c.tabs {
		if t.g.window <= 0 {
			continue
		}
		keep := max(0, c.pos-(t.g.window-1)) / c.pool.rows // first logical block still visible
		n := min(keep-t.first, len(t.ids))
		if n <= 0 {
			continue
		}
		c.pool.give(t.g, t.ids[:n])
		t.ids = append(t.ids[:0], t.ids[n:]...)
		t.first += n
		t.dirty = true
	}
}

// Seq is one sequence's share of a batch: its cache and the number of new
// rows (positions) it contributes, in batch order.
type Seq struct {
	Cache *Cache
	Rows  int
}

// Forward runs the network over x [rows, hidden], where the rows are the
// new positions of each sequence in seqs in order, and returns the final
// RMSNorm's output for every row (a scratch tensor of c's arena). The caches
// advance by each sequence's rows. A sequence's rows are computed exactly as
// if it ran alone.
func (m *Model) Forward(c *nn.Ctx, x gpu.Tensor, seqs []Seq) gpu.Tensor {
	H := m.Cfg.HiddenSize
	total := 0
	for _, s := range seqs {
		if s.Cache.m != m {
			panic("lfm2: cache of another model")
		}
		total += s.Rows
	}
	if x.Rows != total || x.Cols != H {
		panic(fmt.Sprintf("lfm2: forward of %v for %d rows", x, total))
	}
	for _, s := range seqs {
		if err := s.Cache.reserve(c.Q, s.Rows); err != nil {
			// The caller's memory budget admits what the pool holds (or
			// the pool has no limit): running out here is a sizing bug.
			panic(fmt.Sprintf("lfm2: forward of %d rows at position %d: %v", s.Rows, s.Cache.pos, err))
		}
	}
	// The rows of sequences that bring more than one (prompts and their
	// chunks) may take the queue's prompt products; decode rows never do.
	var runs []nn.Run
	r0 := 0
	for _, s := range seqs {
		if s.Rows > 1 {
			if n := len(runs); n > 0 && runs[n-1].Hi == r0 {
				runs[n-1].Hi += s.Rows
			} else {
				runs = append(runs, nn.Run{Lo: r0, Hi: r0 + s.Rows})
			}
		}
		r0 += s.Rows
	}
	if len(runs) > 0 {
		defer c.PromptRows(total, runs)()
	}
	w := c.Tmp(total, H)
	c.Q.Copy(w, x)
	for i := range m.Blocks {
		m.block(c, i, w, seqs)
	}
	for _, s := range seqs {
		s.Cache.pos += s.Rows
		s.Cache.trim()
	}
	out := c.Tmp(total, H)
	m.rmsNorm(c, out, w, m.Norm)
	return out
}

// norm is Lfm2RMSNorm: normalise in fp32, round to bf16, multiply by the
// weight (bf16 × bf16, rounded).
func (m *Model) norm(c *nn.Ctx, w gpu.Tensor) gpu.RowNorm {
	bf16 := c.P == nn.BF16
	return gpu.RowNorm{Eps: float32(m.Cfg.NormEps), Round: bf16, W: w, RoundW: bf16}
}

// rmsNorm is Lfm2RMSNorm of x into dst.
func (m *Model) rmsNorm(c *nn.Ctx, dst, x, w gpu.Tensor) { gpu.NormRows(c.Q, dst, x, m.norm(c, w)) }

// block runs layer i in place on the residual stream w.
func (m *Model) block(c *nn.Ctx, i int, w gpu.Tensor, seqs []Seq) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	b := &m.Blocks[i]
	R, H := w.Rows, w.Cols
	// The operator norm runs inside the operator's first product
	// (gpu.NormMatMul: one kernel on a GPU for a decode row), which writes
	// the normalised rows h for the products after it.
	h := c.Tmp(R, H)
	op := c.Tmp(R, H)
	if b.Conv != nil {
		m.shortConv(c, i, op, h, w, seqs)
	} else {
		m.attention(c, i, op, h, w, seqs)
	}
	c.Q.Add(op, op, w) // hidden_states = op + residual
	c.Round(op)
	F := b.W1.Rows
	a, g := c.Tmp(R, F), c.Tmp(R, F)
	// g = (h·w3ᵀ) ⊙ silu(h·w1ᵀ) after the FFN norm, each step rounded (one
	// kernel on a GPU for a decode row: gpu.NormGLU); then the down
	// projection straight into w, then w + op: the same floats (+ and ×
	// commute), in the order a backend can fold into the products that
	// precede them.
	c.NormGLU(g, a, h, op, m.norm(c, b.FFNNorm), b.W1, b.W3)
	c.Linear(w, g, b.W2, gpu.Tensor{})
	c.Q.Add(w, w, op)
	c.Round(w)
}

// shortConv runs the conv operator of layer i on the operator norm of the
// residual stream w (written to h).
func (m *Model) shortConv(c *nn.Ctx, i int, dst, h, w gpu.Tensor, seqs []Seq) {
	sc := m.Blocks[i].Conv
	R, H := h.Rows, h.Cols
	bcx := c.Tmp(R, 3*H)
	c.NormLinear(bcx, h, w, m.norm(c, m.Blocks[i].OpNorm), sc.InProj, sc.InProjB)
	B, C, X := bcx.ColSlice(0, H), bcx.ColSlice(H, 2*H), bcx.ColSlice(2*H, 3*H)
	bx := c.Tmp(R, H)
	conv := c.Tmp(R, H)
	// B ⊙ x, rounded, then one convolution for every sequence, each with
	// its own state (one launch on a GPU, the gate's product in it, however
	// many sessions the step holds).
	states, rows := make([]gpu.Tensor, len(seqs)), make([]int, len(seqs))
	for k, s := range seqs {
		states[k], rows[k] = s.Cache.conv[i], s.Rows
	}
	gpu.ShortConvSeqsGated(c.Q, conv, bx, B, X, sc.Conv, states, rows, c.P == nn.BF16)
	if !sc.ConvB.IsNil() {
		c.Q.AddRow(conv, conv, sc.ConvB)
	}
	c.Round(conv)
	c.Q.Mul(conv, C, conv)
	c.Round(conv)
	c.Linear(dst, conv, sc.OutProj, sc.OutProjB)
}

// attention runs the attention operator of layer i on the operator norm
// of the residual stream w (written to h).
func (m *Model) attention(c *nn.Ctx, i int, dst, h, w gpu.Tensor, seqs []Seq) {
	at := m.Blocks[i].Attn
	R := h.Rows
	hd := at.HeadD
	qd, kvd := at.Heads*hd, at.KVHeads*hd
	// k and v are computed in scratch rows and copied into the cache by
	// row lists (gpu.CopyRows): a replayed step then changes only uploaded
	// data as the cache rows move, not the arguments of the products, norm
	// and rotation that would write the cache directly — on a GPU each
	// changed kernel argument costs a graph-node update on the host.
	qkv := c.Tmp(R, qd+2*kvd)
	c.NormLinear(qkv, h, w, m.norm(c, m.Blocks[i].OpNorm), at.QKV, gpu.Tensor{})
	// q and k leave the packed rows for contiguous ones as their heads are
	// prepared (each head's norm is then one op over all rows, whatever
	// the batch); v goes to the cache from its columns.
	q, k, v := c.Tmp(R, qd), c.Tmp(R, kvd), qkv.ColSlice(qd+kvd, qd+2*kvd)
	pos := make([]int32, R)
	r0 := 0
	for _, s := range seqs {
		for j := 0; j < s.Rows; j++ {
			pos[r0+j] = int32(s.Cache.pos + j)
		}
		r0 += s.Rows
	}
	// q_layernorm / k_layernorm per head, then the bf16 rotation (one
	// gpu.PrepHeads for both: one launch on a GPU).
	rp := gpu.RoPEParams{Style: gpu.RotateHalf, HeadDim: hd, InvFreq: m.InvFreq, Pos: pos, BF16: c.P == nn.BF16}
	gpu.PrepHeads(c.Q, rp, false,
		gpu.HeadPrep{Dst: q, Src: qkv.ColSlice(0, qd), Norm: m.norm(c, at.QNorm)},
		gpu.HeadPrep{Dst: k, Src: qkv.ColSlice(qd, qd+kvd), Norm: m.norm(c, at.KNorm)})
	o := c.Tmp(R, qd)
	// The new rows go into their blocks of the pools (a chunk may span
	// several), all sequences' in one row copy per pool; then one attention
	// for every sequence, each through its own table: on a GPU the launches
	// do not grow with the sessions, and the moving rows and positions are
	// data, not kernel arguments.
	var w2 poolWrites
	aseqs := make([]gpu.AttnSeq, 0, len(seqs))
	blockRows := 0 // one pool per model and device: the same for every cache
	r0 = 0
	for _, s := range seqs {
		if s.Rows == 0 {
			continue
		}
		cc := s.Cache
		t := cc.tabs[cc.group[i]]
		kp, vp := t.g.layerPools(i)
		br := cc.pool.rows
		if blockRows != 0 && br != blockRows {
			panic(fmt.Sprintf("lfm2: caches of %d- and %d-row blocks in one forward", blockRows, br))
		}
		blockRows = br
		pw := w2.pool(kp, vp)
		for j := 0; j < s.Rows; j++ {
			a := cc.pos + j
			pw.dst = append(pw.dst, t.ids[a/br-t.first]*int32(br)+int32(a%br))
			pw.src = append(pw.src, int32(r0+j))
		}
		t.upload(c.Q, cc.dev)
		// Key row j of the table is position base+j; the window mask is
		// relative, so positions are given relative to base.
		p := cc.pos - t.first*br
		aseqs = append(aseqs, gpu.AttnSeq{Rows: s.Rows, QPos0: p, K: kp, V: vp, Blocks: t.dev, Keys: p + s.Rows})
		r0 += s.Rows
	}
	for _, pw := range w2 {
		gpu.CopyRows(c.Q, pw.k, k, pw.dst, pw.src)
		gpu.CopyRows(c.Q, pw.v, v, pw.dst, pw.src)
	}
	gpu.AttentionSeqs(c.Q, o, q, gpu.AttnParams{
		Heads: at.Heads, KVHeads: at.KVHeads, HeadDim: hd,
		Scale:  float32(1 / math.Sqrt(float64(hd))),
		Causal: true, Window: at.Window,
		ProbBF16:  c.P == nn.BF16 && m.FlashAttention,
		BlockRows: max(blockRows, 1),
	}, aseqs)
	c.Round(o)
	c.Linear(dst, o, at.Out, gpu.Tensor{})
}

// poolWrites are the rows a step copies into each KV pool (one pool for
// all the sequences of a model's caches, in practice).
type poolWrites []*poolWrite

type poolWrite struct {
	k, v     gpu.Tensor
	dst, src []int32 // pool rows and the scratch rows they take
}

// pool returns the writes into the pools k and v, adding them if new.
func (w *poolWrites) pool(k, v gpu.Tensor) *poolWrite {
	for _, p := range *w {
		if gpu.SameView(p.k, k) && gpu.SameView(p.v, v) {
			return p
		}
	}
	p := &poolWrite{k: k, v: v}
	*w = append(*w, p)
	return p
}

// Logits computes the tied text head dst[rows, vocab] = h · embed_tokensᵀ,
// rounded as the reference's bf16 F.linear output.
func (m *Model) Logits(c *nn.Ctx, dst, h gpu.Tensor) {
	c.Linear(dst, h, m.Embed, gpu.Tensor{})
}

// EmbedTokens writes the embeddings of ids into dst [len(ids), hidden].
func (m *Model) EmbedTokens(c *nn.Ctx, dst gpu.Tensor, ids []int32) {
	c.Q.Embed(dst, m.Embed, ids)
}

// BytesFor returns what a cache of c's model holds once grown to
// positions (Model.BytesFor).
func (c *Cache) BytesFor(positions int) int64 { return c.m.BytesFor(positions) }
