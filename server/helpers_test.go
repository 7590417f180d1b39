package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const (
	tinyModel = "../testdata/lfm2-audio-tiny"
	frameLen  = 1920 // samples of one 80 ms frame at 24 kHz
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testServer is a Server with the tiny model on a loopback port.
type testServer struct {
	*Server
	url    string
	eng    *pipeline.Engine
	dev    *cpu.Device
	logs   *syncBuffer
	stop   context.CancelFunc
	served chan error
	client *http.Client
	once   sync.Once
}

// startServer serves the tiny checkpoint with cfg (its Logger is replaced
// by a buffer) and stops it when the test ends.
func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	return startServerOpts(t, cfg, pipeline.Options{})
}

// startServerOpts is startServer with the engine's options (MaxTurns is
// the server's MaxConcurrent).
func startServerOpts(t testing.TB, cfg Config, opts pipeline.Options) *testServer {
	t.Helper()
	dev := cpu.New(2)
	m, err := lfm2audio.Load(dev, tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Version = "test"
	s := New(cfg)
	opts.MaxTurns = s.cfg.MaxConcurrent
	eng := pipeline.New(m, dev, opts)
	s.SetBackend(&Backend{Engine: eng, Model: m.Name, Device: dev.Name(), GPU: dev})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + ln.Addr().String(), eng: eng, dev: dev, logs: logs, stop: stop,
		served: make(chan error, 1), client: &http.Client{Transport: &http.Transport{}}}
	go func() { ts.served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		if err := ts.shutdown(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		eng.Close()
		m.Close()
		dev.Close()
		if t.Failed() {
			t.Logf("server logs:\n%s", logs.String())
		}
	})
	return ts
}

// shutdown stops Serve and returns its result (once).
func (ts *testServer) shutdown() error {
	var err error
	ts.once.Do(func() {
		ts.stop()
		err = <-ts.served
		ts.client.CloseIdleConnections()
	})
	return err
}

// post sends a JSON body.
func (ts *testServer) post(t testing.TB, path string, body any) *http.Response {
	t.Helper()
	return ts.do(t, context.Background(), http.MethodPost, path, body)
}

func (ts *testServer) do(t testing.TB, ctx context.Context, method, path string, body any) *http.Response {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, ts.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// getJSON GETs path and decodes the body into v, returning the status.
func (ts *testServer) getJSON(t testing.TB, path string, v any) int {
	t.Helper()
	resp := ts.do(t, context.Background(), http.MethodGet, path, nil)
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return resp.StatusCode
}

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data string
}

// sseReader reads server-sent events.
type sseReader struct {
	sc *bufio.Scanner
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return &sseReader{sc: sc}
}

// next returns the next event, or false at the end of the stream.
func (r *sseReader) next() (sseEvent, bool) {
	var ev sseEvent
	seen := false
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if seen {
				return ev, true
			}
		case strings.HasPrefix(line, "event: "):
			ev.name, seen = line[len("event: "):], true
		case strings.HasPrefix(line, "data: "):
			ev.data, seen = ev.data+line[len("data: "):], true
		}
	}
	return ev, false
}

// readAll reads every event of a stream.
func readAll(t testing.TB, body io.Reader) []sseEvent {
	t.Helper()
	var evs []sseEvent
	r := newSSEReader(body)
	for {
		ev, ok := r.next()
		if !ok {
			if err := r.sc.Err(); err != nil {
				t.Fatalf("read stream: %v", err)
			}
			return evs
		}
		evs = append(evs, ev)
	}
}

// loadClip reads a reference case's input waveform.
func loadClip(t testing.TB, name string) *audio.Clip {
	t.Helper()
	f, err := safetensors.Open(tinyModel + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wav, err := f.Tensor("input_wav").Float32s()
	if err != nil {
		t.Fatal(err)
	}
	rate, err := f.Tensor("input_sample_rate").Int64s()
	if err != nil {
		t.Fatal(err)
	}
	return &audio.Clip{SampleRate: int(rate[0]), Samples: wav}
}

// wavBytes encodes a clip as a 16-bit WAV, and wavBase64 as its base64.
func wavBytes(t testing.TB, c *audio.Clip) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := audio.WriteWAV(&b, c.SampleRate, c.Samples); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func wavBase64(t testing.TB, c *audio.Clip) string {
	return base64.StdEncoding.EncodeToString(wavBytes(t, c))
}

// questionWAV returns case 1's 16 kHz spoken question as a base64 WAV.
func questionWAV(t testing.TB) string {
	return wavBase64(t, loadClip(t, "case1_question_16k.safetensors"))
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// getJSON serves a GET of path on s and decodes its 200 answer into v.
func getJSON(t *testing.T, s http.Handler, path string, v any) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
