package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// turn is an admitted, running turn: it holds a slot and its conversation
// until events returns.
type turn struct {
	s       *Server
	conv    *conversation
	stream  *pipeline.Stream
	index   int // the conversation's reply this turn makes: 1, 2, …
	release func()
	log     *slog.Logger
}

// begin is every turn route's start: the backend must be ready, the body
// is read and decoded into the route's job under the decode budget, its
// text is tokenized, and the turn is admitted (or queued, or refused).
func begin[J any](s *Server, c echo.Context, decode func([]byte, limits, func() int64) (J, *apiError), turnOf func(J) *turnJob) (*Backend, J, *turn, *apiError) {
	var zero J
	be, aerr := s.ready()
	if aerr != nil {
		return nil, zero, nil, aerr
	}
	// The body and its decoding hold memory before the request takes a
	// turn slot, under the decode budget: the body's charge, then its
	// samples' bytes while the request waits for a slot. Released on every
	// path (an error, a panic the recover middleware catches, a client
	// that hangs up) when begin returns; a running turn's audio is bounded
	// by the turn slots.
	res, aerr := s.reserveBody(c)
	if aerr != nil {
		return nil, zero, nil, aerr
	}
	defer res.release()
	body, aerr := s.readBody(c)
	if aerr != nil {
		return nil, zero, nil, aerr
	}
	res.shrink(decodeCost(int64(len(body))))
	if s.hookDecode != nil {
		s.hookDecode(c.Request().Context())
	}
	job, aerr := decode(body, s.limits, s.seed)
	if aerr != nil {
		return nil, zero, nil, aerr
	}
	res.shrink(clipBytes(turnOf(job).req.Audio))
	turnOf(job).applyVoice(be.Engine.Model().Template())
	if aerr := s.encodeText(c.Request().Context(), be, &turnOf(job).req); aerr != nil {
		return nil, zero, nil, aerr
	}
	t, aerr := s.admit(c, be, turnOf(job))
	if aerr != nil {
		return nil, zero, nil, aerr
	}
	return be, job, t, nil
}

// clipBytes returns the bytes of a clip's samples (0 without one).
func clipBytes(c *audio.Clip) int64 {
	if c == nil {
		return 0
	}
	return 4 * int64(len(c.Samples))
}

// encodeText tokenizes a request's text and system prompt for the engine
// (pipeline.Request.TextTokens, SystemTokens). Text from a client is
// plain text: a special token it spells ("<|im_end|>") is encoded as its
// characters, so that no client can forge the chat template's turns (the
// template's own control tokens come from the engine). It runs before the
// request takes a turn slot, and stops when the request's context ends
// (the client hung up). Config.MaxTextBytes has bounded the text already.
func (s *Server) encodeText(ctx context.Context, be *Backend, req *pipeline.Request) *apiError {
	if s.hookEncode != nil {
		s.hookEncode(ctx)
	}
	tok := be.Engine.Model().Tokenizer()
	encode := func(text string) ([]int, *apiError) {
		if text == "" {
			return nil, nil // nothing to encode; the engine adds nothing either
		}
		ids, err := tok.EncodeContext(ctx, text, tokenizer.EncodeOptions{SplitSpecial: true})
		if err != nil {
			return nil, newError(http.StatusServiceUnavailable, typeServer, codeCancelled, "", "gave up tokenizing the request's text: "+err.Error())
		}
		if ids == nil {
			ids = []int{} // encoded, to nothing: the engine must not encode it again
		}
		return ids, nil
	}
	var aerr *apiError
	if req.TextTokens, aerr = encode(req.Text); aerr != nil {
		return aerr
	}
	req.SystemTokens, aerr = encode(req.System)
	return aerr
}

// admit takes a turn slot (waiting in the bounded queue if need be), holds
// the job's conversation (a new one when it names none) and starts the
// turn. The turn stops when the request's context ends: the client hung up
// or the server's grace period is over.
func (s *Server) admit(c echo.Context, be *Backend, job *turnJob) (*turn, *apiError) {
	ctx := c.Request().Context()
	release, err := s.lim.acquire(ctx)
	if err != nil {
		if errors.Is(err, errQueueFull) || errors.Is(err, errQueueTimeout) {
			e := newError(http.StatusTooManyRequests, typeRateLimit, codeRateLimited, "", err.Error()+"; retry later")
			e.retryAfter = s.cfg.RetryAfter
			return nil, e
		}
		return nil, newError(http.StatusServiceUnavailable, typeServer, codeCancelled, "", "gave up waiting for a turn slot: "+err.Error())
	}
	if s.draining.Load() { // a shutdown began while this request waited
		release()
		return nil, shuttingDown()
	}
	conv, aerr := s.convs.acquire(ctx, job.conversationID, be.Engine.NewSession)
	if aerr != nil {
		release()
		return nil, aerr
	}
	index := conv.sess.Turns() + 1
	if job.expectTurns >= 0 && index-1 != job.expectTurns {
		s.convs.release(conv, true)
		release()
		return nil, newError(http.StatusConflict, typeInvalidRequest, codeStaleAudioID, "",
			fmt.Sprintf("the request continues from reply %d, but the conversation has %d replies; send the latest reply's audio id", job.expectTurns, index-1))
	}
	if s.hookStart != nil {
		s.hookStart(&job.req)
	}
	stream, err := be.Engine.Start(ctx, conv.sess, job.req)
	// Idle conversations make room for a turn the memory budget cannot
	// hold, least recently used first.
	for me := (*pipeline.MemoryError)(nil); errors.As(err, &me) && s.convs.evictBytes(me.Need-me.Free, conv); {
		stream, err = be.Engine.Start(ctx, conv.sess, job.req)
	}
	if err != nil {
		s.convs.release(conv, job.conversationID != "") // a new conversation without a turn is forgotten
		release()
		return nil, startError(err, job.audioParam, s.cfg.RetryAfter)
	}
	log := s.logger(c).With("conversation_id", conv.id)
	log.Info("turn started", "input", job.describe(), "seed", job.req.Seed)
	return &turn{s: s, conv: conv, stream: stream, index: index, release: release, log: log}, nil
}

// events hands the turn's text and audio to the route's callbacks and
// returns its terminal event (exactly one of done and fail is set) once
// the conversation and the slot are free again. A callback's error (the
// client went away) cancels the turn, and the stream is still drained, so
// that the engine's work for it ends before events returns.
func (t *turn) events(onText func(string) error, onAudio func(*pipeline.AudioEvent) error) (done *pipeline.DoneEvent, fail *pipeline.ErrorEvent) {
	var sinkErr error
	for ev := range t.stream.Events {
		switch ev := ev.(type) {
		case *pipeline.TextEvent:
			if sinkErr == nil {
				sinkErr = onText(ev.Delta)
			}
		case *pipeline.AudioEvent:
			if sinkErr == nil {
				sinkErr = onAudio(ev)
			}
		case *pipeline.DoneEvent:
			done = ev
		case *pipeline.ErrorEvent:
			fail = ev
		}
		if sinkErr != nil {
			t.stream.Cancel() // idempotent
		}
	}
	if done == nil && fail == nil { // the engine promises a terminal event; never leave the caller without one
		fail = &pipeline.ErrorEvent{Err: errors.New("the turn ended without a result")}
	}
	t.finish(done, fail, sinkErr)
	return done, fail
}

// finish frees the turn's conversation and slot and records it.
func (t *turn) finish(done *pipeline.DoneEvent, fail *pipeline.ErrorEvent, sinkErr error) {
	// The engine frees the session and its slot before it delivers the
	// terminal event, so a client may start its next turn at once.
	var tm pipeline.Timings
	outcome := ""
	switch {
	case done != nil:
		tm, outcome = done.Timings, done.Stop.String()
		t.log.Info("turn done", "stop", outcome, "steps", tm.Steps, "tokens", tm.Tokens, "frames", tm.Frames,
			"first_audio", tm.FirstAudio, "total", tm.Total, "rtf", round3(tm.RTF))
	default:
		tm, outcome = fail.Timings, "failed"
		if cancelled(fail.Err) || sinkErr != nil {
			outcome = "cancelled"
			t.log.Info("turn cancelled", "cause", fail.Err, "client_error", sinkErr, "steps", tm.Steps)
		} else {
			t.log.Warn("turn failed", "err", fail.Err, "steps", tm.Steps)
		}
	}
	t.s.convs.release(t.conv, true)
	t.release()
	t.s.met.turn(outcome, tm)
}

// timingsJSON is a turn's timings on the wire (milliseconds; null: the
// turn produced no text or no audio).
type timingsJSON struct {
	PrefillMS    float64            `json:"prefill_ms"`
	FirstTextMS  *float64           `json:"first_text_ms"`
	FirstAudioMS *float64           `json:"first_audio_ms"`
	TotalMS      float64            `json:"total_ms"`
	AudioSeconds float64            `json:"audio_seconds"`
	RTF          float64            `json:"real_time_factor"`
	PromptRows   int                `json:"prompt_rows"`
	Steps        int                `json:"steps"`
	Tokens       int                `json:"text_tokens"`
	Frames       int                `json:"audio_frames"`
	BusyMS       map[string]float64 `json:"stage_busy_ms"`
}

func newTimings(tm pipeline.Timings) *timingsJSON {
	ms := func(d time.Duration) float64 { return round3(float64(d) / 1e6) }
	opt := func(d time.Duration) *float64 {
		if d <= 0 {
			return nil
		}
		v := ms(d)
		return &v
	}
	j := &timingsJSON{
		PrefillMS: ms(tm.Prefill), FirstTextMS: opt(tm.FirstText), FirstAudioMS: opt(tm.FirstAudio),
		TotalMS: ms(tm.Total), AudioSeconds: round3(tm.AudioSeconds), RTF: round3(tm.RTF),
		PromptRows: tm.PromptRows, Steps: tm.Steps, Tokens: tm.Tokens, Frames: tm.Frames,
		BusyMS: make(map[string]float64, len(tm.Busy)),
	}
	for k, v := range tm.Busy {
		j.BusyMS[k] = ms(v)
	}
	return j
}

// round3 rounds to three decimals (microseconds, for milliseconds).
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
