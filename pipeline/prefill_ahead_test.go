package pipeline

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/stages/chat"
)

// prefill runs Engine.Prefill to its end and returns the rows it computed.
func prefill(t *testing.T, e *Engine, s *Session, req Request) int {
	t.Helper()
	st, err := e.Prefill(context.Background(), s, req)
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, st, time.Minute)
	if c.err != nil {
		t.Fatal(c.err)
	}
	if c.text != "" || len(c.audio) > 0 || c.done.Timings.Steps != 0 {
		t.Fatalf("a prefill produced text %q, %d frames, %d steps", c.text, len(c.audio), c.done.Timings.Steps)
	}
	return c.done.Timings.PromptRows
}

// TestPrefillAhead: a prefill computes the system prompt (first turn) or
// the end of the last reply (later turns) so that the turn after it
// prefills only its own rows, and the conversation is the same, token for
// token and sample for sample, as one that was never prefilled ahead.
func TestPrefillAhead(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	ahead, plain := e.NewSession(), e.NewSession()
	sys := Request{System: "Respond with interleaved text and audio."}
	req1 := Request{Text: "What is the capital of France?", System: sys.System, MaxNewTokens: 16, Seed: 3, AudioSampling: DefaultAudio}
	req2 := Request{Text: "And of Spain?", MaxNewTokens: 16, Seed: 4, AudioSampling: DefaultAudio}

	if n := prefill(t, e, ahead, sys); n == 0 {
		t.Fatal("the first prefill computed no rows: the system prompt was not prefilled")
	}
	if u := ahead.Unfed(); u != 0 {
		t.Errorf("%d rows unfed after a prefill", u)
	}
	a1, p1 := run(t, e, ahead, req1), run(t, e, plain, req1)
	if a1.done.Timings.PromptRows >= p1.done.Timings.PromptRows {
		t.Errorf("after a prefill the turn prefilled %d rows, without one %d: the prefill saved nothing", a1.done.Timings.PromptRows, p1.done.Timings.PromptRows)
	}
	// The end of the reply (its <|im_end|> and newline) is all a second
	// prefill has to compute.
	if n := prefill(t, e, ahead, Request{}); n < 1 || n > 4 {
		t.Errorf("the prefill after a reply computed %d rows, want the reply's end (1 to 4)", n)
	}
	if n := prefill(t, e, ahead, Request{}); n != 0 {
		t.Errorf("a prefill with nothing new computed %d rows", n)
	}
	a2, p2 := run(t, e, ahead, req2), run(t, e, plain, req2)
	for i, pair := range [][2]collected{{a1, p1}, {a2, p2}} {
		a, p := pair[0], pair[1]
		if !slices.Equal(a.tokens, p.tokens) || !slices.Equal(flat(a.audio), flat(p.audio)) {
			t.Errorf("turn %d: prefilled ahead %q (%d frames), not %q (%d frames)", i+1, a.text, len(a.audio), p.text, len(p.audio))
		}
	}
	if ahead.Turns() != 2 {
		t.Errorf("prefills counted as turns: %d turns, want 2", ahead.Turns())
	}
}

// TestPrefillCancelled: a cancelled prefill leaves the session as it was.
func TestPrefillCancelled(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	s := e.NewSession()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st, err := e.Prefill(ctx, s, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if c := collect(t, st, time.Minute); c.err == nil {
		t.Fatalf("a cancelled prefill ended with %+v", c.done)
	}
	if !s.chat.Empty() || s.Turns() != 0 {
		t.Errorf("a cancelled prefill left %d rows, %d turns", s.chat.Len(), s.Turns())
	}
	// The session still works, and prefills its system prompt.
	if r := run(t, e, s, Request{Text: "Hi", MaxNewTokens: 4}); r.done.Timings.PromptRows == 0 {
		t.Error("no prompt rows")
	}
}

// TestTruncateReply: a reply cut after k frames keeps its rows up to its
// k-th frame (the text after it goes too), ends its turn, and the next turn
// is what a fresh session holding the cut history would say.
func TestTruncateReply(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{})
	defer e.Close()
	sp := m.Info().Special
	s := e.NewSession()
	st, err := e.Start(context.Background(), s, Request{Text: "Tell me a story.", MaxNewTokens: 40, Seed: 1, Teacher: endless{sp}, AudioSampling: DefaultAudio})
	if err != nil {
		t.Fatal(err)
	}
	full := collect(t, st, time.Minute)
	if full.err != nil {
		t.Fatal(full.err)
	}
	if len(full.audio) < 6 {
		t.Fatalf("the reply has %d frames; the test needs 6", len(full.audio))
	}
	before := s.chat.Len()

	kept, text, err := s.TruncateReply(st, 1000)
	if err != nil || kept != len(full.audio) || s.chat.Len() != before {
		t.Fatalf("truncating past the end: kept %d of %d frames, %d rows of %d, err %v", kept, len(full.audio), s.chat.Len(), before, err)
	}
	if text != full.text {
		t.Errorf("the whole reply's text %q, want %q", text, full.text)
	}
	kept, text, err = s.TruncateReply(st, 3)
	if err != nil || kept != 3 {
		t.Fatalf("kept %d frames (want 3), err %v", kept, err)
	}
	if len(text) >= len(full.text) || full.text[:len(text)] != text {
		t.Errorf("cut text %q is not a shorter prefix of %q", text, full.text)
	}
	rows := s.chat.Rows(0, s.chat.Len())
	var frames int
	for _, r := range rows {
		if r.Mod == chat.AudioOut {
			frames++
		}
	}
	if frames != 3 {
		t.Errorf("the history holds %d reply frames, want 3", frames)
	}
	if s.fed != 0 || s.cache != nil {
		t.Errorf("the cache (fed %d) survived a cut into its rows", s.fed)
	}
	if mem := e.Memory(); mem.KV != 0 || mem.History != historyBytes(rows) {
		t.Errorf("memory after the cut: %+v; want no KV and the cut history's %d bytes", mem, historyBytes(rows))
	}

	whole := e.NewSession()
	whole.chat, whole.turns = s.chat.Clone(), s.turns
	next := Request{Text: "Go on.", MaxNewTokens: 12, Seed: 2, AudioSampling: DefaultAudio}
	a, b := run(t, e, s, next), run(t, e, whole, next)
	if !slices.Equal(a.tokens, b.tokens) || !slices.Equal(flat(a.audio), flat(b.audio)) {
		t.Errorf("after the cut %q (%d frames); a fresh session of the cut history %q (%d frames)", a.text, len(a.audio), b.text, len(b.audio))
	}
	// st is no longer the latest reply.
	if _, _, err := s.TruncateReply(st, 1); !errors.Is(err, ErrNotLastReply) {
		t.Errorf("truncating an older reply: %v, want ErrNotLastReply", err)
	}
	if _, _, err := s.TruncateReply(st, -1); err == nil {
		t.Error("negative frames accepted")
	}
}
