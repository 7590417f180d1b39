package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/pipeline/live"
)

// writeConversationWAV: the fixture's question twice, 4 s of its room noise
// between and 2 s after.
func writeConversationWAV(t *testing.T) string {
	t.Helper()
	ref, err := refcase.Open(tiny + "/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	clip, err := ref.Clip("input_wav")
	if err != nil {
		t.Fatal(err)
	}
	q, noise := clip.Samples, clip.Samples[:clip.SampleRate/2]
	x := append([]float32(nil), q...)
	for range 8 {
		x = append(x, noise...)
	}
	x = append(x, q...)
	for range 4 {
		x = append(x, noise...)
	}
	p := filepath.Join(t.TempDir(), "conversation.wav")
	var b bytes.Buffer
	if err := audio.WriteWAV(&b, clip.SampleRate, x); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMicFromFile: a recorded conversation through `mic --wav --out` is two
// turns; the WAV holds both replies, and a second run writes the same file.
func TestMicFromFile(t *testing.T) {
	in := writeConversationWAV(t)
	dir := t.TempDir()
	var first []byte
	for i, out := range []string{filepath.Join(dir, "a.wav"), filepath.Join(dir, "b.wav")} {
		code, stdout, stderr := runCmd(t, "", "mic", "--model", tiny, "--wav", in, "--out", out, "--max-new-tokens", "60", "--seed", "3")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if i == 0 {
			t.Logf("stderr:\n%s", stderr)
		}
		if n := strings.Count(stderr, "you ▸"); n != 2 {
			t.Errorf("%d utterances reported, want 2", n)
		}
		if lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n"); len(lines) != 2 {
			t.Errorf("stdout has %d reply lines, want 2: %q", len(lines), stdout)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		c, err := audio.DecodeBytes(b, audio.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// 60 steps of the 6-text/12-audio interleave hold 36 audio
		// frames of 1920 samples; a sampled end-of-audio frame is not
		// decoded. Each reply is a few frames short of that at most.
		frames := len(c.Samples) / 1920
		t.Logf("reply WAV: %d frames", frames)
		if c.SampleRate != 24000 || len(c.Samples)%1920 != 0 || frames > 2*36 || frames < 2*30 {
			t.Errorf("reply WAV: %d Hz, %d samples; want 24000 Hz, whole frames of 1920, 60 to 72 of them", c.SampleRate, len(c.Samples))
		}
		if first == nil {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Error("a second run with the same seed wrote a different WAV")
		}
	}
}

func TestMicDemoModel(t *testing.T) {
	in := writeConversationWAV(t)
	code, _, stderr := runCmd(t, "", "mic", "--wav", in, "--out", filepath.Join(t.TempDir(), "o.wav"), "--max-new-tokens", "12")
	if code != exitOK || !strings.Contains(stderr, "DEMO model") || !strings.Contains(stderr, "NOISE") {
		t.Errorf("exit %d, stderr %q; want 0 and the demo-model warning", code, stderr)
	}
}

func TestMicUsage(t *testing.T) {
	t.Setenv("PULSE_SERVER", "unix:"+filepath.Join(t.TempDir(), "none"))
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"mic", "--barge-in", "maybe"}, exitUsage, "want on or off"},
		{[]string{"mic", "--vad-threshold", "-3"}, exitUsage, "--vad-threshold"},
		{[]string{"mic", "--vad-silence", "1ms"}, exitUsage, "MinSilence"},
		{[]string{"mic", "--mic-rate", "100"}, exitUsage, "--mic-rate"},
		{[]string{"mic", "--realtime"}, exitUsage, "--realtime goes with --wav and --out"},
		{[]string{"mic", "--max-new-tokens", "0"}, exitUsage, "--max-new-tokens"},
		{[]string{"mic", "--audio-temperature", "-1"}, exitUsage, "--audio-temperature -1: want 0 to 100"},
		{[]string{"mic", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"mic", "--model", "/nonexistent", "--wav", "x.wav"}, exitError, "config"},
		{[]string{"mic", "--model", tiny, "--wav", "/nonexistent.wav"}, exitError, "nonexistent.wav"},
		// No sound server: the error says what to do.
		{[]string{"mic", "--list-devices"}, exitError, "PulseAudio"},
		{[]string{"mic", "--model", tiny}, exitError, "PULSE_SERVER"},
		{[]string{"help", "mic"}, exitOK, "-barge-in"},
	}
	for _, tt := range tests {
		code, out, errOut := runCmd(t, "", tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("omni-pipe %v: exit %d, output %q; want exit %d containing %q", tt.args, code, out+errOut, tt.code, tt.want)
		}
	}
	// --barge-in takes on/off with or without "=".
	for _, v := range []string{"off", "on"} {
		code, _, errOut := runCmd(t, "", "mic", "--barge-in", v, "--realtime")
		if code != exitUsage || !strings.Contains(errOut, "--realtime goes with") {
			t.Errorf("--barge-in %s: exit %d, %q", v, code, errOut)
		}
	}
}

// The printer keeps the reply on one stdout line: status notes that come
// in the middle of it wait for its end.
func TestMicPrinter(t *testing.T) {
	var out, log bytes.Buffer
	p := &micPrinter{out: &out, log: &log}
	for _, ev := range []live.Event{
		{Kind: live.Listening},
		{Kind: live.SpeechEnd, Audio: 2500 * time.Millisecond},
		{Kind: live.TurnStart, Turn: 1},
		{Kind: live.Text, Turn: 1, Text: "Hello"},
		{Kind: live.SpeechIgnored, Reason: "echo"},
		{Kind: live.Text, Turn: 1, Text: " there"},
		{Kind: live.BargeIn, Turn: 1, Heard: 1200 * time.Millisecond},
		{Kind: live.TurnEnd, Turn: 1, Err: context.Canceled},
		{Kind: live.TurnStart, Turn: 2},
		{Kind: live.Text, Turn: 2, Text: "Yes."},
		{Kind: live.TurnEnd, Turn: 2, Audio: time.Second},
		{Kind: live.TurnStart, Turn: 3},
		{Kind: live.TurnEnd, Turn: 3, Err: errors.New("codec broke")},
	} {
		p.event(ev)
	}
	p.finish()
	if want := "Hello there\nYes.\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	for _, want := range []string{"you ▸ 2.5 s", "(speech ignored: echo)\n  [interrupted after 1.2 s]", "(1.0 s of speech", "the reply failed: codec broke"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, log.String())
		}
	}
}

// Ctrl-C in the middle of a conversation: exit status 0, and the replies so
// far are written.
func TestMicCtrlC(t *testing.T) {
	in := writeConversationWAV(t)
	out := filepath.Join(t.TempDir(), "o.wav")
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"mic", "--model", tiny, "--wav", in, "--out", out, "--realtime", "--max-new-tokens", "60"},
			&env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }})
	}()
	// The signal handler is in place once the banner is out; the first
	// reply has been generated once its summary line is.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(stderr.String(), "real-time factor"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reply within a minute: %s", stderr.String())
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d after SIGINT: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "bye") || !strings.Contains(stderr.String(), "wrote "+out) {
		t.Errorf("stderr %q lacks bye and the WAV", stderr.String())
	}
	if fi, err := os.Stat(out); err != nil || fi.Size() <= 44 {
		t.Errorf("reply WAV: %v, %v", fi, err)
	}
}
