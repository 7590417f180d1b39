// Package server is omni-pipe's HTTP API, on echo v4:
//
//	POST /v1/audio/chat         one turn: speech and/or text in; SSE text and 24 kHz PCM out (or one JSON)
//	POST /v1/chat/completions   the same, in OpenAI's Chat Completions audio format
//	GET  /v1/realtime           OpenAI's Realtime API over a WebSocket: server VAD, barge-in
//	GET  /                      a browser page that talks to /v1/realtime
//	GET  /v1/models             the served model
//	GET  /health                readiness, model, backend, device, version, sessions in use
//	GET  /metrics               Prometheus metrics
//
// A Server admits at most Config.MaxConcurrent turns at once, queues at
// most Config.MaxQueue more, and turns the rest away with 429 and
// Retry-After; until they have a slot, the requests' bodies and their
// decoded audio hold at most Config.DecodeBudget bytes (429 beyond).
// Conversations (pipeline sessions) are kept by id for
// Config.ConversationTTL. Every turn runs under its request's context: a
// client that hangs up stops its turn at the next frame. docs/api.md
// describes the wire formats.
package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// Config configures a Server. Zero values take the defaults.
type Config struct {
	// MaxConcurrent is the number of turns that generate at once (default
	// 4). The engine's MaxTurns must be at least this.
	MaxConcurrent int
	// MaxQueue is the number of requests that may wait for a turn slot
	// (default 16; negative: none wait). Beyond it requests get 429.
	MaxQueue int
	// QueueTimeout bounds a request's wait for a slot (default 30 s).
	QueueTimeout time.Duration
	// RetryAfter is what 429 replies ask clients to wait (default 1 s).
	RetryAfter time.Duration
	// MaxBodyBytes bounds a request body (default 32 MiB).
	MaxBodyBytes int64
	// DecodeBudget bounds, in bytes, the memory that request bodies being
	// read and decoded hold at once, server-wide (default MaxConcurrent
	// largest bodies: MaxConcurrent × 7 × MaxBodyBytes, 896 MiB). A body
	// is charged 7 bytes a byte (decodeCost: the body, its audio's base64
	// text, the WAV bytes and the float samples) for its declared
	// Content-Length (else MaxBodyBytes) from before it is read, for its
	// size once it has arrived, then for its decoded samples' bytes until
	// the request has a turn slot (or is refused one). A realtime client
	// event likewise, from when it has arrived until the session has taken
	// its audio. A request whose charge does not fit within DecodeWait gets
	// 429 decode_budget_exceeded with Retry-After (a realtime event: an
	// error event); a charge above the whole budget takes all of it (the
	// request decodes alone).
	DecodeBudget int64
	// DecodeWait bounds a request's wait for decode budget (default 1 s;
	// negative: none waits). Waiting holds no memory: the body is read
	// once the budget is reserved.
	DecodeWait time.Duration
	// BodyTimeout bounds the upload of a request body (default 60 s).
	BodyTimeout time.Duration
	// MaxAudio bounds an input clip's duration (default 120 s).
	MaxAudio time.Duration
	// MaxTextBytes bounds a request's text and, separately, its system
	// prompt, in bytes (default 256 KiB: at the 3 to 5 bytes a token of
	// English or CJK text, more than fits in the model's 32768 positions).
	// Longer text is refused with 400 text_too_long before it is
	// tokenized.
	MaxTextBytes int
	// MaxNewTokens bounds a request's max_new_tokens (default 2048 steps,
	// at most about 2.7 minutes of speech).
	MaxNewTokens int
	// MaxConversations bounds the conversations kept (default 256); a new
	// one then evicts the least recently used idle one.
	MaxConversations int
	// ConversationTTL is how long an idle conversation is kept (default
	// 30 min).
	ConversationTTL time.Duration
	// ShutdownGrace is how long running turns may go on after a shutdown
	// begins before they are cancelled (default 30 s).
	ShutdownGrace time.Duration
	// WriteStall drops a streaming client whose connection takes no
	// event for this long (default 30 s). Streams themselves have no
	// deadline.
	WriteStall time.Duration
	// CORSOrigins, when set, allows browser requests from these origins
	// ("*" for any). CORS is off by default.
	CORSOrigins []string
	// APIKeys, when set, are the bearer tokens the /v1 routes accept.
	APIKeys []string
	// Realtime configures /v1/realtime (realtime.go).
	Realtime RealtimeConfig
	// Version is reported by /health and /metrics.
	Version string
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) defaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 4
	}
	switch {
	case c.MaxQueue == 0:
		c.MaxQueue = 16
	case c.MaxQueue < 0:
		c.MaxQueue = 0
	}
	def(&c.QueueTimeout, 30*time.Second)
	def(&c.RetryAfter, time.Second)
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.DecodeBudget <= 0 {
		c.DecodeBudget = decodeCost(c.MaxBodyBytes)
		if c.DecodeBudget <= math.MaxInt64/int64(c.MaxConcurrent) {
			c.DecodeBudget *= int64(c.MaxConcurrent)
		}
	}
	switch {
	case c.DecodeWait == 0:
		c.DecodeWait = time.Second
	case c.DecodeWait < 0:
		c.DecodeWait = 0
	}
	def(&c.BodyTimeout, 60*time.Second)
	def(&c.MaxAudio, 120*time.Second)
	if c.MaxTextBytes <= 0 {
		c.MaxTextBytes = 256 << 10
	}
	if c.MaxNewTokens <= 0 {
		c.MaxNewTokens = 2048
	}
	if c.MaxConversations <= 0 {
		c.MaxConversations = 256
	}
	def(&c.ConversationTTL, 30*time.Minute)
	def(&c.ShutdownGrace, 30*time.Second)
	def(&c.WriteStall, 30*time.Second)
	c.Realtime.defaults(c.MaxAudio)
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Backend is what the server runs turns on.
type Backend struct {
	Engine *pipeline.Engine
	Model  string // the model's name, as /v1/models lists it
	// Commit is the Hugging Face commit of a model that came by its repo
	// id (Model is then owner/name); empty for a folder.
	Commit string
	Device string // the backend in words, e.g. "cpu (2 workers, bf16)"
	// GPU is the device the engine runs on (any gpu.Device, the CPU
	// backend's too). /health and /metrics describe it with
	// gpu.DescribeDevice at each request: kind, name, driver and memory in
	// use. Nil: no device is reported.
	GPU gpu.Device
}

// modelFamily returns the served model's family, its codec and its
// family's defaults (zero without an engine).
func (b *Backend) modelFamily() (name, codec string, defaults *family.Defaults) {
	if b.Engine == nil {
		return "", "", nil
	}
	m := b.Engine.Model()
	d := family.DefaultsOf(m.Template())
	return m.Info().Family, m.AudioCodec().Kind(), &d
}

// Server is the HTTP API. Create it with New, hand it the model with
// SetBackend once loaded (until then /health answers 503), and run it with
// Serve or mount it as an http.Handler.
type Server struct {
	cfg      Config
	e        *echo.Echo
	log      *slog.Logger
	lim      *limiter
	decode   *byteBudget // the memory of the request bodies being decoded
	convs    *conversations
	met      *metrics
	rt       *rtState
	limits   limits
	backend  atomic.Pointer[Backend]
	draining atomic.Bool
	inflight atomic.Int64 // requests being handled
	started  time.Time
	seed     func() int64 // random seeds for requests without one

	// Test hooks, nil in production: hookDecode runs before a request's
	// body is decoded (holding its decode budget), hookEncode before its
	// text is tokenized, hookStart before its turn starts on the engine.
	hookDecode func(ctx context.Context)
	hookEncode func(ctx context.Context)
	hookStart  func(req *pipeline.Request)
}

// New returns a server whose model is still loading.
func New(cfg Config) *Server {
	cfg.defaults()
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		lim:     newLimiter(cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout),
		decode:  newByteBudget(cfg.DecodeBudget),
		convs:   newConversations(cfg.MaxConversations, cfg.ConversationTTL),
		limits:  limits{maxAudio: cfg.MaxAudio, maxNewTokens: cfg.MaxNewTokens, maxTextBytes: cfg.MaxTextBytes},
		started: time.Now(),
		seed:    randomSeed,
	}
	s.met = newMetrics(
		func() float64 { return float64(s.lim.active()) },
		func() float64 { return float64(s.lim.queued()) },
		func() float64 { return float64(s.convs.count()) },
		s.device, s.memory)
	s.met.registerDecode(cfg.DecodeBudget, func() float64 { return float64(s.decode.inUse()) })
	s.rt = newRTState(s.met.reg)
	s.e = s.routes()
	return s
}

// SetBackend makes the server ready: from now on turns run on b.
func (s *Server) SetBackend(b *Backend) {
	s.backend.Store(b)
	s.met.info.WithLabelValues(b.Model, b.Device, s.cfg.Version).Set(1)
	s.log.Info("ready", "model", b.Model, "backend", b.Device)
}

// device describes the backend's device now, or returns false while the
// model loads or when the backend names none.
func (s *Server) device() (gpu.Info, bool) {
	b := s.backend.Load()
	if b == nil || b.GPU == nil {
		return gpu.Info{}, false
	}
	return gpu.DescribeDevice(b.GPU), true
}

// memory returns the engine's memory, or false while the model loads.
func (s *Server) memory() (pipeline.MemoryStats, bool) {
	b := s.backend.Load()
	if b == nil || b.Engine == nil {
		return pipeline.MemoryStats{}, false
	}
	return b.Engine.Memory(), true
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.e.ServeHTTP(w, r) }

// errShutdown is the cause of the turns cancelled when the shutdown grace
// period ends.
var errShutdown = errors.New("the server shut down")

// Serve serves HTTP on ln until ctx is done, then shuts down gracefully:
// while running turns finish (for up to Config.ShutdownGrace) it keeps
// accepting connections but answers /health and new turns with 503
// shutting_down, so that a load balancer's probes see the drain; once no
// turn is left it stops accepting and closes idle connections. At the end
// of the grace period it cancels the turns still running (they stop at
// their next frame) and waits for their handlers. It returns nil after a
// clean shutdown. The caller closes the engine afterwards.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	base, cancelAll := context.WithCancelCause(context.Background())
	defer cancelAll(nil)
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	stopSweep := s.sweepConversations()
	defer stopSweep()
	defer s.convs.closeAll()

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("shutting down: refusing new turns, letting running ones finish",
		"active", s.lim.active(), "queued", s.lim.queued(), "grace", s.cfg.ShutdownGrace)
	gctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	s.waitTurns(gctx)
	if err := hs.Shutdown(gctx); err != nil {
		s.log.Warn("grace period over: cancelling the turns still running", "active", s.lim.active())
		cancelAll(errShutdown)
		// Cancelled turns end at their next frame; their handlers then
		// drain and return.
		for deadline := time.Now().Add(10 * time.Second); s.inflight.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if n := s.inflight.Load(); n > 0 {
			s.log.Error("requests still running after cancellation", "requests", n)
		}
		hs.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	s.log.Info("shut down")
	return nil
}

// waitTurns returns once no turn holds or waits for a slot, or when ctx
// ends.
func (s *Server) waitTurns(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.lim.active() > 0 || s.lim.queued() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepConversations forgets idle conversations periodically until the
// returned function is called.
func (s *Server) sweepConversations() (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	every := min(s.cfg.ConversationTTL/4, time.Minute)
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if n := s.convs.sweep(); n > 0 {
					s.log.Info("forgot idle conversations", "count", n)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

// routes builds the echo router and its middleware.
func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard) // logs go through slog
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = s.handleError

	e.Use(s.requestID, s.track)
	e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogLatency: true, LogRemoteIP: true, LogMethod: true, LogURI: true, LogRoutePath: true,
		LogRequestID: true, LogStatus: true, LogError: true, LogResponseSize: true, LogUserAgent: true,
		HandleError: true,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			route := v.RoutePath
			if route == "" || strings.HasSuffix(route, "*") {
				route = "unmatched"
			}
			s.met.request(route, v.Status)
			level := slog.LevelInfo
			if v.Status >= 500 {
				level = slog.LevelError
			}
			attrs := []slog.Attr{slog.String("request_id", v.RequestID), slog.String("method", v.Method),
				slog.String("uri", v.URI), slog.Int("status", v.Status), slog.Duration("latency", v.Latency),
				slog.Int64("bytes_out", v.ResponseSize), slog.String("remote_ip", v.RemoteIP),
				slog.String("user_agent", v.UserAgent)}
			if v.Error != nil {
				attrs = append(attrs, slog.String("error", v.Error.Error()))
			}
			s.log.LogAttrs(context.Background(), level, "request", attrs...)
			return nil
		},
	}))
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			s.logger(c).Error("panic in handler", "panic", err, "stack", string(stack))
			return newError(http.StatusInternalServerError, typeServer, codeInternal, "", "internal error (logged with this request id)")
		},
	}))
	if len(s.cfg.CORSOrigins) > 0 {
		// No AllowHeaders: a preflight is allowed the headers it asks for.
		// The openai SDKs send their own (X-Stainless-OS, -Lang, -Arch,
		// -Runtime, -Retry-Count, -Timeout, …, more with each release),
		// which a fixed list refused, failing every browser request.
		e.Use(middleware.CORSWithConfig(middleware.CORSConfig{
			AllowOrigins:  s.cfg.CORSOrigins,
			AllowMethods:  []string{http.MethodGet, http.MethodPost, http.MethodOptions},
			ExposeHeaders: []string{echo.HeaderXRequestID, headerConversationID, echo.HeaderRetryAfter},
		}))
	}

	e.GET("/health", s.health)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{})))
	// Per-route middleware: an echo Group with middleware would answer 404
	// instead of 405 for a wrong method.
	e.GET("/v1/models", s.models, s.auth)
	e.POST("/v1/audio/chat", s.audioChat, s.auth)
	e.POST("/v1/chat/completions", s.chatCompletions, s.auth)
	e.GET("/v1/realtime", s.realtime) // its own auth: browsers send the key as a subprotocol
	s.webRoutes(e)
	return e
}

const headerConversationID = "X-Conversation-Id"

// requestID gives every request an id: the client's X-Request-Id when it
// is a sane token, else a new one. It is echoed in the response header,
// the logs and error bodies.
func (s *Server) requestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if !saneID(id) {
			id = newID("req_")
			c.Request().Header.Set(echo.HeaderXRequestID, id)
		}
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

// saneID accepts 1 to 128 characters of [A-Za-z0-9._:-].
func saneID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return false
		}
	}
	return true
}

func requestID(c echo.Context) string { return c.Response().Header().Get(echo.HeaderXRequestID) }

// logger returns the server's logger with the request's id.
func (s *Server) logger(c echo.Context) *slog.Logger {
	return s.log.With("request_id", requestID(c))
}

// track counts the requests in flight, for shutdown.
func (s *Server) track(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		s.inflight.Add(1)
		defer s.inflight.Add(-1)
		if s.draining.Load() { // let clients move to another server
			c.Response().Header().Set(echo.HeaderConnection, "close")
		}
		return next(c)
	}
}

// auth checks the bearer token when API keys are configured.
func (s *Server) auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if len(s.cfg.APIKeys) == 0 {
			return next(c)
		}
		token, ok := strings.CutPrefix(c.Request().Header.Get(echo.HeaderAuthorization), "Bearer ")
		if ok {
			for _, k := range s.cfg.APIKeys {
				if subtle.ConstantTimeCompare([]byte(token), []byte(k)) == 1 {
					return next(c)
				}
			}
		}
		return newError(http.StatusUnauthorized, typeInvalidRequest, codeInvalidAPIKey, "", "missing or wrong API key (Authorization: Bearer KEY)")
	}
}

// statusClientClosed records a request whose client hung up before its
// reply (nginx's 499 "client closed request"): not a server error.
const statusClientClosed = 499

// clientGone reports whether the request's context ended other than by
// the server's shutdown: the client hung up (or its connection broke).
func clientGone(c echo.Context) bool {
	ctx := c.Request().Context()
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errShutdown)
}

// handleError writes a handler's error as an OpenAI-style error body.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *apiError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he) && he.Code == http.StatusNotFound:
		ae = newError(he.Code, typeInvalidRequest, codeNotFound, "", fmt.Sprintf("no route %s %s (see docs/api.md)", c.Request().Method, c.Request().URL.Path))
	case errors.As(err, &he) && he.Code == http.StatusMethodNotAllowed:
		ae = newError(he.Code, typeInvalidRequest, codeMethodNotAllowed, "", fmt.Sprintf("%s is not allowed on %s", c.Request().Method, c.Request().URL.Path))
	case errors.As(err, &he):
		ae = newError(he.Code, typeInvalidRequest, "http_"+fmt.Sprint(he.Code), "", fmt.Sprint(he.Message))
	default:
		s.logger(c).Error("handler error", "err", err)
		ae = newError(http.StatusInternalServerError, typeServer, codeInternal, "", "internal error (logged with this request id)")
	}
	if ae.Code == codeCancelled && clientGone(c) {
		// The work stopped because the client hung up; nobody reads an
		// error body. Logged and counted as 499, not as a 503.
		c.Response().WriteHeader(statusClientClosed)
		return
	}
	s.met.errors.WithLabelValues(ae.Code).Inc()
	if err := writeError(c, ae); err != nil {
		s.logger(c).Warn("write error response", "err", err)
	}
}

// ready returns the backend, or a 503 while the model loads or the server
// shuts down.
func (s *Server) ready() (*Backend, *apiError) {
	if s.draining.Load() {
		return nil, shuttingDown()
	}
	b := s.backend.Load()
	if b == nil {
		e := newError(http.StatusServiceUnavailable, typeServer, codeModelLoading, "", "the model is still loading; retry shortly")
		e.retryAfter = s.cfg.RetryAfter
		return nil, e
	}
	return b, nil
}

// decodeCostFactor is the most memory, per byte of a request body or a
// realtime client event, that reading it and decoding its audio can hold
// at once: the body (1); its audio's base64 text as JSON decodes it (1),
// and a second copy of the content (/v1/chat/completions's raw message
// content, the realtime events' strict field check: 1); the decoded WAV
// or PCM bytes (3/4); and the float32 samples, 4 bytes per 8-bit sample at
// worst (3). That is 6.75, rounded up.
const decodeCostFactor = 7

// decodeCost is the decode budget a body of n bytes is charged.
func decodeCost(n int64) int64 {
	if n > math.MaxInt64/decodeCostFactor {
		return math.MaxInt64
	}
	return decodeCostFactor * n
}

// reserveBody reserves the request body's decode budget
// (Config.DecodeBudget) before the body is read: for its Content-Length,
// or for MaxBodyBytes when it declares none. A body declared too large reserves
// nothing (readBody refuses it unread). The caller releases the
// reservation; nil reserves nothing.
func (s *Server) reserveBody(c echo.Context) (*reservation, *apiError) {
	r := c.Request()
	n := r.ContentLength
	switch {
	case n > s.cfg.MaxBodyBytes:
		return nil, nil
	case n < 0: // chunked: up to the limit
		n = s.cfg.MaxBodyBytes
	}
	res, err := s.decode.acquire(r.Context(), decodeCost(n), s.cfg.DecodeWait)
	if err == nil {
		return res, nil
	}
	c.Response().Header().Set(echo.HeaderConnection, "close") // the body is left unread
	if errors.Is(err, errDecodeBusy) {
		return nil, s.decodeBusy()
	}
	return nil, newError(http.StatusServiceUnavailable, typeServer, codeCancelled, "", "gave up waiting for decode budget: "+err.Error())
}

// decodeBusy is the error of a request or realtime event refused for
// want of decode budget.
func (s *Server) decodeBusy() *apiError {
	e := newError(http.StatusTooManyRequests, typeRateLimit, codeDecodeBusy, "",
		fmt.Sprintf("%v (%d bytes, --decode-budget); retry later", errDecodeBusy, s.cfg.DecodeBudget))
	e.retryAfter = s.cfg.RetryAfter
	return e
}

// readBody reads a request body within the size and time limits. When it
// fails, the connection is closed after the error reply instead of reading
// the rest of the body (which a stalled client would never send).
func (s *Server) readBody(c echo.Context) ([]byte, *apiError) {
	r := c.Request()
	rc := http.NewResponseController(c.Response())
	rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	var body []byte
	var err error
	if r.ContentLength <= s.cfg.MaxBodyBytes {
		body, err = io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
		if err == nil {
			rc.SetReadDeadline(time.Time{}) // a stream's connection must not time out
			return body, nil
		}
	}
	c.Response().Header().Set(echo.HeaderConnection, "close")
	var mbe *http.MaxBytesError
	switch {
	case err == nil || errors.As(err, &mbe):
		return nil, newError(http.StatusRequestEntityTooLarge, typeInvalidRequest, codeBodyTooLarge, "",
			fmt.Sprintf("the request body exceeds %d bytes", s.cfg.MaxBodyBytes))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, newError(http.StatusRequestTimeout, typeInvalidRequest, codeBodyTimeout, "",
			fmt.Sprintf("the request body took longer than %s to arrive", s.cfg.BodyTimeout))
	}
	return nil, badRequest(codeInvalidJSON, "", "read the request body: %v", err)
}

// health reports readiness: 200 with the model once it is loaded, 503
// while it loads or the server shuts down.
func (s *Server) health(c echo.Context) error {
	type sessions struct {
		Active        int `json:"active"`
		Queued        int `json:"queued"`
		MaxActive     int `json:"max_active"`
		MaxQueued     int `json:"max_queued"`
		Conversations int `json:"conversations"`
	}
	h := struct {
		Status   string           `json:"status"`
		Model    string           `json:"model,omitempty"`
		Commit   string           `json:"model_commit,omitempty"`
		Backend  string           `json:"backend,omitempty"`
		Device   *gpu.Info        `json:"device,omitempty"`
		Family   string           `json:"model_family,omitempty"`
		Codec    string           `json:"codec,omitempty"`
		Defaults *family.Defaults `json:"defaults,omitempty"` // the family's system prompts and voices
		Version  string           `json:"version"`
		Uptime   float64          `json:"uptime_seconds"`
		Sessions sessions         `json:"sessions"`
		// Memory is the engine's memory budget and the bytes in use (KV
		// caches, history, codec state; conversations: what the stored
		// conversations hold between turns).
		Memory *memoryJSON `json:"memory,omitempty"`
	}{
		Status: "ok", Version: s.cfg.Version, Uptime: round3(time.Since(s.started).Seconds()),
		Sessions: sessions{Active: s.lim.active(), Queued: s.lim.queued(), MaxActive: s.cfg.MaxConcurrent,
			MaxQueued: s.cfg.MaxQueue, Conversations: s.convs.count()},
	}
	code := http.StatusOK
	if b := s.backend.Load(); b != nil {
		h.Model, h.Commit, h.Backend = b.Model, b.Commit, b.Device
		h.Family, h.Codec, h.Defaults = b.modelFamily()
		if info, ok := s.device(); ok {
			h.Device = &info
		}
		if m, ok := s.memory(); ok {
			h.Memory = &memoryJSON{MemoryStats: m, Conversations: s.convs.bytes()}
		}
	} else {
		h.Status, code = "loading", http.StatusServiceUnavailable
	}
	if s.draining.Load() {
		h.Status, code = "shutting_down", http.StatusServiceUnavailable
	}
	return c.JSON(code, h)
}

// models lists the served model, as OpenAI's GET /v1/models.
func (s *Server) models(c echo.Context) error {
	b, err := s.ready()
	if err != nil {
		return err
	}
	type model struct {
		ID       string           `json:"id"`
		Object   string           `json:"object"`
		Created  int64            `json:"created"`
		OwnedBy  string           `json:"owned_by"`
		Commit   string           `json:"commit,omitempty"` // the Hugging Face commit of a model that came by name
		Family   string           `json:"family,omitempty"`
		Codec    string           `json:"codec,omitempty"`
		Defaults *family.Defaults `json:"defaults,omitempty"` // the family's system prompts and voices
	}
	fam, codec, defaults := b.modelFamily()
	return c.JSON(http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: b.Model, Object: "model", Created: s.started.Unix(), OwnedBy: "omni-pipe", Commit: b.Commit, Family: fam, Codec: codec, Defaults: defaults}}})
}

// maxSeed is the largest seed: 2^53 − 1, the largest integer JavaScript
// (any float64 JSON reader) holds exactly, so that a client can send back
// the seed a reply reports.
const maxSeed = 1<<53 - 1

// randomSeed returns a random seed in [0, maxSeed].
func randomSeed() int64 { return rand.Int64N(maxSeed + 1) }
