package server

import (
	"context"
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestRealtimeSession: session.created comes first with the defaults;
// session.update changes only the fields it sends and session.updated
// reports the whole session; a bad update is an error naming the field, and
// the socket stays open.
func TestRealtimeSession(t *testing.T) {
	ts := startServer(t, Config{})
	c := dialRT(t, ts, nil)
	created := c.seen[0]
	for path, want := range map[string]any{
		"session.type": "realtime", "session.object": "realtime.session",
		"session.audio.input.format.type": "audio/pcm", "session.audio.input.format.rate": 24000.0,
		"session.audio.output.format.type": "audio/pcm", "session.audio.output.voice": "alloy",
		"session.audio.input.turn_detection.type": "server_vad", "session.audio.input.turn_detection.threshold": 0.5,
		"session.audio.input.turn_detection.silence_duration_ms": 500.0, "session.audio.input.turn_detection.interrupt_response": true,
		"session.max_output_tokens": "inf", "session.instructions": "Respond with interleaved text and audio.",
	} {
		if got := created.get(path); got != want {
			t.Errorf("session.created %s = %v, want %v", path, got, want)
		}
	}
	if !strings.HasPrefix(created.str("session.id"), "sess_") {
		t.Errorf("session id %q", created.str("session.id"))
	}

	c.send(map[string]any{"type": "session.update", "event_id": "u1", "session": map[string]any{
		"type": "realtime", "instructions": "Be brief.", "max_output_tokens": 64,
		"audio": map[string]any{"input": map[string]any{"turn_detection": map[string]any{"type": "server_vad", "threshold": 0.7}},
			"output": map[string]any{"voice": "marin"}},
	}})
	up := c.until("session.updated")[0]
	for path, want := range map[string]any{
		"session.instructions": "Be brief.", "session.max_output_tokens": 64.0, "session.audio.output.voice": "marin",
		"session.audio.input.turn_detection.threshold":           0.7,
		"session.audio.input.turn_detection.silence_duration_ms": 500.0, // not sent: kept
		"session.temperature":                                    1.0,
	} {
		if got := up.get(path); got != want {
			t.Errorf("session.updated %s = %v, want %v", path, got, want)
		}
	}
	// Only what is sent changes; null turns detection off.
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"audio": map[string]any{"input": map[string]any{"turn_detection": nil}}}})
	up = c.until("session.updated")[0]
	if up.get("session.audio.input.turn_detection") != nil || up.str("session.instructions") != "Be brief." || up.str("session.audio.output.voice") != "marin" {
		t.Errorf("after turning detection off: %v", up["session"])
	}
	for _, tc := range []struct {
		name    string
		session map[string]any
		code    string
		param   string
	}{
		{"unknown voice", map[string]any{"audio": map[string]any{"output": map[string]any{"voice": "nobody"}}}, "invalid_value", "session.audio.output.voice"},
		{"format", map[string]any{"audio": map[string]any{"input": map[string]any{"format": map[string]any{"type": "audio/pcmu"}}}}, "unsupported_value", "session.audio.input.format"},
		{"semantic vad", map[string]any{"turn_detection": map[string]any{"type": "semantic_vad"}}, "unsupported_value", "session.turn_detection.type"},
		{"threshold", map[string]any{"turn_detection": map[string]any{"type": "server_vad", "threshold": 2}}, "invalid_value", "session.turn_detection.threshold"},
		{"temperature", map[string]any{"temperature": -1}, "invalid_value", "session.temperature"},
		{"unknown field", map[string]any{"colour": "blue"}, "unknown_parameter", "session.colour"},
		{"tokens", map[string]any{"max_output_tokens": "lots"}, "invalid_value", "session.max_output_tokens"},
	} {
		c.send(map[string]any{"type": "session.update", "event_id": "bad-" + tc.name, "session": tc.session})
		c.expectError(tc.code, tc.param, "bad-"+tc.name)
	}
	// Still open, still the same session.
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"temperature": 0.5}})
	up = c.until("session.updated")[0]
	if up.num("session.temperature") != 0.5 || up.str("session.audio.output.voice") != "marin" {
		t.Errorf("after the errors: %v", up["session"])
	}
}

// TestRealtimeManualTurn: with turn detection off the client appends,
// commits and asks for the response; every event of a response comes in
// order, its audio is 24 kHz PCM16 and response.done reports its usage.
func TestRealtimeManualTurn(t *testing.T) {
	ts := startServer(t, Config{})
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil, "max_response_output_tokens": 30}})
	c.until("session.updated")

	c.send(map[string]any{"type": "input_audio_buffer.commit", "event_id": "empty"})
	c.expectError("input_audio_buffer_commit_empty", "", "empty")
	c.appendAudio(utterance(0, 200*time.Millisecond, 0))
	c.send(map[string]any{"type": "input_audio_buffer.clear"})
	c.until("input_audio_buffer.cleared")
	c.appendAudio(utterance(100*time.Millisecond, 800*time.Millisecond, 100*time.Millisecond))
	c.send(map[string]any{"type": "input_audio_buffer.commit"})
	evs := c.until("conversation.item.done")
	if got := types(evs); !slices.Equal(got, []string{"input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"}) {
		t.Errorf("commit events %v", got)
	}
	userItem := evs[0].str("item_id")
	if evs[1].str("item.id") != userItem || evs[1].str("item.role") != "user" {
		t.Errorf("item.added %v, want user item %s", evs[1], userItem)
	}
	c.send(map[string]any{"type": "response.create"})
	evs = c.until("response.done")
	checkResponse(t, evs, "completed", "incomplete")
	c.send(map[string]any{"type": "response.create", "event_id": "again"})
	c.expectError("no_input", "", "again")
}

// types lists the events' types.
func types(evs []rtEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.typ()
	}
	return out
}

// checkResponse checks one response's events, response.created to
// response.done: their order, ids and audio; status is one of want.
func checkResponse(t *testing.T, evs []rtEvent, want ...string) (audioBytes int, transcript string) {
	t.Helper()
	var skel []string
	var respID, itemID string
	for _, ev := range evs {
		switch ev.typ() {
		case "response.output_audio.delta":
			raw, err := base64.StdEncoding.DecodeString(ev.str("delta"))
			if err != nil || len(raw)%2 != 0 {
				t.Errorf("audio delta: %d bytes, %v", len(raw), err)
			}
			audioBytes += len(raw)
		case "response.output_audio_transcript.delta":
			transcript += ev.str("delta")
		case "response.created":
			respID = ev.str("response.id")
			skel = append(skel, ev.typ())
		case "response.output_item.added":
			itemID = ev.str("item.id")
			skel = append(skel, ev.typ())
		case "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
			"conversation.item.truncated":
		default:
			if ev.typ() == "conversation.item.added" && ev.str("item.role") == "user" {
				continue
			}
			if ev.typ() == "conversation.item.done" && ev.str("item.role") == "user" {
				continue
			}
			skel = append(skel, ev.typ())
		}
		if id := ev.str("response_id"); id != "" && id != respID {
			t.Errorf("%s of response %s inside response %s", ev.typ(), id, respID)
		}
		if id := ev.str("item_id"); id != "" && strings.HasPrefix(ev.typ(), "response.") && id != itemID {
			t.Errorf("%s of item %s, want %s", ev.typ(), id, itemID)
		}
	}
	wantSkel := []string{"response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
		"response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
		"response.output_item.done", "conversation.item.done", "response.done"}
	if !slices.Equal(skel, wantSkel) {
		t.Errorf("response events\n%v\nwant\n%v", skel, wantSkel)
	}
	done := evs[len(evs)-1]
	if st := done.str("response.status"); !slices.Contains(want, st) {
		t.Errorf("response.done status %q (%v), want one of %v", st, done.get("response.status_details"), want)
	}
	if done.num("response.usage.output_tokens") <= 0 || done.num("response.usage.input_tokens") <= 0 {
		t.Errorf("usage %v", done.get("response.usage"))
	}
	for _, ev := range evs {
		if ev.typ() == "response.output_audio_transcript.done" && ev.str("transcript") != transcript {
			t.Errorf("transcript.done %q, deltas %q", ev.str("transcript"), transcript)
		}
	}
	if audioBytes == 0 {
		t.Error("no audio")
	}
	if audioBytes%(2*rtFrame) != 0 {
		t.Errorf("%d audio bytes: not whole 80 ms frames of 24 kHz PCM16", audioBytes)
	}
	return audioBytes, transcript
}

// TestRealtimeServerVAD: with the default server VAD, speech starts and
// stops, the utterance is committed and the response starts with no client
// event; the history before it was prefilled while the user spoke.
func TestRealtimeServerVAD(t *testing.T) {
	ts := startServer(t, Config{})
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"max_output_tokens": 24}})
	c.until("session.updated")
	c.appendAudio(utterance(500*time.Millisecond, 900*time.Millisecond, 900*time.Millisecond))
	evs := c.until("response.done")
	var started, stopped rtEvent
	for _, ev := range evs {
		switch ev.typ() {
		case "input_audio_buffer.speech_started":
			started = ev
		case "input_audio_buffer.speech_stopped":
			stopped = ev
		}
	}
	if started == nil || stopped == nil {
		t.Fatalf("no speech_started/stopped in %v", types(evs))
	}
	if at := started.num("audio_start_ms"); at < 450 || at > 600 {
		t.Errorf("speech started at %v ms, want about 500", at)
	}
	if at := stopped.num("audio_end_ms"); at < 1350 || at > 1500 {
		t.Errorf("speech stopped at %v ms, want about 1400", at)
	}
	if started.str("item_id") == "" || started.str("item_id") != stopped.str("item_id") {
		t.Errorf("speech item ids %q, %q", started.str("item_id"), stopped.str("item_id"))
	}
	i := slices.IndexFunc(evs, func(ev rtEvent) bool { return ev.typ() == "response.created" })
	checkResponse(t, evs[i:], "completed", "incomplete")
	if !strings.Contains(ts.logs.String(), "prefilled ahead") {
		t.Error("no prefill while the user spoke (log: realtime: prefilled ahead)")
	}
}

// TestRealtimeBargeIn: speech during a response cancels it (response.done
// cancelled, reason turn_detected), the assistant item keeps only the
// audio sent (conversation.item.truncated), a client truncate cuts it to
// what was played, and the new utterance gets its own response.
func TestRealtimeBargeIn(t *testing.T) {
	ts := startServer(t, Config{})
	longReplies(ts)
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"max_output_tokens": 400}})
	c.until("session.updated")
	c.appendAudio(utterance(300*time.Millisecond, 800*time.Millisecond, 800*time.Millisecond))
	for range 5 { // a few frames out before the user speaks again
		c.until("response.output_audio.delta")
	}
	c.appendAudio(utterance(0, 800*time.Millisecond, 0))
	evs := c.until("response.done")
	done := evs[len(evs)-1]
	if done.str("response.status") != "cancelled" || done.str("response.status_details.reason") != "turn_detected" {
		t.Fatalf("response.done %v %v, want cancelled, turn_detected", done.str("response.status"), done.get("response.status_details"))
	}
	if !slices.Contains(types(evs), "input_audio_buffer.speech_started") {
		t.Errorf("no speech_started before the cancellation: %v", types(evs))
	}
	var sent int
	for _, ev := range c.seen {
		if ev.typ() == "response.output_audio.delta" {
			raw, _ := base64.StdEncoding.DecodeString(ev.str("delta"))
			sent += len(raw) / 2
		}
	}
	item := done.get("response.output")
	if item == nil {
		t.Fatal("no output item")
	}
	itemID := evs[len(evs)-1].get("response.output").([]any)[0].(map[string]any)["id"].(string)
	tr := c.until("conversation.item.truncated")
	got := tr[len(tr)-1]
	if got.str("item_id") != itemID || int(got.num("audio_end_ms")) != sent*1000/rtRate {
		t.Errorf("truncated %v, want item %s at %d ms (the audio sent)", got, itemID, sent*1000/rtRate)
	}
	// The client played less than it was sent.
	c.send(map[string]any{"type": "conversation.item.truncate", "item_id": itemID, "content_index": 0, "audio_end_ms": 160})
	tr = c.until("conversation.item.truncated")
	if got := tr[len(tr)-1]; got.num("audio_end_ms") != 160 {
		t.Errorf("client truncate: %v", got)
	}
	c.send(map[string]any{"type": "conversation.item.truncate", "event_id": "late", "item_id": itemID, "content_index": 0, "audio_end_ms": 999999})
	c.expectError("invalid_value", "audio_end_ms", "late")
	c.send(map[string]any{"type": "conversation.item.retrieve", "item_id": itemID})
	ret := c.until("conversation.item.retrieved")
	if st := ret[len(ret)-1].str("item.status"); st != "incomplete" {
		t.Errorf("the cut item's status %q, want incomplete", st)
	}
	// The barge-in's own utterance ends (the rest of its silence) and is
	// answered.
	c.appendAudio(utterance(0, 0, 900*time.Millisecond))
	c.until("input_audio_buffer.speech_stopped")
	c.send(map[string]any{"type": "response.cancel"})
	evs = c.until("response.done")
	if st := evs[len(evs)-1].str("response.status"); st != "cancelled" {
		t.Errorf("second response %s, want cancelled by response.cancel", st)
	}
	if r := evs[len(evs)-1].str("response.status_details.reason"); r != "client_cancelled" {
		t.Errorf("reason %q, want client_cancelled", r)
	}
}

// TestRealtimeItems: conversation.item.create (text and audio),
// retrieve, delete; response.create on text; errors for what cannot be
// done, with the socket open throughout.
func TestRealtimeItems(t *testing.T) {
	ts := startServer(t, Config{})
	longReplies(ts)
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil}})
	c.until("session.updated")
	c.send(map[string]any{"type": "conversation.item.create", "item": map[string]any{"id": "u1", "type": "message", "role": "user",
		"content": []any{map[string]any{"type": "input_text", "text": "Hello!"}}}})
	evs := c.until("conversation.item.done")
	if evs[0].typ() != "conversation.item.added" || evs[0].str("item.id") != "u1" {
		t.Errorf("item create: %v", types(evs))
	}
	c.send(map[string]any{"type": "conversation.item.create", "item": map[string]any{"id": "u2", "type": "message", "role": "user",
		"content": []any{map[string]any{"type": "input_audio", "audio": pcmB64(utterance(0, 300*time.Millisecond, 0))}}}})
	c.until("conversation.item.done")
	c.send(map[string]any{"type": "conversation.item.retrieve", "item_id": "u2"})
	if ev := c.until("conversation.item.retrieved"); ev[0].str("item.id") != "u2" {
		t.Errorf("retrieved %v", ev[0])
	}
	c.send(map[string]any{"type": "conversation.item.delete", "item_id": "u2"})
	if ev := c.until("conversation.item.deleted"); ev[0].str("item_id") != "u2" {
		t.Errorf("deleted %v", ev[0])
	}
	c.send(map[string]any{"type": "conversation.item.delete", "event_id": "d", "item_id": "u2"})
	c.expectError("item_not_found", "item_id", "d")
	c.send(map[string]any{"type": "response.cancel", "event_id": "rc"})
	c.expectError("response_cancel_not_active", "", "rc")
	c.send(map[string]any{"type": "response.create", "response": map[string]any{"max_output_tokens": 300}})
	evs = c.until("response.created")
	c.send(map[string]any{"type": "response.create", "event_id": "twice"})
	evs = append(evs, c.until("response.done")...)
	if !slices.ContainsFunc(evs, func(ev rtEvent) bool {
		return ev.typ() == "error" && ev.str("error.code") == "conversation_already_has_active_response"
	}) {
		t.Errorf("a second response.create while one runs: no error in %v", types(evs))
	}
	checkResponse(t, slices.DeleteFunc(evs, func(ev rtEvent) bool { return ev.typ() == "error" }), "completed", "incomplete")
	c.send(map[string]any{"type": "conversation.item.delete", "event_id": "h", "item_id": "u1"})
	c.expectError("item_in_history", "item_id", "h")
	c.send(map[string]any{"type": "conversation.item.truncate", "event_id": "tu", "item_id": "u1", "content_index": 0, "audio_end_ms": 0})
	c.expectError("invalid_value", "item_id", "tu")
	for _, tc := range []struct{ raw, code string }{
		{`{"type":"no.such.event","event_id":"x1"}`, "unknown_event"},
		{`{"type":`, "invalid_json"},
		{`{"event_id":"x3"}`, "missing_required_parameter"},
		{`{"type":"input_audio_buffer.append","audio":"%%%"}`, "invalid_audio"},
		{`{"type":"input_audio_buffer.append","audio":"AA=="}`, "invalid_audio"},
		{`{"type":"input_audio_buffer.commit","extra":1}`, "unknown_parameter"},
		{`{"type":"conversation.item.create","item":{"type":"message","role":"assistant","content":[]}}`, "unsupported_value"},
		{`{"type":"output_audio_buffer.clear"}`, "unsupported_value"},
	} {
		c.sendRaw([]byte(tc.raw))
		c.expectError(tc.code, "", "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageBinary, []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	c.expectError("binary_message", "", "")
	c.send(map[string]any{"type": "session.update", "session": map[string]any{}})
	c.until("session.updated")
}

// TestRealtimeBeta: a client that sends OpenAI-Beta: realtime=v1 gets the
// beta names (response.audio.delta, conversation.item.created) and the
// flat session object.
func TestRealtimeBeta(t *testing.T) {
	ts := startServer(t, Config{})
	c := dialRT(t, ts, &websocket.DialOptions{HTTPHeader: http.Header{"OpenAI-Beta": {"realtime=v1"}}})
	s := c.seen[0]
	if s.str("session.input_audio_format") != "pcm16" || s.str("session.turn_detection.type") != "server_vad" || s.str("session.voice") != "alloy" {
		t.Errorf("beta session.created %v", s["session"])
	}
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil, "voice": "shimmer", "max_response_output_tokens": 12}})
	up := c.until("session.updated")[0]
	if up.get("session.turn_detection") != nil || up.str("session.voice") != "shimmer" || up.num("session.max_response_output_tokens") != 12 {
		t.Errorf("beta session.updated %v", up["session"])
	}
	c.send(map[string]any{"type": "conversation.item.create", "item": map[string]any{"type": "message", "role": "user",
		"content": []any{map[string]any{"type": "input_text", "text": "Hi"}}}})
	c.send(map[string]any{"type": "response.create"})
	evs := c.until("response.done")
	got := map[string]bool{}
	for _, ev := range evs {
		got[ev.typ()] = true
	}
	for _, want := range []string{"conversation.item.created", "response.audio.delta", "response.audio_transcript.delta", "response.audio.done",
		"response.audio_transcript.done", "response.content_part.added", "response.content_part.done", "response.output_item.done"} {
		if !got[want] && (want != "response.audio_transcript.delta" || got["response.audio_transcript.done"]) {
			if want == "response.audio_transcript.delta" {
				continue // the tiny model may say no text
			}
			t.Errorf("beta response lacks %s (has %v)", want, types(evs))
		}
	}
	for _, ga := range []string{"response.output_audio.delta", "conversation.item.added", "conversation.item.done"} {
		if got[ga] {
			t.Errorf("beta client got the GA event %s", ga)
		}
	}
}

// TestRealtimeCancelBeforeStart: the server VAD answers an utterance that
// arrives in one append (speech starts and ends in one event, while the
// prefill ahead it started still runs, so the response waits for it); a
// response.cancel sent right then ends that response visibly — created,
// then done with status cancelled, reason client_cancelled — whether it
// had started or not, and the next utterance is answered.
func TestRealtimeCancelBeforeStart(t *testing.T) {
	ts := startServer(t, Config{})
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"max_response_output_tokens": 16}})
	c.until("session.updated")
	for round := range 3 {
		c.send(map[string]any{"type": "input_audio_buffer.append",
			"audio": pcmB64(utterance(300*time.Millisecond, 800*time.Millisecond, 900*time.Millisecond))})
		c.until("input_audio_buffer.speech_stopped")
		c.send(map[string]any{"type": "response.cancel"})
		evs := c.until("response.done")
		done := evs[len(evs)-1]
		if !slices.Contains(types(evs), "response.created") {
			t.Errorf("round %d: response.done without response.created: %v", round, types(evs))
		}
		if st, r := done.str("response.status"), done.str("response.status_details.reason"); st != "cancelled" || r != "client_cancelled" {
			t.Errorf("round %d: response %s (%s), want cancelled by the client", round, st, r)
		}
	}
	// The conversation goes on: the next utterance is answered in full.
	c.send(map[string]any{"type": "input_audio_buffer.append",
		"audio": pcmB64(utterance(300*time.Millisecond, 800*time.Millisecond, 900*time.Millisecond))})
	evs := c.until("response.done")
	if st := evs[len(evs)-1].str("response.status"); st == "cancelled" || st == "failed" {
		t.Errorf("the next utterance's response: %s", st)
	}
}

// TestRealtimeTruncateWhilePlaying: a conversation.item.truncate of the
// reply still in progress (a client that stops playback, cancels and
// truncates at once) is kept and applied once the reply has ended, cut at
// what the client played or, for an audio_end_ms past the reply's audio
// (up to the largest integers), at the reply's end; never an error.
func TestRealtimeTruncateWhilePlaying(t *testing.T) {
	ts := startServer(t, Config{})
	longReplies(ts)
	c := dialRT(t, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"turn_detection": nil, "max_output_tokens": 40}})
	c.until("session.updated")
	for _, tc := range []struct {
		name   string
		end    int64
		cancel bool // response.cancel right after the truncate
	}{
		{"played part, then cancelled", 80, true},
		{"played part", 160, false},
		{"past the reply", 60_000, false},
		{"past any reply", 9_000_000_000_000_000, false},
	} {
		c.send(map[string]any{"type": "conversation.item.create", "item": map[string]any{"type": "message", "role": "user",
			"content": []any{map[string]any{"type": "input_text", "text": "Hello!"}}}})
		c.send(map[string]any{"type": "response.create"})
		c.until("response.output_audio.delta")
		itemID := c.seen[len(c.seen)-1].str("item_id")
		c.send(map[string]any{"type": "conversation.item.truncate", "event_id": "tr", "item_id": itemID, "content_index": 0, "audio_end_ms": tc.end})
		if tc.cancel {
			c.send(map[string]any{"type": "response.cancel"})
		}
		evs := c.until("response.done")
		for _, ev := range evs {
			if ev.typ() == "error" {
				t.Errorf("%s: error %s: %s", tc.name, ev.str("error.code"), ev.str("error.message"))
			}
		}
		sent := 0
		for _, ev := range c.seen {
			if ev.typ() == "response.output_audio.delta" && ev.str("item_id") == itemID {
				raw, _ := base64.StdEncoding.DecodeString(ev.str("delta"))
				sent += len(raw) / 2
			}
		}
		want := min(tc.end, int64(sent*1000/rtRate))
		if ev := c.next(); ev.typ() != "conversation.item.truncated" || ev.str("item_id") != itemID || int64(ev.num("audio_end_ms")) != want {
			t.Errorf("%s: after the reply %v, want conversation.item.truncated of %s at %d ms", tc.name, ev, itemID, want)
		}
	}
}
