package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// StageShare is one stage's part of a traced run.
type StageShare struct {
	Stage   string  `json:"stage"`
	Batches int     `json:"batches"`
	Busy    float64 `json:"busy_share"` // the stage's batches' time over the run's span
	// BatchP50MS and BatchP90MS are the batches' durations.
	BatchP50MS float64 `json:"batch_p50_ms"`
	BatchP90MS float64 `json:"batch_p90_ms"`
	// TurnsP50 is the turns a batch serves (the median batch).
	TurnsP50 float64 `json:"turns_p50"`
}

// Milestone is when a turn reached a point of its way to its first audio,
// in ms from the start of its first stage interval (its log-mel, or its
// prompt's first step when it has no clip), over the run's turns.
type Milestone struct {
	Name  string  `json:"name"`
	Turns int     `json:"turns"` // the turns that reached it
	P50MS float64 `json:"p50_ms"`
	P90MS float64 `json:"p90_ms"`
	P99MS float64 `json:"p99_ms"`
}

// TraceReport says where a traced engine's time went: each stage's share
// and batches, and a new turn's milestones to its first audio.
type TraceReport struct {
	SpanMS     float64      `json:"span_ms"`
	Stages     []StageShare `json:"stages"`
	Milestones []Milestone  `json:"milestones"`
}

// The milestones, in order.
const (
	MilestoneEncoded    = "encoder done"
	MilestoneFirstStep  = "first backbone step begins"
	MilestoneLastStep   = "last backbone step before the first frame ends"
	MilestoneFirstFrame = "first frame sampled"
	MilestoneFirstAudio = "first audio decoded"
)

// AnalyseTrace summarises an engine trace (pipeline.Trace's intervals, in
// any order).
func AnalyseTrace(ivs []pipeline.Interval) TraceReport {
	var rep TraceReport
	if len(ivs) == 0 {
		return rep
	}
	t0, t1 := ivs[0].Start, ivs[0].End
	for _, iv := range ivs {
		if iv.Start.Before(t0) {
			t0 = iv.Start
		}
		if iv.End.After(t1) {
			t1 = iv.End
		}
	}
	span := t1.Sub(t0)
	rep.SpanMS = ms(span)
	byStage := map[string][]pipeline.Interval{}
	for _, iv := range ivs {
		byStage[iv.Stage] = append(byStage[iv.Stage], iv)
	}
	for _, st := range []string{pipeline.StageFrontend, pipeline.StageEncoder, pipeline.StageBackbone, pipeline.StageDepth, pipeline.StageCodec} {
		xs := byStage[st]
		if len(xs) == 0 {
			continue
		}
		var busy time.Duration
		durs, turns := make([]float64, len(xs)), make([]float64, len(xs))
		for i, iv := range xs {
			d := iv.End.Sub(iv.Start)
			busy += d
			durs[i], turns[i] = ms(d), float64(len(iv.Turns))
		}
		share := 0.0
		if span > 0 {
			share = float64(busy) / float64(span)
		}
		rep.Stages = append(rep.Stages, StageShare{Stage: st, Batches: len(xs), Busy: share,
			BatchP50MS: quantile(durs, 0.5), BatchP90MS: quantile(durs, 0.9), TurnsP50: quantile(turns, 0.5)})
	}

	// Each turn's way, in time order.
	sorted := slices.Clone(ivs)
	slices.SortStableFunc(sorted, func(a, b pipeline.Interval) int { return a.Start.Compare(b.Start) })
	type way struct {
		start                 time.Time
		encoded, first, frame time.Time
		lastStep              time.Time // the end of the latest backbone step before the first frame
		audio                 time.Time
	}
	ways := map[uint64]*way{}
	var order []uint64
	for _, iv := range sorted {
		for _, id := range iv.Turns {
			w := ways[id]
			if w == nil {
				w = &way{start: iv.Start}
				ways[id] = w
				order = append(order, id)
			}
			switch iv.Stage {
			case pipeline.StageEncoder:
				setOnce(&w.encoded, iv.End)
			case pipeline.StageBackbone:
				setOnce(&w.first, iv.Start)
				if w.frame.IsZero() {
					w.lastStep = iv.End
				}
			case pipeline.StageDepth:
				setOnce(&w.frame, iv.End)
			case pipeline.StageCodec:
				setOnce(&w.audio, iv.End)
			}
		}
	}
	points := []struct {
		name string
		at   func(*way) time.Time
	}{
		{MilestoneEncoded, func(w *way) time.Time { return w.encoded }},
		{MilestoneFirstStep, func(w *way) time.Time { return w.first }},
		{MilestoneLastStep, func(w *way) time.Time {
			if w.frame.IsZero() {
				return time.Time{} // it never spoke
			}
			return w.lastStep
		}},
		{MilestoneFirstFrame, func(w *way) time.Time { return w.frame }},
		{MilestoneFirstAudio, func(w *way) time.Time { return w.audio }},
	}
	for _, p := range points {
		var v []float64
		for _, id := range order {
			w := ways[id]
			if at := p.at(w); !at.IsZero() {
				v = append(v, ms(at.Sub(w.start)))
			}
		}
		rep.Milestones = append(rep.Milestones, Milestone{Name: p.name, Turns: len(v),
			P50MS: quantile(v, 0.5), P90MS: quantile(v, 0.9), P99MS: quantile(v, 0.99)})
	}
	return rep
}

// setOnce sets *at to t unless it is set.
func setOnce(at *time.Time, t time.Time) {
	if at.IsZero() {
		*at = t
	}
}

// PrintTrace writes rep as two tables.
func PrintTrace(w io.Writer, rep TraceReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "stage trace over %.0f ms\n", rep.SpanMS)
	fmt.Fprintln(tw, "stage\tbatches\tbusy\tbatch p50\tp90\tturns a batch p50\t")
	for _, s := range rep.Stages {
		fmt.Fprintf(tw, "%s\t%d\t%.0f%%\t%.2f ms\t%.2f ms\t%.0f\t\n", s.Stage, s.Batches, 100*s.Busy, s.BatchP50MS, s.BatchP90MS, s.TurnsP50)
	}
	fmt.Fprintln(tw, "a new turn, from its first stage\tturns\tp50\tp90\tp99\t")
	for _, m := range rep.Milestones {
		fmt.Fprintf(tw, "%s\t%d\t%.1f ms\t%.1f ms\t%.1f ms\t\n", m.Name, m.Turns, m.P50MS, m.P90MS, m.P99MS)
	}
	return tw.Flush()
}
