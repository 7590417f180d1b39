package lfm2

import (
	"fmt"
	"maps"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

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
		cq := gputest.NewCountingQueue(tm.dev.NewQueue("count"))
		c := nn.NewCtx(tm.dev, cq, nn.BF16)
		seqs := make([]Seq, sessions)
		for i := range seqs {
			x, _ := randomRows(tm.dev, c.Q, 3+i, H, uint64(i))
			cc := tm.m.NewCache(tm.dev)
			tm.m.Forward(c, x, []Seq{{Cache: cc, Rows: 3 + i}})
			seqs[i] = Seq{Cache: cc, Rows: 1}
		}
		x, _ := randomRows(tm.dev, c.Q, sessions, H, 77)
		clear(cq.Ops)
		tm.m.Forward(c, x, seqs)
		counts[sessions] = maps.Clone(cq.Ops)
		if cq.Ops["Attention"] != 0 || cq.Ops["ShortConv"] != 0 {
			t.Errorf("%d sessions: per-session ops issued directly: %v", sessions, cq.Ops)
		}
	}
	t.Logf("ops of a step: %v", counts[8])
	if fmt.Sprint(counts[2]) != fmt.Sprint(counts[8]) {
		t.Errorf("a step's ops grow with the sessions:\n 2: %v\n 8: %v", counts[2], counts[8])
	}
}
