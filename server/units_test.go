package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

func TestLimiter(t *testing.T) {
	l := newLimiter(1, 1, time.Hour)
	relA, err := l.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var relB func()
	go func() {
		var err error
		relB, err = l.acquire(context.Background())
		got <- err
	}()
	waitFor(t, "B to queue", 10*time.Second, func() bool { return l.queued() == 1 })
	if _, err := l.acquire(context.Background()); !errors.Is(err, errQueueFull) {
		t.Errorf("third acquire: %v, want errQueueFull", err)
	}
	relA()
	if err := <-got; err != nil {
		t.Fatalf("B: %v", err)
	}
	if l.active() != 1 || l.queued() != 0 {
		t.Errorf("%d active, %d queued after B got the slot", l.active(), l.queued())
	}

	// A queued request gives up at its context's end or the timeout.
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("client gone")
	go func() {
		waitFor(t, "C to queue", 10*time.Second, func() bool { return l.queued() == 1 })
		cancel(cause)
	}()
	if _, err := l.acquire(ctx); !errors.Is(err, cause) {
		t.Errorf("cancelled wait: %v", err)
	}
	l.timeout = time.Millisecond
	if _, err := l.acquire(context.Background()); !errors.Is(err, errQueueTimeout) {
		t.Errorf("timed-out wait: %v", err)
	}
	relB()
	if l.active() != 0 || l.queued() != 0 {
		t.Errorf("%d active, %d queued at the end", l.active(), l.queued())
	}

	none := newLimiter(1, 0, time.Hour)
	rel, _ := none.acquire(context.Background())
	if _, err := none.acquire(context.Background()); !errors.Is(err, errQueueFull) {
		t.Errorf("no queue: %v", err)
	}
	rel()
}

func TestConversations(t *testing.T) {
	now := time.Unix(1000, 0)
	ctx := context.Background()
	cs := newConversations(2, time.Minute)
	cs.now = func() time.Time { return now }
	newSess := func() *pipeline.Session { return &pipeline.Session{} }
	code := func(e *apiError) string {
		if e == nil {
			return ""
		}
		return e.Code
	}

	a, err := cs.acquire(ctx, "", newSess)
	if err != nil || !strings.HasPrefix(a.id, "conv_") || len(a.id) != len("conv_")+24 {
		t.Fatalf("new conversation %+v, %v", a, err)
	}
	if _, err := cs.acquire(ctx, a.id, newSess); code(err) != codeConversationBusy || err.Status != http.StatusConflict {
		t.Errorf("held conversation: %v", err)
	}
	cs.release(a, true)
	if got, err := cs.acquire(ctx, a.id, newSess); err != nil || got != a {
		t.Fatalf("released conversation: %v", err)
	}
	cs.release(a, true)

	// The least recently used idle conversation makes room.
	now = now.Add(time.Second)
	b, _ := cs.acquire(ctx, "", newSess)
	cs.release(b, true)
	now = now.Add(time.Second)
	c, _ := cs.acquire(ctx, "", newSess)
	if _, err := cs.acquire(ctx, a.id, newSess); code(err) != codeUnknownConversation {
		t.Errorf("evicted conversation: %v", err)
	}
	// With every conversation held, none can be made.
	if bb, err := cs.acquire(ctx, b.id, newSess); err != nil {
		t.Fatal(err)
	} else if _, err := cs.acquire(ctx, "", newSess); code(err) != codeTooManyConvs {
		t.Errorf("full store: %v", err)
	} else {
		cs.release(bb, true)
	}
	cs.release(c, true)

	// Idle conversations expire.
	now = now.Add(time.Minute + time.Second)
	if _, err := cs.acquire(ctx, c.id, newSess); code(err) != codeUnknownConversation {
		t.Errorf("expired conversation: %v", err)
	}
	if n := cs.sweep(); n != 1 || cs.count() != 0 {
		t.Errorf("sweep forgot %d, %d left", n, cs.count())
	}
	// A new conversation whose turn never started is forgotten.
	d, _ := cs.acquire(ctx, "", newSess)
	cs.release(d, false)
	if cs.count() != 0 {
		t.Errorf("%d conversations after dropping a new one", cs.count())
	}
}

// A conversation held by a request whose client has gone is waited for,
// not refused as busy; the waiter gives up when its own client goes.
func TestConversationsWaitForCancelledHolder(t *testing.T) {
	cs := newConversations(2, time.Minute)
	newSess := func() *pipeline.Session { return &pipeline.Session{} }
	gone, hangUp := context.WithCancel(context.Background())
	a, _ := cs.acquire(gone, "", newSess)
	hangUp()

	got := make(chan *apiError, 1)
	go func() {
		c, err := cs.acquire(context.Background(), a.id, newSess)
		if err == nil && c != a {
			err = badRequest("wrong", "", "acquired %s, want %s", c.id, a.id)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("acquired while the cancelled turn still held it: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	cs.release(a, true)
	if err := <-got; err != nil {
		t.Fatalf("after the cancelled turn let go: %v", err)
	}

	// The waiter's own client goes while it waits.
	// The waiter above holds it now; say its client has gone too (nothing
	// else runs, so cs.mu is not needed).
	a.held = gone
	waiter, giveUp := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer giveUp()
	if _, err := cs.acquire(waiter, a.id, newSess); err == nil || err.Code != codeCancelled {
		t.Errorf("waiter that gave up: %v, want %s", err, codeCancelled)
	}
}

func TestAudioIDs(t *testing.T) {
	for _, tc := range []struct {
		id   string
		conv string
		n    int
		ok   bool
	}{
		{audioID("conv_abc", 3), "conv_abc", 3, true},
		{"audio_conv_a_b_12", "conv_a_b", 12, true},
		{"audio_conv_abc_0", "", 0, false},
		{"audio_conv_abc_x", "", 0, false},
		{"audio_other_1", "", 0, false},
		{"conv_abc_1", "", 0, false},
		{"audio_", "", 0, false},
	} {
		conv, n, ok := parseAudioID(tc.id)
		if conv != tc.conv || n != tc.n || ok != tc.ok {
			t.Errorf("parseAudioID(%q) = %q, %d, %v; want %q, %d, %v", tc.id, conv, n, ok, tc.conv, tc.n, tc.ok)
		}
	}
}

func TestSaneID(t *testing.T) {
	for id, want := range map[string]bool{
		"abc-123_X.y:z": true, "": false, "a b": false, "a\nb": false, "é": false,
		strings.Repeat("a", 128): true, strings.Repeat("a", 129): false,
	} {
		if saneID(id) != want {
			t.Errorf("saneID(%.20q) = %v", id, !want)
		}
	}
}
