package main

import "flag"

// Commands whose engine lands in later work say so plainly.
func init() {
	for _, c := range []struct{ name, summary, usage string }{
		{"serve", "Run the HTTP server.", "[flags]"},
		{"mic", "Talk to the model live: microphone in, speaker out.", "[flags]"},
		{"bench", "Measure where the time goes, stage by stage.", "[flags]"},
		{"generate", "Run one turn from a WAV or text and write the reply.", "--model DIR (--wav FILE | --text STR) [flags]"},
		{"parity", "Compare every stage with a reference file.", "--model DIR --reference REF.safetensors"},
	} {
		register(&command{name: c.name, summary: c.summary, usage: c.usage,
			setup: func(fs *flag.FlagSet, e *env) func([]string) error {
				return func([]string) error { return errNotBuilt }
			}})
	}
}
