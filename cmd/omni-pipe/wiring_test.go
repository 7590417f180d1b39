package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// captureEngines records the options of every engine a command builds.
func captureEngines(t *testing.T) *[]pipeline.Options {
	t.Helper()
	var got []pipeline.Options
	orig := newEngine
	t.Cleanup(func() { newEngine = orig })
	newEngine = func(m family.Model, dev gpu.Device, o pipeline.Options) *pipeline.Engine {
		got = append(got, o)
		return orig(m, dev, o)
	}
	return &got
}

// TestEngineLogsToTheCommandsLog: every command that builds an engine
// hands it its own logger, so that a stage's panic and its stack land in
// the command's log (serve's --log-format and --log-level included), not
// in the process's default logger.
func TestEngineLogsToTheCommandsLog(t *testing.T) {
	wav := writeConversationWAV(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // how the probe line looks in stderr
	}{
		// serve builds its engine before it listens; port -1 then fails.
		{"serve", []string{"serve", "--addr", "127.0.0.1:-1", "--log-format", "json", "--threads", "1"}, exitError, `"msg":"probe"`},
		{"serve-level", []string{"serve", "--addr", "127.0.0.1:-1", "--log-level", "error", "--threads", "1"}, exitError, `level=ERROR msg=probe`},
		{"generate", []string{"generate", "--text", "hi", "--max-new-tokens", "2", "--out", "", "--threads", "1"}, exitOK, `level=ERROR msg=probe`},
		{"mic", []string{"mic", "--wav", wav, "--out", filepath.Join(t.TempDir(), "o.wav"), "--max-new-tokens", "2", "--threads", "1"}, exitOK, `level=ERROR msg=probe`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := captureEngines(t)
			stdout, stderr := &strings.Builder{}, &lockedBuffer{}
			e := &env{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, getenv: func(string) string { return "" }}
			if code := run(tc.args, e); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if len(*got) != 1 {
				t.Fatalf("%d engines built, want 1", len(*got))
			}
			log := (*got)[0].Logger
			if log == nil {
				t.Fatal("the engine got no logger: its panics would go to slog.Default()")
			}
			log.Info("below serve's --log-level error")
			log.Error("probe", "stage", "test")
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("the engine's log line is not in the command's log (want %q):\n%s", tc.want, stderr)
			}
			if tc.name == "serve-level" && strings.Contains(stderr.String(), "below serve") {
				t.Errorf("the engine's logger ignores --log-level error:\n%s", stderr)
			}
		})
	}
}

// TestServeDecodeBudget: --decode-budget (and OMNIPIPE_DECODE_BUDGET)
// reach server.Config.DecodeBudget; unset, the server derives it; a size
// that does not parse is a usage error.
func TestServeDecodeBudget(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int64
	}{
		{nil, nil, 0},
		{[]string{"--decode-budget", "256MiB"}, nil, 256 << 20},
		{nil, map[string]string{"OMNIPIPE_DECODE_BUDGET": "1GB"}, 1e9},
	} {
		cfg := serveConfig(t, tc.args, tc.env)
		if cfg.DecodeBudget != tc.want {
			t.Errorf("%v %v: DecodeBudget %d, want %d", tc.args, tc.env, cfg.DecodeBudget, tc.want)
		}
	}
	code, out, errOut := runCmd(t, "", "serve", "--decode-budget", "lots")
	if code != exitUsage || !strings.Contains(out+errOut, "--decode-budget") {
		t.Errorf("--decode-budget lots: exit %d, %s", code, out+errOut)
	}
}

// TestServeMaxTextBytes: --max-text-bytes (and OMNIPIPE_MAX_TEXT_BYTES)
// reach server.Config.MaxTextBytes; the default is the server's.
func TestServeMaxTextBytes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{nil, nil, 256 << 10},
		{[]string{"--max-text-bytes", "1000"}, nil, 1000},
		{nil, map[string]string{"OMNIPIPE_MAX_TEXT_BYTES": "4096"}, 4096},
	} {
		cfg := serveConfig(t, tc.args, tc.env)
		if cfg.MaxTextBytes != tc.want {
			t.Errorf("%v %v: MaxTextBytes %d, want %d", tc.args, tc.env, cfg.MaxTextBytes, tc.want)
		}
	}
}

// TestServeFlagsDocumented: docs/api.md's configuration table has a row for
// every flag of serve, naming its environment variable where it has one.
func TestServeFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := regexp.MustCompile("^\\| `--([a-z-]+)` \\|").FindStringSubmatch(line); m != nil {
			rows[m[1]] = line
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	setupServe(fs, &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
	envRe := regexp.MustCompile(`\(env (OMNIPIPE_[A-Z_]+)\)`)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("docs/api.md's configuration table has no row for --%s", f.Name)
			return
		}
		if m := envRe.FindStringSubmatch(f.Usage); m != nil && !strings.Contains(row, "`"+m[1]+"`") {
			t.Errorf("docs/api.md's row for --%s does not name %s: %s", f.Name, m[1], row)
		}
	})
	if n < 20 {
		t.Errorf("serve has %d flags: did setupServe register them?", n)
	}
}

// serveConfig runs `serve` with args (after an address it cannot bind)
// and the environment vars, and returns the server.Config it built the
// server with.
func serveConfig(t *testing.T, args []string, vars map[string]string) *server.Config {
	t.Helper()
	var cfg *server.Config
	orig := newServer
	newServer = func(c server.Config) *server.Server {
		cfg = &c
		return orig(c)
	}
	defer func() { newServer = orig }()
	args = append([]string{"serve", "--addr", "127.0.0.1:-1", "--threads", "1"}, args...)
	e := &env{stdin: strings.NewReader(""), stdout: &strings.Builder{}, stderr: &lockedBuffer{}, getenv: func(k string) string { return vars[k] }}
	if code := run(args, e); code != exitError || cfg == nil {
		t.Fatalf("%v: exit %d, server built %v; want exit %d (no port -1) after building the server", args, code, cfg != nil, exitError)
	}
	return cfg
}
