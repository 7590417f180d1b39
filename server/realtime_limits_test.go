package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
)

// TestRealtimeAuth: with API keys, the upgrade needs the bearer header or
// the subprotocol browsers send; the server then speaks "realtime".
func TestRealtimeAuth(t *testing.T) {
	ts := startServer(t, Config{APIKeys: []string{"k1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, opts := range []*websocket.DialOptions{nil, bearer("wrong"), {Subprotocols: []string{"realtime", "openai-insecure-api-key.nope"}}} {
		_, resp, err := websocket.Dial(ctx, rtURL(ts), opts)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("dial without the right key: %v, %v", resp, err)
		}
	}
	dialRT(t, ts, bearer("k1"))
	c := dialRT(t, ts, &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key.k1"}})
	if p := c.ws.Subprotocol(); p != "realtime" {
		t.Errorf("subprotocol %q, want realtime", p)
	}
	// Plain HTTP is told to upgrade.
	resp := ts.do(t, context.Background(), http.MethodGet, "/v1/realtime", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET without a key: %d", resp.StatusCode)
	}
}

// TestRealtimeLimits: one session too many is told so and closed with
// 1013; the input buffer is bounded; an idle session is closed; a plain
// GET is asked to upgrade.
func TestRealtimeLimits(t *testing.T) {
	ts := startServer(t, Config{Realtime: RealtimeConfig{MaxSessions: 1, MaxBufferAudio: time.Second, IdleTimeout: 400 * time.Millisecond}})
	c := dialRT(t, ts, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws2, _, err := websocket.Dial(ctx, rtURL(ts), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, data, err := ws2.Read(ctx)
	if err != nil || !strings.Contains(string(data), "too_many_sessions") {
		t.Errorf("the second session got %s, %v; want a too_many_sessions error", data, err)
	}
	if _, _, err := ws2.Read(ctx); websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Errorf("the second session closed with %v, want 1013 try again later", err)
	}
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil}})
	c.until("session.updated")
	c.appendAudio(make([]float32, rtRate)) // one second: the limit
	c.send(map[string]any{"type": "input_audio_buffer.append", "event_id": "over", "audio": pcmB64(make([]float32, 960))})
	c.expectError("input_audio_buffer_full", "audio", "over")
	// Idle: no event for 400 ms.
	evs := c.until("error")
	if code := evs[len(evs)-1].str("error.code"); code != "idle_timeout" {
		t.Errorf("idle: error %q", code)
	}
	if _, err := c.read(5 * time.Second); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("idle session closed with %v", err)
	}
	resp := ts.do(t, context.Background(), http.MethodGet, "/v1/realtime", nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(string(body), "websocket_required") {
		t.Errorf("plain GET: %d %s", resp.StatusCode, body)
	}
}

// TestRealtimeDropsLeaveNothing: 100 clients that drop the socket in the
// middle of a response leave no goroutine, slot or session behind.
func TestRealtimeDropsLeaveNothing(t *testing.T) {
	ts := startServer(t, Config{MaxConcurrent: 8, MaxQueue: -1})
	longReplies(ts)
	client := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, rtURL(ts), nil)
		if err != nil {
			return err
		}
		defer ws.CloseNow()
		send := func(s string) error { return ws.Write(ctx, websocket.MessageText, []byte(s)) }
		if err := send(`{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"Talk."}]}}`); err != nil {
			return err
		}
		if err := send(`{"type":"response.create","response":{"max_output_tokens":400}}`); err != nil {
			return err
		}
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return err
			}
			switch s := string(data); {
			case strings.Contains(s, `"response.output_audio.delta"`):
				return nil // mid-response: drop it (CloseNow, no close frame)
			case strings.Contains(s, `"rate_limit_exceeded"`):
				return errBusyRetry
			}
		}
	}
	if err := client(); err != nil { // warm-up: the transport's goroutines exist before the baseline
		t.Fatal(err)
	}
	waitIdle(t, ts)
	baseline := goleak.IgnoreCurrent()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 100; i += 8 {
				for {
					err := client()
					if errors.Is(err, errBusyRetry) {
						time.Sleep(5 * time.Millisecond) // a dropped session's slot is still draining
						continue
					}
					if err != nil {
						errs <- err
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitIdle(t, ts)
	goleak.VerifyNone(t, baseline)
}

var errBusyRetry = errors.New("busy: retry")

// waitIdle waits until no realtime session, turn, slot or decode budget
// is left.
func waitIdle(t *testing.T, ts *testServer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for ts.rt.active.Load() > 0 || ts.lim.active() > 0 || ts.eng.Running() > 0 || ts.decode.inUse() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still %d sessions, %d slots, %d turns, %d bytes of decode budget",
				ts.rt.active.Load(), ts.lim.active(), ts.eng.Running(), ts.decode.inUse())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRealtimeDecodeBudget: a realtime event that finds the decode budget
// full is refused with an error event naming it, and the session goes on;
// once the budget is free its audio is taken, and the session's events
// give every byte back.
func TestRealtimeDecodeBudget(t *testing.T) {
	ts := startServer(t, Config{DecodeWait: -1})
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil}})
	c.until("session.updated")

	// Another holds all but room for small events: an append does not fit.
	other, err := ts.decode.acquire(context.Background(), ts.cfg.DecodeBudget-decodeCost(1024), 0)
	if err != nil {
		t.Fatal(err)
	}
	pcm := utterance(0, 200*time.Millisecond, 0)
	c.send(map[string]any{"type": "input_audio_buffer.append", "event_id": "evt_refused", "audio": pcmB64(pcm)})
	ev := c.expectError(codeDecodeBusy, "", "evt_refused")
	if ev.str("error.type") != typeRateLimit {
		t.Errorf("error type %q, want %s", ev.str("error.type"), typeRateLimit)
	}
	c.send(map[string]any{"type": "input_audio_buffer.commit", "event_id": "commit1"})
	c.expectError(codeCommitEmpty, "", "commit1") // the refused audio was not taken

	other.release()
	c.send(map[string]any{"type": "input_audio_buffer.append", "audio": pcmB64(pcm)})
	c.send(map[string]any{"type": "input_audio_buffer.commit"})
	c.until("input_audio_buffer.committed")
	if n := ts.decode.inUse(); n != 0 {
		t.Errorf("%d bytes of decode budget in use with no event in flight", n)
	}
	m := scrape(t, ts)
	if v, ok := metricValue(m, `omnipipe_realtime_client_events_total{type="refused"}`); !ok || v != 1 {
		t.Errorf("refused events %v (found %v), want 1", v, ok)
	}
	c.ws.CloseNow()
	waitIdle(t, ts)
}
