package main

import "flag"

// Commands whose engine lands in later work say so plainly.
func init() {
	for _, c := range []struct{ name, summary, usage string }{} {
		register(&command{name: c.name, summary: c.summary, usage: c.usage,
			setup: func(fs *flag.FlagSet, e *env) func([]string) error {
				return func([]string) error { return errNotBuilt }
			}})
	}
}
