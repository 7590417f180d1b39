package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

func TestLoadUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--sessions", "4"}, "--sessions needs --model DIR, --synthetic or --url"},
		{[]string{"bench", "--sessions", "0", "--model", tiny}, `--sessions "0"`},
		{[]string{"bench", "--sessions", "1,x", "--model", tiny}, `--sessions "1,x"`},
		{[]string{"bench", "--sessions", "2", "--url", "http://x", "--model", tiny}, "excludes --model"},
		{[]string{"bench", "--sessions", "2", "--url", "x:80"}, "want http://HOST:PORT"},
		{[]string{"bench", "--sessions", "2", "--model", tiny, "--memory-budget", "lots"}, "--memory-budget"},
		{[]string{"bench", "--sessions", "2", "--model", tiny, "--max-batch", "-1"}, "--max-batch -1"},
		{[]string{"bench", "--sessions", "2", "--model", tiny, "--ramp", "-1s"}, "--ramp -1s"},
		{[]string{"bench", "--sessions", "2", "--model", tiny, "--ramp", "soon"}, `invalid value "soon" for flag -ramp`},
	} {
		code, out, errOut := runCmd(t, "", tt.args...)
		if code != exitUsage || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("omni-pipe %v: exit %d, output %q; want exit %d containing %q", tt.args, code, out+errOut, exitUsage, tt.want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{{"512MiB", 512 << 20}, {"8GiB", 8 << 30}, {"1.5 GiB", 3 << 29}, {"1000", 1000}, {"2GB", 2e9}, {"64KiB", 64 << 10}} {
		if got, err := parseBytes(tc.in); err != nil || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1MiB", "0", "lots"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) gave no error", bad)
		}
	}
}

// TestLoadCommand: bench --sessions 1,2 on the tiny model prints the
// curve's table; --json the reports, --svg the drawing, --trace the
// stages' batches.
func TestLoadCommand(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "load.svg")
	trace := filepath.Join(t.TempDir(), "trace.json")
	args := []string{"bench", "--model", tiny, "--sessions", "1,2", "--seconds", "1", "--max-new-tokens", "12", "--max-batch", "2", "--prefill-chunk", "8", "--memory-budget", "256MiB"}
	code, out, errOut := runCmd(t, "", append(args, "--svg", svg, "--trace", trace)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"first audio p50", "sessions dry", "largest N without an underrun", "stage trace over", "first audio decoded"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "max batch 2, prefill chunk 8 rows, memory budget 0.2 GiB") {
		t.Errorf("stderr: %s", errOut)
	}
	if data, err := os.ReadFile(svg); err != nil || !strings.HasPrefix(string(data), "<svg") {
		t.Errorf("svg: %v", err)
	}
	var ivs []pipeline.Interval
	if data, err := os.ReadFile(trace); err != nil {
		t.Errorf("--trace: %v", err)
	} else if err := json.Unmarshal(data, &ivs); err != nil {
		t.Errorf("--trace: %v", err)
	}
	stages := map[string]int{}
	for _, iv := range ivs {
		stages[iv.Stage]++
		if iv.End.Before(iv.Start) || len(iv.Turns) == 0 {
			t.Errorf("--trace: interval %+v", iv)
		}
	}
	for _, st := range []string{pipeline.StageFrontend, pipeline.StageEncoder, pipeline.StageBackbone, pipeline.StageDepth, pipeline.StageCodec} {
		if stages[st] == 0 {
			t.Errorf("--trace: no %s interval (%v)", st, stages)
		}
	}
	prof := filepath.Join(t.TempDir(), "load.prof")
	code, out, errOut = runCmd(t, "", append(args, "--json", "--cpuprofile", prof, "--trace", trace)...)
	if code != exitOK {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("--cpuprofile with --sessions wrote no profile: %v", err)
	}
	var reps []bench.LoadReport
	if err := json.Unmarshal([]byte(out), &reps); err != nil || len(reps) != 2 || reps[1].Sessions != 2 || len(reps[1].PerSession) != 2 || reps[0].MemoryBudget != 256<<20 {
		t.Fatalf("--json: %v, %+v", err, reps)
	}
	// Each run of the curve has its own trace: its first audio milestone
	// counts that run's turns only.
	for _, r := range reps {
		if r.Trace == nil || len(r.Trace.Milestones) == 0 {
			t.Fatalf("--json --trace: run of %d sessions has no trace summary", r.Sessions)
		}
		last := r.Trace.Milestones[len(r.Trace.Milestones)-1]
		if last.Name != bench.MilestoneFirstAudio || last.Turns != r.Sessions {
			t.Errorf("--json --trace: run of %d sessions: %+v, want %d turns to first audio", r.Sessions, last, r.Sessions)
		}
	}
	// --ramp 400ms: of 2 sessions the second starts 200 ms into the run.
	code, out, errOut = runCmd(t, "", "bench", "--model", tiny, "--sessions", "2", "--seconds", "1", "--max-new-tokens", "12", "--ramp", "400ms", "--json")
	if code != exitOK {
		t.Fatalf("--ramp: exit %d: %s", code, errOut)
	}
	reps = nil
	if err := json.Unmarshal([]byte(out), &reps); err != nil || len(reps) != 1 || len(reps[0].PerSession) != 2 {
		t.Fatalf("--ramp: %v, %+v", err, reps)
	}
	if s := reps[0].PerSession[1]; s.StartMS < 200 {
		t.Errorf("--ramp 400ms: the second of 2 sessions started at %.0f ms, want ≥ 200", s.StartMS)
	}
}

// TestServeBatchFlags: --max-batch, --prefill-chunk and --memory-budget
// (and their environment variables) reach the engine's options; unset,
// the engine picks the device's defaults.
func TestServeBatchFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want pipeline.Options
	}{
		{nil, nil, pipeline.Options{}},
		{[]string{"--max-batch", "32", "--prefill-chunk", "128", "--memory-budget", "2GiB"}, nil, pipeline.Options{MaxBatch: 32, PrefillChunk: 128, MemoryBudget: 2 << 30}},
		{nil, map[string]string{"OMNIPIPE_MAX_BATCH": "7", "OMNIPIPE_MEMORY_BUDGET": "1MiB"}, pipeline.Options{MaxBatch: 7, MemoryBudget: 1 << 20}},
	} {
		got := captureEngines(t)
		e := &env{stdin: strings.NewReader(""), stdout: &strings.Builder{}, stderr: &lockedBuffer{},
			getenv: func(k string) string { return tc.env[k] }}
		args := append([]string{"serve", "--addr", "127.0.0.1:-1", "--threads", "1"}, tc.args...)
		if code := run(args, e); code != exitError { // the port fails after the engine is built
			t.Fatalf("%v: exit %d", args, code)
		}
		if len(*got) != 1 {
			t.Fatalf("%v: %d engines", args, len(*got))
		}
		o := (*got)[0]
		if o.MaxBatch != tc.want.MaxBatch || o.PrefillChunk != tc.want.PrefillChunk || o.MemoryBudget != tc.want.MemoryBudget {
			t.Errorf("%v %v: options max batch %d, chunk %d, budget %d; want %+v", args, tc.env, o.MaxBatch, o.PrefillChunk, o.MemoryBudget, tc.want)
		}
	}
	code, out, errOut := runCmd(t, "", "serve", "--memory-budget", "lots")
	if code != exitUsage || !strings.Contains(out+errOut, "--memory-budget") {
		t.Errorf("--memory-budget lots: exit %d, %s", code, out+errOut)
	}
}
