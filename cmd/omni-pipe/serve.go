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

	"github.com/omni-pipe/omni-pipe/internal/demomodel"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server"
)

// newEngine and newServer build the engine and the server (variables, so
// that tests see what the commands hand them).
var (
	newEngine = pipeline.New
	newServer = server.New
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
	maxBatch := f.int("max-batch", "OMNIPIPE_MAX_BATCH", 0, "sessions one backbone or depthformer step serves, separately from --max-concurrent (0: the device's default: 256 on a GPU, 4 per core on the CPU)")
	prefillChunk := f.int("prefill-chunk", "OMNIPIPE_PREFILL_CHUNK", 0, "prompt rows one step prefills, interleaved with the other sessions' frames (0: the device's default: 512 on a GPU, 64 on the CPU)")
	memBudget := f.string("memory-budget", "OMNIPIPE_MEMORY_BUDGET", "", "bytes for KV caches, history and codec state, e.g. 8GiB (default: 9/10 of a GPU's free memory, half the host's available memory); a turn that does not fit evicts idle conversations or gets 429")
	maxQueue := f.int("max-queue", "OMNIPIPE_MAX_QUEUE", 16, "requests that may wait for a turn slot; beyond it: 429 (0: none wait)")
	queueTimeout := f.duration("queue-timeout", "OMNIPIPE_QUEUE_TIMEOUT", 30*time.Second, "longest wait for a turn slot before 429")
	maxBodyMB := f.int("max-body-mb", "OMNIPIPE_MAX_BODY_MB", 32, "largest request body, MiB")
	decodeBudget := f.string("decode-budget", "OMNIPIPE_DECODE_BUDGET", "", "memory the request bodies being read and decoded may hold at once, e.g. 1GiB; each is charged 7 bytes a byte, and one that does not fit within a second gets 429 (default: --max-concurrent bodies of --max-body-mb)")
	maxAudio := f.duration("max-audio", "OMNIPIPE_MAX_AUDIO", 120*time.Second, "longest input audio")
	maxNewTokens := f.int("max-new-tokens", "OMNIPIPE_MAX_NEW_TOKENS", 2048, "largest max_new_tokens a request may ask for (steps: text tokens and 80 ms audio frames)")
	maxTextBytes := f.int("max-text-bytes", "OMNIPIPE_MAX_TEXT_BYTES", 256<<10, "largest request text, and separately system prompt, in bytes; longer: 400 text_too_long, before tokenizing")
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
		prec, err := mf.check()
		if err != nil {
			return err
		}
		if err := firstError(
			intIn("--max-concurrent", *maxConcurrent, 1, 1024),
			intIn("--max-queue", *maxQueue, 0, 1<<16),
			intIn("--max-batch", *maxBatch, 0, 4096),
			intIn("--prefill-chunk", *prefillChunk, 0, 1<<16),
			durationIn("--queue-timeout", *queueTimeout, time.Millisecond, time.Hour),
			intIn("--max-body-mb", *maxBodyMB, 1, 4096),
			durationIn("--max-audio", *maxAudio, time.Second, time.Hour),
			intIn("--max-new-tokens", *maxNewTokens, 1, maxNewTokensLimit),
			intIn("--max-text-bytes", *maxTextBytes, 1, maxTextBytesLimit),
			durationIn("--conversation-ttl", *convTTL, time.Second, 7*24*time.Hour),
			durationIn("--shutdown-grace", *grace, time.Millisecond, time.Hour),
			durationIn("--write-stall", *stall, time.Second, time.Hour),
		); err != nil {
			return err
		}
		if *maxConvs < *maxConcurrent || *maxConvs > 1<<20 {
			return usageError{fmt.Sprintf("--max-conversations %d: want %d (--max-concurrent) to %d", *maxConvs, *maxConcurrent, 1<<20)}
		}
		budget, err := optionalBytes("--memory-budget", *memBudget)
		if err != nil {
			return err
		}
		decodeBytes, err := optionalBytes("--decode-budget", *decodeBudget)
		if err != nil {
			return err
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
			MaxBodyBytes: int64(*maxBodyMB) << 20, DecodeBudget: decodeBytes, MaxAudio: *maxAudio, MaxNewTokens: *maxNewTokens, MaxTextBytes: *maxTextBytes,
			MaxConversations: *maxConvs, ConversationTTL: *convTTL, ShutdownGrace: *grace, WriteStall: *stall,
			CORSOrigins: splitList(*cors), APIKeys: splitList(e.getenv("OMNIPIPE_API_KEYS")),
			Version: versionString(), Logger: log,
		}

		// Load first: a model that does not load is the error, before any
		// "listening" (mapping the weights takes well under a second).
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		mf.log = log
		start := time.Now()
		m, dev, _, err := mf.openOrDemo("serving")
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		if mf.dir == "" {
			log.Warn("serving the embedded demo model: random weights, its replies are noise", "model", demomodel.Name)
		}
		eng := newEngine(m, dev, pipeline.Options{Precision: prec, MaxTurns: *maxConcurrent, Logger: log,
			MaxBatch: *maxBatch, PrefillChunk: *prefillChunk, MemoryBudget: budget})
		defer eng.Close()
		loaded := []any{"model", m.Info().Name, "family", m.Info().Family, "codec", m.AudioCodec().Kind(), "params", m.Info().Params, "took", time.Since(start).Round(time.Millisecond)}
		if mf.source != nil {
			loaded = append(loaded, "commit", mf.source.Commit, "folder", mf.source.Dir)
		}
		log.Info("model loaded", loaded...)
		if s, ok := m.(interface{ Summary() string }); ok {
			log.Debug(s.Summary())
		}

		srv := newServer(cfg)
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		var commit string
		if mf.source != nil {
			commit = mf.source.Commit
		}
		srv.SetBackend(&server.Backend{Engine: eng, Model: m.Info().Name, Commit: commit, Device: fmt.Sprintf("%s, %s", dev.Name(), prec), GPU: dev})
		log.Info("listening", "addr", ln.Addr().String(), "version", cfg.Version)
		if err := srv.Serve(ctx, ln); err != nil {
			return err
		}
		log.Info("bye")
		return nil
	}
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

// optionalBytes parses the size flag named's value v (0 when empty: the
// server's default), a usage error when it does not parse.
func optionalBytes(name, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	b, err := parseBytes(v)
	if err != nil {
		return 0, usageError{name + " " + err.Error()}
	}
	return b, nil
}
