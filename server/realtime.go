package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/omni-pipe/omni-pipe/audio/vad"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server/realtime"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// RealtimeConfig configures /v1/realtime. Zero values take the defaults.
type RealtimeConfig struct {
	// MaxSessions bounds the realtime connections served at once (default
	// 64); one more is told so (error too_many_sessions) and closed.
	MaxSessions int
	// MaxBufferAudio bounds the input audio buffer and one item's audio
	// (default: Config.MaxAudio).
	MaxBufferAudio time.Duration
	// IdleTimeout closes a connection that sends no event for this long
	// (default 10 min).
	IdleTimeout time.Duration
}

func (c *RealtimeConfig) defaults(maxAudio time.Duration) {
	if c.MaxSessions <= 0 {
		c.MaxSessions = 64
	}
	if c.MaxBufferAudio <= 0 {
		c.MaxBufferAudio = maxAudio
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
}

const (
	rtRate        = 24000 // the wire's PCM16 rate
	rtFrame       = 1920  // samples of one 80 ms model frame at rtRate
	rtMaxEvent    = 16 << 20
	rtInBuffer    = 64 // client events read ahead of the session loop
	rtMinCommitMS = 100

	// Codes of realtime error events (beside the server's and package
	// realtime's).
	codeTooManySessions  = "too_many_sessions"
	codeBufferFull       = "input_audio_buffer_full"
	codeCommitEmpty      = "input_audio_buffer_commit_empty"
	codeActiveResponse   = "conversation_already_has_active_response"
	codeNoActiveResponse = "response_cancel_not_active"
	codeItemNotFound     = "item_not_found"
	codeItemInHistory    = "item_in_history"
	codeNoInput          = "no_input"
	codeIdleTimeout      = "idle_timeout"
	codeBinaryMessage    = "binary_message"
)

// rtState is the server's realtime bookkeeping.
type rtState struct {
	active     atomic.Int64
	sessions   prometheus.Counter
	events     *prometheus.CounterVec // type
	bargeIns   prometheus.Counter
	speechToAu prometheus.Histogram // end of speech → first audio delta
	prefilled  prometheus.Counter   // rows prefilled ahead of end of speech
}

func newRTState(reg *prometheus.Registry) *rtState {
	rt := &rtState{
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "realtime_sessions_total",
			Help: "Realtime WebSocket sessions accepted."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "realtime_client_events_total",
			Help: "Realtime client events received, by type (invalid: malformed or unknown; refused: not decoded for want of decode budget)."}, []string{"type"}),
		bargeIns: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "realtime_barge_ins_total",
			Help: "Responses cancelled because the user started speaking."}),
		speechToAu: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "realtime_speech_end_to_audio_seconds",
			Help:    "Time from the server VAD's end of speech to the first response.output_audio.delta sent.",
			Buckets: []float64{.025, .05, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10}}),
		prefilled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "realtime_prefill_ahead_rows_total",
			Help: "History rows prefilled while the user spoke, before their turn began."}),
	}
	reg.MustRegister(rt.sessions, rt.events, rt.bargeIns, rt.speechToAu, rt.prefilled,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "realtime_sessions",
			Help: "Realtime WebSocket sessions open."}, func() float64 { return float64(rt.active.Load()) }))
	return rt
}

// realtimeAuth checks the API key of a WebSocket upgrade: the bearer
// header, or the subprotocol browsers send ("openai-insecure-api-key.KEY").
func (s *Server) realtimeAuth(r *http.Request) bool {
	if len(s.cfg.APIKeys) == 0 {
		return true
	}
	var tokens []string
	if t, ok := strings.CutPrefix(r.Header.Get(echo.HeaderAuthorization), "Bearer "); ok {
		tokens = append(tokens, t)
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if t, ok := strings.CutPrefix(strings.TrimSpace(p), "openai-insecure-api-key."); ok {
				tokens = append(tokens, t)
			}
		}
	}
	for _, t := range tokens {
		for _, k := range s.cfg.APIKeys {
			if subtle.ConstantTimeCompare([]byte(t), []byte(k)) == 1 {
				return true
			}
		}
	}
	return false
}

// realtime serves GET /v1/realtime: an OpenAI Realtime API session over a
// WebSocket (docs/api.md).
func (s *Server) realtime(c echo.Context) error {
	r := c.Request()
	if !s.realtimeAuth(r) {
		return newError(http.StatusUnauthorized, typeInvalidRequest, codeInvalidAPIKey, "",
			"missing or wrong API key (Authorization: Bearer KEY, or the subprotocol openai-insecure-api-key.KEY)")
	}
	be, aerr := s.ready()
	if aerr != nil {
		return aerr
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return newError(http.StatusUpgradeRequired, typeInvalidRequest, "websocket_required", "",
			"/v1/realtime is a WebSocket: connect with ws:// or wss:// (see docs/api.md)")
	}
	opts := &websocket.AcceptOptions{Subprotocols: []string{"realtime"}, OriginPatterns: s.cfg.CORSOrigins}
	ws, err := websocket.Accept(c.Response(), r, opts)
	if err != nil {
		s.logger(c).Info("realtime: websocket handshake failed", "err", err)
		return nil // Accept has answered
	}
	ws.SetReadLimit(rtMaxEvent)
	dialect := realtime.GA
	if strings.Contains(strings.ToLower(r.Header.Get("OpenAI-Beta")), "realtime=v1") {
		dialect = realtime.Beta
	}
	log := s.logger(c).With("route", "realtime", "dialect", dialect.String())
	if n := s.rt.active.Add(1); n > int64(s.cfg.Realtime.MaxSessions) {
		s.rt.active.Add(-1)
		rc := &rtConn{s: s, ws: ws, dialect: dialect, ctx: r.Context(), log: log}
		rc.sendError(&realtime.Error{Type: realtime.TypeRateLimit, Code: codeTooManySessions,
			Message: fmt.Sprintf("the server is serving its maximum of %d realtime sessions; retry later", s.cfg.Realtime.MaxSessions)})
		ws.Close(websocket.StatusTryAgainLater, "too many sessions")
		return nil
	}
	defer s.rt.active.Add(-1)
	s.rt.sessions.Inc()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rc := newRTConn(s, be, ws, dialect, ctx, log)
	defer func() {
		if p := recover(); p != nil {
			ws.Close(websocket.StatusInternalError, "internal error (logged)")
			panic(p) // the recover middleware logs it
		}
	}()
	err = rc.run()
	switch status := websocket.CloseStatus(err); {
	case err == nil:
		ws.Close(websocket.StatusNormalClosure, "")
	case status == websocket.StatusNormalClosure || status == websocket.StatusGoingAway:
		log.Info("realtime: client closed", "responses", rc.nresp)
	default:
		log.Info("realtime: session ended", "err", err, "responses", rc.nresp)
	}
	ws.CloseNow()
	return nil
}

// rtItem is a conversation item.
type rtItem struct {
	id     string
	role   string // "user" or "assistant"
	status string // "completed", "incomplete", "in_progress"
	// User items: their parts, until a response takes them into the
	// model's history.
	texts []string
	audio []float32
	parts []map[string]any // the content as items report it
	// inHistory: the model has heard (user) or said (assistant) it.
	inHistory bool
	// Assistant items.
	transcript string
	sentMS     int64            // audio sent to the client
	stream     *pipeline.Stream // the turn, for truncation
	truncateMS *int64           // a truncation waiting for the session to be free
}

func (it *rtItem) json(d realtime.Dialect) map[string]any {
	m := map[string]any{"id": it.id, "object": "realtime.item", "type": "message", "role": it.role, "status": it.status}
	if it.role == "assistant" {
		m["content"] = []map[string]any{{"type": d.AssistantContentType(), "transcript": it.transcript}}
	} else {
		m["content"] = it.parts
	}
	return m
}

// rtResponse is the response in progress.
type rtResponse struct {
	id      string
	item    *rtItem
	st      *pipeline.Stream
	release func()
	// cut is why the response was cancelled ("turn_detected",
	// "client_cancelled"); its output after that is not sent.
	cut        string
	samples    int64 // PCM samples sent
	frames     int   // model frames whose audio was sent
	speechEnd  time.Time
	firstAudio bool
	rs         *audioResampler
	inputs     []*rtItem // the user items it answers
}

// rtWant is a response asked for while the session was busy.
type rtWant struct {
	params    *realtime.ResponseCreate
	speechEnd time.Time
}

type rtMsg struct {
	ev  realtime.Event
	err *realtime.Error
	// res is the event's decode budget, held until the session loop has
	// handled it (nil: none).
	res *reservation
}

// rtConn is one realtime session. Its loop (run) owns all of its state; a
// reader goroutine decodes client events into in.
type rtConn struct {
	s       *Server
	be      *Backend
	ws      *websocket.Conn
	dialect realtime.Dialect
	ctx     context.Context
	log     *slog.Logger
	in      chan rtMsg
	readErr error
	reader  sync.WaitGroup

	cfg   realtime.Session
	sess  *pipeline.Session
	det   *vad.Detector // nil: turn detection off
	buf   []float32     // the input audio buffer
	pos   int64         // samples appended since the session began
	maxN  int           // MaxBufferAudio in samples
	items []*rtItem

	speechItem string // the item id of the utterance the VAD is in
	resp       *rtResponse
	want       *rtWant
	pre        *pipeline.Stream // a prefill ahead of the user's turn
	preRelease func()
	lastItem   string
	nresp      int
	nevent     atomic.Int64
}

func newRTConn(s *Server, be *Backend, ws *websocket.Conn, d realtime.Dialect, ctx context.Context, log *slog.Logger) *rtConn {
	c := &rtConn{s: s, be: be, ws: ws, dialect: d, ctx: ctx, log: log, in: make(chan rtMsg, rtInBuffer),
		sess: be.Engine.NewSession(),
		maxN: int(s.cfg.Realtime.MaxBufferAudio.Seconds() * rtRate),
		cfg: realtime.Session{ID: newID("sess_"), Model: be.Model, Voice: realtime.DefaultVoice,
			Instructions: be.Engine.Model().Template().SystemPrompt(family.Interleaved), Temperature: realtime.DefaultTemperature},
	}
	v := realtime.DefaultVAD
	c.cfg.VAD = &v
	return c
}

// run serves the session until the client leaves or the connection fails;
// nothing of the session (reader, turns, slots) outlives it.
func (c *rtConn) run() error {
	defer c.sess.Close()
	defer c.stopAll()
	if err := c.setVAD(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(c.ctx)
	c.ctx = ctx
	c.reader.Add(1)
	go c.read()
	defer c.drainIn() // after the reader's end: it closes c.in
	defer c.reader.Wait()
	defer cancel() // first: it ends the reader's Read
	if err := c.send("session.created", map[string]any{"session": c.cfg.JSON(c.dialect)}); err != nil {
		return err
	}
	idle := time.NewTimer(c.s.cfg.Realtime.IdleTimeout)
	defer idle.Stop()
	for {
		var respEv, preEv <-chan pipeline.Event
		if c.resp != nil && c.resp.st != nil {
			respEv = c.resp.st.Events
		}
		if c.pre != nil {
			preEv = c.pre.Events
		}
		var err error
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case m, ok := <-c.in:
			if !ok {
				return c.readErr
			}
			idle.Reset(c.s.cfg.Realtime.IdleTimeout)
			err = func() error {
				defer m.res.release() // a panic too
				return c.handle(m)
			}()
		case ev := <-respEv:
			err = c.responseEvent(ev)
		case ev := <-preEv:
			err = c.prefillEvent(ev)
		case <-idle.C:
			c.sendError(&realtime.Error{Type: realtime.TypeInvalidRequest, Code: codeIdleTimeout,
				Message: fmt.Sprintf("no client event for %s: closing the session", c.s.cfg.Realtime.IdleTimeout)})
			c.ws.Close(websocket.StatusPolicyViolation, "idle timeout")
			return errors.New("idle timeout")
		}
		if err != nil {
			return err
		}
	}
}

// read decodes client events until the connection ends.
func (c *rtConn) read() {
	defer c.reader.Done()
	defer close(c.in)
	for {
		typ, r, err := c.ws.Reader(c.ctx)
		if err != nil {
			c.readErr = err
			return
		}
		m, err := c.decodeEvent(typ, r)
		if err != nil {
			c.readErr = err
			return
		}
		select {
		case c.in <- m:
		case <-c.ctx.Done():
			m.res.release()
			return
		}
	}
}

// decodeEvent reads and decodes one client event (the message r) under
// the server's decode budget: its bytes are charged as they arrive,
// decodeCost of each chunk before the chunk is read (readCharged), so a
// session never holds more of a message than its charge (reading a whole
// message first would let each session hold up to rtMaxEvent bytes the
// budget does not see); once decoded, the event keeps its audio's bytes
// charged until the loop has handled it. An event whose chunks are not
// all charged within Config.DecodeWait is refused with an error event
// (decode_budget_exceeded) naming it — the rest of the message read and
// dropped, nothing kept but its event_id (scanEventID) — and the session
// goes on. A read error ends the session.
func (c *rtConn) decodeEvent(typ websocket.MessageType, r io.Reader) (rtMsg, error) {
	if typ != websocket.MessageText {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return rtMsg{}, err
		}
		return rtMsg{err: realtime.Invalid(codeBinaryMessage, "", "client events are JSON text messages, not binary ones")}, nil
	}
	data, res, refused, err := readCharged(c.ctx, c.s.decode, c.s.cfg.DecodeWait, r)
	if err != nil {
		return rtMsg{}, err
	}
	if refused != nil {
		e := &realtime.Error{Type: realtime.TypeServer, Code: codeCancelled, Message: "gave up waiting for decode budget: " + refused.err.Error()}
		if errors.Is(refused.err, errDecodeBusy) {
			ae := c.s.decodeBusy()
			e = &realtime.Error{Type: ae.Type, Code: ae.Code, Message: ae.Message}
			c.log.Info("realtime: event refused", "err", refused.err, "bytes", refused.bytes)
		}
		return rtMsg{err: e.WithEventID(refused.eventID)}, nil
	}
	var m rtMsg
	m.ev, m.err = realtime.Decode(data)
	res.shrink(audioBytes(m.ev))
	m.res = res
	return m, nil
}

// rtReadFirst is the first chunk of a client event readCharged reads;
// later chunks double up to rtReadMax.
const (
	rtReadFirst = 512
	rtReadMax   = 1 << 20
)

// refusal is a message readCharged did not take for want of decode
// budget: why, its length, and its top-level event_id ("" if none).
type refusal struct {
	err     error
	bytes   int64
	eventID string
}

// readCharged reads the message r, reserving decodeCost of each chunk
// (rtReadFirst bytes, then doubling up to rtReadMax) from budget before
// reading it, the chunks' waits together at most wait. It returns the
// message and its reservation (decodeCost of its length); or, where a
// chunk's reservation fails, a refusal, with the rest of r read and
// dropped and nothing reserved; or r's error, with nothing reserved.
func readCharged(ctx context.Context, budget *byteBudget, wait time.Duration, r io.Reader) ([]byte, *reservation, *refusal, error) {
	var (
		buf []byte
		res *reservation
	)
	deadline := time.Now().Add(wait)
	// more reserves the next chunk and gives buf room for it; on a refusal
	// it reads the rest of the message after head (buf and what was read
	// past it) and returns why.
	more := func(head []byte) (*refusal, error) {
		step := min(max(rtReadFirst, cap(buf)), rtReadMax)
		left := wait
		if wait > 0 {
			left = max(time.Until(deadline), time.Nanosecond)
		}
		got, err := budget.acquire(ctx, decodeCost(int64(step)), left)
		if err != nil {
			res.release()
			n, id, rerr := scanEventID(head, r)
			if rerr != nil {
				return nil, rerr
			}
			return &refusal{err: err, bytes: n, eventID: id}, nil
		}
		res = res.join(got)
		// Exactly step more (slices.Grow may round far above what was
		// charged).
		buf = append(make([]byte, 0, len(buf)+step), buf...)
		return nil, nil
	}
	if ref, err := more(nil); ref != nil || err != nil {
		return nil, nil, ref, err
	}
	for {
		var err error
		if len(buf) < cap(buf) {
			var n int
			n, err = r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
		} else {
			// Full: one byte more says whether the message goes on, so a
			// message that fills its chunks exactly is not charged another.
			var one [1]byte
			var n int
			n, err = r.Read(one[:])
			if n == 1 {
				if ref, merr := more(append(buf, one[0])); ref != nil || merr != nil {
					return nil, nil, ref, merr
				}
				buf = append(buf, one[0])
			}
		}
		if err == io.EOF {
			res.shrink(decodeCost(int64(len(buf))))
			return buf, res, nil, nil
		}
		if err != nil {
			res.release()
			return nil, nil, nil, err
		}
	}
}

// scanEventID reads the rest of a JSON event whose first bytes are head
// from r, keeping nothing but the string value of its top-level
// "event_id" (at most 512 bytes), and returns the message's
// length and that id ("" where there is none, it is longer or not a
// string, or the text is not a JSON object up to it). It holds a few
// hundred bytes whatever the message's size: a refused event's audio is
// skipped, not buffered.
func scanEventID(head []byte, r io.Reader) (int64, string, error) {
	var sc idScanner
	n := int64(len(head))
	sc.feed(head)
	var chunk [4096]byte
	for {
		k, err := r.Read(chunk[:])
		n += int64(k)
		sc.feed(chunk[:k])
		if err == io.EOF {
			return n, sc.id(), nil
		}
		if err != nil {
			return n, "", err
		}
	}
}

// idScanner finds a JSON object's top-level "event_id" string in a stream
// of its bytes: it tracks nesting and strings (with their escapes) and
// keeps only top-level keys and the value of the key event_id.
type idScanner struct {
	depth          int
	inStr, esc     bool
	expectKey      bool // at depth 1: the next string is a key
	capKey, capVal bool // the string being read is a key / the id
	key, val       []byte
	lastKey        string
	found, bad     bool
}

func (s *idScanner) feed(p []byte) {
	for _, b := range p {
		if s.found || s.bad {
			return
		}
		if s.inStr {
			if s.esc {
				s.esc = false
			} else if b == '\\' {
				s.esc = true
			} else if b == '"' {
				s.inStr = false
				switch {
				case s.capKey:
					s.lastKey, s.capKey = string(s.key), false
				case s.capVal:
					s.found = true
				}
				continue
			}
			switch {
			case s.capKey && len(s.key) < 64:
				s.key = append(s.key, b)
			case s.capKey:
				s.capKey, s.lastKey = false, "" // too long to be event_id
			case s.capVal && len(s.val) < 6*512+2:
				s.val = append(s.val, b)
			case s.capVal:
				s.bad = true
			}
			continue
		}
		switch b {
		case ' ', '\t', '\n', '\r':
		case '{', '[':
			if s.depth == 0 && b != '{' {
				s.bad = true
			}
			s.depth++
			s.expectKey = s.depth == 1
		case '}', ']':
			s.depth--
			if s.depth <= 0 {
				s.bad = true // the object ended without the id
			}
		case '"':
			s.inStr = true
			if s.depth == 1 {
				if s.expectKey {
					s.capKey, s.key = true, s.key[:0]
				} else if s.lastKey == "event_id" {
					s.capVal = true
				}
			}
		case ',':
			if s.depth == 1 {
				s.expectKey, s.lastKey = true, ""
			}
		case ':':
			if s.depth == 1 {
				s.expectKey = false
			}
		default:
			if s.depth == 0 {
				s.bad = true
			}
		}
	}
}

// id returns the event_id found ("" if none or unusable).
func (s *idScanner) id() string {
	if !s.found {
		return ""
	}
	var id string
	q := make([]byte, 0, len(s.val)+2)
	q = append(append(append(q, '"'), s.val...), '"')
	if json.Unmarshal(q, &id) != nil || len(id) > 512 {
		return ""
	}
	return id
}

// drainIn gives back the decode budget of the events the loop did not
// take; the reader has ended.
func (c *rtConn) drainIn() {
	for m := range c.in {
		m.res.release()
	}
}

// audioBytes returns the bytes of the samples a decoded event holds.
func audioBytes(ev realtime.Event) int64 {
	var n int
	switch ev := ev.(type) {
	case *realtime.BufferAppend:
		n = len(ev.Samples)
	case *realtime.ItemCreate:
		for _, p := range ev.Item.Content {
			n += len(p.Audio)
		}
	}
	return 4 * int64(n)
}

// stopAll cancels the response and the prefill in flight and waits for
// their ends, so that their slots and the session are free.
func (c *rtConn) stopAll() {
	if c.resp != nil && c.resp.st != nil {
		c.resp.st.Cancel()
		for range c.resp.st.Events {
		}
		c.resp.release()
		c.resp = nil
	}
	if c.pre != nil {
		c.pre.Cancel()
		for range c.pre.Events {
		}
		c.preRelease()
		c.pre = nil
	}
}

// send writes a server event of GA type typ in the session's dialect
// (nothing when the dialect has no such event).
func (c *rtConn) send(typ string, fields map[string]any) error {
	name := c.dialect.Name(typ)
	if name == "" {
		return nil
	}
	if fields == nil {
		fields = map[string]any{}
	}
	fields["type"] = name
	fields["event_id"] = fmt.Sprintf("event_%d", c.nevent.Add(1))
	data, err := json.Marshal(fields)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.WriteStall)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("send %s: %w", name, err)
	}
	return nil
}

// sendError writes an error event; the session goes on.
func (c *rtConn) sendError(e *realtime.Error) error {
	c.s.met.errors.WithLabelValues(e.Code).Inc()
	return c.send("error", map[string]any{"error": e})
}

// handle acts on one client event.
func (c *rtConn) handle(m rtMsg) error {
	if m.err != nil {
		label := "invalid"
		if m.err.Code == codeDecodeBusy {
			label = "refused" // not read for want of decode budget
		}
		c.s.rt.events.WithLabelValues(label).Inc()
		return c.sendError(m.err)
	}
	var typ string
	switch ev := m.ev.(type) {
	case *realtime.SessionUpdate:
		typ = realtime.TypeSessionUpdate
		c.s.rt.events.WithLabelValues(typ).Inc()
		return c.sessionUpdate(ev)
	case *realtime.BufferAppend:
		typ = realtime.TypeBufferAppend
		c.s.rt.events.WithLabelValues(typ).Inc()
		return c.appendAudio(ev)
	case *realtime.BufferCommit:
		c.s.rt.events.WithLabelValues(realtime.TypeBufferCommit).Inc()
		return c.commit(ev.ID())
	case *realtime.BufferClear:
		c.s.rt.events.WithLabelValues(realtime.TypeBufferClear).Inc()
		c.buf = c.buf[:0]
		c.speechItem = ""
		if c.det != nil {
			c.det.Reset()
		}
		return c.send("input_audio_buffer.cleared", nil)
	case *realtime.ItemCreate:
		c.s.rt.events.WithLabelValues(realtime.TypeItemCreate).Inc()
		return c.itemCreate(ev)
	case *realtime.ItemRetrieve:
		c.s.rt.events.WithLabelValues(realtime.TypeItemRetrieve).Inc()
		it := c.item(ev.ItemID)
		if it == nil {
			return c.sendError(itemNotFound(ev.ItemID, ev.ID()))
		}
		return c.send("conversation.item.retrieved", map[string]any{"item": it.json(c.dialect)})
	case *realtime.ItemTruncate:
		c.s.rt.events.WithLabelValues(realtime.TypeItemTruncate).Inc()
		return c.itemTruncate(ev)
	case *realtime.ItemDelete:
		c.s.rt.events.WithLabelValues(realtime.TypeItemDelete).Inc()
		return c.itemDelete(ev)
	case *realtime.ResponseCreate:
		c.s.rt.events.WithLabelValues(realtime.TypeResponseCreate).Inc()
		if c.resp != nil || c.want != nil {
			return c.sendError(realtime.Invalid(codeActiveResponse, "", "the conversation already has a response in progress; wait for response.done or send response.cancel").WithEventID(ev.ID()))
		}
		c.want = &rtWant{params: ev}
		return c.startWanted()
	case *realtime.ResponseCancel:
		c.s.rt.events.WithLabelValues(realtime.TypeResponseCancel).Inc()
		switch {
		case c.resp == nil && c.want == nil:
			return c.sendError(realtime.Invalid(codeNoActiveResponse, "", "there is no response in progress to cancel").WithEventID(ev.ID()))
		case c.resp != nil && ev.ResponseID != "" && ev.ResponseID != c.resp.id:
			return c.sendError(realtime.Invalid(codeNoActiveResponse, "response_id", "response %s is not in progress (%s is)", quote(ev.ResponseID), c.resp.id).WithEventID(ev.ID()))
		case c.resp == nil: // wanted while a prefill ran: cancelled before it started
			c.want = nil
			return c.cancelledBeforeStart()
		}
		c.cancelResponse("client_cancelled")
		return nil
	}
	return fmt.Errorf("realtime: unhandled event %T", m.ev)
}

func itemNotFound(id, eventID string) *realtime.Error {
	return realtime.Invalid(codeItemNotFound, "item_id", "no item %s in the conversation", quote(id)).WithEventID(eventID)
}

func (c *rtConn) item(id string) *rtItem {
	for _, it := range c.items {
		if it.id == id {
			return it
		}
	}
	return nil
}

// sessionUpdate applies a session.update and reports the whole session.
func (c *rtConn) sessionUpdate(ev *realtime.SessionUpdate) error {
	p := ev.Session
	if p.Instructions != nil && *p.Instructions != c.cfg.Instructions {
		if len(*p.Instructions) > c.s.cfg.MaxTextBytes {
			return c.sendError(realtime.Invalid(codeTextTooLong, "session.instructions", "instructions exceed %d bytes", c.s.cfg.MaxTextBytes).WithEventID(ev.ID()))
		}
		if c.sess.Turns() > 0 || c.resp != nil {
			return c.sendError(realtime.Invalid(realtime.CodeUnsupported, "session.instructions",
				"the instructions are the system prompt of the conversation's first turn; they cannot change once the model has answered (open a new session)").WithEventID(ev.ID()))
		}
	}
	old := c.cfg
	c.cfg.Apply(p)
	if p.Instructions != nil && old.Instructions != c.cfg.Instructions {
		// A prefilled system prompt is stale: begin the conversation again.
		c.stopPrefill()
		c.sess.Close()
		c.sess = c.be.Engine.NewSession()
	}
	if p.SetVAD {
		if err := c.setVAD(); err != nil {
			c.cfg = old
			c.setVAD()
			return c.sendError(realtime.Invalid(realtime.CodeInvalidValue, "session.audio.input.turn_detection", "%v", err).WithEventID(ev.ID()))
		}
	}
	return c.send("session.updated", map[string]any{"session": c.cfg.JSON(c.dialect)})
}

// setVAD (re)builds the detector from the session's turn detection.
func (c *rtConn) setVAD() error {
	c.speechItem = ""
	if c.cfg.VAD == nil {
		c.det = nil
		return nil
	}
	v := c.cfg.VAD
	start := max(1, 30*v.Threshold) // dB above the floor: 0.5 → the detector's default 15
	det, err := vad.New(vad.Config{
		SampleRate: rtRate,
		StartDB:    start,
		StopDB:     min(start, vad.DefaultStopDB),
		PreRoll:    time.Duration(v.PrefixPaddingMS) * time.Millisecond,
		MinSilence: time.Duration(v.SilenceDurationMS) * time.Millisecond,
		PostRoll:   min(vad.DefaultPostRoll, time.Duration(v.SilenceDurationMS)*time.Millisecond),
		MaxSpeech:  min(vad.DefaultMaxSpeech, c.s.cfg.Realtime.MaxBufferAudio),
	})
	if err != nil {
		return err
	}
	c.det = det
	return nil
}

func ms(samples int64) int64 { return samples * 1000 / rtRate }

// appendAudio adds audio to the input buffer and runs the VAD over it.
func (c *rtConn) appendAudio(ev *realtime.BufferAppend) error {
	if len(c.buf)+len(ev.Samples) > c.maxN {
		return c.sendError(realtime.Invalid(codeBufferFull, "audio",
			"the input audio buffer would exceed %s; commit or clear it", c.s.cfg.Realtime.MaxBufferAudio).WithEventID(ev.ID()))
	}
	c.buf = append(c.buf, ev.Samples...)
	c.pos += int64(len(ev.Samples))
	if c.det == nil {
		return nil
	}
	for _, vev := range c.det.Write(ev.Samples) {
		if err := c.vadEvent(vev); err != nil {
			return err
		}
	}
	if !c.det.Speaking() {
		// Nothing is being said: keep only what a manual commit could
		// want (the pre-roll).
		keep := int(c.cfg.VAD.PrefixPaddingMS) * rtRate / 1000
		if len(c.buf) > 2*keep+rtRate {
			n := copy(c.buf, c.buf[len(c.buf)-keep:])
			c.buf = c.buf[:n]
		}
	}
	return nil
}

func (c *rtConn) vadEvent(ev vad.Event) error {
	switch ev.Kind {
	case vad.Start:
		c.speechItem = newID("item_")
		if err := c.send("input_audio_buffer.speech_started", map[string]any{"audio_start_ms": ms(ev.At), "item_id": c.speechItem}); err != nil {
			return err
		}
		if c.resp != nil && c.resp.cut == "" && c.cfg.VAD.InterruptResponse {
			c.s.rt.bargeIns.Inc()
			c.cancelResponse("turn_detected")
		}
		c.prefillAhead()
	case vad.End:
		id := c.speechItem
		if id == "" {
			id = newID("item_")
		}
		c.speechItem = ""
		end := time.Now()
		if err := c.send("input_audio_buffer.speech_stopped", map[string]any{"audio_end_ms": ms(ev.At), "item_id": id}); err != nil {
			return err
		}
		c.buf = c.buf[:0]
		if err := c.addAudioItem(id, ev.Audio, true); err != nil {
			return err
		}
		if c.cfg.VAD.CreateResponse && c.want == nil {
			c.want = &rtWant{speechEnd: end}
			return c.startWanted()
		}
	}
	return nil
}

// commit makes the input buffer a user item.
func (c *rtConn) commit(eventID string) error {
	if ms(int64(len(c.buf))) < rtMinCommitMS {
		return c.sendError(realtime.Invalid(codeCommitEmpty, "",
			"the input audio buffer holds %d ms of audio; a commit needs at least %d ms", ms(int64(len(c.buf))), rtMinCommitMS).WithEventID(eventID))
	}
	id := c.speechItem
	if id == "" {
		id = newID("item_")
	}
	c.speechItem = ""
	pcm := append([]float32(nil), c.buf...)
	c.buf = c.buf[:0]
	if c.det != nil {
		c.det.Reset()
	}
	return c.addAudioItem(id, pcm, true)
}

// addAudioItem adds a committed user audio item.
func (c *rtConn) addAudioItem(id string, pcm []float32, committed bool) error {
	it := &rtItem{id: id, role: "user", status: "completed", audio: pcm,
		parts: []map[string]any{{"type": "input_audio", "transcript": nil}}}
	prev := c.lastItem
	c.items = append(c.items, it)
	c.lastItem = id
	if committed {
		if err := c.send("input_audio_buffer.committed", map[string]any{"item_id": id, "previous_item_id": nullable(prev)}); err != nil {
			return err
		}
	}
	return c.itemAdded(it, prev)
}

// itemAdded reports a new item: conversation.item.added and .done (GA) or
// conversation.item.created (beta).
func (c *rtConn) itemAdded(it *rtItem, prev string) error {
	if err := c.send("conversation.item.added", map[string]any{"item": it.json(c.dialect), "previous_item_id": nullable(prev)}); err != nil {
		return err
	}
	if it.status == "in_progress" {
		return nil
	}
	return c.send("conversation.item.done", map[string]any{"item": it.json(c.dialect), "previous_item_id": nullable(prev)})
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// itemCreate adds a user message from the client.
func (c *rtConn) itemCreate(ev *realtime.ItemCreate) error {
	if ev.PreviousItemID != nil && *ev.PreviousItemID != c.lastItem && !(*ev.PreviousItemID == "root" && len(c.items) == 0) {
		return c.sendError(realtime.Invalid(realtime.CodeUnsupported, "previous_item_id",
			"items can only be added at the end of the conversation (after %s)", quote(c.lastItem)).WithEventID(ev.ID()))
	}
	id := ev.Item.ID
	if id == "" {
		id = newID("item_")
	} else if c.item(id) != nil {
		return c.sendError(realtime.Invalid(realtime.CodeInvalidValue, "item.id", "the conversation already has an item %s", quote(id)).WithEventID(ev.ID()))
	}
	it := &rtItem{id: id, role: "user", status: "completed"}
	var textBytes int
	for _, p := range ev.Item.Content {
		if p.Text != nil {
			textBytes += len(*p.Text)
			it.texts = append(it.texts, *p.Text)
			it.parts = append(it.parts, map[string]any{"type": "input_text", "text": *p.Text})
			continue
		}
		it.audio = append(it.audio, p.Audio...)
		it.parts = append(it.parts, map[string]any{"type": "input_audio", "transcript": nil})
	}
	switch {
	case textBytes > c.s.cfg.MaxTextBytes:
		return c.sendError(realtime.Invalid(codeTextTooLong, "item.content", "the item's text exceeds %d bytes", c.s.cfg.MaxTextBytes).WithEventID(ev.ID()))
	case len(it.audio) > c.maxN:
		return c.sendError(realtime.Invalid(codeAudioTooLong, "item.content", "the item's audio exceeds %s", c.s.cfg.Realtime.MaxBufferAudio).WithEventID(ev.ID()))
	}
	prev := c.lastItem
	c.items = append(c.items, it)
	c.lastItem = id
	return c.itemAdded(it, prev)
}

// itemDelete removes an item the model has not heard yet.
func (c *rtConn) itemDelete(ev *realtime.ItemDelete) error {
	i := -1
	for j, it := range c.items {
		if it.id == ev.ItemID {
			i = j
		}
	}
	if i < 0 {
		return c.sendError(itemNotFound(ev.ItemID, ev.ID()))
	}
	if c.items[i].inHistory {
		return c.sendError(realtime.Invalid(codeItemInHistory, "item_id",
			"item %s is already in the model's history, which omni-pipe cannot edit (truncate an assistant item instead)", quote(ev.ItemID)).WithEventID(ev.ID()))
	}
	c.items = append(c.items[:i], c.items[i+1:]...)
	c.lastItem = ""
	if n := len(c.items); n > 0 {
		c.lastItem = c.items[n-1].id
	}
	return c.send("conversation.item.deleted", map[string]any{"item_id": ev.ItemID})
}

// itemTruncate cuts an assistant item back to the audio the client played:
// the latest reply's, or the one in progress (cut once it has ended).
func (c *rtConn) itemTruncate(ev *realtime.ItemTruncate) error {
	it := c.item(ev.ItemID)
	playing := c.resp != nil && c.resp.item == it
	switch {
	case it == nil:
		return c.sendError(itemNotFound(ev.ItemID, ev.ID()))
	case it.role != "assistant":
		return c.sendError(realtime.Invalid(realtime.CodeInvalidValue, "item_id", "item %s is not an assistant item", quote(ev.ItemID)).WithEventID(ev.ID()))
	case it.stream == nil && !playing:
		return c.sendError(realtime.Invalid(realtime.CodeUnsupported, "item_id",
			"only the latest assistant item can be truncated (%s is not)", quote(ev.ItemID)).WithEventID(ev.ID()))
	case int64(ev.AudioEndMS) > it.sentMS && !playing:
		return c.sendError(realtime.Invalid(realtime.CodeInvalidValue, "audio_end_ms",
			"audio_end_ms %d is past the item's %d ms of audio", ev.AudioEndMS, it.sentMS).WithEventID(ev.ID()))
	}
	end := int64(ev.AudioEndMS)
	it.truncateMS = &end
	return c.settle()
}

// settle does what waited for the session to be free: truncations, then
// a wanted response.
func (c *rtConn) settle() error {
	if c.resp != nil || c.pre != nil {
		return nil
	}
	for _, it := range c.items {
		if it.truncateMS == nil {
			continue
		}
		// A truncation sent while the reply played may name more audio
		// than the reply came to have.
		end := min(*it.truncateMS, it.sentMS)
		it.truncateMS = nil
		frames := int(end * rtRate / 1000 / rtFrame)
		kept, text, err := c.sess.TruncateReply(it.stream, frames)
		if err != nil {
			c.log.Warn("realtime: truncate", "item", it.id, "err", err)
			if err := c.sendError(&realtime.Error{Type: realtime.TypeServer, Code: codeInternal, Message: "truncate the item: " + err.Error()}); err != nil {
				return err
			}
			continue
		}
		it.transcript = text
		it.sentMS = min(it.sentMS, end)
		it.status = "incomplete"
		c.log.Debug("realtime: truncated", "item", it.id, "audio_end_ms", end, "frames", kept)
		if err := c.send("conversation.item.truncated", map[string]any{"item_id": it.id, "content_index": 0, "audio_end_ms": end}); err != nil {
			return err
		}
	}
	if c.want != nil {
		return c.startWanted()
	}
	if c.speechItem != "" { // the user is speaking: get the history ready
		c.prefillAhead()
	}
	return nil
}

// tryAcquire takes a turn slot if one is free now.
func (c *rtConn) tryAcquire() (func(), bool) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	release, err := c.s.lim.acquire(done)
	if err != nil {
		return nil, false
	}
	return release, true
}

// prefillAhead computes the history before the user's coming turn while
// they speak (a free slot permitting), so that at end of speech only their
// audio is left to encode and prefill.
func (c *rtConn) prefillAhead() {
	if c.pre != nil || c.resp != nil || c.s.draining.Load() {
		return
	}
	if n := c.sess.Unfed(); n == 0 && c.sess.Turns() > 0 {
		return
	}
	release, ok := c.tryAcquire()
	if !ok {
		return
	}
	req := pipeline.Request{System: c.cfg.Instructions}
	if aerr := c.s.encodeText(c.ctx, c.be, &req); aerr != nil {
		release()
		return
	}
	st, err := c.be.Engine.Prefill(c.ctx, c.sess, req)
	if err != nil {
		release()
		c.log.Debug("realtime: no prefill ahead", "err", err)
		return
	}
	c.pre, c.preRelease = st, release
}

func (c *rtConn) stopPrefill() {
	if c.pre == nil {
		return
	}
	c.pre.Cancel()
	for range c.pre.Events {
	}
	c.preRelease()
	c.pre = nil
}

func (c *rtConn) prefillEvent(ev pipeline.Event) error {
	switch ev := ev.(type) {
	case *pipeline.DoneEvent:
		c.s.rt.prefilled.Add(float64(ev.Timings.PromptRows))
		c.log.Debug("realtime: prefilled ahead", "rows", ev.Timings.PromptRows, "took", ev.Timings.Total)
	case *pipeline.ErrorEvent:
		c.log.Debug("realtime: prefill ahead failed", "err", ev.Err)
	default:
		return nil
	}
	for range c.pre.Events { // closes right after the terminal event
	}
	c.preRelease()
	c.pre = nil
	return c.settle()
}
