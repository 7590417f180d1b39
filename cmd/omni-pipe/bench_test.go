package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
)

func TestBenchUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "--model DIR or --synthetic is required"},
		{[]string{"bench", "--synthetic", "--model", tiny}, "exclude each other"},
		{[]string{"bench", "--model", tiny, "--synthetic-dir", "x"}, "--synthetic-dir needs --synthetic"},
		{[]string{"bench", "--model", tiny, "--turns", "0"}, "--turns 0"},
		{[]string{"bench", "--model", tiny, "--seconds", "0"}, "--seconds 0"},
		{[]string{"bench", "--model", tiny, "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		code, out, errOut := runCmd(t, "", tt.args...)
		if code != exitUsage || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("omni-pipe %v: exit %d, output %q; want exit %d containing %q", tt.args, code, out+errOut, exitUsage, tt.want)
		}
	}
}

// The command runs real turns on the tiny fixture model and prints every
// stage; --json gives the same report to machines.
func TestBenchCommand(t *testing.T) {
	args := []string{"bench", "--model", tiny, "--seconds", "1", "--turns", "2", "--warmup", "1", "--max-new-tokens", "24"}
	code, out, errOut := runCmd(t, "", args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("stderr:\n%s\nstdout:\n%s", errOut, out)
	for _, want := range []string{"log-mel", "encoder + adapter", "prefill", "backbone text step", "backbone audio step",
		"depthformer frame", "codec call", "loop per frame", "first text", "real-time factor", "overlapped the backbone",
		"bandwidth floor", "memcpy"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, want := range []string{"warm-up 1/1", "turn 2/2", "measuring memory bandwidth"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the progress lacks %q", want)
		}
	}

	prof := filepath.Join(t.TempDir(), "cpu.prof")
	code, out, errOut = runCmd(t, "", append(args, "--json", "--greedy", "--turns", "1", "--cpuprofile", prof, "--no-mmap")...)
	if code != exitOK {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	// 24 steps: 6 text (the prefill's included), 12 audio, 6 text.
	want := map[string]int{bench.KeyLogMel: 1, bench.KeyEncoder: 1, bench.KeyPrefill: 1,
		bench.KeyTextStep: 11, bench.KeyAudioStep: 12, bench.KeyDepthFrame: 12}
	for key, n := range want {
		if s, ok := rep.Stage(key); !ok || s.N != n {
			t.Errorf("stage %s: %+v, want %d intervals", key, s, n)
		}
	}
	if len(rep.Turns) != 1 || rep.Turns[0].Steps != 24 || rep.Turns[0].DecodedFrames != 12 || rep.Settings.Audio != "greedy" {
		t.Errorf("turns %+v, settings %+v: want one turn of 24 steps, 12 decoded frames, greedy audio", rep.Turns, rep.Settings)
	}
	if rep.Machine.Bandwidth.CopyGBs <= 0 || rep.Floors.AudioFrame <= 0 {
		t.Errorf("machine %+v, floors %+v: want a measured bandwidth and a floor", rep.Machine, rep.Floors)
	}
	if rep.Model.Holding != "read into memory" {
		t.Errorf("--no-mmap: weights %q", rep.Model.Holding)
	}
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("--cpuprofile wrote no profile: %v", err)
	}
}
