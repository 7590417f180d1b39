package pipeline

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

const fixtureDir = tinyModel + "/"

// bf16Ulp is one bf16 ulp at the magnitude of top, 2^(⌊log2|top|⌋ − 7):
// parity's unit for a pick's margin (internal/parity/rules.go).
func bf16Ulp(top float64) float64 {
	if top == 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return math.NaN()
	}
	return math.Ldexp(1, math.Ilogb(top)-7)
}

func TestBF16Ulp(t *testing.T) {
	for _, tc := range []struct{ top, want float64 }{
		{1, 1.0 / 128}, {1.99, 1.0 / 128}, {2, 1.0 / 64}, {-3, 1.0 / 64},
		{8, 0.0625}, {15.9, 0.0625}, {16, 0.125}, {31, 0.125}, {0.5, 1.0 / 256},
	} {
		if got := bf16Ulp(tc.top); got != tc.want {
			t.Errorf("bf16Ulp(%g) = %g, want %g", tc.top, got, tc.want)
		}
	}
	if !math.IsNaN(bf16Ulp(0)) || !math.IsNaN(bf16Ulp(math.Inf(1))) {
		t.Error("bf16Ulp of 0 or ±Inf is not NaN")
	}
}

// refTop returns the reference's top logit at a pick: its stored logits'
// maximum where it stored the evaluation's logits (idx and all: the
// *_logits_step_idx and *_logits tensors, per the values of one
// evaluation, off the evaluation's offset within them), else ours of its
// pick (ours), which is in the same binade up to noise.
func refTop(step int, idx []int, all []float32, per, off int, ours []float32, refPick int) float64 {
	for k, s := range idx {
		if s == step && (k+1)*per <= len(all) {
			return float64(slices.Max(all[k*per+off : k*per+off+len(ours)]))
		}
	}
	return float64(ours[refPick])
}

// TestFreeRunningGreedyFollowsReference: with nothing forced, the greedy
// engine reproduces the reference trace step by step until its first
// departure, which must be at a pick the reference itself won by at most
// 2 bf16 ulps of its top logit (parity's free-running rule where a run
// shares the reference's rounding, as at the fixtures' sizes: 1 ulp =
// 2^(⌊log2|top|⌋ − 7)).
func TestFreeRunningGreedyFollowsReference(t *testing.T) {
	const divergenceUlps = 2
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	for _, name := range []string{"case1_question_16k", "case2_tone_noise_24k", "case3_text_only"} {
		t.Run(name, func(t *testing.T) {
			ref, err := refcase.Open(fixtureDir + name + ".safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			tr, _ := ref.Trace("")
			req := Request{System: ref.System, MaxNewTokens: tr.Steps(), Record: NewRecorder()}
			for _, turn := range ref.Turns {
				if turn.Audio != "" {
					req.Audio, _ = ref.Clip(turn.Audio)
				}
				req.Text += turn.Text
			}
			st, err := e.Start(context.Background(), e.NewSession(), req)
			if err != nil {
				t.Fatal(err)
			}
			if c := collect(t, st, time.Minute); c.err != nil {
				t.Fatal(c.err)
			}
			toks, _, _ := req.Record.Ints("step_text_token")
			codes, _, _ := req.Record.Ints("step_codes")
			ourText, textShape, _ := req.Record.Floats("text_logits")
			ourAudio, audioShape, _ := req.Record.Floats("audio_logits")
			ourTextIdx, _, _ := req.Record.Ints("text_logits_step_idx")
			ourAudioIdx, _, _ := req.Record.Ints("audio_logits_step_idx")
			tm, _ := ref.Floats("step_text_margin")
			am, _ := ref.Floats("step_audio_margin")
			refTextIdx, _ := ref.Ints("text_logits_step_idx")
			refText, _ := ref.Floats("text_logits")
			refAudioIdx, _ := ref.Ints("audio_logits_step_idx")
			refAudio, _ := ref.Floats("audio_logits")
			CB := m.Cfg.Codebooks
			// ours returns the engine's logits of an evaluation (cb −1: text).
			ours := func(s, cb int) []float32 {
				idx, all, V, per := ourAudioIdx, ourAudio, audioShape[2], CB*audioShape[2]
				if cb < 0 {
					idx, all, V, per, cb = ourTextIdx, ourText, textShape[1], textShape[1], 0
				}
				k := slices.Index(idx, s)
				if k < 0 {
					t.Fatalf("the engine recorded no logits at step %d", s)
				}
				return all[k*per+cb*V : k*per+(cb+1)*V]
			}
			// diverged checks the first departure: the reference's margin
			// in ulps of its top logit.
			diverged := func(s, cb, got, want int, margin float32) {
				l := ours(s, cb)
				var top float64
				if cb < 0 {
					top = refTop(s, refTextIdx, refText, len(l), 0, l, want)
				} else {
					top = refTop(s, refAudioIdx, refAudio, CB*len(l), cb*len(l), l, want)
				}
				ulps := float64(margin) / bf16Ulp(top)
				t.Logf("first divergence at step %d codebook %d (−1: text): ours %d, reference %d; reference margin %g = %.3g ulps of its top logit %g",
					s, cb, got, want, margin, ulps, top)
				if !(ulps <= divergenceUlps) {
					t.Errorf("diverged at step %d codebook %d, a pick the reference won by %.3g ulps (> %g)", s, cb, ulps, float64(divergenceUlps))
				}
			}
			for s := range tr.Steps() {
				if tr.Modality[s] == 1 {
					if toks[s] != tr.Tokens[s] {
						diverged(s, -1, toks[s], tr.Tokens[s], tm[s])
						return
					}
					continue
				}
				for i, want := range tr.Codes[s] {
					if got := codes[s*CB+i]; got != want {
						diverged(s, i, got, want, am[s*CB+i])
						return
					}
				}
			}
			t.Logf("all %d steps identical to the reference", tr.Steps())
		})
	}
}

func run(t *testing.T, e *Engine, s *Session, req Request) collected {
	t.Helper()
	st, err := e.Start(context.Background(), s, req)
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, st, time.Minute)
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c
}

func flat(frames [][]float32) []float32 {
	var out []float32
	for _, f := range frames {
		out = append(out, f...)
	}
	return out
}

func TestDeterminism(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	greedy := Request{Text: "What is the capital of France?", MaxNewTokens: 40}
	a, b := run(t, e, e.NewSession(), greedy), run(t, e, e.NewSession(), greedy)
	if a.text != b.text || !slices.Equal(flat(a.audio), flat(b.audio)) {
		t.Error("two greedy runs differ")
	}
	sampled := Request{Text: "What is the capital of France?", MaxNewTokens: 40,
		TextSampling: Sampling{Temperature: 0.8, TopK: 50}, AudioSampling: DefaultAudio, Seed: 1234}
	c, d := run(t, e, e.NewSession(), sampled), run(t, e, e.NewSession(), sampled)
	if c.text != d.text || !slices.Equal(flat(c.audio), flat(d.audio)) {
		t.Error("two sampled runs with the same seed differ")
	}
	sampled.Seed = 99
	f := run(t, e, e.NewSession(), sampled)
	if f.text == c.text && slices.Equal(flat(f.audio), flat(c.audio)) {
		t.Error("a different seed gave the identical reply")
	}
}

// TestMultiTurnPrefillsOnlyNewRows: the second turn prefills the history's
// unfed rows only, and gives the same reply as a fresh session that is fed
// the whole conversation at once.
func TestMultiTurnPrefillsOnlyNewRows(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	s := e.NewSession()
	first := run(t, e, s, Request{Text: "What is the capital of France?", MaxNewTokens: 20})
	rows1, fed1 := s.chat.Len(), s.fed
	// A fresh session holding the same history, none of it computed yet.
	whole := e.NewSession()
	whole.chat, whole.turns = s.chat.Clone(), s.turns
	req := Request{Text: "Now answer in one short sentence.", MaxNewTokens: 20}
	second := run(t, e, s, req)
	if second.done.Timings.PromptRows >= rows1 {
		t.Errorf("second turn prefilled %d rows; the history had %d", second.done.Timings.PromptRows, rows1)
	}
	t.Logf("turn 1: %d prompt rows; turn 2: %d new rows of %d", first.done.Timings.PromptRows, second.done.Timings.PromptRows, s.chat.Len())
	if s.Turns() != 2 {
		t.Errorf("session counts %d turns", s.Turns())
	}
	fresh := run(t, e, whole, req)
	if want := fed1 + second.done.Timings.PromptRows; fresh.done.Timings.PromptRows != want {
		t.Errorf("the fresh session prefilled %d rows, want the %d of the whole conversation", fresh.done.Timings.PromptRows, want)
	}
	if second.text != fresh.text || !slices.Equal(second.tokens, fresh.tokens) || !slices.Equal(flat(second.audio), flat(fresh.audio)) {
		t.Errorf("second turn %q (%d frames), a fresh session fed the whole conversation %q (%d frames)",
			second.text, len(second.audio), fresh.text, len(fresh.audio))
	}
	if len(second.audio) == 0 && second.text == "" {
		t.Error("the second turn said nothing: the comparison proves little")
	}
}

// TestStagesOverlap: the codec decodes frame N while the backbone computes
// step N+1, which feeds that frame back: the codec is off the loop. A device
// makes the two meet: the codec's first decode (of the first audio step's
// frame) and the backbone's first step that embeds a frame each wait, inside
// their work, until the other has arrived. An engine that ran them one
// after the other would never get both there (the test would time out); on
// this one it holds with any GOMAXPROCS, and the trace's labels then show
// which intervals met.
func TestStagesOverlap(t *testing.T) {
	codecAt, backboneAt := make(chan struct{}), make(chan struct{})
	var codecMet, backboneMet atomic.Bool
	meet := func(mine, theirs chan struct{}, met *atomic.Bool) {
		close(mine)
		select {
		case <-theirs:
			met.Store(true)
		case <-time.After(10 * time.Second):
		}
	}
	var codecOnce, backboneOnce sync.Once
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		switch {
		case c.Queue == codecQueue && c.Op == "Embed":
			codecOnce.Do(func() { meet(codecAt, backboneAt, &codecMet) })
		case c.Queue == StageBackbone && c.Op == "Embed" && len(c.IDs) > c.Rows: // a frame's codes summed into a row
			backboneOnce.Do(func() { meet(backboneAt, codecAt, &backboneMet) })
		}
		return nil
	})
	tr := &Trace{}
	e := New(m, dev, Options{Trace: tr})
	defer e.Close()
	run(t, e, e.NewSession(), Request{Text: "What is the capital of France?", MaxNewTokens: 30})
	if !codecMet.Load() || !backboneMet.Load() {
		t.Fatalf("the codec's first decode (met: %v) and the backbone's step that feeds its frame back (met: %v) never ran at the same time",
			codecMet.Load(), backboneMet.Load())
	}
	// The labels: the first decode is of frame N, sampled by the
	// depthformer at step N; the backbone's step N+1 overlaps it.
	ivs := tr.Intervals()
	var dec *Interval
	for i, iv := range ivs {
		if iv.Stage == StageCodec {
			dec = &ivs[i]
			break
		}
	}
	if dec == nil || len(dec.Steps) != 1 {
		t.Fatalf("first codec interval %+v, want one decoding one frame", dec)
	}
	id, n := dec.Turns[0], dec.Steps[0]
	at := func(stage string, step int) *Interval {
		for i, iv := range ivs {
			for k, tid := range iv.Turns {
				if iv.Stage == stage && tid == id && iv.Steps[k] == step {
					return &ivs[i]
				}
			}
		}
		return nil
	}
	if at(StageDepth, n) == nil {
		t.Fatalf("the codec decoded a frame of step %d, which no depthformer interval sampled", n)
	}
	bb := at(StageBackbone, n+1)
	if bb == nil {
		t.Fatalf("no backbone interval for step %d", n+1)
	}
	if !(bb.Start.Before(dec.End) && dec.Start.Before(bb.End)) {
		t.Errorf("the decode of step %d's frame [%v, %v] does not overlap step %d's backbone work [%v, %v]",
			n, dec.Start, dec.End, n+1, bb.Start, bb.End)
	}
	end, start := bb.End, bb.Start
	if dec.End.Before(end) {
		end = dec.End
	}
	if dec.Start.After(start) {
		start = dec.Start
	}
	t.Logf("the decode of step %d's frame overlapped step %d's backbone work for %v", n, n+1, end.Sub(start))
}

// TestCancelStopsAtFrameBoundary: cancelling a turn ends its stream with
// context.Canceled, frees its slot and session, and leaks no goroutine.
func TestCancelStopsAtFrameBoundary(t *testing.T) {
	m, dev := loadTiny(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := New(m, dev, Options{MaxTurns: 2, Precision: nn.BF16})
	s := e.NewSession()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.Start(ctx, s, Request{Text: "What is the capital of France?", MaxNewTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	// Read until the first audio frame, then hang up.
	for ev := range st.Events {
		if _, ok := ev.(*AudioEvent); ok {
			break
		}
	}
	cancel()
	c := collect(t, st, time.Minute)
	if !errors.Is(c.err, context.Canceled) {
		t.Fatalf("stream ended with %v, want context.Canceled", c.err)
	}
	if e.Running() != 0 || s.Busy() {
		t.Errorf("running %d, session busy %v after cancel", e.Running(), s.Busy())
	}
	// The session stays usable.
	run(t, e, s, Request{Text: "Again.", MaxNewTokens: 8})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestStartErrors(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{MaxTurns: 1, MaxContext: 200})
	defer e.Close()
	if _, err := e.Start(context.Background(), e.NewSession(), Request{}); !errors.Is(err, ErrEmptyRequest) {
		t.Errorf("empty request: %v", err)
	}
	if _, err := e.Start(context.Background(), e.NewSession(), Request{Text: "hi", MaxNewTokens: 500}); !errors.Is(err, ErrContextFull) {
		t.Errorf("context overflow: %v", err)
	}
	if _, err := e.Start(context.Background(), e.NewSession(), Request{Text: "hi", TextSampling: Sampling{TopP: 3}}); err == nil {
		t.Error("top_p 3 accepted")
	}
	s := e.NewSession()
	st, err := e.Start(context.Background(), s, Request{Text: "hi", MaxNewTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start(context.Background(), s, Request{Text: "again"}); !errors.Is(err, ErrSessionBusy) {
		t.Errorf("second turn on a busy session: %v", err)
	}
	if _, err := e.Start(context.Background(), e.NewSession(), Request{Text: "other"}); !errors.Is(err, ErrBusy) {
		t.Errorf("turn beyond MaxTurns: %v", err)
	}
	st.Cancel()
	collect(t, st, time.Minute)
}

// TestCloseWithTurnsInTheFrontEnd: turns cancelled while they sit in the
// go-streams log-mel/encoder flow are drained on Close, and every goroutine
// the engine started (the flow's included) returns.
func TestCloseWithTurnsInTheFrontEnd(t *testing.T) {
	m, dev := loadTiny(t)
	clip := toneClip(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := New(m, dev, Options{MaxTurns: 6})
	var streams []*Stream
	for range 6 {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := e.Start(ctx, e.NewSession(), Request{Audio: clip, MaxNewTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		cancel() // while the clip waits for or runs through the front end
		streams = append(streams, st)
	}
	for _, st := range streams {
		if c := collect(t, st, time.Minute); !errors.Is(c.err, context.Canceled) {
			t.Errorf("stream ended with %v, want context.Canceled", c.err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSuppressStops: a turn that may not stop runs MaxNewTokens steps and
// emits no stopping token, whether its frames are sampled on the device
// path or picked on the host (a recording forces the host path); the two
// paths give the same reply, bit for bit, with every sampling step on.
func TestSuppressStops(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	sp := m.Info().Special
	var replies []collected
	// The audio sampling uses every step of the sampler: temperature,
	// top-k, top-p and a windowed repetition penalty.
	audioS := Sampling{Temperature: 1.1, TopK: 40, TopP: 0.9, RepetitionPenalty: 1.3, RepetitionWindow: 6}
	for _, rec := range []*Recorder{nil, NewRecorder()} {
		req := Request{Text: "Say something long.", MaxNewTokens: 48, Seed: 4, AudioSampling: audioS,
			SuppressStops: true, Record: rec}
		c := run(t, e, e.NewSession(), req)
		if c.done.Timings.Steps != 48 || c.done.Stop != MaxTokens {
			t.Errorf("record %v: %d steps, stop %v; want 48 steps and max_tokens", rec != nil, c.done.Timings.Steps, c.done.Stop)
		}
		if c.done.Timings.Frames == 0 || len(c.audio) == 0 {
			t.Errorf("record %v: no audio frames", rec != nil)
		}
		for _, tok := range c.tokens {
			if tok == sp.IMEnd || tok == sp.TextEnd {
				t.Errorf("record %v: stopping token %d emitted", rec != nil, tok)
			}
		}
		replies = append(replies, c)
	}
	if !slices.Equal(replies[0].tokens, replies[1].tokens) || !slices.Equal(flat(replies[0].audio), flat(replies[1].audio)) {
		t.Errorf("device-path and host-path replies differ")
	}
}
