// Package pipeline runs conversations: the turn state machine, sampling,
// and the engine whose stages (log-mel, encoder, backbone, depthformer,
// codec) are goroutine actors connected by bounded channels.
package pipeline

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/stages/family"
)

// Mode is how a turn alternates text and audio: the family's modes (its
// default system prompt depends on the mode too).
type Mode = family.Mode

const (
	// Interleaved is speech-to-speech: blocks of NText text tokens and
	// NAudio audio frames until <|text_end|>, then audio until the
	// end-of-audio frame (generate_interleaved).
	Interleaved = family.Interleaved
	// Sequential is ASR and TTS: text until <|audio_start|>, then audio until
	// end-of-audio, then text until <|im_end|> (generate_sequential).
	Sequential = family.Sequential
)

// Kind is what a backbone step samples.
type Kind uint8

// Step kinds.
const (
	TextStep Kind = iota + 1
	AudioStep
)

func (k Kind) String() string {
	switch k {
	case TextStep:
		return "text"
	case AudioStep:
		return "audio"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// StopReason says why a turn ended.
type StopReason uint8

// Stop reasons.
const (
	NotStopped StopReason = iota
	EndOfTurn             // the model emitted <|im_end|>
	MaxTokens             // max_new_tokens steps were taken
)

func (r StopReason) String() string {
	switch r {
	case NotStopped:
		return "running"
	case EndOfTurn:
		return "end_of_turn"
	case MaxTokens:
		return "max_tokens"
	}
	return fmt.Sprintf("StopReason(%d)", uint8(r))
}

// Turn is the state machine of one assistant turn, a pure value: no
// goroutines, no clock. The token ids and the end-of-audio code it acts on
// are the model's (family.Special, read from the checkpoint). The engine calls Step before each backbone step to
// learn what to sample, then OnText or OnAudio with what it sampled; the
// result says whether to emit it, and whether the turn is over. It follows
// liquid-audio's generate_interleaved and generate_sequential exactly,
// including their odd corners (text after <|text_end|> switches straight
// back to audio; the modality counter keeps counting across an
// end-of-audio frame).
type Turn struct {
	sp            family.Special
	mode          Mode
	nText, nAudio int
	maxNew        int

	kind     Kind
	left     int // modality_left
	textDone bool
	steps    int
	stopped  StopReason
	pending  bool // Step was called and its sample not yet observed
}

// NewTurn returns the state of a turn that starts with a text step, for a
// model whose special tokens and end-of-audio code are sp.
func NewTurn(sp family.Special, mode Mode, nText, nAudio, maxNewTokens int) *Turn {
	return &Turn{sp: sp, mode: mode, nText: nText, nAudio: nAudio, maxNew: maxNewTokens, kind: TextStep, left: nText}
}

// Step starts the next backbone step and returns what it samples; ok is
// false when the turn is over (then Stopped says why).
func (t *Turn) Step() (k Kind, ok bool) {
	if t.pending {
		panic("pipeline: Turn.Step before the previous step's sample")
	}
	if t.stopped != NotStopped {
		return 0, false
	}
	if t.steps >= t.maxNew {
		t.stopped = MaxTokens
		return 0, false
	}
	t.steps++
	if t.mode == Interleaved {
		t.left--
	}
	t.pending = true
	return t.kind, true
}

// Outcome is what to do with a sample.
type Outcome struct {
	// Emit: the sample is part of the reply (yielded, and appended to the
	// conversation's history).
	Emit bool
	// Stop: the turn is over; the sample is not fed back.
	Stop bool
}

// OnText observes the text token sampled by a TextStep.
func (t *Turn) OnText(tok int) Outcome {
	t.observe(TextStep)
	if t.mode == Sequential {
		switch tok {
		case t.sp.IMEnd:
			t.stopped = EndOfTurn
			return Outcome{Emit: true, Stop: true}
		case t.sp.AudioStart:
			t.kind = AudioStep
		}
		return Outcome{Emit: true}
	}
	if tok == t.sp.IMEnd {
		t.stopped = EndOfTurn
		return Outcome{Stop: true}
	}
	if tok == t.sp.TextEnd {
		t.textDone = true
	}
	if t.left == 0 || t.textDone {
		t.kind = AudioStep
		t.left = t.nAudio
	}
	return Outcome{Emit: true}
}

// OnAudio observes the frame sampled by an AudioStep. A frame whose first
// code is end-of-audio is rewritten in place to all end-of-audio.
func (t *Turn) OnAudio(codes []int) Outcome {
	t.observe(AudioStep)
	if t.mode == Interleaved && t.left == 0 && !t.textDone {
		t.kind = TextStep
		t.left = t.nText
	}
	if len(codes) > 0 && codes[0] == t.sp.EOA {
		for i := range codes {
			codes[i] = t.sp.EOA
		}
		t.kind = TextStep
	}
	return Outcome{Emit: true}
}

func (t *Turn) observe(k Kind) {
	if !t.pending || t.kind != k {
		panic(fmt.Sprintf("pipeline: %v sample observed while expecting %v (pending %v)", k, t.kind, t.pending))
	}
	t.pending = false
}

// Steps returns the number of backbone steps taken.
func (t *Turn) Steps() int { return t.steps }

// Stopped returns why the turn ended (NotStopped while it runs).
func (t *Turn) Stopped() StopReason { return t.stopped }

// TextDone reports whether <|text_end|> was seen.
func (t *Turn) TextDone() bool { return t.textDone }

// Kind returns the kind of the next step.
func (t *Turn) Kind() Kind { return t.kind }
