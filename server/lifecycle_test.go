package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// TestHangUpsLeakNothing abandons 50 streams in every way a client can
// (hanging up mid-stream, cancelling while queued or uploading) and checks
// that each turn stopped and every goroutine it started returned, first
// while the server runs, then after it and the engine shut down.
func TestHangUpsLeakNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // runs after the server's own cleanup
	ts := startServer(t, Config{MaxConcurrent: 4, MaxQueue: 64})
	question := questionWAV(t)

	// Warm up: one whole turn, so that lazily started goroutines are in
	// the baseline.
	if s, _ := streamAudioChat(t, ts, map[string]any{"audio": question, "max_new_tokens": 20}); s.err != nil {
		t.Fatal(s.err.Error)
	}
	ts.client.CloseIdleConnections()
	running := goleak.IgnoreCurrent()

	const streams, clients = 50, 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	gotEvent := 0
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < streams; i += clients {
				req := map[string]any{"text": "Tell me a long story.", "max_new_tokens": 2000}
				if i%2 == 0 {
					req = map[string]any{"audio": question, "max_new_tokens": 2000}
				}
				ctx, cancel := context.WithCancel(context.Background())
				if i%3 == 2 { // gone before, while queued, or just after admission
					time.AfterFunc(time.Duration(i%7)*time.Millisecond, cancel)
				}
				resp, err := ts.doErr(ctx, http.MethodPost, "/v1/audio/chat", req)
				if err != nil { // cancelled before the reply began
					cancel()
					continue
				}
				if _, ok := newSSEReader(resp.Body).next(); ok {
					mu.Lock()
					gotEvent++
					mu.Unlock()
				}
				if i%3 == 0 {
					resp.Body.Close() // hang up mid-stream
				}
				cancel()
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every abandoned turn to stop", time.Minute, func() bool {
		return ts.lim.active() == 0 && ts.lim.queued() == 0 && ts.eng.Running() == 0
	})
	ts.client.CloseIdleConnections()
	if err := goleak.Find(running); err != nil {
		t.Fatalf("goroutines outlived their abandoned streams: %v", err)
	}
	cancelled := strings.Count(ts.logs.String(), `"msg":"turn cancelled"`)
	t.Logf("%d of %d streams got an event before the hang-up; %d turns cancelled", gotEvent, streams, cancelled)
	if gotEvent < streams/2 || cancelled < gotEvent {
		t.Errorf("%d streams began and %d turns were cancelled; want every begun stream cancelled", gotEvent, cancelled)
	}
	// The server still serves whole turns.
	if s, _ := streamAudioChat(t, ts, map[string]any{"text": "Still there?", "max_new_tokens": 10}); s.err != nil {
		t.Fatal(s.err.Error)
	}
}

// doErr is do without t.Fatal, for goroutines.
func (ts *testServer) doErr(ctx context.Context, method, path string, body map[string]any) (*http.Response, error) {
	data, err := marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, ts.url+path, strings.NewReader(string(data)))
	if err != nil {
		return nil, err
	}
	return ts.client.Do(req)
}

// A shutdown lets a running stream finish, refusing new work meanwhile.
func TestGracefulShutdown(t *testing.T) {
	ts := startServer(t, Config{ShutdownGrace: time.Minute})
	resp := ts.post(t, "/v1/audio/chat", map[string]any{"text": "Speak for a while.", "max_new_tokens": 150})
	defer resp.Body.Close()
	r := newSSEReader(resp.Body)
	first, ok := r.next()
	if !ok {
		t.Fatal("no first event")
	}
	served := make(chan error, 1)
	go func() { served <- ts.shutdown() }()
	waitFor(t, "the drain to begin", 30*time.Second, ts.draining.Load)

	// While draining: not ready, and no new turns.
	rec := httptest.NewRecorder()
	ts.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"status":"shutting_down"`) {
		t.Errorf("/health while draining: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	ts.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/audio/chat", strings.NewReader(`{"text":"hi"}`)))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), codeShuttingDown) {
		t.Errorf("new turn while draining: %d %s", rec.Code, rec.Body)
	}

	evs := []sseEvent{first}
	for ev, ok := r.next(); ok; ev, ok = r.next() {
		evs = append(evs, ev)
	}
	s := parseStream(t, evs)
	if s.done == nil {
		t.Fatalf("the running stream did not finish: %+v", s.err.Error)
	}
	if s.done.Timings.Steps != 150 && s.done.Stop != "end_of_turn" {
		t.Errorf("finished after %d steps (%s)", s.done.Timings.Steps, s.done.Stop)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// After the grace period, running turns are cancelled and the stream
// ends with an error event.
func TestShutdownCancelsAfterGrace(t *testing.T) {
	ts := startServer(t, Config{ShutdownGrace: 100 * time.Millisecond, MaxNewTokens: 30000})
	resp := ts.post(t, "/v1/audio/chat", map[string]any{"text": "Speak for ever.", "max_new_tokens": 30000})
	defer resp.Body.Close()
	r := newSSEReader(resp.Body)
	first, ok := r.next()
	if !ok {
		t.Fatal("no first event")
	}
	start := time.Now()
	if err := ts.shutdown(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	t.Logf("shutdown took %v with a 100 ms grace period", time.Since(start))
	// Keep reading through the same scanner: it may already hold events
	// past the first.
	evs := []sseEvent{first}
	for ev, ok := r.next(); ok; ev, ok = r.next() {
		evs = append(evs, ev)
	}
	if err := r.sc.Err(); err != nil {
		t.Fatal(err)
	}
	s := parseStream(t, evs)
	if s.err == nil || s.err.Error.Code != codeCancelled {
		t.Fatalf("stream end: done %+v, error %+v", s.done, s.err)
	}
	if !strings.Contains(s.err.Error.Message, errShutdown.Error()) {
		t.Errorf("error event %q does not say the server shut down", s.err.Error.Message)
	}
}

// stepTeacher makes every text step of a turn take step: a frame in
// progress that a client's hang-up must wait out.
type stepTeacher struct {
	step time.Duration
}

func (s stepTeacher) Text(_, picked int, _ []float32) int {
	time.Sleep(s.step)
	return picked
}

func (stepTeacher) AudioCode(_, _, picked int, _ []float32) int { return picked }

// TestContinueAfterHangUp: a client that hangs up on a turn and at once
// sends the conversation's next one is answered once the cancelled turn
// has stopped at its frame, not refused as conversation_busy.
func TestContinueAfterHangUp(t *testing.T) {
	ts := startServer(t, Config{})
	ts.hookStart = func(req *pipeline.Request) {
		if req.Text == "Tell me a long story." {
			req.Teacher = stepTeacher{500 * time.Millisecond}
		}
	}
	first := ts.post(t, "/v1/audio/chat", map[string]any{"text": "Hi.", "max_new_tokens": 4, "stream": false})
	first.Body.Close()
	id := first.Header.Get(headerConversationID)
	if first.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("first turn: %s, conversation %q", first.Status, id)
	}

	ctx, hangUp := context.WithCancel(context.Background())
	long := ts.do(t, ctx, http.MethodPost, "/v1/audio/chat", map[string]any{"conversation_id": id, "text": "Tell me a long story."})
	if long.StatusCode != http.StatusOK {
		t.Fatalf("long turn: %s", long.Status)
	}
	hangUp() // the turn is inside its first (slow) text step
	long.Body.Close()
	time.Sleep(50 * time.Millisecond) // the server sees the connection close

	next := ts.post(t, "/v1/audio/chat", map[string]any{"conversation_id": id, "text": "Never mind. Hello!", "max_new_tokens": 4, "stream": false})
	defer next.Body.Close()
	if next.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(next.Body)
		t.Fatalf("next turn after the hang-up: %s %s", next.Status, body)
	}
}

// TestClientClosedIsNotServerError: a client that hangs up before its
// reply (during a non-streamed turn, or while queued for a slot) is
// recorded as 499, as nginx does, not as a 503 server error.
func TestClientClosedIsNotServerError(t *testing.T) {
	ts := startServer(t, Config{MaxConcurrent: 1})
	ts.hookStart = func(req *pipeline.Request) {
		if req.Text == "Tell me a long story." {
			req.Teacher = stepTeacher{50 * time.Millisecond}
		}
	}
	long := map[string]any{"text": "Tell me a long story.", "max_new_tokens": 8, "stream": false} // 300 ms or more
	for _, tc := range []struct {
		name   string
		queued bool // hang up while another turn holds the only slot
	}{{"non-streamed turn", false}, {"queued", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var holder chan *http.Response
			if tc.queued {
				holder = make(chan *http.Response, 1)
				go postAsync(ts, context.Background(), long, holder)
				waitFor(t, "a turn holding the slot", 5*time.Second, func() bool { return ts.lim.active() == 1 })
			}
			ctx, hangUp := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer hangUp()
			if _, err := ts.doErr(ctx, http.MethodPost, "/v1/audio/chat", long); err == nil {
				t.Fatal("the request finished before its client hung up")
			}
			if holder != nil {
				if r := <-holder; r != nil {
					r.Body.Close()
				}
			}
			waitFor(t, "the hung-up request recorded", 5*time.Second, func() bool {
				return strings.Contains(scrape(t, ts), `omnipipe_http_requests_total{code="499",route="/v1/audio/chat"}`)
			})
			if m := scrape(t, ts); strings.Contains(m, `code="503"`) {
				t.Errorf("a client hang-up counted as 503:\n%s", grepLines(m, "http_requests_total"))
			}
		})
	}
}

// grepLines returns the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
