// Package live runs a spoken conversation with the model: microphone →
// voice-activity detection → one turn per utterance → text to the terminal
// and speech to the loudspeaker, with barge-in.
//
//	err := live.Run(ctx, live.Config{
//		Engine: eng, Source: mic, Sink: speaker, BargeIn: true,
//		OnEvent: func(ev live.Event) { ... }, // text deltas, turn boundaries
//	})
//
// The loop is one goroutine (Run's caller) that selects over the source's
// chunks and the running turn's events; it starts no goroutine of its own.
// All turns belong to one pipeline.Session, so the model hears the whole
// conversation. When an utterance ends (the VAD's End) a turn starts with
// it; the reply's text goes to OnEvent and its audio to the Sink.
//
// While the assistant is busy (generating, or its audio still playing),
// speech is handled by Config.BargeIn:
//
//   - off (half duplex): an utterance that begins before the reply has
//     played out (plus EchoTail) is dropped whole. The loudspeaker cannot
//     interrupt the assistant, and neither can the user.
//   - on: an onset cancels the turn at its next frame boundary (the part
//     generated so far stays in the conversation's history), drops the
//     queued audio, and the new utterance becomes the next turn. Since the
//     microphone also hears the loudspeaker, an energy VAD would take the
//     assistant's own voice for the user's: speech that begins in the first
//     EchoGuard of a reply's playback interrupts only if it is still voiced
//     when the guard ends (a cough, the loudspeaker's first syllable is
//     not an interruption), and while audio plays the VAD's thresholds are
//     raised by PlayingBoostDB. That is no echo
//     cancellation: with loudspeakers loud enough, the assistant still
//     interrupts itself. Use headphones, or barge-in off.
//
// Time is the source's sample count. With VirtualTime (for recordings read
// as fast as possible) generation takes no time on that clock and the
// loudspeaker is simulated, so the same recording and seed always give the
// same conversation whatever the machine's speed.
package live

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/audio/device"
	"github.com/omni-pipe/omni-pipe/audio/vad"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// Config configures Run. Durations and levels whose comment names a
// default take it when zero; a negative value turns them off.
type Config struct {
	Engine *pipeline.Engine
	Source device.Source
	Sink   device.Sink
	// VAD tunes the voice-activity detector; SampleRate is the Source's.
	VAD vad.Config
	// Request is the template of every turn: System, Mode, sampling,
	// MaxNewTokens, Seed. Audio is set to the utterance.
	Request pipeline.Request
	// BargeIn lets speech interrupt the assistant.
	BargeIn bool
	// EchoGuard: with BargeIn, speech that begins in the first EchoGuard
	// of a reply's playback barges in only if it is still voiced when the
	// guard ends; otherwise it is dropped (default 300 ms).
	EchoGuard time.Duration
	// PlayingBoostDB: with BargeIn, the VAD's thresholds are raised this
	// much while reply audio plays (default 10 dB).
	PlayingBoostDB float64
	// EchoTail is how long the assistant counts as audible after its
	// audio has played out: the room's echo (default 200 ms).
	EchoTail time.Duration
	// VirtualTime: the Source is a recording read as fast as it goes (not
	// paced); the Source is not read while a turn generates, and the Sink
	// is fed in step with the Source as a loudspeaker would play, so it
	// receives exactly what was heard before each barge-in.
	VirtualTime bool
	// OnEvent, if set, is called on Run's goroutine for every Event. It
	// should return quickly: the microphone waits meanwhile.
	OnEvent func(Event)
}

// Defaults.
const (
	DefaultEchoGuard      = 300 * time.Millisecond
	DefaultPlayingBoostDB = 10
	DefaultEchoTail       = 200 * time.Millisecond
)

// Kind is what an Event reports.
type Kind uint8

// Event kinds.
const (
	Listening     Kind = iota + 1 // the loop is ready
	SpeechStart                   // the user started speaking
	SpeechIgnored                 // speech while the assistant was busy, not taken (Reason)
	SpeechEnd                     // an utterance ended (Audio: its length)
	Skipped                       // an utterance was not sent (Err: why)
	TurnStart                     // a turn began (Turn)
	Text                          // reply text (Text: the delta)
	BargeIn                       // the user interrupted the reply (Heard)
	TurnEnd                       // a turn ended (Err, Stop, Timings, Audio)
	HistoryReset                  // the conversation outgrew the context; a new one began
)

var kindNames = [...]string{"", "listening", "speech-start", "speech-ignored", "speech-end", "skipped",
	"turn-start", "text", "barge-in", "turn-end", "history-reset"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is something that happened in the conversation.
type Event struct {
	Kind Kind
	// At is the microphone time: audio read from the Source so far.
	At time.Duration
	// Turn numbers the turns from 1 (TurnStart, Text, BargeIn, TurnEnd).
	Turn int
	// Text is a piece of the reply (Text).
	Text string
	// Audio is the utterance's length (SpeechEnd) or the reply audio the
	// turn produced (TurnEnd).
	Audio time.Duration
	// Heard is the reply audio played before the barge-in (BargeIn).
	Heard time.Duration
	// Reason says why speech was ignored (SpeechIgnored).
	Reason string
	// Err: why an utterance was skipped (Skipped), or why a turn did not
	// end normally (TurnEnd: context.Canceled after a barge-in).
	Err error
	// Stop and Timings of the turn (TurnEnd).
	Stop    pipeline.StopReason
	Timings pipeline.Timings
}

// Run holds the conversation until the source ends and the last reply has
// played (nil), ctx is cancelled (ctx.Err()), or the source, sink or
// engine fails. It does not close the Source or the Sink.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Engine == nil || cfg.Source == nil || cfg.Sink == nil {
		return errors.New("live: Config needs an Engine, a Source and a Sink")
	}
	if cfg.EchoGuard == 0 {
		cfg.EchoGuard = DefaultEchoGuard
	}
	if cfg.PlayingBoostDB == 0 {
		cfg.PlayingBoostDB = DefaultPlayingBoostDB
	}
	if cfg.EchoTail == 0 {
		cfg.EchoTail = DefaultEchoTail
	}
	srcRate, sinkRate := cfg.Source.SampleRate(), cfg.Sink.SampleRate()
	if srcRate <= 0 || sinkRate <= 0 {
		return fmt.Errorf("live: source rate %d Hz, sink rate %d Hz", srcRate, sinkRate)
	}
	vc := cfg.VAD
	vc.SampleRate = srcRate
	det, err := vad.New(vc)
	if err != nil {
		return err
	}
	l := &loop{
		cfg: cfg, det: det, srcRate: srcRate, sinkRate: sinkRate,
		sess:        cfg.Engine.NewSession(),
		guard:       samplesOf(cfg.EchoGuard, srcRate),
		tail:        samplesOf(cfg.EchoTail, srcRate),
		replyStart:  -1,
		lastAudible: -1,
	}
	defer func() { l.sess.Close() }()
	return l.run(ctx)
}

func samplesOf(d time.Duration, rate int) int64 {
	if d < 0 {
		return 0
	}
	return int64(d) * int64(rate) / int64(time.Second)
}

type loop struct {
	cfg               Config
	det               *vad.Detector
	sess              *pipeline.Session
	srcRate, sinkRate int
	guard, tail       int64 // EchoGuard, EchoTail in source samples

	mic     int64 // source samples read
	srcDone bool
	// The utterance in progress began while the assistant was busy:
	ignoring bool // with barge-in off: it is dropped
	deferred bool // in the echo guard: it barges in once voiced after the guard

	// The running turn.
	st      *pipeline.Stream
	events  <-chan pipeline.Event
	turn    int
	cut     bool      // barged in on: its output is dropped
	pending []float32 // an utterance waiting for the running turn to end
	rs      *audio.Stream
	replyN  int64 // sink samples of the reply produced

	// Playback of the current reply.
	replyStart  int64 // mic position when its first audio was queued; -1: none yet
	replyQueued int64 // sink samples of it queued so far
	lastAudible int64 // mic position when reply audio was last seen queued; -1: never

	// VirtualTime: the simulated loudspeaker.
	vq      []float32 // vq[vh:] is queued, not yet played
	vh      int
	vClock  int64 // sink samples the virtual clock has reached
	vHeard  int64 // samples of the current reply played
	sinkErr error
}

func (l *loop) emit(ev Event) {
	if l.cfg.OnEvent != nil {
		ev.At = time.Duration(l.mic * int64(time.Second) / int64(l.srcRate))
		l.cfg.OnEvent(ev)
	}
}

func (l *loop) run(ctx context.Context) error {
	l.emit(Event{Kind: Listening})
	var drain *time.Ticker // polls the loudspeaker once the source has ended
	defer func() {
		if drain != nil {
			drain.Stop()
		}
	}()
	for {
		if l.srcDone && l.st == nil && l.pending == nil {
			if l.cfg.VirtualTime {
				l.playOut()
			}
			if err := l.sinkErr; err != nil {
				return err
			}
			if l.queued() == 0 {
				return nil
			}
			if drain == nil {
				drain = time.NewTicker(20 * time.Millisecond)
			}
		}
		var chunks <-chan []float32
		if !l.srcDone && !(l.cfg.VirtualTime && l.st != nil) {
			chunks = l.cfg.Source.Chunks()
		}
		var tick <-chan time.Time
		if drain != nil {
			tick = drain.C
		}
		select {
		case <-ctx.Done():
			l.abort()
			return ctx.Err()
		case c, ok := <-chunks:
			if !ok {
				l.srcDone = true
				if err := l.cfg.Source.Err(); err != nil {
					l.abort()
					return fmt.Errorf("microphone: %w", err)
				}
				for _, ev := range l.det.Flush() {
					if err := l.vadEvent(ctx, ev); err != nil {
						l.abort()
						return err
					}
				}
				continue
			}
			if err := l.chunk(ctx, c); err != nil {
				l.abort()
				return err
			}
		case ev := <-l.events:
			if err := l.turnEvent(ctx, ev); err != nil {
				l.abort()
				return err
			}
		case <-tick:
		}
		if l.sinkErr != nil {
			l.abort()
			return l.sinkErr
		}
	}
}

// chunk handles a piece of microphone audio.
func (l *loop) chunk(ctx context.Context, c []float32) error {
	l.mic += int64(len(c))
	if l.cfg.VirtualTime {
		l.advance()
	}
	boost := 0.0
	if l.audible() && l.cfg.BargeIn { // audible first: it tracks the echo tail
		boost = max(l.cfg.PlayingBoostDB, 0)
	}
	l.det.SetBoost(boost)
	for _, ev := range l.det.Write(c) {
		if err := l.vadEvent(ctx, ev); err != nil {
			return err
		}
	}
	if l.deferred && l.mic >= l.replyStart+l.guard && l.det.Voiced() {
		// Still speaking after the echo guard: the user's, not a transient.
		l.deferred = false
		if l.replying() {
			l.bargeIn()
		}
		l.emit(Event{Kind: SpeechStart})
	}
	return nil
}

// replying reports whether a reply is in progress: generating, or playing
// (not only its echo tail, which the VAD's boost covers).
func (l *loop) replying() bool { return (l.st != nil && !l.cut) || l.queued() > 0 }

// inGuard reports whether speech with its onset at microphone position at
// began in the reply's first EchoGuard of playback (not before it).
func (l *loop) inGuard(at int64) bool {
	return l.replyStart >= 0 && at >= l.replyStart && at-l.replyStart < l.guard
}

// audible reports whether reply audio is playing, or played within
// EchoTail; called for every chunk, it notes when playing last was seen.
func (l *loop) audible() bool {
	if l.queued() > 0 {
		l.lastAudible = l.mic
		return true
	}
	return l.lastAudible >= 0 && l.mic-l.lastAudible < l.tail
}

// busyAt reports whether the assistant was generating or audible (its
// echo tail included) for speech with its onset at microphone position at.
func (l *loop) busyAt(at int64) bool {
	return l.replying() || (l.lastAudible >= 0 && at-l.lastAudible < l.tail)
}

func (l *loop) vadEvent(ctx context.Context, ev vad.Event) error {
	switch ev.Kind {
	case vad.Start:
		replying := l.replying()
		switch {
		case !l.cfg.BargeIn && l.busyAt(ev.At):
			l.ignoring = true
			l.emit(Event{Kind: SpeechIgnored, Reason: "the assistant is speaking (barge-in off)"})
			return nil
		case l.cfg.BargeIn && replying && l.inGuard(ev.At):
			l.deferred = true // decided when the guard ends
			return nil
		}
		if replying {
			l.bargeIn()
		}
		l.emit(Event{Kind: SpeechStart})
	case vad.End:
		switch {
		case l.ignoring:
			l.ignoring = false
			return nil
		case l.deferred:
			l.deferred = false
			l.emit(Event{Kind: SpeechIgnored, Reason: "echo guard: a sound that ended while the reply began playing"})
			return nil
		}
		l.emit(Event{Kind: SpeechEnd, Audio: time.Duration(int64(len(ev.Audio)) * int64(time.Second) / int64(l.srcRate))})
		if l.st != nil { // the interrupted turn is still ending
			l.pending = ev.Audio
			return nil
		}
		return l.start(ctx, ev.Audio)
	}
	return nil
}

// bargeIn cuts the reply: the turn is cancelled, its audio dropped.
func (l *loop) bargeIn() {
	heard := l.heard()
	if l.st != nil && !l.cut {
		l.st.Cancel()
		l.cut = true
	}
	l.flush()
	l.emit(Event{Kind: BargeIn, Turn: l.turn, Heard: heard})
	l.replyStart, l.lastAudible = -1, -1
}

// start begins a turn with an utterance.
func (l *loop) start(ctx context.Context, utt []float32) error {
	l.pending = nil
	req := l.cfg.Request
	req.Audio = &audio.Clip{SampleRate: l.srcRate, Samples: utt}
	st, err := l.cfg.Engine.Start(ctx, l.sess, req)
	if errors.Is(err, pipeline.ErrContextFull) && l.sess.Turns() > 0 {
		l.sess.Close()
		l.sess = l.cfg.Engine.NewSession()
		l.emit(Event{Kind: HistoryReset, Err: err})
		st, err = l.cfg.Engine.Start(ctx, l.sess, req)
	}
	switch {
	case errors.Is(err, audio.ErrTooShort) || errors.Is(err, pipeline.ErrContextFull):
		l.emit(Event{Kind: Skipped, Err: err})
		return nil
	case err != nil:
		return fmt.Errorf("start turn %d: %w", l.turn+1, err)
	}
	l.turn++
	l.st, l.events, l.cut = st, st.Events, false
	l.rs, l.replyN = nil, 0
	l.replyStart, l.replyQueued, l.vHeard = -1, 0, 0
	l.emit(Event{Kind: TurnStart, Turn: l.turn})
	return nil
}

func (l *loop) turnEvent(ctx context.Context, ev pipeline.Event) error {
	switch ev := ev.(type) {
	case *pipeline.TextEvent:
		if !l.cut {
			l.emit(Event{Kind: Text, Turn: l.turn, Text: ev.Delta})
		}
	case *pipeline.AudioEvent:
		if l.cut {
			return nil
		}
		pcm := ev.Samples
		if ev.Rate != l.sinkRate {
			if l.rs == nil {
				r, err := audio.NewResampler(ev.Rate, l.sinkRate)
				if err != nil {
					return fmt.Errorf("reply audio at %d Hz for a %d Hz loudspeaker: %w", ev.Rate, l.sinkRate, err)
				}
				l.rs = r.NewStream()
			}
			pcm = l.rs.Append(nil, pcm)
		}
		l.replyN += int64(len(pcm))
		l.queue(pcm)
	case *pipeline.DoneEvent:
		return l.endTurn(ctx, nil, ev.Stop, ev.Timings)
	case *pipeline.ErrorEvent:
		return l.endTurn(ctx, ev.Err, pipeline.NotStopped, ev.Timings)
	}
	return nil
}

func (l *loop) endTurn(ctx context.Context, err error, stop pipeline.StopReason, tm pipeline.Timings) error {
	if l.rs != nil && !l.cut {
		tail := l.rs.Flush(nil)
		l.replyN += int64(len(tail))
		l.queue(tail)
	}
	l.st, l.events, l.rs = nil, nil, nil
	l.emit(Event{Kind: TurnEnd, Turn: l.turn, Err: err, Stop: stop, Timings: tm,
		Audio: time.Duration(l.replyN * int64(time.Second) / int64(l.sinkRate))})
	if l.pending != nil {
		return l.start(ctx, l.pending)
	}
	return nil
}

// abort cancels the running turn and waits for its end, and silences the
// loudspeaker.
func (l *loop) abort() {
	if l.st != nil {
		l.st.Cancel()
		var last error = context.Canceled
		for ev := range l.events {
			if e, ok := ev.(*pipeline.ErrorEvent); ok {
				last = e.Err
			}
		}
		l.st, l.events = nil, nil
		l.emit(Event{Kind: TurnEnd, Turn: l.turn, Err: last})
	}
	l.flush()
}

// Playback, on the Sink or, with VirtualTime, on the simulated loudspeaker.

func (l *loop) queue(pcm []float32) {
	if len(pcm) == 0 {
		return
	}
	if l.replyStart < 0 {
		l.replyStart = l.mic
	}
	l.replyQueued += int64(len(pcm))
	l.lastAudible = l.mic
	if l.cfg.VirtualTime {
		l.vq = append(l.vq, pcm...)
		return
	}
	if err := l.cfg.Sink.Write(pcm); err != nil && l.sinkErr == nil {
		l.sinkErr = fmt.Errorf("loudspeaker: %w", err)
	}
}

// queued returns the reply samples waiting to play.
func (l *loop) queued() int64 {
	if l.cfg.VirtualTime {
		return int64(len(l.vq) - l.vh)
	}
	return int64(l.cfg.Sink.Queued()) * int64(l.sinkRate) / int64(time.Second)
}

// heard returns the samples of the current reply played so far.
func (l *loop) heard() time.Duration {
	n := l.vHeard
	if !l.cfg.VirtualTime {
		n = max(0, l.replyQueued-l.queued())
	}
	return time.Duration(n * int64(time.Second) / int64(l.sinkRate))
}

func (l *loop) flush() {
	if l.cfg.VirtualTime {
		l.vq, l.vh = l.vq[:0], 0
		return
	}
	l.cfg.Sink.Flush()
}

// advance plays the simulated loudspeaker up to the microphone's time.
func (l *loop) advance() {
	to := l.mic * int64(l.sinkRate) / int64(l.srcRate)
	n := min(to-l.vClock, l.queued())
	l.vClock = to
	if n > 0 {
		l.play(int(n))
	}
}

// playOut plays what is left once the microphone has ended.
func (l *loop) playOut() { l.play(int(l.queued())) }

func (l *loop) play(n int) {
	if n == 0 {
		return
	}
	if err := l.cfg.Sink.Write(l.vq[l.vh : l.vh+n]); err != nil && l.sinkErr == nil {
		l.sinkErr = fmt.Errorf("loudspeaker: %w", err)
	}
	l.vHeard += int64(n)
	l.vh += n
	switch {
	case l.vh == len(l.vq):
		l.vq, l.vh = l.vq[:0], 0
	case l.vh > 1<<16 && l.vh > len(l.vq)/2:
		k := copy(l.vq, l.vq[l.vh:])
		l.vq, l.vh = l.vq[:k], 0
	}
}
