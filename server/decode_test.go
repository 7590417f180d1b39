package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// byteBudget admits reservations up to its size, waits a bounded time for
// bytes to come back, and gets every byte back.
func TestByteBudget(t *testing.T) {
	errCause := errors.New("the client hung up")
	tests := []struct {
		name    string
		held    int64 // reserved before the call, released 20 ms into it when freeAt
		freeAt  bool
		n       int64
		wait    time.Duration
		cancel  bool // the context is cancelled 20 ms into the call
		wantErr error
		wantN   int64 // the bytes the reservation holds
	}{
		{name: "fits", held: 60, n: 40, wantN: 40},
		{name: "full, no wait", held: 61, n: 40, wantErr: errDecodeBusy},
		{name: "full, times out", held: 61, n: 40, wait: 30 * time.Millisecond, wantErr: errDecodeBusy},
		{name: "full, freed while waiting", held: 61, freeAt: true, n: 40, wait: 5 * time.Second, wantN: 40},
		{name: "full, client gone", held: 61, n: 40, wait: 5 * time.Second, cancel: true, wantErr: errCause},
		{name: "above the budget: all of it", n: 1000, wantN: 100},
		{name: "above the budget, one other", held: 1, n: 1000, wantErr: errDecodeBusy},
		{name: "nothing", held: 100, n: 0, wantN: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newByteBudget(100)
			held, err := b.acquire(context.Background(), tc.held, 0)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if tc.freeAt || tc.cancel {
				time.AfterFunc(20*time.Millisecond, func() {
					if tc.freeAt {
						held.release()
					}
					if tc.cancel {
						cancel(errCause)
					}
				})
			}
			res, err := b.acquire(ctx, tc.n, tc.wait)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("acquire: %v, want %v", err, tc.wantErr)
			}
			if err == nil && res.n.Load() != tc.wantN {
				t.Errorf("reserved %d bytes, want %d", res.n.Load(), tc.wantN)
			}
			res.shrink(tc.wantN / 2)
			res.release()
			res.release() // a second release gives nothing back
			held.release()
			if n := b.inUse(); n != 0 {
				t.Errorf("%d bytes still in use after every release", n)
			}
		})
	}
}

// TestByteBudgetFirstComeFirstServed: a reservation that waits is not
// passed over by a later, smaller one that would fit: the small one waits
// behind it, and is served once the large one has had its bytes.
func TestByteBudgetFirstComeFirstServed(t *testing.T) {
	b := newByteBudget(100)
	held, err := b.acquire(context.Background(), 80, 0)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 2)
	letGo := make(chan struct{})
	var wg sync.WaitGroup
	take := func(name string, n int64, hold <-chan struct{}) {
		defer wg.Done()
		r, err := b.acquire(context.Background(), n, 10*time.Second)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			served <- name + " failed"
			return
		}
		served <- name
		if hold != nil {
			<-hold
		}
		r.release()
	}
	wg.Add(1)
	go take("large", 100, letGo) // all of the budget: waits for the 80
	// With a reservation queued even one of nothing does not go ahead.
	for b.sem.TryAcquire(0) {
		time.Sleep(time.Millisecond)
	}
	wg.Add(1)
	go take("small", 10, nil) // 80 + 10 would fit, but the large one came first
	select {
	case name := <-served:
		t.Fatalf("%s was served while the 80 bytes were still held", name)
	case <-time.After(50 * time.Millisecond):
	}
	held.release()
	if first := <-served; first != "large" {
		t.Fatalf("%s served first, want large", first)
	}
	close(letGo) // the large one holds all 100 bytes until now
	if second := <-served; second != "small" {
		t.Errorf("then %s, want small", second)
	}
	wg.Wait()
	if n := b.inUse(); n != 0 {
		t.Errorf("%d bytes still in use after every release", n)
	}
}

// toneClip is d of a 440 Hz tone at 16 kHz.
func toneClip(d time.Duration) *audio.Clip {
	n := int(d.Seconds() * 16000)
	c := &audio.Clip{SampleRate: 16000, Samples: make([]float32, n)}
	for i := range c.Samples {
		c.Samples[i] = float32(0.3 * math.Sin(2*math.Pi*440*float64(i)/16000))
	}
	return c
}

// postRaw posts body to path under ctx, with a Content-Length unless
// chunked; the error is the transport's.
func (ts *testServer) postRaw(ctx context.Context, path string, body []byte, chunked bool) (*http.Response, error) {
	var r io.Reader = strings.NewReader(string(body))
	if chunked {
		r = io.MultiReader(r) // no length the client can tell: sent chunked
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+path, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return ts.client.Do(req)
}

// TestDecodeBudget: uploads being decoded hold the decode budget before
// they take a turn slot. Beyond the budget a request gets 429
// decode_budget_exceeded with Retry-After, while those within it (large
// and small) are answered; a body of unknown length is charged the body
// limit, a body declared too large still gets 413; every byte comes back.
func TestDecodeBudget(t *testing.T) {
	clip := toneClip(500 * time.Millisecond)
	large, err := json.Marshal(map[string]any{"audio": wavBase64(t, clip), "max_new_tokens": 3, "stream": false})
	if err != nil {
		t.Fatal(err)
	}
	small := []byte(`{"text": "Hi.", "max_new_tokens": 2, "stream": false}`)
	size := int64(len(large))
	budget := 2*decodeCost(size) + decodeCost(1024) // two large bodies, and room for small ones
	ts := startServer(t, Config{MaxBodyBytes: 2 * size, DecodeBudget: budget, DecodeWait: -1, RetryAfter: 2 * time.Second})

	// The first two decodes wait for the gate, holding their budget.
	gate := make(chan struct{})
	var entered atomic.Int64
	ts.hookDecode = func(context.Context) {
		if entered.Add(1) <= 2 {
			<-gate
		}
	}
	var wg sync.WaitGroup
	results := make(chan string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := ts.postRaw(context.Background(), "/v1/audio/chat", large, false)
			if err != nil {
				results <- fmt.Sprintf("large %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				results <- fmt.Sprintf("large %d: %d %s", i, resp.StatusCode, body)
				return
			}
			results <- ""
		}()
	}
	waitFor(t, "two decodes holding their budget", 10*time.Second, func() bool { return entered.Load() == 2 })
	if got, want := ts.decode.inUse(), 2*decodeCost(size); got != want {
		t.Errorf("%d bytes of decode budget in use, want %d (two bodies of %d bytes)", got, want, size)
	}

	tests := []struct {
		name    string
		path    string
		body    []byte
		chunked bool
		status  int
		code    string
	}{
		{name: "a third large body", path: "/v1/audio/chat", body: large, status: http.StatusTooManyRequests, code: codeDecodeBusy},
		{name: "a third large chat completion", path: "/v1/chat/completions", body: []byte(fmt.Sprintf(
			`{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": %q, "format": "wav"}}]}]}`, wavBase64(t, clip))),
			status: http.StatusTooManyRequests, code: codeDecodeBusy},
		{name: "a small body fits", path: "/v1/audio/chat", body: small, status: http.StatusOK},
		{name: "unknown length: charged the limit", path: "/v1/audio/chat", body: small, chunked: true, status: http.StatusTooManyRequests, code: codeDecodeBusy},
		{name: "declared too large: 413", path: "/v1/audio/chat", body: append(append(large, large...), ' '), status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := ts.postRaw(context.Background(), tc.path, tc.body, tc.chunked)
			if err != nil {
				t.Fatal(err)
			}
			if tc.status == http.StatusOK {
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					body, _ := io.ReadAll(resp.Body)
					t.Fatalf("%d %s, want 200", resp.StatusCode, body)
				}
				return
			}
			if tc.status == http.StatusTooManyRequests {
				if ra := resp.Header.Get("Retry-After"); ra != "2" {
					t.Errorf("Retry-After %q, want 2", ra)
				}
				if !resp.Close {
					t.Error("the connection of a refused, unread body is kept open")
				}
			}
			e := checkError(t, resp, tc.status, tc.code, "")
			if tc.code == codeDecodeBusy && (e.Error.Type != typeRateLimit || !strings.Contains(e.Error.Message, "decode budget")) {
				t.Errorf("error %+v, want a rate_limit_error naming the decode budget", e.Error)
			}
		})
	}

	close(gate)
	wg.Wait()
	close(results)
	for r := range results {
		if r != "" {
			t.Error(r)
		}
	}
	if n := ts.decode.inUse(); n != 0 {
		t.Errorf("%d bytes of decode budget still in use after every request ended", n)
	}
	m := scrape(t, ts)
	for name, want := range map[string]float64{
		"omnipipe_decode_budget_bytes":                                    float64(budget),
		"omnipipe_decode_used_bytes":                                      0,
		`omnipipe_errors_total{kind="decode_budget_exceeded"}`:            3,
		`omnipipe_http_requests_total{code="429",route="/v1/audio/chat"}`: 2,
	} {
		if v, ok := metricValue(m, name); !ok || v != want {
			t.Errorf("/metrics %s = %v (found %v), want %v", name, v, ok, want)
		}
	}
	if !strings.Contains(ts.logs.String(), codeDecodeBusy) {
		t.Error("no log line names the refusal")
	}
}

// The decode budget comes back on every way a request can end while it
// holds it or waits for it: a bad body, a panic in the handler, a client
// that hangs up while its body is decoded or while it waits. (net/http
// watches for a hang-up only once the body is read, so a client that
// hangs up while waiting is let go when its wait ends.)
func TestDecodeBudgetReleased(t *testing.T) {
	good, _ := json.Marshal(map[string]any{"audio": wavBase64(t, toneClip(200*time.Millisecond)), "max_new_tokens": 2, "stream": false})
	tests := []struct {
		name   string
		body   []byte
		hook   func(ctx context.Context, hungUp chan<- struct{})
		full   bool // the budget is taken by another until the request has given up
		status int  // 0: the client hangs up
	}{
		{name: "bad base64", body: []byte(`{"audio": "!!!"}`), status: http.StatusBadRequest},
		{name: "not a WAV", body: []byte(`{"audio": "AAAAAAAAAAAA"}`), status: http.StatusBadRequest},
		{name: "malformed JSON", body: []byte(`{"audio": `), status: http.StatusBadRequest},
		{name: "panic while decoding", body: good, hook: func(context.Context, chan<- struct{}) { panic("decoder bug") },
			status: http.StatusInternalServerError},
		{name: "hang-up while decoding", body: good, hook: func(ctx context.Context, hungUp chan<- struct{}) {
			hungUp <- struct{}{}
			<-ctx.Done()
		}},
		{name: "hang-up while waiting", body: good, full: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{DecodeWait: 200 * time.Millisecond})
			hungUp := make(chan struct{}, 1)
			if tc.hook != nil {
				ts.hookDecode = func(ctx context.Context) { tc.hook(ctx, hungUp) }
			}
			var other *reservation
			if tc.full {
				var err error
				if other, err = ts.decode.acquire(context.Background(), ts.cfg.DecodeBudget, 0); err != nil {
					t.Fatal(err)
				}
				go func() {
					time.Sleep(50 * time.Millisecond) // the request is waiting by then
					hungUp <- struct{}{}
				}()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := ts.postRaw(ctx, "/v1/audio/chat", tc.body, false)
				switch {
				case tc.status == 0:
					if err == nil {
						resp.Body.Close()
						t.Errorf("%d, want the request to be cut off by the hang-up", resp.StatusCode)
					}
				case err != nil:
					t.Error(err)
				default:
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != tc.status {
						t.Errorf("%d %s, want %d", resp.StatusCode, body, tc.status)
					}
				}
			}()
			if tc.status == 0 {
				<-hungUp
				cancel()
			}
			<-done
			if tc.status == 0 {
				waitFor(t, "the hung-up request's handler to end", 10*time.Second, func() bool { return ts.inflight.Load() == 0 })
			}
			other.release()
			if n := ts.decode.inUse(); n != 0 {
				t.Errorf("%d bytes of decode budget still in use", n)
			}
		})
	}
}

// A request waiting in the turn queue keeps its decoded samples' bytes
// charged (its body's charge already given back); once it has a slot it
// holds no budget.
func TestDecodeBudgetWhileQueued(t *testing.T) {
	ts := startServer(t, Config{MaxConcurrent: 1})
	sp := ts.eng.Model().Info().Special
	ts.hookStart = func(req *pipeline.Request) {
		if req.Audio == nil { // the text-only turn is kept going
			req.Teacher = slowTeacher{sp.IMEnd, sp.TextEnd, sp.EOA}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running := make(chan *http.Response, 1)
	go postAsync(ts, ctx, map[string]any{"text": "Talk.", "max_new_tokens": 2000}, running)
	waitFor(t, "the first turn", 10*time.Second, func() bool { return ts.eng.Running() == 1 })

	clip := toneClip(300 * time.Millisecond)
	queued := make(chan *http.Response, 1)
	go postAsync(ts, context.Background(), map[string]any{"audio": wavBase64(t, clip), "max_new_tokens": 2, "stream": false}, queued)
	waitFor(t, "the audio request to queue", 10*time.Second, func() bool { return ts.lim.queued() == 1 })
	if got, want := ts.decode.inUse(), 4*int64(len(clip.Samples)); got != want {
		t.Errorf("a queued request holds %d bytes of decode budget, want its %d samples' %d", got, len(clip.Samples), want)
	}
	cancel()
	if r := <-running; r != nil {
		r.Body.Close()
	}
	r := <-queued
	if r == nil {
		t.Fatal("the queued request failed")
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Errorf("the queued request: %d", r.StatusCode)
	}
	if n := ts.decode.inUse(); n != 0 {
		t.Errorf("%d bytes of decode budget still in use", n)
	}
}
