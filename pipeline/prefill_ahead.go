package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/omni-pipe/omni-pipe/stages/chat"
)

// Live conversations (the server's /v1/realtime) need two things a
// request/response route does not: the history before the user's next
// utterance computed while they still speak, and a reply cut back to what
// the listener heard when they interrupted it.

// ErrNotLastReply: TruncateReply was given a turn that is not the
// session's latest reply, or whose reply is not in the history.
var ErrNotLastReply = errors.New("the turn is not the conversation's latest reply")

// Prefill computes the session's rows that its cache does not hold yet —
// the system prompt of a new conversation (req.System or SystemTokens; the
// mode's default when empty), the end of the last reply — so that the next
// Start prefills only its own user turn. It runs as a turn that samples
// nothing: its stream ends with a DoneEvent whose Timings.PromptRows are
// the rows computed (a DoneEvent at once when there are none), or an
// ErrorEvent; the session is busy until then. Only req's System,
// SystemTokens and Mode are read.
func (e *Engine) Prefill(ctx context.Context, s *Session, req Request) (*Stream, error) {
	s.mu.Lock()
	switch {
	case s.shut:
		s.mu.Unlock()
		return nil, ErrSessionClosed
	case s.busy:
		s.mu.Unlock()
		return nil, ErrSessionBusy
	}
	nothing := !(s.chat.Empty() && s.turns == 0) && s.chat.Len() == s.fed
	s.mu.Unlock()
	if nothing {
		ev := make(chan Event, 1)
		ev <- &DoneEvent{Timings: Timings{Busy: map[string]time.Duration{}}}
		close(ev)
		return &Stream{Events: ev, t: &turn{cancelF: func(error) {}}}, nil
	}
	pre := Request{System: req.System, SystemTokens: req.SystemTokens, Mode: req.Mode, MaxNewTokens: 1, prefill: true}
	return e.Start(ctx, s, pre)
}

// Unfed returns the rows of the session's history that its cache does not
// hold (what the next turn prefills before its own rows).
func (s *Session) Unfed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		return -1
	}
	return s.chat.Len() - s.fed
}

// TruncateReply cuts the reply of st, the session's latest turn (it must
// have ended), after its first frames audio frames: the text and audio it
// generated after them leave the history, as if the model had stopped
// there (the listener interrupted it and heard no more). It returns the
// frames kept and the reply's text up to them. A reply with no more than
// frames frames is left as it is. When the cut reaches rows the backbone's
// cache already holds, the cache is dropped and the next turn (or Prefill)
// computes the history afresh.
func (s *Session) TruncateReply(st *Stream, frames int) (kept int, text string, err error) {
	if frames < 0 {
		return 0, "", fmt.Errorf("truncate a reply to %d frames", frames)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.shut:
		return 0, "", ErrSessionClosed
	case s.busy:
		return 0, "", ErrSessionBusy
	case st == nil || st.t == nil || st.t.sess != s || !st.t.kept:
		return 0, "", ErrNotLastReply
	}
	t := st.t
	scratch := chat.New(s.e.m.Tokenizer(), s.e.m.Template())
	h0 := scratch.Len()
	scratch.NewTurn(chat.Assistant)
	h1 := scratch.Len()
	scratch.NewTurn(chat.User)
	h2 := scratch.Len()
	scratch.EndTurn()
	assistant, user, end := scratch.Rows(h0, h1), scratch.Rows(h1, h2), scratch.Rows(h2, scratch.Len())

	rows := s.chat.Rows(0, s.chat.Len())
	start := findRows(rows, t.chatStart, assistant)
	if start < 0 {
		return 0, "", ErrNotLastReply
	}
	start += len(assistant)
	stop := len(rows) - len(end)
	if stop < start || !sameRows(rows[stop:], end) || findRows(rows[:stop], start, user) >= 0 || findRows(rows[:stop], start, assistant) >= 0 {
		return 0, "", ErrNotLastReply
	}
	cut, n := stop, 0
	for i := start; i < stop; i++ {
		if rows[i].Mod == chat.AudioIn {
			return 0, "", ErrNotLastReply
		}
		if rows[i].Mod != chat.AudioOut {
			continue
		}
		if n == frames {
			cut = i
			break
		}
		n++
	}
	if n == frames && cut < stop {
		// Drop text after the last kept frame too: it was never heard.
		for cut > start && rows[cut-1].Mod == chat.Text {
			cut--
		}
	}
	text = s.replyText(rows[start:min(cut, stop)])
	if cut == stop {
		return n, text, nil
	}
	s.chat.Truncate(cut)
	s.chat.EndTurn()
	if s.fed > cut && s.cache != nil {
		s.cache.Free()
		s.cache, s.fed = nil, 0
	}
	// What the session holds now (as settleMemory counts it).
	was := s.held
	s.held = bytesOf{history: historyBytes(s.chat.Rows(0, s.chat.Len()))}
	if k, ok := s.cache.(kvSizer); ok && s.cache != nil {
		s.held.kv = k.Bytes()
	}
	s.e.mem.move(was, s.held)
	return n, text, nil
}

// replyText decodes the text rows of a reply as its stream did.
func (s *Session) replyText(rows []chat.Row) string {
	tok := s.e.m.Tokenizer()
	dec := tok.NewStreamDecoder()
	var b []byte
	for _, r := range rows {
		if r.Mod == chat.Text && !tok.IsSpecial(r.Token) {
			b = append(b, dec.Add(r.Token)...)
		}
	}
	return string(append(b, dec.Flush()...))
}

// findRows returns the first index at or after from where rows has the
// text rows of pat, or -1.
func findRows(rows []chat.Row, from int, pat []chat.Row) int {
	for i := from; i+len(pat) <= len(rows); i++ {
		if sameRows(rows[i:i+len(pat)], pat) {
			return i
		}
	}
	return -1
}

func sameRows(a, b []chat.Row) bool {
	return slices.EqualFunc(a, b, func(x, y chat.Row) bool {
		return x.Mod == chat.Text && y.Mod == chat.Text && x.Token == y.Token
	})
}
