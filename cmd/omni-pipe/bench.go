package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

func init() {
	register(&command{
		name: "bench",
		summary: `Measure where the time goes, stage by stage: real turns through the engine on a model folder
(--model) or on a synthetic LFM2-Audio-1.5B with random weights (--synthetic), with per-stage medians
and p90s, the loop per 80 ms frame against its memory-bandwidth floor, time to first text and audio,
the real-time factor and the codec's overlap with the backbone. Progress goes to stderr, the report
to stdout (--json for machines).`,
		usage: "(--model DIR | --synthetic) [flags] | --sessions N[,N…] (--model DIR | --synthetic | --url URL) [flags]",
		setup: setupBench,
	})
}

func setupBench(fs *flag.FlagSet, e *env) func([]string) error {
	var mf modelFlags
	mf.register(fs, e)
	synthetic := fs.Bool("synthetic", false, "build a synthetic LFM2-Audio-1.5B (random bf16 weights, real sizes; 3.2 GB in a temporary folder)")
	synthDir := fs.String("synthetic-dir", "", "with --synthetic: write the checkpoint into this folder and keep it (reuse it later with --model)")
	wav := fs.String("wav", "", "the user's speech (WAV); default: a synthetic speech-like clip")
	seconds := fs.Float64("seconds", 4.9, "length of the synthetic clip in seconds (4.9 s gives the reference measurement's 93-row prompt)")
	turns := fs.Int("turns", 3, "measured turns")
	warmup := fs.Int("warmup", 1, "turns run first and not measured")
	maxNew := fs.Int("max-new-tokens", 36, "backbone steps per turn (36: 6 text, 12 audio, 6 text, 12 audio)")
	greedy := fs.Bool("greedy", false, "greedy audio codes (default: the official temperature 1, top-k 4, seeded)")
	seed := fs.Uint64("seed", 1, "sampling seed of the first turn (turn i uses seed+i)")
	allowStop := fs.Bool("allow-stop", false, "let the model end its text, turn or speech (default: those entries are never picked, so every turn runs --max-new-tokens steps)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the turns (go tool pprof) to this file")
	var lf loadFlags
	lf.register(fs)
	return func(args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if *lf.sessions != "" {
			return lf.run(e, loadRun{mf: &mf, synthetic: *synthetic, synthDir: *synthDir, seconds: *seconds,
				maxNew: *maxNew, seed: *seed, allowStop: *allowStop, asJSON: *asJSON, cpuProfile: *cpuProfile})
		}
		explicit := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		switch {
		case *synthetic && explicit["model"]:
			return usageError{"--model and --synthetic exclude each other"}
		case !*synthetic && mf.dir == "":
			return usageError{"--model DIR or --synthetic is required"}
		case *synthDir != "" && !*synthetic:
			return usageError{"--synthetic-dir needs --synthetic"}
		}
		if _, err := mf.check(); err != nil {
			return err
		}
		if err := firstError(
			intIn("--turns", *turns, 1, 10000),
			intIn("--warmup", *warmup, 0, 1000),
			intIn("--max-new-tokens", *maxNew, 1, maxNewTokensLimit),
		); err != nil {
			return err
		}
		if *wav == "" {
			if err := floatIn("--seconds", *seconds, 0.01, 600); err != nil {
				return err
			}
		}
		if err := checkWritable("--cpuprofile", *cpuProfile); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()

		clip, source, err := benchClip(*wav, *seconds)
		if err != nil {
			return err
		}
		var (
			m    family.Model
			dev  gpu.Device
			prec nn.Precision
		)
		if *synthetic {
			m, dev, prec, err = openSynthetic(&mf, *synthDir, e)
		} else {
			fmt.Fprintf(e.stderr, "loading %s\n", mf.dir)
			m, dev, prec, err = mf.open()
		}
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		fmt.Fprintf(e.stderr, "measuring memory bandwidth\n")
		bw := bench.DeviceBandwidth(dev, workers(dev))
		opts := bench.Options{
			Clip: clip, ClipSource: source, Turns: *turns, Warmup: *warmup, MaxNewTokens: *maxNew,
			AudioSampling: pipeline.DefaultAudio, Seed: *seed, AllowStop: *allowStop,
			Precision: prec, Bandwidth: &bw, Progress: e.stderr, Weights: "memory-mapped",
		}
		if mf.noMmap {
			opts.Weights = "read into memory"
		}
		if *greedy {
			opts.AudioSampling = pipeline.Sampling{}
		}
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
		rep, err := bench.Run(ctx, m, dev, opts)
		if err != nil {
			return err
		}
		if mf.source != nil {
			rep.Model.Commit = mf.source.Commit
		}
		if *asJSON {
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}
		return rep.Print(e.stdout)
	}
}

// openSynthetic writes the real-size synthetic checkpoint (into dir, or a
// temporary folder removed once loaded: the mapping keeps the data) and
// loads it.
func openSynthetic(mf *modelFlags, dir string, e *env) (_ family.Model, _ gpu.Device, _ nn.Precision, err error) {
	p, err := mf.check()
	if err != nil {
		return nil, nil, 0, err
	}
	// The device first: one that cannot open fails before gigabytes are
	// written.
	dev, err := mf.openDevice()
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() {
		if err != nil {
			dev.Close()
		}
	}()
	ck := bench.Real()
	size, err := ck.Bytes()
	if err != nil {
		return nil, nil, 0, err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "omni-pipe-bench-"); err != nil {
			return nil, nil, 0, err
		}
		defer os.RemoveAll(dir)
	}
	fmt.Fprintf(e.stderr, "writing a synthetic LFM2-Audio-1.5B checkpoint (%.2f GB of random weights) to %s\n", float64(size)/1e9, dir)
	start := time.Now()
	if err := ck.WriteDir(dir); err != nil {
		return nil, nil, 0, fmt.Errorf("synthetic checkpoint: %w", err)
	}
	fmt.Fprintf(e.stderr, "written in %.1f s; loading\n", time.Since(start).Seconds())
	m, err := mf.loadOn(dev, dir, "LFM2-Audio-1.5B (synthetic)")
	if err != nil {
		return nil, nil, 0, err
	}
	return m, dev, p, nil
}

// benchClip reads --wav, or makes the synthetic clip at 16 kHz.
func benchClip(path string, seconds float64) (*audio.Clip, string, error) {
	if path == "" {
		c, err := bench.SpeechClip(seconds, 16000, 1)
		return c, "synthetic speech-like clip", err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	c, err := audio.Decode(f, audio.DecodeOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	return c, path, nil
}

// startCPUProfile starts a CPU profile (go tool pprof) into the file path
// ("": none) and returns what stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
