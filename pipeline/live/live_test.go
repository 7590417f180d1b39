package live

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/audio/device"
	"github.com/omni-pipe/omni-pipe/audio/vad"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const (
	tinyModel = "../../testdata/lfm2-audio-tiny"
	rate      = 16000
	imEnd     = 7 // <|im_end|> in the tiny tokenizer (testdata README)
)

// fixture holds the tiny model and the fixture's spoken question (16 kHz:
// background noise, speech from 0.55 s to about 4.3 s, noise to 4.9 s).
type fixture struct {
	dev    *cpu.Device
	m      *lfm2audio.Model
	speech []float32
	noise  []float32 // the question's leading 0.5 s: its room noise
}

// load loads the fixture; it is closed when the test ends.
func load(t *testing.T) *fixture {
	f := open(t)
	t.Cleanup(f.close)
	return f
}

func (f *fixture) close() { f.m.Close(); f.dev.Close() }

// open loads the fixture; the caller closes it.
func open(t *testing.T) *fixture {
	t.Helper()
	f, err := safetensors.Open(tinyModel + "/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw, err := f.Lookup("input_wav")
	if err != nil {
		t.Fatal(err)
	}
	speech, err := tw.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	dev := cpu.New(2)
	m, err := lfm2audio.Load(dev, tinyModel)
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	return &fixture{dev: dev, m: m, speech: speech, noise: speech[:8000]}
}

func (f *fixture) engine(t *testing.T) *pipeline.Engine {
	e := pipeline.New(f.m, f.dev, pipeline.Options{MaxTurns: 2})
	t.Cleanup(func() { e.Close() })
	return e
}

// conversation: the question, gap seconds of room noise, the question
// again, 2 s of noise.
func (f *fixture) conversation(gap float64) []float32 {
	x := append([]float32(nil), f.speech...)
	for n := int(gap * rate); n > 0; n -= len(f.noise) {
		x = append(x, f.noise[:min(n, len(f.noise))]...)
	}
	x = append(x, f.speech...)
	for range 4 {
		x = append(x, f.noise...)
	}
	return x
}

// greedy: 60 steps as the fixture's reference case (36 audio frames,
// 2.88 s of speech; the tiny model never says <|im_end|> that early).
var greedy = pipeline.Request{MaxNewTokens: 60}

type recorded struct {
	mu  sync.Mutex
	evs []Event
}

func (r *recorded) add(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

func (r *recorded) of(k Kind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.evs {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorded) kinds() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.evs {
		if e.Kind != Text {
			b.WriteString(e.Kind.String() + " ")
		}
	}
	return b.String()
}

// runVirtual plays x as the microphone on the virtual clock.
func runVirtual(t *testing.T, e *pipeline.Engine, x []float32, sinkRate int, cfg Config) (*device.Recorder, *recorded) {
	t.Helper()
	src, err := device.NewClipSource(&audio.Clip{SampleRate: rate, Samples: x}, device.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rec := device.NewRecorder(sinkRate)
	evs := &recorded{}
	cfg.Engine, cfg.Source, cfg.Sink, cfg.VirtualTime, cfg.OnEvent = e, src, rec, true, evs.add
	if cfg.Request.MaxNewTokens == 0 {
		cfg.Request = greedy
	}
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v (events: %s)", err, evs.kinds())
	}
	t.Logf("events: %s", evs.kinds())
	return rec, evs
}

func secs(d time.Duration) float64 { return d.Seconds() }

// Two utterances 4 s apart: two turns of one conversation, both replies
// played in full. The reply (2.88 s) ends before the second question.
func TestTwoUtterancesTwoTurns(t *testing.T) {
	f := load(t)
	e := f.engine(t)
	for _, bargeIn := range []bool{true, false} {
		rec, evs := runVirtual(t, e, f.conversation(4), 24000, Config{BargeIn: bargeIn})
		ends := evs.of(TurnEnd)
		if len(evs.of(TurnStart)) != 2 || len(ends) != 2 {
			t.Fatalf("barge-in %v: %d turns started, %d ended; want 2", bargeIn, len(evs.of(TurnStart)), len(ends))
		}
		var total time.Duration
		for i, end := range ends {
			if end.Err != nil {
				t.Errorf("turn %d: %v", i+1, end.Err)
			}
			if end.Timings.Frames == 0 || end.Audio <= 0 {
				t.Errorf("turn %d: no reply audio (%d frames)", i+1, end.Timings.Frames)
			}
			total += end.Audio
		}
		if got := rec.Duration(); got != total {
			t.Errorf("the loudspeaker got %v of audio, the turns made %v", got, total)
		}
		if len(evs.of(BargeIn)) != 0 || len(rec.Flushes()) != 0 || len(evs.of(SpeechIgnored)) != 0 {
			t.Errorf("barge-ins %d, flushes %d, ignored %d; want none", len(evs.of(BargeIn)), len(rec.Flushes()), len(evs.of(SpeechIgnored)))
		}
		// One session: the second turn did not prefill the system prompt
		// and the first exchange again.
		p1, p2 := ends[0].Timings.PromptRows, ends[1].Timings.PromptRows
		t.Logf("prompt rows prefilled: turn 1 %d, turn 2 %d; reply audio %v", p1, p2, total)
		if p2 >= p1 {
			t.Errorf("turn 2 prefilled %d rows, turn 1 %d: the second turn did not continue the conversation", p2, p1)
		}
		// The turn started when the question ended: 0.7 s (MinSilence)
		// after the speech's end at about 4.3 s.
		if at := secs(evs.of(TurnStart)[0].At); at < 4.3+0.7 || at > 4.3+0.7+0.2 {
			t.Errorf("turn 1 started at %.2f s of microphone time, want about 5.0 s", at)
		}
	}
}

// The virtual clock makes a conversation reproducible to the bit.
func TestVirtualTimeDeterministic(t *testing.T) {
	f := load(t)
	e := f.engine(t)
	seeded := pipeline.Request{MaxNewTokens: 40, Seed: 7, AudioSampling: pipeline.DefaultAudio}
	x := f.conversation(1)
	a, _ := runVirtual(t, e, x, 24000, Config{BargeIn: true, Request: seeded})
	b, _ := runVirtual(t, e, x, 24000, Config{BargeIn: true, Request: seeded})
	if sa, sb := a.Samples(), b.Samples(); len(sa) == 0 || !slices.Equal(sa, sb) {
		t.Errorf("two runs: %d and %d samples, not identical", len(sa), len(sb))
	}
}

// burst is a 440 Hz tone at -20 dBFS over the room noise.
func (f *fixture) burst(d time.Duration) []float32 {
	x := make([]float32, int(d*rate/time.Second))
	for i := range x {
		x[i] = f.noise[i%len(f.noise)] + float32(0.1*math.Sin(2*math.Pi*440*float64(i)/rate))
	}
	return x
}

// Speech while the first reply plays (virtual time). The reply starts at
// about 5.04 s of microphone time (the question ends at 4.34 s, plus 0.7 s
// MinSilence) and lasts 2.88 s.
func TestBargeInVirtual(t *testing.T) {
	f := load(t)
	e := f.engine(t)
	// The second question's onset: 4.9+1+0.55 = 6.45 s, confirmed
	// MinSpeech (0.12 s) later: 1.53 s into the reply.
	second := f.conversation(1)
	// A 200 ms tone 0.26 s into the reply, then silence.
	transient := append(append([]float32(nil), f.speech...), f.noise[:rate*4/10]...)
	transient = append(transient, f.burst(200*time.Millisecond)...)
	for range 10 {
		transient = append(transient, f.noise...)
	}
	const chunk = 0.02 // the file source's chunk: the loop's time step
	tests := []struct {
		name     string
		x        []float32
		cfg      Config
		turns    int
		bargeIns int
		ignored  bool
		heard    float64 // seconds of reply heard before the cut
		late     float64 // how much later the cut may come
	}{
		{"barge-in", second, Config{BargeIn: true}, 2, 1, false, 1.53, 0},
		{"barge-in off", second, Config{}, 1, 0, true, 0, 0},
		// The reply ends at about 7.92 s. An onset 0.1 s later is in the
		// 200 ms echo tail; 0.4 s later it is a new question.
		{"barge-in off, onset in the echo tail", f.conversation(7.92 + 0.1 - 5.45), Config{}, 1, 0, true, 0, 0},
		{"barge-in off, onset after the echo tail", f.conversation(7.92 + 0.4 - 5.45), Config{}, 2, 0, false, 0, 0},
		// Speech that began in a 2 s guard and goes on barges in when
		// the guard ends, at its next voiced frame: the guard ends in a
		// 70 ms dip of the question (1.10-1.17 s into the file).
		{"speech through the echo guard", second, Config{BargeIn: true, EchoGuard: 2 * time.Second}, 2, 1, false, 2, 0.07},
		// A sound that begins and ends in a 1 s guard is dropped.
		{"transient in the echo guard", transient, Config{BargeIn: true, EchoGuard: time.Second}, 1, 0, true, 0, 0},
		// Without the guard the same sound interrupts, and is the next
		// "question".
		{"transient without a guard", transient, Config{BargeIn: true, EchoGuard: -1}, 2, 1, false, 0.26 + 0.12, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, evs := runVirtual(t, e, tt.x, 24000, tt.cfg)
			ends := evs.of(TurnEnd)
			bis := evs.of(BargeIn)
			if len(ends) != tt.turns || len(bis) != tt.bargeIns {
				t.Fatalf("%d turns, %d barge-ins; want %d, %d", len(ends), len(bis), tt.turns, tt.bargeIns)
			}
			if got := len(evs.of(SpeechIgnored)); (got > 0) != tt.ignored || got > 1 {
				t.Errorf("speech ignored %d times, want %v (once)", got, tt.ignored)
			}
			var want time.Duration
			if tt.bargeIns == 0 {
				for _, end := range ends {
					want += end.Audio
				}
			} else {
				heard := bis[0].Heard
				t.Logf("heard %.3f s of %.3f s before the barge-in", secs(heard), secs(ends[0].Audio))
				// Within two of the loop's time steps: the reply's start
				// and the onset's confirmation each fall on a chunk.
				if s := secs(heard); s < tt.heard-2*chunk-1e-9 || s > tt.heard+tt.late+2*chunk+1e-9 {
					t.Errorf("heard %.3f s of the reply, want %.2f s (-%.2f, +%.2f)", s, tt.heard, 2*chunk, tt.late+2*chunk)
				}
				want = heard
				if len(ends) > 1 {
					want += ends[1].Audio
				}
				if len(rec.Flushes()) != 0 {
					t.Errorf("virtual time: the recorder was flushed %d times; it receives only what played", len(rec.Flushes()))
				}
			}
			if got := rec.Duration(); got != want {
				t.Errorf("the loudspeaker got %v, want %v", got, want)
			}
		})
	}
}

// A loudspeaker at another rate gets the reply resampled.
func TestSinkRate(t *testing.T) {
	f := load(t)
	e := f.engine(t)
	x := f.conversation(4)[:len(f.speech)+2*rate]
	rec, evs := runVirtual(t, e, x, 16000, Config{})
	ends := evs.of(TurnEnd)
	if len(ends) != 1 {
		t.Fatalf("%d turns, want 1", len(ends))
	}
	r, _ := audio.NewResampler(24000, 16000)
	if got, want := len(rec.Samples()), r.OutputLen(ends[0].Timings.Frames*1920); got != want {
		t.Errorf("%d samples at 16 kHz, want %d (%d frames of 1920 at 24 kHz, resampled)", got, want, ends[0].Timings.Frames)
	}
}

// chanSource is a microphone the test speaks into.
type chanSource struct {
	ch  chan []float32
	err error
}

func (s *chanSource) SampleRate() int          { return rate }
func (s *chanSource) Chunks() <-chan []float32 { return s.ch }
func (s *chanSource) Err() error               { return s.err }
func (s *chanSource) Close() error             { return nil }

func (s *chanSource) say(x []float32) {
	for i := 0; i < len(x); i += 320 {
		s.ch <- x[i:min(i+320, len(x))]
	}
}

// gate is a Teacher that changes nothing but holds the first turn at a
// step until released, and ends later turns at once (with <|im_end|>).
type gate struct {
	at      int
	reached chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	turn    int
}

func (g *gate) hold(step int) {
	g.mu.Lock()
	turn := g.turn
	g.mu.Unlock()
	if turn == 1 && step == g.at {
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
}

func (g *gate) Text(step, picked int, _ []float32) int {
	g.mu.Lock()
	if step == 0 {
		g.turn++
	}
	turn := g.turn
	g.mu.Unlock()
	if turn > 1 && step == 0 {
		return imEnd
	}
	g.hold(step)
	return picked
}

func (g *gate) AudioCode(step, _, picked int, _ []float32) int {
	g.hold(step)
	return picked
}

// Real time: speech while the reply is being generated cancels the turn at
// its next frame boundary, flushes the loudspeaker, and the new utterance
// is the next turn.
func TestBargeInCancelsGeneration(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := open(t)
	defer f.close()
	e := pipeline.New(f.m, f.dev, pipeline.Options{})
	defer e.Close()
	g := &gate{at: 30, reached: make(chan struct{}), release: make(chan struct{})}
	released := sync.OnceFunc(func() { close(g.release) })
	defer released()
	src := &chanSource{ch: make(chan []float32, 4096)}
	rec := device.NewRecorder(24000)
	evs := &recorded{}
	bargedIn := make(chan struct{})
	onEvent := func(ev Event) {
		evs.add(ev)
		if ev.Kind == BargeIn {
			close(bargedIn)
		}
	}
	req := pipeline.Request{MaxNewTokens: 2000, Teacher: g}
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Config{Engine: e, Source: src, Sink: rec, BargeIn: true, Request: req, OnEvent: onEvent})
	}()
	src.say(f.speech)
	src.say(f.noise)
	src.say(f.noise) // 1 s of pause: the question has ended
	select {
	case <-g.reached: // turn 1 is at step 30 of 2000, holding
	case err := <-done:
		t.Fatalf("Run returned %v before the reply (events %s)", err, evs.kinds())
	}
	src.say(f.speech[:rate*2]) // the user speaks again
	select {
	case <-bargedIn:
	case err := <-done:
		t.Fatalf("Run returned %v without a barge-in (events %s)", err, evs.kinds())
	}
	released()
	src.say(f.noise)
	src.say(f.noise)
	close(src.ch)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("events: %s", evs.kinds())
	ends := evs.of(TurnEnd)
	if len(ends) != 2 {
		t.Fatalf("%d turns ended, want 2", len(ends))
	}
	if !errors.Is(ends[0].Err, context.Canceled) {
		t.Errorf("turn 1 ended with %v, want context.Canceled", ends[0].Err)
	}
	if s := ends[0].Timings.Steps; s >= req.MaxNewTokens || s < g.at {
		t.Errorf("turn 1 ran %d steps; the cut was at step %d of %d", s, g.at, req.MaxNewTokens)
	}
	if ends[1].Err != nil || ends[1].Stop != pipeline.EndOfTurn {
		t.Errorf("turn 2 ended with %v, %v; want <|im_end|> (forced by the teacher)", ends[1].Err, ends[1].Stop)
	}
	if fl := rec.Flushes(); len(fl) != 1 {
		t.Errorf("the loudspeaker was flushed %d times, want once", len(fl))
	}
	// Nothing of turn 1 reached the terminal after the barge-in.
	sawBargeIn := false
	for _, ev := range evs.evs {
		switch {
		case ev.Kind == BargeIn:
			sawBargeIn = true
		case ev.Kind == Text && ev.Turn == 1 && sawBargeIn:
			t.Errorf("text %q of turn 1 after the barge-in", ev.Text)
		}
	}
}

// Ctrl-C: Run returns ctx.Err() promptly with a turn in flight, and no
// goroutine of the loop, the source or the turn outlives it.
func TestCancelEndsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := open(t)
	defer f.close()
	e := pipeline.New(f.m, f.dev, pipeline.Options{})
	defer e.Close()
	// A half-second tone, then a minute of room noise, in real time.
	x := append(append(append([]float32(nil), f.noise[:rate/4]...), f.burst(time.Second/2)...), f.conversation(60)[len(f.speech):]...)
	src, err := device.NewClipSource(&audio.Clip{SampleRate: rate, Samples: x}, device.FileOptions{Realtime: true, Chunk: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ends []Event
	err = Run(ctx, Config{Engine: e, Source: src, Sink: device.NewRecorder(24000), BargeIn: true, VAD: vad.Config{MinSilence: 300 * time.Millisecond},
		Request: pipeline.Request{MaxNewTokens: 2000},
		OnEvent: func(ev Event) {
			switch ev.Kind {
			case TurnStart:
				cancel()
			case TurnEnd:
				ends = append(ends, ev)
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if len(ends) != 1 || !errors.Is(ends[0].Err, context.Canceled) {
		t.Errorf("turn ends %v, want one, cancelled", ends)
	}
	if n := e.Running(); n != 0 {
		t.Errorf("%d turns still running after Run returned", n)
	}
}

func TestErrors(t *testing.T) {
	f := load(t)
	e := f.engine(t)
	rec := device.NewRecorder(24000)
	micErr := errors.New("unplugged")
	bad := &chanSource{ch: make(chan []float32), err: micErr}
	close(bad.ch)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no engine", Config{Source: bad, Sink: rec}, "needs an Engine"},
		{"bad VAD", Config{Engine: e, Source: bad, Sink: rec, VAD: vad.Config{StartDB: 6, StopDB: 9}}, "StopDB"},
		{"source fails", Config{Engine: e, Source: bad, Sink: rec}, "microphone: unplugged"},
		{"sink rate", Config{Engine: e, Source: bad, Sink: device.NewRecorder(0)}, "sink rate"},
	}
	for _, tt := range tests {
		err := Run(context.Background(), tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Run = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	// A click too short for the front end is skipped, not fatal.
	src := &chanSource{ch: make(chan []float32, 64)}
	evs := &recorded{}
	close(src.ch)
	err := Run(context.Background(), Config{Engine: e, Source: src, Sink: rec, OnEvent: evs.add})
	if err != nil || len(evs.of(TurnStart)) != 0 {
		t.Errorf("empty source: %v, %d turns", err, len(evs.of(TurnStart)))
	}
}

func TestKindString(t *testing.T) {
	for k := Listening; k <= HistoryReset; k++ {
		if s := k.String(); s == "" || strings.HasPrefix(s, "Kind(") {
			t.Errorf("kind %d has no name", k)
		}
	}
	if s := Kind(99).String(); s != "Kind(99)" {
		t.Errorf("Kind(99) = %q", s)
	}
}

// A conversation that outgrows the context starts a new one instead of
// failing: 85 prompt rows + 60 steps fit in 200 positions, a second turn
// on top does not.
func TestHistoryReset(t *testing.T) {
	f := load(t)
	e := pipeline.New(f.m, f.dev, pipeline.Options{MaxContext: 200})
	defer e.Close()
	_, evs := runVirtual(t, e, f.conversation(4), 24000, Config{})
	if n, r := len(evs.of(TurnEnd)), len(evs.of(HistoryReset)); n != 2 || r != 1 {
		t.Fatalf("%d turns, %d history resets; want 2, 1", n, r)
	}
	if ends := evs.of(TurnEnd); ends[1].Err != nil || ends[1].Timings.PromptRows != ends[0].Timings.PromptRows {
		t.Errorf("turn 2: %v, %d prompt rows; want a fresh conversation's %d", ends[1].Err, ends[1].Timings.PromptRows, ends[0].Timings.PromptRows)
	}
}
