package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// loadFlags are bench's load-generator flags: --sessions switches bench
// from its stage-by-stage report to N concurrent turns.
type loadFlags struct {
	sessions, url, svg, budget *string
	trace                      *string
	maxBatch, prefillChunk     *int
	ramp                       *time.Duration
}

func (lf *loadFlags) register(fs *flag.FlagSet) {
	lf.sessions = fs.String("sessions", "", "load test: N concurrent turns, or a comma-separated list for a curve (1,4,16,64,256); each a new conversation with its own synthetic clip")
	lf.url = fs.String("url", "", "with --sessions: load a running server (http://HOST:PORT, its /v1/audio/chat) instead of an engine in this process; the API key comes from OMNIPIPE_API_KEY")
	lf.svg = fs.String("svg", "", "with --sessions: also draw sessions against time into this SVG file")
	lf.maxBatch = fs.Int("max-batch", 0, "with --sessions, in process: sessions one step serves (0: the device's default)")
	lf.prefillChunk = fs.Int("prefill-chunk", 0, "with --sessions, in process: prompt rows one step prefills (0: the device's default)")
	lf.trace = fs.String("trace", "", "with --sessions, in process: write every stage's batches (pipeline.Interval: stage, turns, steps, rows, start, end) to this file as JSON, and report for each run each stage's share and a new turn's milestones to its first audio (where a loaded engine's time goes; in --json as its trace field)")
	lf.ramp = fs.Duration("ramp", 0, "with --sessions: spread the sessions' starts evenly over this long (e.g. 10s: a steady arrival) instead of starting them all at once")
	lf.budget = fs.String("memory-budget", "", "with --sessions, in process: the engine's memory budget (e.g. 8GiB, 512MiB; default: from the device's free memory)")
}

// parseSessions parses --sessions: counts from 1 to 4096.
func parseSessions(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > 4096 {
			return nil, usageError{fmt.Sprintf("--sessions %q: want counts from 1 to 4096, comma-separated", s)}
		}
		out = append(out, n)
	}
	return out, nil
}

// parseBytes parses a size: a number of bytes with an optional KiB, MiB,
// GiB or TiB suffix (KB, MB, GB, TB: powers of 1000).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mul    int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mul := int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mul = strings.TrimSpace(rest), u.mul
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || v*float64(mul) > 1<<62 {
		return 0, fmt.Errorf("%q: want a size such as 512MiB or 8GiB", s)
	}
	return int64(v * float64(mul)), nil
}

// loadRun is what the load generator takes from bench's other flags.
type loadRun struct {
	mf        *modelFlags
	synthetic bool
	synthDir  string
	seconds   float64
	maxNew    int
	seed      uint64
	allowStop bool
	asJSON    bool
	// cpuProfile, when set, receives a CPU profile (go tool pprof) of
	// the load: where the host's time goes while N sessions run.
	cpuProfile string
}

func (lf *loadFlags) run(e *env, r loadRun) error {
	counts, err := parseSessions(*lf.sessions)
	if err != nil {
		return err
	}
	if err := firstError(
		intIn("--max-new-tokens", r.maxNew, 1, maxNewTokensLimit),
		floatIn("--seconds", r.seconds, 0.5, 600),
		intIn("--max-batch", *lf.maxBatch, 0, 4096),
		intIn("--prefill-chunk", *lf.prefillChunk, 0, 1<<16),
		checkWritable("--svg", *lf.svg),
		checkWritable("--trace", *lf.trace),
		checkWritable("--cpuprofile", r.cpuProfile),
		durationIn("--ramp", *lf.ramp, 0, time.Hour),
	); err != nil {
		return err
	}
	var budget int64
	if *lf.budget != "" {
		if budget, err = parseBytes(*lf.budget); err != nil {
			return usageError{"--memory-budget " + err.Error()}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	opts := bench.LoadOptions{ClipSeconds: r.seconds, MaxNewTokens: r.maxNew, Seed: r.seed, Ramp: *lf.ramp, Progress: e.stderr}
	var tgt bench.Target
	var tr *pipeline.Trace
	if *lf.url != "" {
		if r.synthetic || r.mf.dir != "" {
			return usageError{"--url loads a server: it excludes --model and --synthetic"}
		}
		if *lf.trace != "" {
			return usageError{"--trace records an engine in this process: it excludes --url"}
		}
		if !strings.HasPrefix(*lf.url, "http://") && !strings.HasPrefix(*lf.url, "https://") {
			return usageError{fmt.Sprintf("--url %q: want http://HOST:PORT", *lf.url)}
		}
		tgt = bench.HTTPTarget(*lf.url, e.getenv("OMNIPIPE_API_KEY"), nil)
	} else {
		switch {
		case r.synthetic && r.mf.dir != "":
			return usageError{"--model and --synthetic exclude each other"}
		case !r.synthetic && r.mf.dir == "":
			return usageError{"--sessions needs --model DIR, --synthetic or --url"}
		}
		if _, err := r.mf.check(); err != nil {
			return err
		}
		m, dev, prec, err := openLoadModel(r, e)
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		if *lf.trace != "" {
			tr = &pipeline.Trace{}
			opts.Trace = tr
		}
		eng := pipeline.New(m, dev, pipeline.Options{Precision: prec, MaxTurns: slices.Max(counts),
			MaxBatch: *lf.maxBatch, PrefillChunk: *lf.prefillChunk, MemoryBudget: budget, Trace: tr})
		defer eng.Close()
		o := eng.Options()
		fmt.Fprintf(e.stderr, "engine on %s: max batch %d, prefill chunk %d rows, memory budget %.1f GiB\n",
			dev.Name(), o.MaxBatch, o.PrefillChunk, float64(eng.Memory().Budget)/(1<<30))
		tgt = bench.EngineTarget(eng, r.allowStop)
	}
	stopProfile, err := startCPUProfile(r.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	reps, err := bench.LoadCurve(ctx, tgt, counts, opts)
	if err != nil {
		return err
	}
	if tr != nil {
		var ivs []pipeline.Interval
		for _, rep := range reps {
			ivs = append(ivs, rep.Intervals...)
		}
		if err := writeTrace(*lf.trace, ivs); err != nil {
			return err
		}
	}
	if *lf.svg != "" {
		f, err := os.Create(*lf.svg)
		if err != nil {
			return err
		}
		if err := bench.WriteLoadSVG(f, reps); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if r.asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(reps)
	}
	return bench.PrintLoad(e.stdout, reps)
}

// openLoadModel opens the in-process load's model: the synthetic
// checkpoint or --model.
func openLoadModel(r loadRun, e *env) (family.Model, gpu.Device, nn.Precision, error) {
	if r.synthetic {
		return openSynthetic(r.mf, r.synthDir, e)
	}
	fmt.Fprintf(e.stderr, "loading %s\n", r.mf.dir)
	return r.mf.open()
}

// writeTrace writes a load run's stage intervals to path as JSON.
func writeTrace(path string, ivs []pipeline.Interval) error {
	data, err := json.Marshal(ivs)
	if err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	return nil
}
