package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a goroutine-safe stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeQuickStart runs the README's first command (serve with no
// --model: the embedded demo model) on a free port, sends the first curl
// example of docs/api.md, checks that the reply streams, then stops the
// server with SIGTERM and expects exit status 0.
// waitListening waits (up to 30 s) for a `serve` started in a goroutine to
// log its address, failing the test if it exits first or never listens.
func waitListening(t *testing.T, exit <-chan int, stderr *lockedBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`msg=listening addr=(\S+)`)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		select {
		case code := <-exit:
			t.Fatalf("serve exited with %d:\n%s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", stderr.String())
		}
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
	}
}

func TestServeQuickStart(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`curl -N http://127\.0\.0\.1:8080(/v1/audio/chat) -d '([^']+)'`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/api.md has no `curl -N http://127.0.0.1:8080/v1/audio/chat -d '…'` example")
	}
	path, body := string(m[1]), string(m[2])

	stderr := &lockedBuffer{}
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" }}
	exit := make(chan int, 1)
	go func() { exit <- run([]string{"serve", "--addr", "127.0.0.1:0", "--threads", "2"}, e) }()

	addr := waitListening(t, exit, stderr)
	stopped := false
	defer func() {
		if !stopped {
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
			<-exit
		}
	}()
	if !strings.Contains(stderr.String(), "DEMO model") || !strings.Contains(stderr.String(), "NOISE") {
		t.Errorf("no loud demo-model warning:\n%s", stderr.String())
	}
	base := "http://" + addr
	// serve loads the model before it listens: its first /health answer
	// is 200, never 503 loading (docs/api.md).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(base + "/health")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("the first /health after \"listening\" answered %d %s", resp.StatusCode, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never healthy:\n%s", stderr.String())
		}
	}

	// /health reports the device the engine runs on.
	if resp, err := http.Get(base + "/health"); err != nil {
		t.Error(err)
	} else {
		var h struct {
			Device *struct{ Kind, Name string }
		}
		err := json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || h.Device == nil || h.Device.Kind != "cpu" || h.Device.Name == "" {
			t.Errorf("/health device %+v (%v), want the CPU device", h.Device, err)
		}
	}

	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	counts := map[string]int{}
	var done struct {
		Text    string
		Timings struct{ Steps int }
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
			counts[event]++
		case strings.HasPrefix(line, "data: ") && event == "done":
			if err := json.Unmarshal([]byte(line[len("data: "):]), &done); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("events %v, %d steps, text %q", counts, done.Timings.Steps, done.Text)
	if counts["text"] == 0 || counts["audio"] == 0 || counts["done"] != 1 || counts["error"] != 0 || done.Timings.Steps == 0 {
		t.Errorf("events %v: want text, audio and one done", counts)
	}

	stopped = true
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != exitOK {
			t.Errorf("exit status %d after SIGTERM, want 0:\n%s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "shut down") {
		t.Errorf("no shutdown log:\n%s", stderr.String())
	}
}

func TestServeBadConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"serve", "--device", "tpu"}, nil, `--device "tpu": want cpu, cuda or auto`},
		{[]string{"serve", "--precision", "fp8"}, nil, "--precision"},
		{[]string{"serve", "--max-concurrent", "0"}, nil, "--max-concurrent"},
		{[]string{"serve", "--log-format", "xml"}, nil, "--log-format"},
		{[]string{"serve"}, map[string]string{"OMNIPIPE_MAX_QUEUE": "many"}, "OMNIPIPE_MAX_QUEUE"},
		{[]string{"serve"}, map[string]string{"OMNIPIPE_QUEUE_TIMEOUT": "soon"}, "OMNIPIPE_QUEUE_TIMEOUT"},
		{[]string{"serve", "extra"}, nil, "unexpected argument"},
	} {
		var stderr bytes.Buffer
		e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, getenv: func(k string) string { return tc.env[k] }}
		if code := run(tc.args, e); code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want %d mentioning %q", tc.args, tc.env, code, stderr.String(), exitUsage, tc.want)
		}
	}
	// The environment sets defaults; a flag wins.
	var stdout bytes.Buffer
	e := &env{stdout: &stdout, stderr: io.Discard, getenv: func(k string) string {
		return map[string]string{"OMNIPIPE_ADDR": "0.0.0.0:9999"}[k]
	}}
	if code := run([]string{"help", "serve"}, e); code != exitOK || !strings.Contains(stdout.String(), `"0.0.0.0:9999"`) {
		t.Errorf("help with OMNIPIPE_ADDR set: exit %d\n%s", code, stdout.String())
	}
}

// TestServeBadModel: a model that does not load is the error, reported
// before the server ever listens.
func TestServeBadModel(t *testing.T) {
	var stderr bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "--model", "/nonexistent", "--addr", "127.0.0.1:0"}, e) }()
	select {
	case code := <-done:
		log := stderr.String()
		if code != exitError || !strings.Contains(log, "/nonexistent") || strings.Contains(log, "listening") || strings.Contains(log, "shutting down") {
			t.Errorf("exit %d, stderr:\n%s\nwant exit %d naming the model folder, never listening", code, log, exitError)
		}
	case <-time.After(30 * time.Second):
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		<-done
		t.Fatalf("serve with a bad model kept running:\n%s", stderr.String())
	}
}
