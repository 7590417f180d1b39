package pipeline

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/chat"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// Stage names, as they appear in timings and traces.
const (
	StageFrontend = "logmel"
	StageEncoder  = "encoder"
	StageBackbone = "backbone"
	StageDepth    = "depthformer"
	StageCodec    = "codec"
)

// Errors a turn can end with.
var (
	ErrEngineClosed  = errors.New("engine closed")
	ErrBusy          = errors.New("the engine is running its maximum number of turns")
	ErrSessionBusy   = errors.New("the conversation already has a turn running")
	ErrContextFull   = errors.New("the conversation exceeds the model's context")
	ErrSlowConsumer  = errors.New("the client did not read the reply fast enough")
	ErrEmptyRequest  = errors.New("the request has neither audio nor text")
	ErrSessionClosed = errors.New("the conversation was closed")
)

// Options configure an Engine. Zero values take the defaults.
type Options struct {
	Precision nn.Precision
	// MaxTurns is the number of turns that may run at once (default 8).
	MaxTurns int
	// MaxBatch caps the sessions one backbone or depthformer step serves,
	// separately from MaxTurns (how many are admitted): the turns beyond it
	// wait for the next step. A step takes the turns that have not spoken
	// yet first, then those it served least recently. Default:
	// DefaultMaxBatch of the device.
	MaxBatch int
	// PrefillChunk is the most prompt rows one backbone step computes: a
	// longer prompt (or several new ones) is prefilled over several steps,
	// interleaved with the other sessions' frames, so that no running
	// session waits more than one chunk for its next frame. Default:
	// DefaultPrefillChunk of the device.
	PrefillChunk int
	// MemoryBudget is the bytes the engine may hold for conversations: KV
	// caches, history and codec state. A turn that cannot be given its
	// memory is refused with a *MemoryError (ErrNoMemory). Default:
	// DefaultMemoryBudget of the device; negative: no limit.
	MemoryBudget int64
	// CodecStateBytes is what one turn's codec stream is charged (default:
	// measured once at New by opening a stream and decoding a few frames).
	CodecStateBytes int64
	// EventBuffer is the number of events a turn buffers for a client that
	// reads slowly before it is cancelled with ErrSlowConsumer (default 4096,
	// about five minutes of speech).
	EventBuffer int
	// MaxContext caps a conversation's positions (default 32768, the
	// model card's context).
	MaxContext int
	// CodecQueue is the number of frames that may wait for the codec
	// (default 256); a full queue holds the depthformer back.
	CodecQueue int
	// HostLogMel keeps the log-mel front end on the host where the
	// device could compute it (family.DeviceFrontend on a gpu.LogMeler
	// queue: the encoder's queue then runs it, the same floats up to the
	// last bit of a float64 log). Env OMNIPIPE_LOGMEL=host.
	HostLogMel bool
	// Trace, when set, records every stage's busy intervals.
	Trace *Trace
	// Logger receives the engine's logs: a stage that panicked, with its
	// stack (default slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.Precision == 0 {
		o.Precision = nn.BF16
	}
	if o.MaxTurns <= 0 {
		o.MaxTurns = 8
	}
	if o.EventBuffer <= 0 {
		o.EventBuffer = 4096
	}
	if o.MaxContext <= 0 {
		o.MaxContext = 32768
	}
	if o.CodecQueue <= 0 {
		o.CodecQueue = 256
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if os.Getenv("OMNIPIPE_LOGMEL") == "host" {
		o.HostLogMel = true
	}
}

// LogMelOnDevice says whether spoken turns' log-mel features are computed
// on the device (by the encoder's queue: family.DeviceFrontend on a
// gpu.LogMeler) rather than by the log-mel stage on the host.
func (e *Engine) LogMelOnDevice() bool { return e.front != nil && e.front.dev != nil }

// Engine runs turns of many conversations through the stage actors:
//
//	Start ─▶ [logmel ▶ encoder] ─▶ [backbone] ⇄ [depthformer] ─▶ [codec] ─▶ events
//
// The log-mel and encoder stages are a go-streams flow; backbone,
// depthformer and codec are actors that batch whatever work is pending
// across sessions. Each stage owns its gpu queue. A turn is in exactly one
// place of the backbone⇄depthformer loop at a time, so the loop's channels,
// sized to MaxTurns, never block; the codec's channel is bounded and
// applies back-pressure.
type Engine struct {
	m    family.Model
	info family.Info // m.Info(), read once
	dev  gpu.Device
	opts Options

	front   *frontend
	bbIn    chan *turn
	depthIn chan *turn
	codecIn chan codecMsg

	mu      sync.Mutex
	idle    *sync.Cond // signalled when running drops to 0
	closed  bool
	running int
	turns   map[*turn]struct{}
	wg      sync.WaitGroup
	stop    chan struct{}

	nextID atomic.Uint64

	mem        ledger
	kvFor      func(positions int) int64 // a cache's bytes at a length; nil: not counted
	codecBytes int64                     // one codec stream's state
}

// New starts an engine for m, a model of any registered family, on dev.
func New(m family.Model, dev gpu.Device, opts Options) *Engine {
	opts.defaults()
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch(dev)
	}
	if opts.PrefillChunk <= 0 {
		opts.PrefillChunk = DefaultPrefillChunk(dev)
	}
	e := &Engine{m: m, info: m.Info(), dev: dev, opts: opts,
		bbIn:    make(chan *turn, opts.MaxTurns),
		depthIn: make(chan *turn, opts.MaxTurns),
		codecIn: make(chan codecMsg, opts.CodecQueue),
		turns:   map[*turn]struct{}{},
		stop:    make(chan struct{}),
	}
	e.idle = sync.NewCond(&e.mu)
	e.initMemory()
	e.front = newFrontend(e)
	e.wg.Add(3)
	go e.actor(StageBackbone, 0, e.bbIn, e.depthIn, e.backboneStep)
	go e.actor(StageDepth, 1, e.depthIn, e.bbIn, e.depthStep)
	go e.codecLoop()
	return e
}

// Model returns the engine's model.
func (e *Engine) Model() family.Model { return e.m }

// Running returns the number of turns in flight.
func (e *Engine) Running() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running
}

// Close cancels every running turn, stops the stages and waits for their
// goroutines to return.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	for t := range e.turns {
		t.cancel(ErrEngineClosed)
	}
	e.mu.Unlock()
	// Let cancelled turns drain through the stages, then stop them.
	e.mu.Lock()
	for e.running > 0 {
		e.idle.Wait()
	}
	e.mu.Unlock()
	e.front.close()
	close(e.stop)
	e.wg.Wait()
	return nil
}

// Session is one conversation: its history and the backbone's cache of
// what has been computed. One turn runs at a time.
type Session struct {
	ID    string
	e     *Engine
	mu    sync.Mutex
	busy  bool
	shut  bool
	chat  *chat.Chat
	cache family.Cache
	fed   int // chat rows the cache holds
	turns int
	last  time.Time
	held  bytesOf // what the conversation holds (KV cache, history), counted in the engine's memory
}

// NewSession starts an empty conversation. Its ID is random (128 bits), so
// it can be handed to clients as a conversation handle.
func (e *Engine) NewSession() *Session {
	return &Session{ID: "conv-" + rand.Text(), e: e, chat: chat.New(e.m.Tokenizer(), e.m.Template()), last: time.Now()}
}

// Options returns the engine's options, defaults filled in.
func (e *Engine) Options() Options { return e.opts }

// Turns returns the number of completed turns.
func (s *Session) Turns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns
}

// LastUsed returns when the session last finished a turn.
func (s *Session) LastUsed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Busy reports whether a turn is running.
func (s *Session) Busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy
}

// Close releases the session's cache; a running turn is not affected until
// it ends, and no new turn may start.
func (s *Session) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shut = true
	if !s.busy {
		if s.cache != nil {
			s.cache.Free()
			s.cache = nil
		}
		s.dropMemory()
	}
}

// Request is one user turn.
type Request struct {
	// Audio is the user's speech (any sample rate; mono), or nil.
	Audio *audio.Clip
	// Text is the user's text (after the audio when both are given).
	Text string
	// System is the system prompt of a new conversation; empty chooses the
	// mode's official prompt. Ignored after the first turn.
	System string
	// TextTokens and SystemTokens, when not nil, are Text's and System's
	// tokens, already encoded; Text and System then only describe the turn.
	// A server encodes a client's text itself, with
	// tokenizer.EncodeOptions{SplitSpecial: true} so that the text cannot
	// spell control tokens, and before it takes a turn slot. Without them
	// Text and System are encoded with special tokens recognized.
	TextTokens, SystemTokens []int
	// Mode is Interleaved (speech to speech; the default) or Sequential.
	Mode Mode
	// TextSampling and AudioSampling pick text tokens and audio codes.
	TextSampling, AudioSampling Sampling
	// MaxNewTokens caps the backbone steps (text tokens and audio frames);
	// default 512 as the official examples.
	MaxNewTokens int
	// Seed makes sampling reproducible: the same seed, request and history
	// give the same reply.
	Seed uint64
	// Teacher, when set, replaces each sampled token or frame by the one
	// it returns (the engine's own pick is still reported to it): a
	// teacher-forced replay of a recorded trace.
	Teacher Teacher
	// Record, when set, receives every intermediate of the turn.
	Record *Recorder
	// SuppressStops keeps the turn from picking a token that ends its text
	// or turn (<|im_end|>, <|text_end|>) or the end-of-audio code: their
	// logits count as −∞ (on the device too), so the turn runs
	// MaxNewTokens steps — a benchmark's fixed schedule.
	SuppressStops bool

	prefill bool // Engine.Prefill's turn: no user turn, nothing sampled (prefill_ahead.go)
}

// Teacher observes each pick with its logits and returns what to use
// instead: step counts backbone steps from 0; codebook is the depthformer
// position within an audio frame.
type Teacher interface {
	Text(step, picked int, logits []float32) int
	AudioCode(step, codebook, picked int, logits []float32) int
}

// Stream is a running turn.
type Stream struct {
	// Events delivers the turn's events, then closes.
	Events <-chan Event
	t      *turn
}

// Cancel stops the turn at the next frame boundary; its stream ends with
// an ErrorEvent carrying context.Canceled.
func (s *Stream) Cancel() { s.t.cancel(context.Canceled) }

// Start begins a turn of s. The turn stops when ctx is cancelled.
func (e *Engine) Start(ctx context.Context, s *Session, req Request) (*Stream, error) {
	if req.Audio == nil && strings.TrimSpace(req.Text) == "" && !req.prefill {
		return nil, ErrEmptyRequest
	}
	if req.Mode == 0 {
		req.Mode = Interleaved
	}
	if req.MaxNewTokens <= 0 {
		req.MaxNewTokens = 512
	}
	if err := req.TextSampling.Validate(); err != nil {
		return nil, fmt.Errorf("text sampling: %w", err)
	}
	if err := req.AudioSampling.Validate(); err != nil {
		return nil, fmt.Errorf("audio sampling: %w", err)
	}
	var melFrames int
	if req.Audio != nil {
		var err error
		if melFrames, err = e.clipFrames(req.Audio); err != nil {
			return nil, err
		}
	}

	s.mu.Lock()
	switch {
	case s.shut:
		s.mu.Unlock()
		return nil, ErrSessionClosed
	case s.busy:
		s.mu.Unlock()
		return nil, ErrSessionBusy
	}
	s.busy = true
	s.mu.Unlock()

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		s.release()
		return nil, ErrEngineClosed
	}
	if e.running >= e.opts.MaxTurns {
		e.mu.Unlock()
		s.release()
		return nil, ErrBusy
	}
	e.running++
	e.mu.Unlock()

	t := e.newTurn(s, req)
	t.kind, _ = t.sm.Step() // MaxNewTokens ≥ 1: the prompt's step samples text
	// The conversation's new rows.
	t.chatStart = s.chat.Len()
	if s.chat.Empty() && s.turns == 0 {
		sys := req.System
		if sys == "" {
			mode := req.Mode
			if mode != Sequential {
				mode = Interleaved
			}
			sys = e.m.Template().SystemPrompt(mode)
		}
		s.chat.NewTurn(chat.System)
		if req.SystemTokens != nil {
			for _, id := range req.SystemTokens {
				s.chat.AppendToken(id)
			}
		} else {
			s.chat.AddText(sys)
		}
		s.chat.EndTurn()
	}
	if !req.prefill {
		s.chat.NewTurn(chat.User)
		if req.Audio != nil {
			t.clip = &chat.Clip{MelFrames: melFrames}
			s.chat.AddAudio(t.clip)
		}
		if req.TextTokens != nil {
			for _, id := range req.TextTokens {
				s.chat.AppendToken(id)
			}
		} else if req.Text != "" {
			s.chat.AddText(req.Text)
		}
		s.chat.EndTurn()
		s.chat.NewTurn(chat.Assistant)
	}
	t.promptRows = s.chat.Len() - s.fed
	if n := s.chat.Len(); n+req.MaxNewTokens > e.opts.MaxContext {
		s.chat.Truncate(t.chatStart)
		e.mu.Lock()
		e.endRunning()
		e.mu.Unlock()
		s.release()
		return nil, fmt.Errorf("%w: %d positions plus up to %d new ones exceed %d", ErrContextFull, n, req.MaxNewTokens, e.opts.MaxContext)
	}
	s.mu.Lock()
	t.charge = e.turnCharge(s, t)
	merr := e.mem.charge(t.charge)
	s.mu.Unlock()
	if merr != nil {
		t.charge = bytesOf{}
		s.chat.Truncate(t.chatStart)
		e.mu.Lock()
		e.endRunning()
		e.mu.Unlock()
		s.release()
		return nil, merr
	}
	e.mu.Lock()
	e.turns[t] = struct{}{}
	e.mu.Unlock()
	// Watch the caller's context.
	t.stopWatch = context.AfterFunc(ctx, func() { t.cancel(context.Cause(ctx)) })
	if ctx.Err() != nil {
		// AfterFunc runs asynchronously even for a context already done:
		// cancel now, so that such a turn never computes anything.
		t.cancel(context.Cause(ctx))
	}
	if t.clip != nil {
		e.front.submit(t)
	} else {
		e.bbIn <- t
	}
	return &Stream{Events: t.events, t: t}, nil
}

// clipFrames validates a clip and returns its mel frame count.
func (e *Engine) clipFrames(c *audio.Clip) (int, error) {
	if c.SampleRate < 1 || c.SampleRate > audio.MaxSampleRate {
		return 0, fmt.Errorf("audio sample rate %d Hz outside 1..%d", c.SampleRate, audio.MaxSampleRate)
	}
	n := audio.ResampledLen(len(c.Samples), c.SampleRate, e.m.Frontend().SampleRate())
	frames, valid := e.m.Frontend().Frames(n)
	if n == 0 || valid < 2 {
		return 0, fmt.Errorf("%w (%d samples at %d Hz)", audio.ErrTooShort, len(c.Samples), c.SampleRate)
	}
	return frames, nil
}

// endRunning gives a turn's slot back (e.mu held by the caller), waking a
// Close that waits for the last one.
func (e *Engine) endRunning() {
	e.running--
	if e.running == 0 {
		e.idle.Broadcast()
	}
}

func (s *Session) release() {
	s.mu.Lock()
	s.busy = false
	s.last = time.Now()
	if s.shut {
		if s.cache != nil {
			s.cache.Free()
			s.cache = nil
		}
		s.dropMemory()
	}
	s.mu.Unlock()
}

// turn is a running turn's state. It is owned by whichever stage holds it.
type turn struct {
	id      uint64
	e       *Engine
	ctx     context.Context
	cancelF context.CancelCauseFunc
	sess    *Session
	req     Request
	sm      *Turn
	textS   *Sampler
	audioS  *Sampler
	textH   []int
	audioH  [][]int
	events  chan Event

	clip *chat.Clip
	mel  *audio.Features
	// melIn is the clip prepared for the device's front end
	// (family.DeviceFrontend): mel then holds the shape only.
	melIn      *audio.DeviceInput
	chatStart  int // the chat's length before this turn
	promptRows int
	prefilled  int       // prompt rows computed so far (chunked prefill)
	served     [2]uint64 // the backbone's and depthformer's last round that served it
	charge     bytesOf   // the memory reserved for it (given back by complete)
	promptH    []float32 // with Record: the prompt's output rows so far

	// The next backbone input.
	kind   Kind // what the pending step samples
	input  inputKind
	token  int
	frame  []int
	hidden []float32 // the backbone row the depthformer samples from
	audioN int       // audio steps so far

	dec  *tokenizer.StreamDecoder
	text strings.Builder

	start     time.Time
	tm        Timings
	busyMu    sync.Mutex
	seq       int
	codec     family.CodecStream // the turn's codec stream, opened at its first frame
	codecN    int                // frames handed to codec so far
	stopWatch func() bool
	finished  bool // the loop stages are done with it (finish was called)
	kept      bool // the reply stays in the conversation's history
}

type inputKind uint8

const (
	inPrompt inputKind = iota + 1
	inToken
	inFrame
)

func (e *Engine) newTurn(s *Session, req Request) *turn {
	tctx, cancel := context.WithCancelCause(context.Background())
	seed := req.Seed
	t := &turn{
		id: e.nextID.Add(1), e: e, ctx: tctx, cancelF: cancel, sess: s, req: req,
		sm:     NewTurn(e.info.Special, req.Mode, e.info.InterleavedText, e.info.InterleavedAudio, req.MaxNewTokens),
		textS:  NewSampler(req.TextSampling, seed, 1),
		audioS: NewSampler(req.AudioSampling, seed, 2),
		audioH: make([][]int, e.info.Codebooks),
		events: make(chan Event, e.opts.EventBuffer),
		dec:    e.m.Tokenizer().NewStreamDecoder(),
		input:  inPrompt,
		start:  time.Now(),
	}
	if req.SuppressStops {
		sp := e.info.Special
		t.textS.Suppress(sp.IMEnd, sp.TextEnd)
		t.audioS.Suppress(sp.EOA)
	}
	t.tm.Busy = map[string]time.Duration{}
	return t
}

// cancel ends the turn with err (context.Canceled when nil) at its next
// stage boundary. It is the one way a stage fails a turn that another stage
// may be looking at (the codec decodes a turn's frames while the loop runs
// it): the cause lives in the turn's context, which is safe for concurrent
// use, and the first one set wins.
func (t *turn) cancel(err error) {
	if err == nil {
		err = context.Canceled
	}
	t.cancelF(err)
}

// failed returns why the turn must stop now, or nil. Any stage may call it.
func (t *turn) failed() error {
	if t.ctx.Err() != nil {
		return context.Cause(t.ctx)
	}
	return nil
}

func (t *turn) addBusy(stage string, d time.Duration) {
	t.busyMu.Lock()
	t.tm.Busy[stage] += d
	t.busyMu.Unlock()
}

// emit delivers an event without ever blocking a stage: a client that lets
// EventBuffer events pile up is cut off.
func (t *turn) emit(ev Event) {
	select {
	case t.events <- ev:
	default:
		t.cancel(ErrSlowConsumer)
	}
}

// emitLast delivers the turn's terminal event: when the buffer is full (a
// client that stopped reading) the oldest event makes room, so the stream
// always ends with its Done or Error.
func (t *turn) emitLast(ev Event) {
	for {
		select {
		case t.events <- ev:
			return
		default:
		}
		select {
		case <-t.events:
		default:
		}
	}
}
