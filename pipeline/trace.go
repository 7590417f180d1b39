package pipeline

import (
	"sync"
	"time"
)

// Interval is one stage's busy period: a batch it computed.
type Interval struct {
	Stage string
	Turns []uint64 // the turns in the batch
	// Steps labels the work by backbone step (counted from 0, the prompt's
	// step, within each turn). The backbone and the depthformer: Steps[i] is
	// the step Turns[i] was at (the depthformer samples the frame of an
	// audio step). The codec, which decodes a run of frames of each turn
	// (several turns in one batch when the codec batches): the step that
	// sampled each frame, turn after turn. The front end: nil.
	Steps []int
	// Rows, for the backbone, is the rows each turn fed the step (1 for a
	// step, up to the prefill chunk for a prompt); for the codec, the
	// frames of each turn (Rows[i] of Steps belong to Turns[i]); nil
	// elsewhere.
	Rows       []int
	Start, End time.Time
	Label      string
}

// Trace records stage intervals on one time axis (for `omni-pipe bench`
// and for tests that check the stages overlap).
type Trace struct {
	mu  sync.Mutex
	ivs []Interval
}

func (tr *Trace) add(iv Interval) {
	tr.mu.Lock()
	tr.ivs = append(tr.ivs, iv)
	tr.mu.Unlock()
}

// Intervals returns a copy of what was recorded, in recording order.
func (tr *Trace) Intervals() []Interval {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]Interval(nil), tr.ivs...)
}

// Reset forgets every interval.
func (tr *Trace) Reset() {
	tr.mu.Lock()
	tr.ivs = nil
	tr.mu.Unlock()
}
