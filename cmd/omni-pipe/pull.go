package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/omni-pipe/omni-pipe/internal/hub"
)

func init() {
	register(&command{
		name: "pull",
		summary: "Download a model from the Hugging Face hub into the Hugging Face cache, and print its snapshot folder.\n\n" +
			"Only the files the model needs come (config, weights, tokenizer, codec); files the cache has are not fetched\n" +
			"again, an interrupted file resumes, and LFS files are checked against their sha256. The cache is\n" +
			"$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, laid out as huggingface_hub does (Python\n" +
			"tools share it). HF_ENDPOINT names a mirror; HF_TOKEN opens gated repos. Afterwards --model owner/name runs it.",
		usage: "[--offline] owner/name[@revision]",
		setup: func(fs *flag.FlagSet, e *env) func([]string) error {
			offline := fs.Bool("offline", false, "never touch the network: only check that the cache has the model (as HF_HUB_OFFLINE=1)")
			return func(args []string) error {
				if len(args) != 1 {
					return usageError{"want one repo id owner/name[@revision]"}
				}
				ref, err := hub.ParseRef(args[0])
				if err != nil {
					return usageError{err.Error()}
				}
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				c := newHubClient(e.getenv, *offline, e.stderr)
				snap, err := c.Pull(ctx, ref)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "%s is commit %s, in %s\n", ref, snap.Commit, c.CacheDir)
				fmt.Fprintln(e.stdout, snap.Dir)
				return nil
			}
		},
	})
}
