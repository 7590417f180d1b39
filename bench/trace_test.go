package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// TestAnalyseTrace: two turns' intervals, given out of order — turn 1 a
// spoken question (log-mel, encoder, a prompt step it shares with turn 2,
// two steps of its own, a frame, a decode, then a later step and frame),
// turn 2 a text question that never speaks — give each stage's batches,
// busy share and turns a batch, and the milestones of the turns that
// reached each.
func TestAnalyseTrace(t *testing.T) {
	at := func(stage string, lo, hi float64, turns ...uint64) pipeline.Interval {
		v := iv(stage, lo, hi)
		v.Turns = turns
		return v
	}
	ivs := []pipeline.Interval{
		at(pipeline.StageCodec, 40, 50, 1),
		at(pipeline.StageFrontend, 0, 2, 1),
		at(pipeline.StageEncoder, 2, 10, 1),
		at(pipeline.StageBackbone, 5, 9, 2), // turn 2's prompt: its first interval
		at(pipeline.StageBackbone, 12, 20, 1, 2),
		at(pipeline.StageBackbone, 21, 25, 1, 2),
		at(pipeline.StageBackbone, 26, 30, 1),
		at(pipeline.StageDepth, 30, 38, 1),
		at(pipeline.StageBackbone, 39, 41, 1),
		at(pipeline.StageDepth, 41, 45, 1),
		at(pipeline.StageCodec, 60, 100, 1),
	}
	rep := AnalyseTrace(ivs)
	if rep.SpanMS != 100 {
		t.Errorf("span %v ms, want 100", rep.SpanMS)
	}
	stages := map[string]StageShare{}
	for _, s := range rep.Stages {
		stages[s.Stage] = s
	}
	bb := stages[pipeline.StageBackbone]
	if bb.Batches != 5 || math.Abs(bb.Busy-0.22) > 1e-9 || bb.BatchP50MS != 4 || bb.TurnsP50 != 1 {
		t.Errorf("backbone %+v, want 5 batches, 22 %% busy, p50 4 ms, 1 turn", bb)
	}
	if c := stages[pipeline.StageCodec]; c.Batches != 2 || math.Abs(c.Busy-0.5) > 1e-9 || c.BatchP90MS != 40 {
		t.Errorf("codec %+v", c)
	}
	want := map[string]Milestone{
		MilestoneEncoded:    {Turns: 1, P50MS: 10},
		MilestoneFirstStep:  {Turns: 2, P50MS: 0, P99MS: 12}, // turn 2 from its prompt, turn 1 from its log-mel
		MilestoneLastStep:   {Turns: 1, P50MS: 30},
		MilestoneFirstFrame: {Turns: 1, P50MS: 38},
		MilestoneFirstAudio: {Turns: 1, P50MS: 50},
	}
	if len(rep.Milestones) != len(want) {
		t.Fatalf("%d milestones, want %d", len(rep.Milestones), len(want))
	}
	for _, m := range rep.Milestones {
		w := want[m.Name]
		if m.Turns != w.Turns || m.P50MS != w.P50MS || (w.P99MS != 0 && m.P99MS != w.P99MS) {
			t.Errorf("%s: %+v, want %+v", m.Name, m, w)
		}
	}
	var out bytes.Buffer
	if err := PrintTrace(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"stage trace over 100 ms", "backbone", MilestoneFirstAudio, "50.0 ms"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the tables lack %q:\n%s", s, out.String())
		}
	}
	if r := AnalyseTrace(nil); len(r.Stages) != 0 || len(r.Milestones) != 0 {
		t.Errorf("an empty trace: %+v", r)
	}
}
