package pipeline

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// refClip returns the input clip of a reference case.
func refClip(t *testing.T, name string) Request {
	t.Helper()
	ref, err := refcase.Open(fixtureDir + name + ".safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var req Request
	for _, turn := range ref.Turns {
		if turn.Audio != "" && req.Audio == nil {
			if req.Audio, err = ref.Clip(turn.Audio); err != nil {
				t.Fatal(err)
			}
		}
	}
	return req
}

// TestChunkedPrefillBitExact: a prompt prefilled in chunks of 1, 7 or 40
// rows gives the same reply, text tokens and audio samples bit for bit, as
// the whole prompt in one step, over two turns of one conversation (the
// second prefills the first reply and a new clip after the history).
func TestChunkedPrefillBitExact(t *testing.T) {
	m, dev := loadTiny(t)
	base := refClip(t, "case1_question_16k")
	run := func(chunk int) []collected {
		e := New(m, dev, Options{PrefillChunk: chunk})
		defer e.Close()
		s := e.NewSession()
		var out []collected
		for turn, text := range []string{"", "And then?"} {
			req := Request{Audio: base.Audio, Text: text, MaxNewTokens: 30, Seed: uint64(7 + turn), AudioSampling: DefaultAudio}
			st, err := e.Start(context.Background(), s, req)
			if err != nil {
				t.Fatal(err)
			}
			c := collect(t, st, time.Minute)
			if c.err != nil {
				t.Fatal(c.err)
			}
			out = append(out, c)
		}
		return out
	}
	whole := run(1 << 20)
	if whole[0].done.Timings.PromptRows < 50 {
		t.Fatalf("the prompt has %d rows: too few to chunk", whole[0].done.Timings.PromptRows)
	}
	for _, chunk := range []int{1, 7, 40} {
		got := run(chunk)
		for i := range got {
			if !slices.Equal(got[i].tokens, whole[i].tokens) {
				t.Errorf("chunk %d, turn %d: tokens %v, whole prefill %v", chunk, i, got[i].tokens, whole[i].tokens)
			}
			if len(got[i].audio) != len(whole[i].audio) {
				t.Errorf("chunk %d, turn %d: %d audio events, whole prefill %d", chunk, i, len(got[i].audio), len(whole[i].audio))
				continue
			}
			for k := range got[i].audio {
				if !slices.Equal(got[i].audio[k], whole[i].audio[k]) {
					t.Errorf("chunk %d, turn %d: audio event %d differs", chunk, i, k)
					break
				}
			}
			if got[i].done.Timings.PromptRows != whole[i].done.Timings.PromptRows {
				t.Errorf("chunk %d, turn %d: %d prompt rows, want %d", chunk, i, got[i].done.Timings.PromptRows, whole[i].done.Timings.PromptRows)
			}
		}
	}
}

// endless is a Teacher that keeps a turn going to MaxNewTokens: it
// replaces <|im_end|> and <|text_end|> by an ordinary token and the
// end-of-audio code by code 0.
type endless struct{ sp family.Special }

func (n endless) Text(_, picked int, _ []float32) int {
	if picked == n.sp.IMEnd || picked == n.sp.TextEnd {
		return 300
	}
	return picked
}

func (n endless) AudioCode(_, _, picked int, _ []float32) int {
	if picked == n.sp.EOA {
		return 0
	}
	return picked
}

// TestChunkedPrefillInterleaves: while a new prompt is prefilled, a
// running session keeps getting its steps: with a chunk of 4 rows the
// prompt takes at least ⌈rows/4⌉ backbone steps, none of which holds more
// than 4 prompt rows, and the running turn shares some of them; a whole
// prefill is one step of every row (what a running turn waited for).
func TestChunkedPrefillInterleaves(t *testing.T) {
	m, dev := loadTiny(t)
	req := refClip(t, "case1_question_16k")
	for _, chunk := range []int{4, 1 << 20} {
		tr := &Trace{}
		e := New(m, dev, Options{PrefillChunk: chunk, Trace: tr})
		teach := endless{e.info.Special}
		a, err := e.Start(context.Background(), e.NewSession(), Request{Text: "Hi", MaxNewTokens: 20000, Teacher: teach})
		if err != nil {
			t.Fatal(err)
		}
		<-a.Events // A runs
		req.MaxNewTokens, req.Teacher = 2, teach
		b, err := e.Start(context.Background(), e.NewSession(), req)
		if err != nil {
			t.Fatal(err)
		}
		cb := collect(t, b, time.Minute)
		a.Cancel()
		collect(t, a, time.Minute)
		e.Close()
		if cb.err != nil {
			t.Fatal(cb.err)
		}
		rows := cb.done.Timings.PromptRows
		steps, maxRows, withA := 0, 0, 0
		for _, iv := range tr.Intervals() {
			k := slices.Index(iv.Turns, b.t.id)
			if iv.Stage != StageBackbone || k < 0 || iv.Steps[k] != 0 {
				continue
			}
			steps++
			maxRows = max(maxRows, iv.Rows[k])
			if slices.Contains(iv.Turns, a.t.id) {
				withA++
			}
		}
		t.Logf("chunk %d: %d prompt rows in %d backbone steps (at most %d rows each), %d shared with the running turn", chunk, rows, steps, maxRows, withA)
		want := min(rows, chunk)
		if maxRows != want || steps < (rows+want-1)/want {
			t.Errorf("chunk %d: %d prompt rows took %d steps of at most %d rows, want %d steps of at most %d", chunk, rows, steps, maxRows, (rows+want-1)/want, want)
		}
	}
}

// TestMaxBatchFair: with more running turns than MaxBatch, no step serves
// more than MaxBatch of them, and none starves: at every backbone step the
// running turns' step counts stay within a few of each other, and all of
// them finish their MaxNewTokens steps.
func TestMaxBatchFair(t *testing.T) {
	m, dev := loadTiny(t)
	tr := &Trace{}
	const turns, batch, steps = 6, 2, 40
	e := New(m, dev, Options{MaxTurns: turns, MaxBatch: batch, Trace: tr})
	defer e.Close()
	teach := endless{e.info.Special}
	var streams []*Stream
	for i := range turns {
		st, err := e.Start(context.Background(), e.NewSession(), Request{Text: "Hi", MaxNewTokens: steps, Seed: uint64(i), Teacher: teach})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for i, st := range streams {
		c := collect(t, st, time.Minute)
		if c.err != nil {
			t.Fatal(c.err)
		}
		if c.done.Timings.Steps != steps {
			t.Errorf("turn %d took %d steps, want %d", i, c.done.Timings.Steps, steps)
		}
	}
	served := map[uint64]int{}
	for _, st := range streams {
		served[st.t.id] = 0
	}
	spread := 0
	for _, iv := range tr.Intervals() {
		if iv.Stage != StageBackbone && iv.Stage != StageDepth {
			continue
		}
		if len(iv.Turns) > batch {
			t.Fatalf("a %s step served %d turns, MaxBatch %d", iv.Stage, len(iv.Turns), batch)
		}
		if iv.Stage != StageBackbone {
			continue
		}
		for k, id := range iv.Turns {
			served[id] = iv.Steps[k] + 1
		}
		lo, hi := steps, 0
		for _, n := range served {
			if n < steps { // still running
				lo = min(lo, n)
			}
			hi = max(hi, n)
		}
		if lo < steps {
			spread = max(spread, hi-lo)
		}
	}
	t.Logf("largest spread of step counts between running turns: %d", spread)
	if spread > 18 { // a text and audio round of 6 + 12 steps
		t.Errorf("the running turns' steps spread by %d: a turn waits while others run ahead", spread)
	}
}

// TestNextBatchFair: turns that all stay in a stage (a prompt prefilled
// over many steps) are each served once every ⌈K/B⌉ rounds, K turns with
// batch B, and a turn that joins is served in its first round.
func TestNextBatchFair(t *testing.T) {
	for _, tc := range []struct{ turns, limit int }{{6, 2}, {7, 3}, {5, 8}, {64, 16}} {
		var queue []*turn
		for range tc.turns {
			queue = append(queue, &turn{audioN: 1}) // speaking: not a newcomer
		}
		last := map[*turn]uint64{}
		period := uint64((tc.turns + tc.limit - 1) / tc.limit)
		for round := uint64(1); round <= 50; round++ {
			if round == 20 {
				joined := &turn{audioN: 1}
				queue = append(queue, joined)
				last[joined] = round - 1 // must be served now
				period = uint64((tc.turns + 1 + tc.limit - 1) / tc.limit)
			}
			var batch []*turn
			batch, queue = nextBatch(queue, 0, tc.limit, round)
			if len(batch) > tc.limit {
				t.Fatalf("%+v: batch of %d", tc, len(batch))
			}
			for _, tt := range batch {
				last[tt] = round
			}
			for tt, r := range last {
				if round-r >= period && round > period {
					t.Fatalf("%+v: round %d: a turn last served in round %d (period %d)", tc, round, r, period)
				}
				_ = tt
			}
			queue = append(queue, batch...) // all stay
		}
	}
}

// TestNextBatchNewcomersFirst: a batch takes the newcomers (turns that have
// not sampled an audio frame, in their first newcomerSteps steps) before
// the turns that speak, however recently it served them, then those it
// served least recently; a turn that has taken newcomerSteps steps without
// speaking is no longer a newcomer.
func TestNextBatchNewcomersFirst(t *testing.T) {
	m, _ := loadTiny(t)
	sp := m.Info().Special
	fresh := func(steps int) *turn {
		tt := &turn{sm: NewTurn(sp, Sequential, 6, 12, 100)}
		for range steps {
			if _, ok := tt.sm.Step(); !ok {
				t.Fatal("the turn stopped")
			}
			tt.sm.OnText(300)
		}
		return tt
	}
	speaking := []*turn{{audioN: 3}, {audioN: 1}, {audioN: 9}, {audioN: 2}}
	for i, tt := range speaking {
		tt.served[0] = uint64(5 + i) // speaking[0] least recently
	}
	n1, n2, old := fresh(1), fresh(newcomerSteps-1), fresh(newcomerSteps+1)
	for _, tt := range []*turn{n1, n2, old} {
		tt.served[0] = 20 // served last round
	}
	queue := []*turn{speaking[2], n1, speaking[0], old, speaking[1], n2, speaking[3]}
	batch, rest := nextBatch(queue, 0, 3, 21)
	want := []*turn{n1, n2, speaking[0]}
	if !slices.Equal(batch, want) {
		t.Errorf("batch %v, want the two newcomers, then the least recently served", batch)
	}
	if len(rest) != 4 || slices.Contains(rest, n1) || slices.Contains(rest, n2) || !slices.Contains(rest, old) {
		t.Errorf("rest %v", rest)
	}
	if r := old.rank(); r != 1 {
		t.Errorf("a turn %d steps in without speaking has rank %d, want 1", newcomerSteps+1, r)
	}
}
