// Command omni-pipe serves LiquidAI's end-to-end speech models: speech in,
// streamed text and 24 kHz speech out.
//
//	omni-pipe serve      HTTP server (/v1/audio/chat, OpenAI-compatible routes)
//	omni-pipe mic        talk to the model live (microphone → speaker)
//	omni-pipe generate   one turn from a WAV or text, with stage dumps
//	omni-pipe parity     compare every stage with a reference file
//	omni-pipe bench      where the time goes, stage by stage
//	omni-pipe decode     audio codes → speech with the model's codec
//	omni-pipe tokenize   text → token ids (like llama-tokenize)
//	omni-pipe pull       download a model from the Hugging Face hub
//	omni-pipe version    print the version
//
// Run `omni-pipe help COMMAND` for a command's flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // bad command line
)

// env is what a command runs with; tests substitute it.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // the argument synopsis after the name
	// setup declares the flags and returns the function that runs the
	// command once they are parsed.
	setup func(fs *flag.FlagSet, e *env) func(args []string) error
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// usageError is a bad command line (exit code 2).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func main() {
	os.Exit(run(os.Args[1:], &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

func run(args []string, e *env) int {
	if len(args) == 0 {
		printHelp(e.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[1] != "help" {
			c, ok := commands[args[1]]
			if !ok {
				fmt.Fprintf(e.stderr, "omni-pipe: unknown command %q (run 'omni-pipe help' for the list)\n", args[1])
				return exitUsage
			}
			fs := newFlagSet(c, e)
			c.setup(fs, e)
			printUsage(e.stdout, c, fs)
			return exitOK
		}
		printHelp(e.stdout)
		return exitOK
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(e.stderr, "omni-pipe: unknown command %q (run 'omni-pipe help' for the list)\n", name)
		return exitUsage
	}
	fs := newFlagSet(c, e)
	runFn := c.setup(fs, e)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h or --help
			printUsage(e.stdout, c, fs)
			return exitOK
		}
		// The error and where the usage is, not the usage itself: a page of
		// flags would bury the one line that matters.
		fmt.Fprintf(e.stderr, "omni-pipe %s: %v\n", name, err)
		fmt.Fprintf(e.stderr, "run 'omni-pipe help %s' for usage\n", name)
		return exitUsage
	}
	err := runFn(fs.Args())
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "omni-pipe %s: %v\n", name, err)
		fmt.Fprintf(e.stderr, "run 'omni-pipe help %s' for usage\n", name)
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "omni-pipe %s: %v\n", name, err)
		return exitError
	}
}

// newFlagSet returns c's flag set. It prints nothing itself: run reports
// parse errors in one line, and printUsage writes the usage on request.
func newFlagSet(c *command, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("omni-pipe "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// printUsage writes c's synopsis, summary and flags.
func printUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: omni-pipe %s %s\n\n%s\n", c.name, c.usage, c.summary)
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if has {
		fmt.Fprintf(w, "\nflags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

func printHelp(w io.Writer) {
	fmt.Fprintf(w, "omni-pipe serves LiquidAI's end-to-end speech models: speech in, streamed text and 24 kHz speech out.\n\nusage: omni-pipe COMMAND [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, firstLine(commands[n].summary))
	}
	fmt.Fprintf(w, "  %-9s %s\n\nrun 'omni-pipe help COMMAND' for a command's flags\n", "help", "show this help, or a command's")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// noArgs rejects positional arguments.
func noArgs(args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", args[0])}
	}
	return nil
}
