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
	cs := newConversations(2, time.Minute)
	cs.now = func() time.Time { return now }
	newSess := func() *pipeline.Session { return &pipeline.Session{} }
	code := func(e *apiError) string {
		if e == nil {
			return ""
		}
		return e.Code
	}

	a, err := cs.acquire("", newSess)
	if err != nil || !strings.HasPrefix(a.id, "conv_") || len(a.id) != len("conv_")+24 {
		t.Fatalf("new conversation %+v, %v", a, err)
	}
	if _, err := cs.acquire(a.id, newSess); code(err) != codeConversationBusy || err.Status != http.StatusConflict {
		t.Errorf("held conversation: %v", err)
	}
	cs.release(a, true)
	if got, err := cs.acquire(a.id, newSess); err != nil || got != a {
		t.Fatalf("released conversation: %v", err)
	}
	cs.release(a, true)

	// The least recently used idle conversation makes room.
	now = now.Add(time.Second)
	b, _ := cs.acquire("", newSess)
	cs.release(b, true)
	now = now.Add(time.Second)
	c, _ := cs.acquire("", newSess)
	if _, err := cs.acquire(a.id, newSess); code(err) != codeUnknownConversation {
		t.Errorf("evicted conversation: %v", err)
	}
	// With every conversation held, none can be made.
	if bb, err := cs.acquire(b.id, newSess); err != nil {
		t.Fatal(err)
	} else if _, err := cs.acquire("", newSess); code(err) != codeTooManyConvs {
		t.Errorf("full store: %v", err)
	} else {
		cs.release(bb, true)
	}
	cs.release(c, true)

	// Idle conversations expire.
	now = now.Add(time.Minute + time.Second)
	if _, err := cs.acquire(c.id, newSess); code(err) != codeUnknownConversation {
		t.Errorf("expired conversation: %v", err)
	}
	if n := cs.sweep(); n != 1 || cs.count() != 0 {
		t.Errorf("sweep forgot %d, %d left", n, cs.count())
	}
	// A new conversation whose turn never started is forgotten.
	d, _ := cs.acquire("", newSess)
	cs.release(d, false)
	if cs.count() != 0 {
		t.Errorf("%d conversations after dropping a new one", cs.count())
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
