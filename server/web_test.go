package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/omni-pipe/omni-pipe/audio"
)

// TestWebPage: / serves the page and its scripts from the binary.
func TestWebPage(t *testing.T) {
	ts := startServer(t, Config{})
	for path, want := range map[string]string{
		"/":                   "/web/app.js",
		"/web/app.js":         "/v1/realtime",
		"/web/mic-worklet.js": "registerProcessor",
	} {
		resp := ts.do(t, context.Background(), http.MethodGet, path, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(want)) {
			t.Errorf("GET %s: %d, %d bytes without %q", path, resp.StatusCode, len(body), want)
		}
	}
	resp := ts.do(t, context.Background(), http.MethodGet, "/web/nothing.js", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET a missing file: %d", resp.StatusCode)
	}
}

// chromium finds Debian's chromium (or another Chrome). Without one the
// browser test skips, unless OMNIPIPE_REQUIRE_BROWSER is set (.ci/run
// installs chromium and sets it), when it fails.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium: install Debian's chromium package (apt-get install chromium; .ci/run does) to run the browser test"
	if os.Getenv("OMNIPIPE_REQUIRE_BROWSER") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestWebPageInChromium: the page in a real headless Chromium, its
// microphone a fake device playing a WAV (a spoken burst, then quiet, on a
// loop): hands-free, the server VAD takes the burst as a turn, the reply's
// transcript is shown and its audio scheduled for playback; when the burst
// comes round again during the reply, the page stops playback (barge-in)
// and tells the server how much was heard.
func TestWebPageInChromium(t *testing.T) {
	exe := chromium(t)
	ts := startServer(t, Config{MaxNewTokens: 300})
	longReplies(ts)
	dir := t.TempDir()
	wav := filepath.Join(dir, "mic.wav")
	var buf bytes.Buffer
	if err := audio.WriteWAV(&buf, rtRate, utterance(500*time.Millisecond, 900*time.Millisecond, 3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wav, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("use-fake-ui-for-media-stream", true),
		chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("use-file-for-fake-audio-capture", wav),
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"),
		chromedp.WindowSize(900, 640),
		chromedp.UserDataDir(filepath.Join(dir, "profile")),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 45*time.Second)
	defer cancelT()

	if err := chromedp.Do(ctx, chromedp.Navigate(ts.url+"/"), chromedp.WaitVisible(chromedp.CSS("#start")), chromedp.Click(chromedp.CSS("#start"))); err != nil {
		t.Fatalf("open the page and press Start: %v", err)
	}
	type state struct {
		Connected       bool
		Turns           int
		Transcript      string
		ScheduledMs     float64
		BargeIns        int
		PlaybackStopped int
		Playing         bool
		Latencies       []float64
		Errors          []string
		LastMessage     string
	}
	read := func() state {
		js := `({connected: omni.connected, turns: omni.turns, transcript: omni.transcript, scheduledMs: omni.scheduledMs,
			bargeIns: omni.bargeIns, playbackStopped: omni.playbackStopped, playing: omni.playing(), latencies: omni.latencies,
			errors: omni.errors, lastMessage: omni.lastMessage})`
		s, err := chromedp.Run(ctx, chromedp.Evaluate[state](js))
		if err != nil {
			t.Fatalf("read the page's state: %v", err)
		}
		return s
	}
	waitFor := func(what string, ok func(state) bool) state {
		for {
			s := read()
			if ok(s) {
				return s
			}
			if len(s.Errors) > 0 || ctx.Err() != nil {
				t.Fatalf("waiting for %s: page state %+v (server logs follow)", what, s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	s := waitFor("a turn", func(s state) bool { return s.Turns >= 1 && s.Transcript != "" && s.ScheduledMs >= 2000 })
	t.Logf("turn: %.0f ms of reply audio scheduled, transcript %d bytes, latency %v ms", s.ScheduledMs, len(s.Transcript), s.Latencies)
	if len(s.Latencies) == 0 || s.Latencies[0] <= 0 {
		t.Errorf("no latency measured: %v", s.Latencies)
	}
	if shown, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#log .turn.assistant .text"))); err != nil || strings.TrimSpace(shown) == "" {
		t.Errorf("the transcript is not on the page (%q, %v)", shown, err)
	}
	if screenshot := os.Getenv("OMNIPIPE_SCREENSHOT"); screenshot != "" {
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s = waitFor("a barge-in", func(s state) bool { return s.BargeIns >= 1 && s.PlaybackStopped >= 1 })
	if s.Playing {
		// Stopped sources end at once; give the page one poll.
		time.Sleep(100 * time.Millisecond)
		if s = read(); s.Playing {
			t.Errorf("still playing after the barge-in: %+v", s)
		}
	}
	logs := ts.logs.String()
	if !strings.Contains(logs, `"reason":"turn_detected"`) && !strings.Contains(logs, "realtime: truncated") {
		t.Log("the server saw no barge-in of its own (the reply had finished generating): the page's truncate is what cut it")
	}
}
