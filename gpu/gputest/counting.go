package gputest

import "github.com/omni-pipe/omni-pipe/gpu"

// CountingQueue is a queue that counts the ops it is given, by method
// name: every method of gpu.Queue, and the batched ops of package gpu
// (CopyMany, CopyRows, AttentionSeqs, ShortConvSeqs, RelPosScores,
// HeadsMatMul) as one op each, as a backend that implements them runs
// them (one launch on CUDA). It runs
// every op on the queue it wraps, the batched ones as their op sequences
// (uncounted). Tests use it to show that a network's ops per step do not
// grow with the sessions in the step.
type CountingQueue struct {
	gpu.Queue
	Ops map[string]int
}

var (
	_ gpu.Copier          = (*CountingQueue)(nil)
	_ gpu.RowCopier       = (*CountingQueue)(nil)
	_ gpu.SeqAttender     = (*CountingQueue)(nil)
	_ gpu.SeqConvolver    = (*CountingQueue)(nil)
	_ gpu.RelPosScorer    = (*CountingQueue)(nil)
	_ gpu.HeadsMultiplier = (*CountingQueue)(nil)
)

// NewCountingQueue wraps q with no ops counted yet.
func NewCountingQueue(q gpu.Queue) *CountingQueue {
	return &CountingQueue{Queue: q, Ops: map[string]int{}}
}

func (c *CountingQueue) count(name string) { c.Ops[name]++ }

func (c *CountingQueue) Name() string { c.count("Name"); return c.Queue.Name() }
func (c *CountingQueue) Write(dst gpu.Tensor, src []float32) {
	c.count("Write")
	c.Queue.Write(dst, src)
}
func (c *CountingQueue) WriteInt(dst gpu.Tensor, src []int32) {
	c.count("WriteInt")
	c.Queue.WriteInt(dst, src)
}
func (c *CountingQueue) Read(dst []float32, src gpu.Tensor) error {
	c.count("Read")
	return c.Queue.Read(dst, src)
}
func (c *CountingQueue) ReadInt(dst []int32, src gpu.Tensor) error {
	c.count("ReadInt")
	return c.Queue.ReadInt(dst, src)
}
func (c *CountingQueue) Copy(dst, src gpu.Tensor)       { c.count("Copy"); c.Queue.Copy(dst, src) }
func (c *CountingQueue) Fill(dst gpu.Tensor, v float32) { c.count("Fill"); c.Queue.Fill(dst, v) }
func (c *CountingQueue) Sync() error                    { c.count("Sync"); return c.Queue.Sync() }
func (c *CountingQueue) MatMul(dst, x, w, bias gpu.Tensor) {
	c.count("MatMul")
	c.Queue.MatMul(dst, x, w, bias)
}
func (c *CountingQueue) Add(dst, a, b gpu.Tensor)    { c.count("Add"); c.Queue.Add(dst, a, b) }
func (c *CountingQueue) Mul(dst, a, b gpu.Tensor)    { c.count("Mul"); c.Queue.Mul(dst, a, b) }
func (c *CountingQueue) AddRow(dst, a, v gpu.Tensor) { c.count("AddRow"); c.Queue.AddRow(dst, a, v) }
func (c *CountingQueue) MulRow(dst, a, v gpu.Tensor) { c.count("MulRow"); c.Queue.MulRow(dst, a, v) }
func (c *CountingQueue) Scale(dst, a gpu.Tensor, s float32) {
	c.count("Scale")
	c.Queue.Scale(dst, a, s)
}
func (c *CountingQueue) RoundBF16(dst gpu.Tensor) { c.count("RoundBF16"); c.Queue.RoundBF16(dst) }
func (c *CountingQueue) Act(dst, a gpu.Tensor, f gpu.Activation) {
	c.count("Act")
	c.Queue.Act(dst, a, f)
}
func (c *CountingQueue) GLU(dst, a gpu.Tensor) { c.count("GLU"); c.Queue.GLU(dst, a) }
func (c *CountingQueue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	c.count("RMSNorm")
	c.Queue.RMSNorm(dst, a, eps)
}
func (c *CountingQueue) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	c.count("LayerNorm")
	c.Queue.LayerNorm(dst, a, w, b, eps)
}
func (c *CountingQueue) Softmax(dst gpu.Tensor)                { c.count("Softmax"); c.Queue.Softmax(dst) }
func (c *CountingQueue) RoPE(dst gpu.Tensor, p gpu.RoPEParams) { c.count("RoPE"); c.Queue.RoPE(dst, p) }
func (c *CountingQueue) Attention(dst, q, k, v gpu.Tensor, p gpu.AttnParams) {
	c.count("Attention")
	c.Queue.Attention(dst, q, k, v, p)
}
func (c *CountingQueue) ShortConv(dst, x, w, state gpu.Tensor) {
	c.count("ShortConv")
	c.Queue.ShortConv(dst, x, w, state)
}
func (c *CountingQueue) Embed(dst, table gpu.Tensor, ids []int32) {
	c.count("Embed")
	c.Queue.Embed(dst, table, ids)
}
func (c *CountingQueue) EmbedIDs(dst, table, ids gpu.Tensor) {
	c.count("EmbedIDs")
	c.Queue.EmbedIDs(dst, table, ids)
}
func (c *CountingQueue) Sample(ids, logits gpu.Tensor, rows []gpu.SampleRow) {
	c.count("Sample")
	c.Queue.Sample(ids, logits, rows)
}
func (c *CountingQueue) Conv1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	c.count("Conv1D")
	c.Queue.Conv1D(dst, x, w, bias, p)
}
func (c *CountingQueue) ConvTranspose1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	c.count("ConvTranspose1D")
	c.Queue.ConvTranspose1D(dst, x, w, bias, p)
}
func (c *CountingQueue) Conv2D(dst, x, w, bias gpu.Tensor, p gpu.Conv2DParams) {
	c.count("Conv2D")
	c.Queue.Conv2D(dst, x, w, bias, p)
}
func (c *CountingQueue) Transpose(dst, src gpu.Tensor) {
	c.count("Transpose")
	c.Queue.Transpose(dst, src)
}

// CopyMany implements gpu.Copier: one op.
func (c *CountingQueue) CopyMany(pairs []gpu.CopyPair) {
	c.count("CopyMany")
	for _, p := range pairs {
		c.Queue.Copy(p.Dst, p.Src)
	}
}

// CopyRows implements gpu.RowCopier: one op.
func (c *CountingQueue) CopyRows(dst, src gpu.Tensor, dstRows, srcRows []int32) {
	c.count("CopyRows")
	gpu.CopyRowsSeq(c.Queue, dst, src, dstRows, srcRows)
}

// AttentionSeqs implements gpu.SeqAttender: one op.
func (c *CountingQueue) AttentionSeqs(dst, q gpu.Tensor, p gpu.AttnParams, seqs []gpu.AttnSeq) {
	c.count("AttentionSeqs")
	gpu.AttentionSeqsSeq(c.Queue, dst, q, p, seqs)
}

// ShortConvSeqs implements gpu.SeqConvolver: one op.
func (c *CountingQueue) ShortConvSeqs(dst, x, w gpu.Tensor, states []gpu.Tensor, rows []int) {
	c.count("ShortConvSeqs")
	gpu.ShortConvSeqsSeq(c.Queue, dst, x, w, states, rows)
}

// RelPosScores implements gpu.RelPosScorer: one op.
func (c *CountingQueue) RelPosScores(scores, work, qu, qv, k, p gpu.Tensor, rp gpu.RelPosParams) {
	c.count("RelPosScores")
	gpu.RelPosScoresSeq(c.Queue, scores, work, qu, qv, k, p, rp)
}

// HeadsMatMul implements gpu.HeadsMultiplier: one op.
func (c *CountingQueue) HeadsMatMul(o, probs, vt gpu.Tensor, heads int) {
	c.count("HeadsMatMul")
	gpu.HeadsMatMulSeq(c.Queue, o, probs, vt, heads)
}
