package server

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server/realtime"
)

// audioResampler takes the model's speech to the wire's 24 kHz.
type audioResampler struct{ st *audio.Stream }

func (r *audioResampler) to24k(pcm []float32, rate int) ([]float32, error) {
	if rate == rtRate {
		return pcm, nil
	}
	if r.st == nil {
		rs, err := audio.NewResampler(rate, rtRate)
		if err != nil {
			return nil, fmt.Errorf("reply audio at %d Hz: %w", rate, err)
		}
		r.st = rs.NewStream()
	}
	return r.st.Append(nil, pcm), nil
}

// startWanted starts the response asked for, unless the session is busy
// (a prefill ahead is finishing: settle starts it then).
func (c *rtConn) startWanted() error {
	if c.resp != nil || c.pre != nil {
		return nil
	}
	w := c.want
	c.want = nil
	return c.startResponse(w)
}

// responseJSON is a response object as response.created and
// response.done carry it.
func (c *rtConn) responseJSON(id, status string, details any, output []map[string]any, usage any) map[string]any {
	m := map[string]any{"id": id, "object": "realtime.response", "status": status, "status_details": details,
		"output": output, "conversation_id": c.cfg.ID, "usage": usage, "metadata": nil}
	if c.dialect == realtime.Beta {
		m["modalities"] = []string{"text", "audio"}
		m["voice"] = c.cfg.Voice
		m["output_audio_format"] = "pcm16"
	} else {
		m["output_modalities"] = []string{"audio"}
		m["audio"] = map[string]any{"output": map[string]any{"format": map[string]any{"type": "audio/pcm", "rate": rtRate}, "voice": c.cfg.Voice}}
	}
	return m
}

// failResponse reports a response that could not start: response.created
// and response.done with status failed, so that a client waiting for its
// end sees one, and an error event.
func (c *rtConn) failResponse(e *realtime.Error) error {
	id := newID("resp_")
	details := map[string]any{"type": "failed", "error": map[string]any{"type": e.Type, "code": e.Code}}
	if err := c.send("response.created", map[string]any{"response": c.responseJSON(id, "in_progress", nil, []map[string]any{}, nil)}); err != nil {
		return err
	}
	if err := c.sendError(e); err != nil {
		return err
	}
	return c.send("response.done", map[string]any{"response": c.responseJSON(id, "failed", details, []map[string]any{}, nil)})
}

// cancelledBeforeStart reports a response that was cancelled while it
// waited to start (a prefill ahead was finishing): response.created and
// response.done with status cancelled, so that a client that asked for it
// (or whose speech the server VAD answers) sees it end. The user's input
// stays in the conversation, unanswered.
func (c *rtConn) cancelledBeforeStart() error {
	id := newID("resp_")
	if err := c.send("response.created", map[string]any{"response": c.responseJSON(id, "in_progress", nil, []map[string]any{}, nil)}); err != nil {
		return err
	}
	details := map[string]any{"type": "cancelled", "reason": "client_cancelled"}
	return c.send("response.done", map[string]any{"response": c.responseJSON(id, "cancelled", details, []map[string]any{}, nil)})
}

// startResponse starts a turn with the user items the model has not heard.
func (c *rtConn) startResponse(w *rtWant) error {
	eventID := ""
	if w.params != nil {
		eventID = w.params.ID()
	}
	if c.s.draining.Load() {
		return c.failResponse(&realtime.Error{Type: realtime.TypeServer, Code: codeShuttingDown, Message: "the server is shutting down"})
	}
	var pending []*rtItem
	var texts []string
	var pcm []float32
	for _, it := range c.items {
		if it.role == "user" && !it.inHistory {
			pending = append(pending, it)
			texts = append(texts, it.texts...)
			pcm = append(pcm, it.audio...)
		}
	}
	if len(pending) == 0 {
		return c.sendError(realtime.Invalid(codeNoInput, "",
			"there is no new user input to respond to: append and commit audio, or create a user item, first").WithEventID(eventID))
	}
	cfg := c.cfg
	req := pipeline.Request{
		Text:          strings.Join(texts, "\n"),
		Mode:          pipeline.Interleaved,
		TextSampling:  pipeline.DefaultText,
		AudioSampling: pipeline.DefaultAudio,
		MaxNewTokens:  c.s.cfg.MaxNewTokens,
		Seed:          uint64(c.s.seed()),
	}
	if c.sess.Turns() == 0 {
		req.System = cfg.Instructions
	}
	if p := w.params; p != nil {
		if p.Instructions != nil && *p.Instructions != cfg.Instructions && c.sess.Turns() > 0 {
			return c.sendError(realtime.Invalid(realtime.CodeUnsupported, "response.instructions",
				"the instructions are the system prompt of the conversation's first turn; they cannot change once the model has answered").WithEventID(eventID))
		}
		if p.Instructions != nil && c.sess.Turns() == 0 && *p.Instructions != cfg.Instructions {
			// The first turn's system prompt differs from the session's,
			// which a prefill may have computed already: start afresh.
			c.sess.Close()
			c.sess = c.be.Engine.NewSession()
			req.System = *p.Instructions
		}
		if p.Temperature != nil {
			cfg.Temperature = *p.Temperature
		}
		if p.MaxOutputTokens != nil {
			cfg.MaxOutputTokens = *p.MaxOutputTokens
		}
	}
	req.AudioSampling.Temperature = cfg.Temperature
	if cfg.MaxOutputTokens > 0 {
		req.MaxNewTokens = min(req.MaxNewTokens, cfg.MaxOutputTokens)
	}
	if len(pcm) > 0 {
		req.Audio = &audio.Clip{SampleRate: rtRate, Samples: pcm}
	}
	if aerr := c.s.encodeText(c.ctx, c.be, &req); aerr != nil {
		return c.failResponse(rtError(aerr))
	}
	release, ok := c.tryAcquire()
	if !ok {
		return c.failResponse(&realtime.Error{Type: realtime.TypeRateLimit, Code: codeRateLimited,
			Message: "the server is running its maximum number of turns; retry later"})
	}
	if c.s.hookStart != nil {
		c.s.hookStart(&req)
	}
	st, err := c.be.Engine.Start(c.ctx, c.sess, req)
	if err != nil {
		release()
		return c.failResponse(rtError(startError(err, "input_audio", c.s.cfg.RetryAfter)))
	}
	for _, it := range pending {
		it.inHistory = true
	}
	for _, it := range c.items { // an older reply can no longer be cut
		it.stream = nil
		it.truncateMS = nil
	}
	c.nresp++
	r := &rtResponse{id: newID("resp_"), st: st, release: release, speechEnd: w.speechEnd, rs: &audioResampler{}, inputs: pending}
	r.item = &rtItem{id: newID("item_"), role: "assistant", status: "in_progress", inHistory: true}
	c.resp = r
	prev := c.lastItem
	c.items = append(c.items, r.item)
	c.lastItem = r.item.id
	c.log.Info("realtime: response started", "response", r.id, "audio_ms", ms(int64(len(pcm))), "text_bytes", len(req.Text), "seed", req.Seed)
	if err := c.send("response.created", map[string]any{"response": c.responseJSON(r.id, "in_progress", nil, []map[string]any{}, nil)}); err != nil {
		return err
	}
	if err := c.send("response.output_item.added", map[string]any{"response_id": r.id, "output_index": 0, "item": r.item.json(c.dialect)}); err != nil {
		return err
	}
	if err := c.itemAdded(r.item, prev); err != nil {
		return err
	}
	return c.send("response.content_part.added", c.partFields(r, map[string]any{"part": map[string]any{"type": "audio", "transcript": ""}}))
}

// partFields adds the ids of the response's one content part to f.
func (c *rtConn) partFields(r *rtResponse, f map[string]any) map[string]any {
	f["response_id"], f["item_id"], f["output_index"], f["content_index"] = r.id, r.item.id, 0, 0
	return f
}

// rtError turns a route error into an error event's.
func rtError(e *apiError) *realtime.Error {
	out := &realtime.Error{Type: e.Type, Code: e.Code, Message: e.Message, Param: e.Param}
	return out
}

// cancelResponse stops the response at the engine's next frame; its
// output from now on is not sent.
func (c *rtConn) cancelResponse(reason string) {
	r := c.resp
	if r == nil || r.cut != "" {
		return
	}
	r.cut = reason
	r.st.Cancel()
	c.log.Info("realtime: response cancelled", "response", r.id, "reason", reason, "sent_ms", ms(r.samples))
}

// responseEvent handles one event of the running turn.
func (c *rtConn) responseEvent(ev pipeline.Event) error {
	r := c.resp
	switch ev := ev.(type) {
	case *pipeline.TextEvent:
		if r.cut != "" {
			return nil
		}
		r.item.transcript += ev.Delta
		return c.send("response.output_audio_transcript.delta", c.partFields(r, map[string]any{"delta": ev.Delta}))
	case *pipeline.AudioEvent:
		if r.cut != "" {
			return nil
		}
		pcm, err := r.rs.to24k(ev.Samples, ev.Rate)
		if err != nil {
			r.st.Cancel()
			return err
		}
		if len(pcm) == 0 {
			return nil
		}
		if err := c.send("response.output_audio.delta", c.partFields(r, map[string]any{"delta": base64.StdEncoding.EncodeToString(audio.PCM16LE(pcm))})); err != nil {
			return err
		}
		r.samples += int64(len(pcm))
		r.frames++
		r.item.sentMS = ms(r.samples)
		if !r.firstAudio {
			r.firstAudio = true
			if !r.speechEnd.IsZero() {
				d := time.Since(r.speechEnd)
				c.s.rt.speechToAu.Observe(d.Seconds())
				c.log.Info("realtime: first audio", "response", r.id, "after_speech_end", d)
			}
		}
		return nil
	case *pipeline.DoneEvent:
		return c.endResponse(ev, nil)
	case *pipeline.ErrorEvent:
		return c.endResponse(nil, ev)
	}
	return nil
}

// endResponse reports the end of the response: the .done events, the
// item as the history keeps it, and response.done with its status and
// usage.
func (c *rtConn) endResponse(done *pipeline.DoneEvent, fail *pipeline.ErrorEvent) error {
	r := c.resp
	for range r.st.Events { // closes right after the terminal event
	}
	r.release()
	c.resp = nil
	var tm pipeline.Timings
	status, outcome := "completed", ""
	var details any
	switch {
	case done != nil:
		tm, outcome = done.Timings, done.Stop.String()
		if done.Stop == pipeline.MaxTokens {
			status = "incomplete"
			details = map[string]any{"type": "incomplete", "reason": "max_output_tokens"}
		}
	case r.cut != "" && cancelled(fail.Err):
		tm, outcome, status = fail.Timings, "cancelled", "cancelled"
		details = map[string]any{"type": "cancelled", "reason": r.cut}
	default:
		tm, outcome, status = fail.Timings, "failed", "failed"
		if cancelled(fail.Err) {
			outcome = "cancelled"
		}
		ae := eventError(fail.Err)
		details = map[string]any{"type": "failed", "error": map[string]any{"type": ae.Type, "code": ae.Code}}
		c.log.Warn("realtime: response failed", "response", r.id, "err", fail.Err)
	}
	c.s.met.turn(outcome, tm)
	it := r.item
	it.status = map[string]string{"completed": "completed", "cancelled": "incomplete", "incomplete": "incomplete", "failed": "incomplete"}[status]
	if tm.Steps > 0 || done != nil {
		it.stream = r.st
		if r.cut != "" && (it.truncateMS == nil || *it.truncateMS > it.sentMS) {
			// Interrupted: the history keeps no more than what was sent,
			// unless the client says it played less.
			sent := it.sentMS
			it.truncateMS = &sent
		}
		for _, in := range r.inputs {
			in.audio, in.texts = nil, nil // the model has them now
		}
	} else { // nothing was generated: the engine forgot the turn and its input
		it.inHistory, it.truncateMS = false, nil
		for _, in := range r.inputs {
			in.inHistory = false
		}
	}
	f := func(m map[string]any) map[string]any { return c.partFields(r, m) }
	if err := c.send("response.output_audio.done", f(map[string]any{})); err != nil {
		return err
	}
	if err := c.send("response.output_audio_transcript.done", f(map[string]any{"transcript": it.transcript})); err != nil {
		return err
	}
	if err := c.send("response.content_part.done", f(map[string]any{"part": map[string]any{"type": "audio", "transcript": it.transcript}})); err != nil {
		return err
	}
	if err := c.send("response.output_item.done", map[string]any{"response_id": r.id, "output_index": 0, "item": it.json(c.dialect)}); err != nil {
		return err
	}
	if err := c.send("conversation.item.done", map[string]any{"item": it.json(c.dialect)}); err != nil {
		return err
	}
	usage := map[string]any{
		"total_tokens": tm.PromptRows + tm.Steps, "input_tokens": tm.PromptRows, "output_tokens": tm.Steps,
		"input_token_details":  map[string]any{"cached_tokens": 0, "text_tokens": 0, "audio_tokens": 0},
		"output_token_details": map[string]any{"text_tokens": tm.Tokens, "audio_tokens": tm.Frames},
	}
	if err := c.send("response.done", map[string]any{"response": c.responseJSON(r.id, status, details, []map[string]any{it.json(c.dialect)}, usage)}); err != nil {
		return err
	}
	c.log.Info("realtime: response done", "response", r.id, "status", status, "steps", tm.Steps, "sent_ms", it.sentMS)
	return c.settle()
}
