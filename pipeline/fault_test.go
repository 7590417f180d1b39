package pipeline

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
)

var errInjected = errors.New("injected device fault")

// toneClip is the fixtures' 24 kHz tone-and-noise clip (a turn with audio
// runs the log-mel and encoder stages).
func toneClip(t *testing.T) *audio.Clip {
	t.Helper()
	ref, err := refcase.Open(fixtureDir + "case2_tone_noise_24k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	clip, err := ref.Clip("input_wav")
	if err != nil {
		t.Fatal(err)
	}
	return clip
}

// testClip is a 30-token turn on toneClip.
func testClip(t *testing.T) Request {
	return Request{Audio: toneClip(t), MaxNewTokens: 30}
}

// TestReadErrorFailsTheTurn: a queue Read that fails (as a GPU backend's
// can) inside any stage ends that turn with an ErrorEvent wrapping the
// device's error, while the codec may still be decoding the turn's earlier
// frames (run with -race: the stages must not share the error unguarded),
// and the engine serves the next turn.
func TestReadErrorFailsTheTurn(t *testing.T) {
	text := Request{Text: "What is the capital of France?", MaxNewTokens: 40}
	tests := []struct {
		name  string
		queue string
		n     int // which of the queue's Reads fails
		req   func(*testing.T) Request
	}{
		// Steps 0–5 read their text picks (the tokens sampled on the
		// device), steps 6… a hidden row each: the 10th read is audio step
		// 9, with frames 0–2 at the codec.
		{"backbone mid-speech", StageBackbone, 10, nil},
		{"backbone prompt", StageBackbone, 1, nil},
		// Each frame samples on the device and reads its codes once: the
		// 3rd read is frame 2's.
		{"depthformer", StageDepth, 3, nil},
		{"codec", codecQueue, 2, nil},
		{"encoder", StageEncoder, 1, testClip},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			reads := map[string]int{} // Reads and ReadInts together, by queue
			m, dev := loadTinyHooked(t, func(c hookCall) error {
				if c.Op != "Read" && c.Op != "ReadInt" {
					return nil
				}
				mu.Lock()
				reads[c.Queue]++
				n := reads[c.Queue]
				mu.Unlock()
				if c.Queue == tt.queue && n == tt.n {
					return errInjected
				}
				return nil
			})
			e := New(m, dev, Options{})
			defer e.Close()
			req := text
			if tt.req != nil {
				req = tt.req(t)
			}
			s := e.NewSession()
			st, err := e.Start(context.Background(), s, req)
			if err != nil {
				t.Fatal(err)
			}
			c := collect(t, st, time.Minute)
			if !errors.Is(c.err, errInjected) {
				t.Fatalf("turn ended with %v (%d frames), want the device's error", c.err, len(c.audio))
			}
			t.Logf("turn failed with %q after %d frames", c.err, len(c.audio))
			if e.Running() != 0 || s.Busy() {
				t.Errorf("running %d, session busy %v after the failure", e.Running(), s.Busy())
			}
			// The same session and a fresh one both work afterwards.
			run(t, e, s, text)
			run(t, e, e.NewSession(), text)
		})
	}
}

// TestBackboneReadErrorWhileTheCodecDecodes: the backbone's read of an
// audio step's row fails while the codec is decoding the turn's earlier
// frames. With -race, an error the stages share without synchronisation is
// reported; the race detector forgets accesses across heavy synchronisation
// (the CPU backend's worker pool), so the test puts the two stages' looks
// at the turn next to each other: the codec, held in frame 0 until the
// backbone's failing read, takes up frames 1–2 (checking whether the turn
// failed) and then pauses before running them, while the backbone waits
// for that (by the clock only, which synchronises nothing) and then fails.
func TestBackboneReadErrorWhileTheCodecDecodes(t *testing.T) {
	release := make(chan struct{})
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		switch {
		case c.Queue == codecQueue && c.Op == "Embed" && c.N == 1: // frame 0
			<-release
		case c.Queue == codecQueue && c.Op == "Embed" && c.N == 3: // frames 1–2
			time.Sleep(150 * time.Millisecond)
		case c.Queue == StageBackbone && c.Op == "Read" && c.N == 4: // audio step 9 (text steps 0–5 read their picks by ReadInt): frames 0–2 are at the codec
			close(release)
			time.Sleep(75 * time.Millisecond)
			return errInjected
		}
		return nil
	})
	e := New(m, dev, Options{})
	defer e.Close()
	st, err := e.Start(context.Background(), e.NewSession(), Request{Text: "What is the capital of France?", MaxNewTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, st, time.Minute)
	if !errors.Is(c.err, errInjected) {
		t.Fatalf("turn ended with %v, want the device's error", c.err)
	}
	if len(c.audio) == 0 {
		t.Error("no frame was decoded before the failure")
	}
}

// panicTeacher panics at one step of one kind and otherwise keeps the
// engine's picks.
type panicTeacher struct {
	text bool // panic in Text (the backbone stage), else in AudioCode (the depthformer)
	step int
}

func (p panicTeacher) Text(step, picked int, _ []float32) int {
	if p.text && step == p.step {
		panic("teacher fault")
	}
	return picked
}

func (p panicTeacher) AudioCode(step, _, picked int, _ []float32) int {
	if !p.text && step == p.step {
		panic("teacher fault")
	}
	return picked
}

// TestStagePanicFailsTheTurn: a panic in any stage goroutine (a device
// that panics mid-step, a Teacher that panics) ends the turns that stage
// held with an ErrorEvent carrying a *StagePanic, and the engine goes on:
// the same session and a fresh one complete their next turns, and Close
// leaves no goroutine behind.
func TestStagePanicFailsTheTurn(t *testing.T) {
	text := Request{Text: "What is the capital of France?", MaxNewTokens: 40}
	tests := []struct {
		name    string
		queue   string // the queue whose op panics
		op      string
		n       int    // which of its calls (0: any during the first turn)
		inside  string // panic only inside this function (a stack frame's name)
		teacher Teacher
		audio   bool
		stage   string // the stage the *StagePanic names
	}{
		// The 10th Embed is audio step 9's frame.
		{name: "backbone", queue: StageBackbone, op: "Embed", n: 10, stage: StageBackbone},
		{name: "backbone prompt", queue: StageBackbone, op: "Embed", n: 1, stage: StageBackbone},
		{name: "depthformer", queue: StageDepth, op: "ReadInt", n: 3, stage: StageDepth},
		{name: "codec", queue: codecQueue, op: "Embed", n: 3, stage: StageCodec},
		// Closing the turn's codec stream frees its memory.
		{name: "codec ending the turn", queue: "device", op: "Free", inside: "mimi.(*Stream).Close", stage: StageCodec},
		{name: "encoder", queue: StageEncoder, op: "Read", n: 1, audio: true, stage: StageEncoder},
		{name: "text teacher", teacher: panicTeacher{text: true, step: 3}, stage: StageBackbone},
		{name: "audio teacher", teacher: panicTeacher{step: 8}, stage: StageDepth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var firstTurn atomic.Bool
			firstTurn.Store(true)
			m, dev := loadTinyHooked(t, func(c hookCall) error {
				if c.Queue == tt.queue && c.Op == tt.op && (c.N == tt.n || tt.n == 0 && firstTurn.Load()) &&
					(tt.inside == "" || strings.Contains(string(debug.Stack()), tt.inside)) {
					panic("device fault")
				}
				return nil
			})
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			var log syncBuffer
			e := New(m, dev, Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			req := text
			if tt.audio {
				req = testClip(t)
			}
			req.Teacher = tt.teacher
			s := e.NewSession()
			st, err := e.Start(context.Background(), s, req)
			if err != nil {
				t.Fatal(err)
			}
			c := collect(t, st, time.Minute)
			firstTurn.Store(false)
			var p *StagePanic
			if !errors.As(c.err, &p) {
				t.Fatalf("turn ended with %v, want a *StagePanic", c.err)
			}
			if p.Stage != tt.stage || len(p.Stack) == 0 {
				t.Errorf("panic reported in stage %q with a %d-byte stack, want stage %q and a stack", p.Stage, len(p.Stack), tt.stage)
			}
			t.Logf("%v", c.err)
			if l := log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "stage="+tt.stage) || !strings.Contains(l, "fault_test.go") {
				t.Errorf("the panic was not logged at error level with its stage and stack:\n%s", l)
			}
			if e.Running() != 0 || s.Busy() {
				t.Errorf("running %d, session busy %v after the panic", e.Running(), s.Busy())
			}
			// The same session and a fresh one: the same session's reply
			// is a fresh session's (the failed turn left nothing behind).
			again := run(t, e, s, text)
			fresh := run(t, e, e.NewSession(), text)
			if again.text != fresh.text || !slices.Equal(flat(again.audio), flat(fresh.audio)) {
				t.Errorf("after the panic the session replies %q, a fresh one %q", again.text, fresh.text)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use (a log the stages
// write to).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
