package main

import (
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3").
var version = "dev"

func versionString() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("omni-pipe %s (%s, %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func init() {
	register(&command{
		name:    "version",
		summary: "Print the version.",
		setup: func(fs *flag.FlagSet, e *env) func([]string) error {
			return func(args []string) error {
				if err := noArgs(args); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, versionString())
				return nil
			}
		},
	})
}
