package pipeline

import (
	"time"
)

// Event is what a turn emits: *TextEvent, *AudioEvent, *DoneEvent or
// *ErrorEvent. A turn's channel carries text and audio events in the order
// they were produced, then exactly one DoneEvent or ErrorEvent, then closes.
type Event interface{ isEvent() }

// TextEvent is a piece of the reply's text.
type TextEvent struct {
	Delta string // UTF-8 text; never half a character
	Token int    // the token that completed Delta
}

// AudioEvent is one decoded frame of reply speech.
type AudioEvent struct {
	Seq     int       // 0, 1, 2 … within the turn
	Samples []float32 // mono, SampleRate Hz (1920 per 80 ms frame)
	Rate    int
}

// DoneEvent ends a successful turn.
type DoneEvent struct {
	Text    string // the whole reply text
	Stop    StopReason
	Timings Timings
}

// ErrorEvent ends a failed or cancelled turn.
type ErrorEvent struct {
	Err     error
	Timings Timings
}

func (*TextEvent) isEvent()  {}
func (*AudioEvent) isEvent() {}
func (*DoneEvent) isEvent()  {}
func (*ErrorEvent) isEvent() {}

// Timings of a turn, measured from its start.
type Timings struct {
	Prefill    time.Duration // until the prompt's last row was computed
	FirstText  time.Duration // until the first text event (0: none)
	FirstAudio time.Duration // until the first audio event (0: none)
	Total      time.Duration
	PromptRows int // rows prefilled this turn
	Steps      int // backbone steps
	Tokens     int // text tokens emitted
	Frames     int // audio frames emitted (the end-of-audio frame included)
	// AudioSeconds is the duration of the decoded reply speech.
	AudioSeconds float64
	// RTF is Total / AudioSeconds (below 1: faster than real time).
	RTF float64
	// Busy is each stage's compute time spent on this turn (a batch's time
	// is shared equally by the turns in it).
	Busy map[string]time.Duration
}
