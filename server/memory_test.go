package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// slowTeacher keeps a turn going (no end of text, turn or audio) and
// slows its text steps and audio codes, so that a test can act while it
// runs.
type slowTeacher struct{ imEnd, textEnd, eoa int }

func (s slowTeacher) Text(_, picked int, _ []float32) int {
	time.Sleep(2 * time.Millisecond)
	if picked == s.imEnd || picked == s.textEnd {
		return 300
	}
	return picked
}

func (s slowTeacher) AudioCode(_, _, picked int, _ []float32) int {
	time.Sleep(time.Millisecond) // audio frames too: a turn of audio must outlast the test's next requests
	if picked == s.eoa {
		return 0
	}
	return picked
}

// postAsync posts body to /v1/audio/chat under ctx and sends the
// response (nil when the request failed, as when ctx is cancelled).
func postAsync(ts *testServer, ctx context.Context, body map[string]any, out chan<- *http.Response) {
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/audio/chat", bytes.NewReader(data))
	if err != nil {
		out <- nil
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	if err != nil {
		resp = nil
	}
	out <- resp
}

func healthMemory(t *testing.T, ts *testServer) memoryJSON {
	t.Helper()
	var h struct {
		Memory *memoryJSON `json:"memory"`
	}
	if code := ts.getJSON(t, "/health", &h); code != http.StatusOK || h.Memory == nil {
		t.Fatalf("/health: %d, memory %v", code, h.Memory)
	}
	return *h.Memory
}

// TestMemoryBudget: with a budget that holds one turn, a finished
// conversation's idle memory is evicted (its id forgotten) to make room
// for a new turn, and a turn that cannot be given memory while the only
// other one runs is refused with 429 memory_budget_exceeded and
// Retry-After; /health and /metrics report the bytes and the budget.
func TestMemoryBudget(t *testing.T) {
	body := map[string]any{"text": "Hello there", "max_new_tokens": 200, "stream": false}
	slow := func(s *Server) {
		sp := s.backend.Load().Engine.Model().Info().Special
		s.hookStart = func(req *pipeline.Request) { req.Teacher = slowTeacher{sp.IMEnd, sp.TextEnd, sp.EOA} }
	}
	// What one turn reserves, measured on a server without a limit.
	probe := startServerOpts(t, Config{}, pipeline.Options{MemoryBudget: -1})
	slow(probe.Server)
	ctx, cancel := context.WithCancel(context.Background())
	resp := make(chan *http.Response, 1)
	go postAsync(probe, ctx, maps.Clone(body), resp)
	waitFor(t, "the probe turn", 10*time.Second, func() bool { return probe.eng.Running() == 1 && probe.eng.Memory().Codec > 0 })
	one := probe.eng.Memory().Used
	cancel()
	if r := <-resp; r != nil {
		r.Body.Close()
	}

	ts := startServerOpts(t, Config{}, pipeline.Options{MemoryBudget: one + 1})
	slow(ts.Server)
	body["max_new_tokens"] = 20
	r := ts.post(t, "/v1/audio/chat", body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("first turn: %d", r.StatusCode)
	}
	idA := r.Header.Get(headerConversationID)
	m := healthMemory(t, ts)
	if m.Budget != one+1 || m.Used == 0 || m.Conversations != m.Used || m.Codec != 0 {
		t.Fatalf("/health memory after a turn: %+v (budget %d)", m, one+1)
	}
	// A new turn needs more than is left: the idle conversation goes.
	body["max_new_tokens"] = 200
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go postAsync(ts, ctx, maps.Clone(body), resp)
	// Until its codec starts a turn holds less than the probe measured
	// (one), and a third turn could still fit: wait for the same state.
	waitFor(t, "the second turn", 10*time.Second, func() bool { return ts.eng.Running() == 1 && ts.eng.Memory().Codec > 0 })
	rA := ts.post(t, "/v1/audio/chat", map[string]any{"text": "again", "conversation_id": idA})
	checkError(t, rA, http.StatusNotFound, codeUnknownConversation, "conversation_id")
	// While it runs, nothing is idle to evict: 429 with Retry-After.
	r = ts.post(t, "/v1/audio/chat", body)
	if r.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	checkError(t, r, http.StatusTooManyRequests, codeMemoryFull, "")

	mr := ts.do(t, context.Background(), http.MethodGet, "/metrics", nil)
	defer mr.Body.Close()
	data, err := io.ReadAll(mr.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"omnipipe_memory_budget_bytes ", `omnipipe_memory_used_bytes{kind="kv"}`, `omnipipe_memory_used_bytes{kind="codec"}`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	if r := <-resp; r != nil {
		r.Body.Close()
	}
}
