package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/devices"
)

// cudaWorks reports whether this machine opens a CUDA device.
func cudaWorks(t *testing.T) bool {
	t.Helper()
	dev, _, err := devices.Open("cuda", devices.Options{})
	if err != nil {
		return false
	}
	dev.Close()
	return true
}

// TestDeviceCUDAUnavailable: --device cuda without a usable GPU is a clear
// one-line error on every command that loads a model, before any work
// (bench --synthetic writes no checkpoint first).
func TestDeviceCUDAUnavailable(t *testing.T) {
	if cudaWorks(t) {
		t.Skip("this machine has a usable CUDA device")
	}
	tmp := t.TempDir()
	for _, args := range [][]string{
		{"generate", "--model", tiny, "--text", "hi"},
		{"generate", "--text", "hi"}, // the demo model
		{"serve", "--addr", "127.0.0.1:0"},
		{"mic", "--model", tiny, "--wav", "x.wav", "--out", filepath.Join(tmp, "o.wav")},
		{"parity", "--model", tiny, "--reference", tiny + "/case3_text_only.safetensors"},
		{"bench", "--model", tiny},
		{"bench", "--synthetic", "--synthetic-dir", filepath.Join(tmp, "synth")},
	} {
		args := append(args, "--device", "cuda")
		code, out, errOut := runCmd(t, "", args...)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
			if strings.HasPrefix(l, "omni-pipe ") {
				lines = append(lines, l)
			}
		}
		want := "omni-pipe " + args[0] + ": --device cuda: "
		if code != exitError || out != "" || len(lines) != 1 || !strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], "--device cpu") {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant exit %d and one line starting %q", args, code, out, errOut, exitError, want)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "synth")); !os.IsNotExist(err) {
		t.Errorf("bench --synthetic --device cuda wrote a checkpoint before failing (%v)", err)
	}
}

// TestDeviceLogged: the device a command runs on is logged; auto falls back
// to the CPU with the reason; OMNIPIPE_DEVICE sets the default.
func TestDeviceLogged(t *testing.T) {
	gpu := cudaWorks(t)
	for _, tc := range []struct {
		args     []string
		env      map[string]string
		kind     string
		fallback bool
	}{
		{[]string{"--device", "cpu"}, nil, "cpu", false},
		{nil, nil, "cpu", false},
		{[]string{"--device", "auto"}, nil, map[bool]string{true: "cuda", false: "cpu"}[gpu], !gpu},
		{nil, map[string]string{"OMNIPIPE_DEVICE": "auto"}, map[bool]string{true: "cuda", false: "cpu"}[gpu], !gpu},
	} {
		args := append([]string{"generate", "--model", tiny, "--text", "hi", "--max-new-tokens", "2", "--out", "", "--threads", "1"}, tc.args...)
		var stdout, stderr strings.Builder
		e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return tc.env[k] }}
		if code := run(args, e); code != exitOK {
			t.Errorf("%v %v: exit %d:\n%s", args, tc.env, code, stderr.String())
			continue
		}
		m := regexp.MustCompile(`(?m)^.*msg=device .*kind=(\S+).*$`).FindStringSubmatch(stderr.String())
		if m == nil || m[1] != tc.kind || strings.Contains(m[0], "cuda not used") != tc.fallback {
			t.Errorf("%v %v: device log %q, want kind=%s, fallback note %v:\n%s", args, tc.env, m, tc.kind, tc.fallback, stderr.String())
		}
	}
}
