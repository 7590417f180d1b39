package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/demomodel"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

func init() {
	register(&command{
		name: "serve",
		summary: `Run the HTTP server: POST /v1/audio/chat (SSE or JSON), POST /v1/chat/completions
(OpenAI-compatible), GET /v1/models, /health, /metrics; docs/api.md has the details.

With no --model it serves the embedded demo model: tiny random weights whose
words and speech are noise, for trying the API. Most flags can also be set by
the environment variable named in their help; a flag given wins. API keys are
read only from OMNIPIPE_API_KEYS (comma-separated), never from a flag.
SIGINT or SIGTERM stops the server gracefully: running replies may finish for
--shutdown-grace, then they are cancelled; the exit status is 0.`,
		usage: "[--model DIR] [--addr HOST:PORT] [flags]",
		setup: setupServe,
	})
}

// envFlags declares flags whose defaults come from environment variables,
// remembering the variables that did not parse.
type envFlags struct {
	fs   *flag.FlagSet
	e    *env
	errs []error
}

func (f *envFlags) lookup(name, def string) string {
	if v := f.e.getenv(name); v != "" {
		return v
	}
	return def
}

func (f *envFlags) string(name, env, def, usage string) *string {
	return f.fs.String(name, f.lookup(env, def), usage+" (env "+env+")")
}

func (f *envFlags) int(name, env string, def int, usage string) *int {
	v := def
	if s := f.e.getenv(env); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: not an integer", env, s))
		}
		v = n
	}
	return f.fs.Int(name, v, usage+" (env "+env+")")
}

func (f *envFlags) duration(name, env string, def time.Duration, usage string) *time.Duration {
	v := def
	if s := f.e.getenv(env); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: not a duration (e.g. 30s, 5m)", env, s))
		}
		v = d
	}
	return f.fs.Duration(name, v, usage+" (env "+env+")")
}

func setupServe(fs *flag.FlagSet, e *env) func([]string) error {
	f := &envFlags{fs: fs, e: e}
	var mf modelFlags // --model (empty: the embedded demo model), --device, --threads, --precision
	mf.register(fs, e)
	addr := f.string("addr", "OMNIPIPE_ADDR", "127.0.0.1:8080", "listen address HOST:PORT")
	maxConcurrent := f.int("max-concurrent", "OMNIPIPE_MAX_CONCURRENT", 4, "turns generated at once")
	maxQueue := f.int("max-queue", "OMNIPIPE_MAX_QUEUE", 16, "requests that may wait for a turn slot; beyond it: 429 (0: none wait)")
	queueTimeout := f.duration("queue-timeout", "OMNIPIPE_QUEUE_TIMEOUT", 30*time.Second, "longest wait for a turn slot before 429")
	maxBodyMB := f.int("max-body-mb", "OMNIPIPE_MAX_BODY_MB", 32, "largest request body, MiB")
	maxAudio := f.duration("max-audio", "OMNIPIPE_MAX_AUDIO", 120*time.Second, "longest input audio")
	maxNewTokens := f.int("max-new-tokens", "OMNIPIPE_MAX_NEW_TOKENS", 2048, "largest max_new_tokens a request may ask for (steps: text tokens and 80 ms audio frames)")
	maxConvs := f.int("max-conversations", "OMNIPIPE_MAX_CONVERSATIONS", 256, "conversations kept in memory (the least recently used idle one is evicted)")
	convTTL := f.duration("conversation-ttl", "OMNIPIPE_CONVERSATION_TTL", 30*time.Minute, "how long an idle conversation is kept")
	grace := f.duration("shutdown-grace", "OMNIPIPE_SHUTDOWN_GRACE", 30*time.Second, "on SIGINT/SIGTERM, how long running replies may finish before they are cancelled")
	stall := f.duration("write-stall", "OMNIPIPE_WRITE_STALL", 30*time.Second, "drop a streaming client that accepts no data for this long")
	cors := f.string("cors-origins", "OMNIPIPE_CORS_ORIGINS", "", "comma-separated origins allowed by CORS (\"*\": any); empty: CORS off")
	logFormat := f.string("log-format", "OMNIPIPE_LOG_FORMAT", "text", "log format: text or json")
	logLevel := f.string("log-level", "OMNIPIPE_LOG_LEVEL", "info", "log level: debug, info, warn or error")

	return func(args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if len(f.errs) > 0 {
			return usageError{errors.Join(f.errs...).Error()}
		}
		if mf.device != "cpu" {
			return usageError{fmt.Sprintf("--device %q: this build runs on cpu only", mf.device)}
		}
		prec, err := nn.ParsePrecision(mf.precision)
		if err != nil {
			return usageError{"--precision: " + err.Error()}
		}
		switch {
		case *maxConcurrent < 1:
			return usageError{"--max-concurrent must be at least 1"}
		case *maxQueue < 0:
			return usageError{"--max-queue must not be negative"}
		case *maxBodyMB < 1:
			return usageError{"--max-body-mb must be at least 1"}
		case *maxNewTokens < 1:
			return usageError{"--max-new-tokens must be at least 1"}
		case *maxConvs < *maxConcurrent:
			return usageError{"--max-conversations must be at least --max-concurrent"}
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
			return usageError{"--log-level: " + err.Error()}
		}
		var handler slog.Handler
		switch opts := (&slog.HandlerOptions{Level: level}); *logFormat {
		case "text":
			handler = slog.NewTextHandler(e.stderr, opts)
		case "json":
			handler = slog.NewJSONHandler(e.stderr, opts)
		default:
			return usageError{fmt.Sprintf("--log-format %q: want text or json", *logFormat)}
		}
		log := slog.New(handler)

		queue := *maxQueue
		if queue == 0 {
			queue = -1 // server.Config: negative means no queue
		}
		cfg := server.Config{
			MaxConcurrent: *maxConcurrent, MaxQueue: queue, QueueTimeout: *queueTimeout,
			MaxBodyBytes: int64(*maxBodyMB) << 20, MaxAudio: *maxAudio, MaxNewTokens: *maxNewTokens,
			MaxConversations: *maxConvs, ConversationTTL: *convTTL, ShutdownGrace: *grace, WriteStall: *stall,
			CORSOrigins: splitList(*cors), APIKeys: splitList(e.getenv("OMNIPIPE_API_KEYS")),
			Version: versionString(), Logger: log,
		}

		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		srv := server.New(cfg)
		if mf.dir == "" {
			fmt.Fprintf(e.stderr, "\n%s\n  NO --model GIVEN: serving the embedded DEMO model (tiny, random weights).\n"+
				"  Every route works, but its words and its speech are NOISE.\n"+
				"  Pass --model DIR (an LFM2-Audio checkpoint folder) for real replies.\n%s\n\n",
				strings.Repeat("!", 78), strings.Repeat("!", 78))
			log.Warn("serving the embedded demo model: random weights, its replies are noise", "model", demomodel.Name)
		}
		// The model loads while the server already answers (/health: 503
		// "loading"); a failed load stops the server.
		serveCtx, cancelServe := context.WithCancelCause(ctx)
		defer cancelServe(nil)
		type loaded struct {
			m   *lfm2audio.Model
			dev gpu.Device
			eng *pipeline.Engine
			err error
		}
		loadc := make(chan loaded, 1)
		go func() {
			start := time.Now()
			m, dev, err := openServeModel(&mf)
			if err != nil {
				cancelServe(err)
				loadc <- loaded{err: err}
				return
			}
			eng := pipeline.New(m, dev, pipeline.Options{Precision: prec, MaxTurns: *maxConcurrent})
			log.Info("model loaded", "model", m.Name, "params", m.Params, "took", time.Since(start).Round(time.Millisecond))
			log.Debug(m.Summary())
			srv.SetBackend(&server.Backend{Engine: eng, Model: m.Name, Device: fmt.Sprintf("%s, %s", dev.Name(), prec)})
			loadc <- loaded{m: m, dev: dev, eng: eng}
		}()

		log.Info("listening", "addr", ln.Addr().String(), "version", cfg.Version)
		serveErr := srv.Serve(serveCtx, ln)
		l := <-loadc // the loader always reports
		if l.eng != nil {
			l.eng.Close()
		}
		if l.m != nil {
			l.m.Close()
			l.dev.Close()
		}
		switch {
		case l.err != nil:
			return l.err
		case serveErr != nil:
			return serveErr
		}
		log.Info("bye")
		return nil
	}
}

// openServeModel loads --model, or the embedded demo model without it.
func openServeModel(mf *modelFlags) (*lfm2audio.Model, gpu.Device, error) {
	if mf.dir != "" {
		m, dev, _, err := mf.open()
		if err != nil {
			return nil, nil, err
		}
		return m, dev, nil
	}
	dev := cpu.New(mf.threads)
	m, err := demomodel.Load(dev)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	return m, dev, nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
