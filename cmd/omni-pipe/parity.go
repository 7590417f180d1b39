package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/omni-pipe/omni-pipe/internal/parity"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
)

func init() {
	register(&command{
		name: "parity",
		summary: `Replay a reference case (made with the official code) and compare every stage with it:
resampler, mel, encoder, adapter, prompt, prefill rows and text logits, teacher-forced steps,
depthformer greedy codes, codes through the loop, free-running greedy, codec. Misses are
measured in bf16 ulps of the reference's top logit (docs/parity.md has the rules). Exits 1 if a
stage is outside its tolerance.`,
		usage: "--model DIR --reference REF.safetensors",
		setup: func(fs *flag.FlagSet, e *env) func([]string) error {
			var mf modelFlags
			mf.register(fs, e)
			refPath := fs.String("reference", "", "reference case file (safetensors with the case in its metadata)")
			picksPath := fs.String("picks", "", "also write every pick of the runs that see their own rows (run, step, codebook, both picks, the reference's margin and the run's shift, in ulps) to this file as JSON lines")
			probs := fs.String("attention-probs", "flash", "how BF16 attention rounds its probabilities: flash (bf16 before the product with V, as the reference's flash kernels) or fp32 (kept in float32, for comparison)")
			return func(args []string) error {
				if err := noArgs(args); err != nil {
					return err
				}
				if *refPath == "" {
					return usageError{"--reference is required"}
				}
				if *probs != "flash" && *probs != "fp32" {
					return usageError{fmt.Sprintf("--attention-probs %q: want flash or fp32", *probs)}
				}
				ref, err := refcase.Open(*refPath)
				if err != nil {
					return err
				}
				defer ref.Close()
				m, dev, _, err := mf.open()
				if err != nil {
					return err
				}
				defer dev.Close()
				defer m.Close()
				lm, err := lfm2audioModel(m, "parity")
				if err != nil {
					return err
				}
				lm.Backbone.FlashAttention = *probs == "flash"
				lm.Depth.FlashAttention = *probs == "flash"
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
				defer stop()
				rep, err := parity.Run(ctx, lm, dev, ref)
				if err != nil {
					return err
				}
				rep.Print(e.stdout)
				if *picksPath != "" {
					if err := writePicks(*picksPath, rep); err != nil {
						return err
					}
				}
				if !rep.OK() {
					return errors.New("a stage is outside its tolerance")
				}
				return nil
			}
		},
	})
}

// writePicks writes rep's picks to path.
func writePicks(path string, rep *parity.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--picks: %w", err)
	}
	if err := rep.WritePicks(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--picks: %w", err)
	}
	return nil
}
