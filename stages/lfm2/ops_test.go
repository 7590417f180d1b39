package lfm2

import (
	"fmt"
	"maps"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// countingQueue counts a queue's ops by name; the batched ops of
// gpu/seqs.go count as one op each (it implements their interfaces and
// runs their sequences on the queue underneath).
type countingQueue struct {
	gpu.Queue
	n map[string]int
}

func (q *countingQueue) op(name string) { q.n[name]++ }

func (q *countingQueue) Copy(dst, src gpu.Tensor)          { q.op("Copy"); q.Queue.Copy(dst, src) }
func (q *countingQueue) Write(dst gpu.Tensor, v []float32) { q.op("Write"); q.Queue.Write(dst, v) }
func (q *countingQueue) WriteInt(dst gpu.Tensor, v []int32) {
	q.op("WriteInt")
	q.Queue.WriteInt(dst, v)
}
func (q *countingQueue) MatMul(dst, x, w, b gpu.Tensor) { q.op("MatMul"); q.Queue.MatMul(dst, x, w, b) }
func (q *countingQueue) Add(dst, a, b gpu.Tensor)       { q.op("Add"); q.Queue.Add(dst, a, b) }
func (q *countingQueue) Mul(dst, a, b gpu.Tensor)       { q.op("Mul"); q.Queue.Mul(dst, a, b) }
func (q *countingQueue) AddRow(dst, a, v gpu.Tensor)    { q.op("AddRow"); q.Queue.AddRow(dst, a, v) }
func (q *countingQueue) MulRow(dst, a, v gpu.Tensor)    { q.op("MulRow"); q.Queue.MulRow(dst, a, v) }
func (q *countingQueue) RoundBF16(dst gpu.Tensor)       { q.op("RoundBF16"); q.Queue.RoundBF16(dst) }
func (q *countingQueue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	q.op("RMSNorm")
	q.Queue.RMSNorm(dst, a, eps)
}
func (q *countingQueue) Act(dst, a gpu.Tensor, f gpu.Activation) { q.op("Act"); q.Queue.Act(dst, a, f) }
func (q *countingQueue) RoPE(dst gpu.Tensor, p gpu.RoPEParams)   { q.op("RoPE"); q.Queue.RoPE(dst, p) }
func (q *countingQueue) Attention(dst, qt, k, v gpu.Tensor, p gpu.AttnParams) {
	q.op("Attention")
	q.Queue.Attention(dst, qt, k, v, p)
}
func (q *countingQueue) ShortConv(dst, x, w, s gpu.Tensor) {
	q.op("ShortConv")
	q.Queue.ShortConv(dst, x, w, s)
}
func (q *countingQueue) CopyRows(dst, src gpu.Tensor, d, s []int32) {
	q.op("CopyRows")
	gpu.CopyRowsSeq(q.Queue, dst, src, d, s)
}
func (q *countingQueue) AttentionSeqs(dst, qt gpu.Tensor, p gpu.AttnParams, seqs []gpu.AttnSeq) {
	q.op("AttentionSeqs")
	gpu.AttentionSeqsSeq(q.Queue, dst, qt, p, seqs)
}
func (q *countingQueue) ShortConvSeqs(dst, x, w gpu.Tensor, states []gpu.Tensor, rows []int) {
	q.op("ShortConvSeqs")
	gpu.ShortConvSeqsSeq(q.Queue, dst, x, w, states, rows)
}

// TestStepOpsIndependentOfSessions: a decode step of 2 sessions and of 8
// issue the same ops, name by name — what batching many sessions on a GPU
// needs (an op per session would be a launch per session). Block-table
// uploads (WriteInt) happen only when a cache takes a new block, which no
// session of this step does.
func TestStepOpsIndependentOfSessions(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	counts := map[int]map[string]int{}
	for _, sessions := range []int{2, 8} {
		cq := &countingQueue{Queue: tm.dev.NewQueue("count"), n: map[string]int{}}
		c := nn.NewCtx(tm.dev, cq, nn.BF16)
		seqs := make([]Seq, sessions)
		for i := range seqs {
			x, _ := randomRows(tm.dev, c.Q, 3+i, H, uint64(i))
			cc := tm.m.NewCache(tm.dev)
			tm.m.Forward(c, x, []Seq{{Cache: cc, Rows: 3 + i}})
			seqs[i] = Seq{Cache: cc, Rows: 1}
		}
		x, _ := randomRows(tm.dev, c.Q, sessions, H, 77)
		clear(cq.n)
		tm.m.Forward(c, x, seqs)
		counts[sessions] = maps.Clone(cq.n)
		if cq.n["Attention"] != 0 || cq.n["ShortConv"] != 0 {
			t.Errorf("%d sessions: per-session ops issued directly: %v", sessions, cq.n)
		}
	}
	t.Logf("ops of a step: %v", counts[8])
	if fmt.Sprint(counts[2]) != fmt.Sprint(counts[8]) {
		t.Errorf("a step's ops grow with the sessions:\n 2: %v\n 8: %v", counts[2], counts[8])
	}
}
