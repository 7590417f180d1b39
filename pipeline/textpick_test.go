package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// startTogether starts reqs, one new session each, on an engine of the
// tiny model whose backbone holds its first op until every turn is started
// (a text turn's Start hands it to the backbone): the first backbone step
// holds the prompts it took, and every other turn joins the second, so
// that all the turns share the backbone's steps from then on. on sees every hooked op (the held one after the hold). opts'
// MaxTurns and MaxBatch are set to len(reqs); a zero PrefillChunk takes
// every prompt whole.
func startTogether(t *testing.T, opts Options, reqs []Request, on func(hookCall) error) (*Engine, []*Stream) {
	t.Helper()
	hold := make(chan struct{})
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		if c.Queue == StageBackbone && c.Op == "Embed" && c.N == 1 {
			<-hold
		}
		return on(c)
	})
	opts.MaxTurns, opts.MaxBatch = len(reqs), len(reqs)
	if opts.PrefillChunk == 0 {
		opts.PrefillChunk = 1 << 20
	}
	e := New(m, dev, opts)
	t.Cleanup(func() { e.Close() })
	var streams []*Stream
	for _, req := range reqs {
		st, err := e.Start(context.Background(), e.NewSession(), req)
		if err != nil {
			close(hold)
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	close(hold)
	return e, streams
}

// sampledText is a text sampling that uses every part of a gpu.SampleRow:
// the draw, top-k, top-p and the windowed repetition penalty.
var sampledText = Sampling{Temperature: 1.3, TopK: 40, TopP: 0.9, RepetitionPenalty: 1.4, RepetitionWindow: 6}

// textPickRequests are four turns of different seeds, two of which
// suppress the stop tokens (a row's Suppress list).
func textPickRequests() []Request {
	var reqs []Request
	for i, text := range []string{"Hi", "What is the capital of France?", "Tell me a story.", "Hi"} {
		reqs = append(reqs, Request{Text: text, MaxNewTokens: 40, Seed: uint64(101 + i),
			TextSampling: sampledText, AudioSampling: DefaultAudio, SuppressStops: i%2 == 1})
	}
	return reqs
}

// replayText checks a recorded turn's text picks against the host's
// sampler: a fresh Sampler of the turn's configuration, seed and stream,
// picking from each recorded text step's logits with the turn's history
// of fed-back tokens, must pick what the engine picked, step by step.
func replayText(t *testing.T, name string, e *Engine, req Request) {
	t.Helper()
	s := NewSampler(req.TextSampling, req.Seed, 1)
	if req.SuppressStops {
		s.Suppress(e.info.Special.IMEnd, e.info.Special.TextEnd)
	}
	r := req.Record
	r.mu.Lock()
	defer r.mu.Unlock()
	var history []int
	n := 0
	for _, st := range r.steps {
		if st.mod != 1 {
			continue
		}
		if len(st.textLogits) != e.info.VocabSize {
			t.Fatalf("%s: text step %d recorded %d logits, want %d", name, n, len(st.textLogits), e.info.VocabSize)
		}
		if want := s.Pick(st.textLogits, history); st.token != want {
			t.Fatalf("%s: text step %d picked %d, the host's sampler %d", name, n, st.token, want)
		}
		if st.yielded == 1 {
			history = append(history, st.token)
		}
		n++
	}
	if n < 6 {
		t.Fatalf("%s: %d text steps recorded: too few to check", name, n)
	}
}

// textTeacher is a Teacher that keeps the engine's picks and remembers
// the text picks and their logits.
type textTeacher struct {
	mu     sync.Mutex
	picks  []int
	logits [][]float32
}

func (x *textTeacher) Text(_, picked int, logits []float32) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.picks = append(x.picks, picked)
	x.logits = append(x.logits, slices.Clone(logits))
	return picked
}

func (x *textTeacher) AudioCode(_, _, picked int, _ []float32) int { return picked }

// TestTextPicksEqualHostSampling: the text steps of sessions that share
// the backbone's steps pick, on the device, what the host's sampler picks
// from the same logits with the same draws (the picks before the device
// sampled text): recorded turns replay step by step through a fresh
// Sampler, and a run where only some turns record and one has a Teacher
// (the others' logits never leave the device) gives every turn the same
// tokens and audio, bit for bit, as the run where all record, and the
// Teacher the logits that run recorded.
func TestTextPicksEqualHostSampling(t *testing.T) {
	run := func(record func(i int) bool, teach *textTeacher) ([]collected, []Request, *Engine) {
		reqs := textPickRequests()
		for i := range reqs {
			if record(i) {
				reqs[i].Record = NewRecorder()
			}
		}
		if teach != nil {
			reqs[1].Teacher = teach
		}
		e, streams := startTogether(t, Options{}, reqs, func(hookCall) error { return nil })
		var out []collected
		for i, st := range streams {
			c := collect(t, st, time.Minute)
			if c.err != nil {
				t.Fatalf("turn %d: %v", i, c.err)
			}
			out = append(out, c)
		}
		return out, reqs, e
	}
	all, allReqs, e := run(func(int) bool { return true }, nil)
	for i, req := range allReqs {
		replayText(t, fmt.Sprintf("all recorded, turn %d", i), e, req)
	}
	// Turns 0 and 2 record, turn 1 has a Teacher, turn 3 neither: the
	// host's rows are gathered from among the step's.
	teach := &textTeacher{}
	some, reqs, e := run(func(i int) bool { return i%2 == 0 }, teach)
	for i, req := range reqs {
		if req.Record != nil {
			replayText(t, fmt.Sprintf("some recorded, turn %d", i), e, req)
		}
	}
	// The Teacher saw turn 1's picks with their logits, as the run where
	// turn 1 recorded recorded them.
	rec := allReqs[1].Record
	rec.mu.Lock()
	var want []stepRecord
	for _, st := range rec.steps {
		if st.mod == 1 {
			want = append(want, st)
		}
	}
	rec.mu.Unlock()
	teach.mu.Lock()
	if len(teach.picks) != len(want) {
		t.Errorf("the Teacher saw %d text steps, want %d", len(teach.picks), len(want))
	}
	for k := range min(len(want), len(teach.picks)) {
		if teach.picks[k] != want[k].token || !slices.Equal(teach.logits[k], want[k].textLogits) {
			t.Errorf("text step %d: the Teacher saw pick %d and %d logits, want pick %d and the recorded logits",
				k, teach.picks[k], len(teach.logits[k]), want[k].token)
			break
		}
	}
	teach.mu.Unlock()
	distinct := false
	for i := range all {
		if some[i].text != all[i].text || !slices.Equal(some[i].tokens, all[i].tokens) {
			t.Errorf("turn %d: text %q, with every turn recorded %q", i, some[i].text, all[i].text)
		}
		if !slices.Equal(flat(some[i].audio), flat(all[i].audio)) {
			t.Errorf("turn %d: the audio differs from the run with every turn recorded", i)
		}
		distinct = distinct || (i > 0 && all[i].text != all[0].text)
	}
	if !distinct {
		t.Error("every turn gave the same text: the seeds do not show")
	}
}

// TestTextStepReadsOnlyPicks: when no turn has a Teacher or a recording,
// the text step of N sessions reads back N token ids in one read, not the
// N·V logits: the backbone's reads are one ReadInt per step with text
// turns, of one id per text turn, and the H floats of each audio step's
// row (for the depthformer), nothing else.
func TestTextStepReadsOnlyPicks(t *testing.T) {
	const sessions = 4
	var mu sync.Mutex
	var reads, ids []int // each backbone Read's and ReadInt's length
	reqs := textPickRequests()[:sessions]
	e, streams := startTogether(t, Options{}, reqs, func(c hookCall) error {
		if c.Queue != StageBackbone {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch c.Op {
		case "Read":
			reads = append(reads, c.Len)
		case "ReadInt":
			ids = append(ids, c.Len)
		}
		return nil
	})
	textSteps, frames := 0, 0
	for i, st := range streams {
		c := collect(t, st, time.Minute)
		if c.err != nil {
			t.Fatalf("turn %d: %v", i, c.err)
		}
		textSteps += c.done.Timings.Steps - c.done.Timings.Frames
		frames += c.done.Timings.Frames
	}
	mu.Lock()
	defer mu.Unlock()
	H, V := e.info.HiddenSize, e.info.VocabSize
	floats, bigReads := 0, 0
	for _, n := range reads {
		floats += n
		if n >= V {
			bigReads++
		}
	}
	t.Logf("%d text steps, %d frames: backbone ReadInts %v, %d floats read", textSteps, frames, ids, floats)
	if bigReads > 0 || floats != frames*H {
		t.Errorf("the backbone read %d floats (%d reads of a logits row or more), want %d: the %d audio steps' rows of %d only",
			floats, bigReads, frames*H, frames, H)
	}
	sum := 0
	for _, n := range ids {
		sum += n
	}
	if sum != textSteps {
		t.Errorf("the backbone's ReadInts read %d ids, want one for each of the %d text steps", sum, textSteps)
	}
	if slices.Max(append([]int{0}, ids...)) != sessions {
		t.Errorf("no ReadInt read the %d ids of the step all %d sessions shared (reads %v)", sessions, sessions, ids)
	}
	if floats+sum >= sessions*V {
		t.Errorf("the whole run read %d values, more than one step's logits of %d sessions", floats+sum, sessions)
	}
}

// TestTextPickReadErrorFailsTheTextTurns: a failed read of a step's text
// picks fails the step's text turns, with the device's error wrapped by
// the backbone, and no other turn: a prompt that is partway through its
// prefill in the same step goes on and completes.
func TestTextPickReadErrorFailsTheTextTurns(t *testing.T) {
	long := Request{Text: strings.Repeat("Tell me a long story about the sea. ", 40), MaxNewTokens: 8}
	reqs := []Request{{Text: "Hi", MaxNewTokens: 20}, {Text: "Hi", MaxNewTokens: 20}, long}
	// Steps 1 and 2 take at most 100 prompt rows each: the two short
	// prompts are whole by the end of step 1 or 2, so ReadInt 2 is of step 2,
	// whose text turns are 0 and 1 (turn 1 maybe at its prompt), while turn
	// 2's prompt of over 200 rows is still being prefilled.
	_, streams := startTogether(t, Options{PrefillChunk: 100}, reqs, func(c hookCall) error {
		if c.Queue == StageBackbone && c.Op == "ReadInt" && c.N == 2 {
			return errInjected
		}
		return nil
	})
	for i, st := range streams[:2] {
		c := collect(t, st, time.Minute)
		if !errors.Is(c.err, errInjected) || !strings.Contains(c.err.Error(), "backbone: ") {
			t.Errorf("text turn %d ended with %v, want the backbone's wrap of the device's error", i, c.err)
		}
	}
	c := collect(t, streams[2], time.Minute)
	if c.err != nil {
		t.Fatalf("the prompt prefilled in the same step failed: %v", c.err)
	}
	if c.done.Timings.PromptRows <= 200 {
		t.Fatalf("the long prompt has %d rows: it may have been whole by step 2", c.done.Timings.PromptRows)
	}
}
