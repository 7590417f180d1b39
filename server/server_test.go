package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// The wire schema, spelled out independently of the server's own types.
type (
	wireTimings struct {
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
	wireDone struct {
		ConversationID string       `json:"conversation_id"`
		Text           string       `json:"text"`
		Audio          string       `json:"audio"`
		SampleRate     int          `json:"sample_rate"`
		Stop           string       `json:"stop"`
		Seed           int64        `json:"seed"`
		Timings        *wireTimings `json:"timings"`
	}
	wireError struct {
		Error struct {
			Message   string  `json:"message"`
			Type      string  `json:"type"`
			Param     *string `json:"param"`
			Code      string  `json:"code"`
			RequestID string  `json:"request_id"`
		} `json:"error"`
	}
)

// streamed is a /v1/audio/chat stream, checked against the event grammar:
// (text | audio)* then exactly one done or error.
type streamed struct {
	text   string
	pcm    []byte // the audio events' PCM, concatenated
	frames int
	done   *wireDone
	err    *wireError
}

func parseStream(t testing.TB, evs []sseEvent) streamed {
	t.Helper()
	var s streamed
	for i, ev := range evs {
		if s.done != nil || s.err != nil {
			t.Fatalf("event %d (%s) after the terminal event", i, ev.name)
		}
		switch ev.name {
		case "text":
			var d struct {
				Delta *string `json:"delta"`
			}
			if err := json.Unmarshal([]byte(ev.data), &d); err != nil || d.Delta == nil {
				t.Fatalf("text event %q: %v", ev.data, err)
			}
			s.text += *d.Delta
		case "audio":
			var a struct {
				Seq *int    `json:"seq"`
				PCM *string `json:"pcm"`
			}
			if err := json.Unmarshal([]byte(ev.data), &a); err != nil || a.Seq == nil || a.PCM == nil {
				t.Fatalf("audio event %.80q: %v", ev.data, err)
			}
			if *a.Seq != s.frames {
				t.Fatalf("audio event seq %d, want %d", *a.Seq, s.frames)
			}
			pcm, err := base64.StdEncoding.DecodeString(*a.PCM)
			if err != nil {
				t.Fatalf("audio event %d: pcm: %v", s.frames, err)
			}
			if len(pcm) != 2*frameLen {
				t.Fatalf("audio event %d: %d PCM bytes, want %d (one 80 ms frame of 16-bit 24 kHz)", s.frames, len(pcm), 2*frameLen)
			}
			s.pcm = append(s.pcm, pcm...)
			s.frames++
		case "done":
			s.done = &wireDone{}
			if err := json.Unmarshal([]byte(ev.data), s.done); err != nil {
				t.Fatalf("done event: %v", err)
			}
		case "error":
			s.err = &wireError{}
			if err := json.Unmarshal([]byte(ev.data), s.err); err != nil {
				t.Fatalf("error event: %v", err)
			}
		default:
			t.Fatalf("unknown event %q", ev.name)
		}
	}
	if s.done == nil && s.err == nil {
		t.Fatalf("stream of %d events without done or error", len(evs))
	}
	return s
}

// streamAudioChat posts a streaming request and parses the reply.
func streamAudioChat(t testing.TB, ts *testServer, req map[string]any) (streamed, *http.Response) {
	t.Helper()
	resp := ts.post(t, "/v1/audio/chat", req)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return parseStream(t, readAll(t, resp.Body)), resp
}

// engineReply runs req on the engine directly, as the server's reference.
func engineReply(t testing.TB, eng *pipeline.Engine, req pipeline.Request) (string, []byte) {
	t.Helper()
	sess := eng.NewSession()
	defer sess.Close()
	st, err := eng.Start(context.Background(), sess, req)
	if err != nil {
		t.Fatal(err)
	}
	var text string
	var pcm []byte
	for ev := range st.Events {
		switch ev := ev.(type) {
		case *pipeline.TextEvent:
			text += ev.Delta
		case *pipeline.AudioEvent:
			pcm = append(pcm, audio.PCM16LE(ev.Samples)...)
		case *pipeline.ErrorEvent:
			t.Fatal(ev.Err)
		}
	}
	return text, pcm
}

func TestAudioChatStream(t *testing.T) {
	ts := startServer(t, Config{})
	clip := loadClip(t, "case1_question_16k.safetensors")
	s, resp := streamAudioChat(t, ts, map[string]any{"audio": wavBase64(t, clip), "max_new_tokens": 40, "temperature": 0, "seed": 7})
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	if s.err != nil {
		t.Fatalf("error event: %+v", s.err.Error)
	}
	d := s.done
	if id := resp.Header.Get(headerConversationID); id == "" || id != d.ConversationID {
		t.Errorf("conversation id: header %q, done %q", id, d.ConversationID)
	}
	if d.Text != s.text {
		t.Errorf("done text %q, text events %q", d.Text, s.text)
	}
	if d.Seed != 7 {
		t.Errorf("seed %d, want 7", d.Seed)
	}
	tm := d.Timings
	if d.Stop != "max_tokens" && d.Stop != "end_of_turn" || d.Stop == "max_tokens" && tm.Steps != 40 || tm.Steps > 40 {
		t.Errorf("stop %q after %d steps (max 40)", d.Stop, tm.Steps)
	}
	if s.frames == 0 || tm.FirstAudioMS == nil || tm.FirstTextMS == nil {
		t.Fatalf("%d audio frames, first audio %v, first text %v", s.frames, tm.FirstAudioMS, tm.FirstTextMS)
	}
	t.Logf("text %q, %d frames, total %.1f ms, first text %.1f ms, first audio %.1f ms", d.Text, s.frames, tm.TotalMS, *tm.FirstTextMS, *tm.FirstAudioMS)
	if want := round3(float64(s.frames) * 0.08); tm.AudioSeconds != want {
		t.Errorf("audio_seconds %v, want %v (%d frames of 80 ms)", tm.AudioSeconds, want, s.frames)
	}
	if tm.Frames < s.frames || tm.Tokens+tm.Frames != tm.Steps {
		t.Errorf("timings count %d tokens + %d frames for %d steps, %d frames streamed", tm.Tokens, tm.Frames, tm.Steps, s.frames)
	}
	for _, stage := range []string{pipeline.StageFrontend, pipeline.StageEncoder, pipeline.StageBackbone, pipeline.StageDepth, pipeline.StageCodec} {
		if tm.BusyMS[stage] <= 0 {
			t.Errorf("no busy time for stage %s: %v", stage, tm.BusyMS)
		}
	}

	// The wire carries exactly the engine's reply: the same request on the
	// engine directly (with the clip as the server decodes it from the
	// 16-bit WAV) gives the same text and the same PCM16 bytes.
	decoded, err := audio.DecodeBytes(wavBytes(t, clip), audio.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	text, pcm := engineReply(t, ts.eng, pipeline.Request{Audio: decoded, MaxNewTokens: 40,
		TextSampling: pipeline.DefaultText, AudioSampling: pipeline.Sampling{TopK: 4}, Seed: 7})
	if text != s.text {
		t.Errorf("engine text %q, streamed %q", text, s.text)
	}
	if !bytes.Equal(pcm, s.pcm) {
		t.Errorf("streamed PCM (%d bytes) differs from the engine's (%d bytes)", len(s.pcm), len(pcm))
	}
}

func TestAudioChatJSON(t *testing.T) {
	ts := startServer(t, Config{})
	req := map[string]any{"audio": questionWAV(t), "text": "Answer briefly.", "max_new_tokens": 30, "top_k": 1, "seed": 3}
	s, _ := streamAudioChat(t, ts, req)
	if s.err != nil {
		t.Fatalf("error event: %+v", s.err.Error)
	}

	req["stream"] = false
	resp := ts.post(t, "/v1/audio/chat", req)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var d wireDone
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.ConversationID == "" || d.ConversationID == s.done.ConversationID || resp.Header.Get(headerConversationID) != d.ConversationID {
		t.Errorf("conversation ids: streamed %q, JSON %q, header %q", s.done.ConversationID, d.ConversationID, resp.Header.Get(headerConversationID))
	}
	// top_k 1 is greedy: both replies are the same.
	if d.Text != s.text {
		t.Errorf("JSON text %q, streamed %q", d.Text, s.text)
	}
	wav, err := base64.StdEncoding.DecodeString(d.Audio)
	if err != nil {
		t.Fatal(err)
	}
	clip, err := audio.DecodeBytes(wav, audio.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if clip.SampleRate != 24000 || d.SampleRate != 24000 || len(clip.Samples) != s.frames*frameLen {
		t.Errorf("WAV of %d samples at %d Hz (sample_rate %d), want %d at 24000", len(clip.Samples), clip.SampleRate, d.SampleRate, s.frames*frameLen)
	}
	if len(wav) < 44 || !bytes.Equal(wav[44:], s.pcm) {
		t.Errorf("the WAV's PCM differs from the streamed PCM")
	}
}

func TestConversationTurns(t *testing.T) {
	ts := startServer(t, Config{})
	first, _ := streamAudioChat(t, ts, map[string]any{"text": "Hello!", "system": "Respond with interleaved text and audio.", "max_new_tokens": 12, "temperature": 0})
	if first.err != nil {
		t.Fatal(first.err.Error)
	}
	id := first.done.ConversationID
	// Each next turn starts the moment the previous one's done event
	// arrives: the conversation must never be found busy.
	for turn := 2; turn <= 5; turn++ {
		req := map[string]any{"conversation_id": id, "max_new_tokens": 8, "temperature": 0}
		if turn%2 == 0 {
			req["audio"] = questionWAV(t)
		} else {
			req["text"] = fmt.Sprintf("Turn %d.", turn)
		}
		s, _ := streamAudioChat(t, ts, req)
		if s.err != nil {
			t.Fatalf("turn %d: %+v", turn, s.err.Error)
		}
		if s.done.ConversationID != id {
			t.Fatalf("turn %d: conversation %q, want %q", turn, s.done.ConversationID, id)
		}
	}
	ts.convs.mu.Lock()
	c := ts.convs.byID[id]
	ts.convs.mu.Unlock()
	if c == nil || c.sess.Turns() != 5 {
		t.Fatalf("conversation %q holds %v", id, c)
	}

	// A turn running on a conversation makes it busy for others.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := ts.do(t, ctx, http.MethodPost, "/v1/audio/chat", map[string]any{"conversation_id": id, "text": "Go on.", "max_new_tokens": 2000})
	defer long.Body.Close()
	if _, ok := newSSEReader(long.Body).next(); !ok {
		t.Fatal("no event from the long turn")
	}
	resp := ts.post(t, "/v1/audio/chat", map[string]any{"conversation_id": id, "text": "Me too."})
	checkError(t, resp, http.StatusConflict, codeConversationBusy, "conversation_id")
}

// checkError checks an error response's status, code, param and request id.
func checkError(t testing.TB, resp *http.Response, status int, code, param string) *wireError {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var e wireError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("status %d, body %q: %v", resp.StatusCode, body, err)
	}
	got := ""
	if e.Error.Param != nil {
		got = *e.Error.Param
	}
	if resp.StatusCode != status || e.Error.Code != code || got != param {
		t.Errorf("got %d %s param %q (%s), want %d %s param %q", resp.StatusCode, e.Error.Code, got, e.Error.Message, status, code, param)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error without message or type: %s", body)
	}
	if rid := resp.Header.Get(echo.HeaderXRequestID); rid == "" || e.Error.RequestID != rid {
		t.Errorf("request id: header %q, body %q", rid, e.Error.RequestID)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q", ct)
	}
	return &e
}

// wavHeader builds a WAV header with the given format tag and data size.
func wavHeader(tag, channels, rate, bits int, data []byte, dataSize uint32) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("RIFF")
	binary.Write(&b, le, uint32(36+len(data)))
	b.WriteString("WAVEfmt ")
	binary.Write(&b, le, uint32(16))
	binary.Write(&b, le, uint16(tag))
	binary.Write(&b, le, uint16(channels))
	binary.Write(&b, le, uint32(rate))
	binary.Write(&b, le, uint32(rate*channels*bits/8))
	binary.Write(&b, le, uint16(channels*bits/8))
	binary.Write(&b, le, uint16(bits))
	b.WriteString("data")
	binary.Write(&b, le, dataSize)
	b.Write(data)
	return b.Bytes()
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestBadRequests(t *testing.T) {
	ts := startServer(t, Config{MaxAudio: 2 * time.Second, MaxBodyBytes: 256 << 10, MaxNewTokens: 100})
	tone := func(seconds float64, rate int) string {
		c := &audio.Clip{SampleRate: rate, Samples: make([]float32, int(seconds*float64(rate)))}
		for i := range c.Samples {
			c.Samples[i] = float32(0.1 * float64(i%50) / 50)
		}
		return wavBase64(t, c)
	}
	good := tone(0.5, 16000)
	mp3 := b64(wavHeader(0x55, 1, 16000, 16, make([]byte, 400), 400))
	empty := b64(wavHeader(1, 1, 16000, 16, nil, 0))
	truncated := b64(wavHeader(1, 1, 16000, 16, make([]byte, 10), 1000))
	userAudio := func(data, format string) map[string]any {
		return map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": data, "format": format}}}}}}
	}
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	ccAudioParam := "messages[0].content[0].input_audio.data"

	for _, tc := range []struct {
		name   string
		path   string
		body   any
		status int
		code   string
		param  string
	}{
		{"malformed JSON", "/v1/audio/chat", `{"text": "hi"`, 400, codeInvalidJSON, ""},
		{"empty body", "/v1/audio/chat", ``, 400, codeInvalidJSON, ""},
		{"not an object", "/v1/audio/chat", `[1, 2]`, 400, codeInvalidJSON, ""},
		{"wrong type", "/v1/audio/chat", `{"text": "hi", "top_k": "four"}`, 400, codeInvalidJSON, "top_k"},
		{"fractional integer", "/v1/audio/chat", `{"text": "hi", "max_new_tokens": 1.5}`, 400, codeInvalidJSON, "max_new_tokens"},
		{"no input", "/v1/audio/chat", `{"system": "Be brief."}`, 400, codeMissingInput, "audio"},
		{"blank text", "/v1/audio/chat", `{"text": "  \n"}`, 400, codeMissingInput, "audio"},
		{"bad base64", "/v1/audio/chat", map[string]any{"audio": "UklGR!!!"}, 400, codeInvalidBase64, "audio"},
		{"not a WAV", "/v1/audio/chat", map[string]any{"audio": b64([]byte("ID3\x03 this is an mp3 file, honest"))}, 400, codeInvalidAudio, "audio"},
		{"truncated WAV", "/v1/audio/chat", map[string]any{"audio": truncated}, 400, codeInvalidAudio, "audio"},
		{"unsupported codec", "/v1/audio/chat", map[string]any{"audio": mp3}, 400, codeUnsupportedAudio, "audio"},
		{"audio too long", "/v1/audio/chat", map[string]any{"audio": tone(2.5, 16000)}, 400, codeAudioTooLong, "audio"},
		{"empty audio string", "/v1/audio/chat", map[string]any{"audio": ""}, 400, codeAudioEmpty, "audio"},
		{"WAV without samples", "/v1/audio/chat", map[string]any{"audio": empty}, 400, codeAudioEmpty, "audio"},
		{"audio too short", "/v1/audio/chat", map[string]any{"audio": tone(0.005, 16000)}, 400, codeAudioTooShort, "audio"},
		{"body too large", "/v1/audio/chat", map[string]any{"text": strings.Repeat("a", 300<<10)}, 413, codeBodyTooLarge, ""},
		{"unknown conversation", "/v1/audio/chat", map[string]any{"text": "hi", "conversation_id": "conv_nope"}, 404, codeUnknownConversation, "conversation_id"},
		{"temperature < 0", "/v1/audio/chat", map[string]any{"audio": good, "temperature": -0.5}, 400, codeInvalidValue, "temperature"},
		{"temperature > 100", "/v1/audio/chat", map[string]any{"text": "hi", "temperature": 1000}, 400, codeInvalidValue, "temperature"},
		{"top_k < 0", "/v1/audio/chat", map[string]any{"text": "hi", "top_k": -1}, 400, codeInvalidValue, "top_k"},
		{"top_p > 1", "/v1/audio/chat", map[string]any{"text": "hi", "top_p": 1.5}, 400, codeInvalidValue, "top_p"},
		{"repetition_penalty > 100", "/v1/audio/chat", map[string]any{"text": "hi", "repetition_penalty": 101}, 400, codeInvalidValue, "repetition_penalty"},
		{"text_temperature < 0", "/v1/audio/chat", map[string]any{"text": "hi", "text_temperature": -1}, 400, codeInvalidValue, "text_temperature"},
		{"text_top_p < 0", "/v1/audio/chat", map[string]any{"text": "hi", "text_top_p": -0.1}, 400, codeInvalidValue, "text_top_p"},
		{"max_new_tokens 0", "/v1/audio/chat", map[string]any{"text": "hi", "max_new_tokens": 0}, 400, codeInvalidValue, "max_new_tokens"},
		{"max_new_tokens over the limit", "/v1/audio/chat", map[string]any{"text": "hi", "max_new_tokens": 101}, 400, codeInvalidValue, "max_new_tokens"},
		{"seed out of range", "/v1/audio/chat", `{"text": "hi", "seed": 1e30}`, 400, codeInvalidJSON, "seed"},

		{"cc: no messages", "/v1/chat/completions", map[string]any{"model": "x", "messages": []any{}}, 400, codeMissingInput, "messages"},
		{"cc: bad base64", "/v1/chat/completions", userAudio("%%%", "wav"), 400, codeInvalidBase64, ccAudioParam},
		{"cc: not a WAV", "/v1/chat/completions", userAudio(b64([]byte("OggS....")), "wav"), 400, codeInvalidAudio, ccAudioParam},
		{"cc: mp3 input", "/v1/chat/completions", userAudio(good, "mp3"), 400, codeUnsupportedAudio, "messages[0].content[0].input_audio.format"},
		{"cc: unsupported codec", "/v1/chat/completions", userAudio(mp3, "wav"), 400, codeUnsupportedAudio, ccAudioParam},
		{"cc: audio too long", "/v1/chat/completions", userAudio(tone(3, 8000), "wav"), 400, codeAudioTooLong, ccAudioParam},
		{"cc: audio too short", "/v1/chat/completions", userAudio(tone(0.005, 16000), "wav"), 400, codeAudioTooShort, ccAudioParam},
		{"cc: image part", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "x"}}}}}}, 400, codeUnsupportedValue, "messages[0].content[0].type"},
		{"cc: wrong part field type", "/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}`, 400, codeInvalidJSON, "messages[0].content[0].text"},
		{"cc: tool role", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "tool", "content": "x"}}}, 400, codeUnsupportedValue, "messages[0].role"},
		{"cc: n 2", "/v1/chat/completions", map[string]any{"messages": user, "n": 2}, 400, codeUnsupportedValue, "n"},
		{"cc: tools", "/v1/chat/completions", map[string]any{"messages": user, "tools": []any{map[string]any{"type": "function",
			"function": map[string]any{"name": "get_weather", "parameters": map[string]any{"type": "object"}}}}}, 400, codeUnsupportedValue, "tools"},
		{"cc: tool_choice", "/v1/chat/completions", map[string]any{"messages": user, "tool_choice": "required"}, 400, codeUnsupportedValue, "tool_choice"},
		{"cc: named tool_choice", "/v1/chat/completions", map[string]any{"messages": user, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}, 400, codeUnsupportedValue, "tool_choice"},
		{"cc: functions", "/v1/chat/completions", map[string]any{"messages": user, "functions": []any{map[string]any{"name": "f"}}}, 400, codeUnsupportedValue, "functions"},
		{"cc: function_call", "/v1/chat/completions", map[string]any{"messages": user, "function_call": map[string]any{"name": "f"}}, 400, codeUnsupportedValue, "function_call"},
		{"cc: mp3 output", "/v1/chat/completions", map[string]any{"messages": user, "modalities": []string{"text", "audio"}, "audio": map[string]any{"voice": "alloy", "format": "mp3"}}, 400, codeUnsupportedValue, "audio.format"},
		{"cc: streamed wav", "/v1/chat/completions", map[string]any{"messages": user, "stream": true, "modalities": []string{"text", "audio"}, "audio": map[string]any{"format": "wav"}}, 400, codeUnsupportedValue, "audio.format"},
		{"cc: bad modality", "/v1/chat/completions", map[string]any{"messages": user, "modalities": []string{"video"}}, 400, codeUnsupportedValue, "modalities[0]"},
		{"cc: history without audio id", "/v1/chat/completions", map[string]any{"messages": []any{
			map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "hello"},
			map[string]any{"role": "user", "content": "again"}}}, 400, codeInvalidValue, "messages[1]"},
		{"cc: foreign audio id", "/v1/chat/completions", map[string]any{"messages": []any{
			map[string]any{"role": "assistant", "audio": map[string]any{"id": "audio_abc123"}},
			map[string]any{"role": "user", "content": "again"}}}, 400, codeInvalidValue, "messages[0].audio.id"},
		{"cc: unknown conversation", "/v1/chat/completions", map[string]any{"messages": []any{
			map[string]any{"role": "assistant", "audio": map[string]any{"id": "audio_conv_0123_1"}},
			map[string]any{"role": "user", "content": "again"}}}, 404, codeUnknownConversation, "conversation_id"},
		{"cc: ends with the assistant", "/v1/chat/completions", map[string]any{"conversation_id": "conv_x", "messages": []any{
			map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "hello"}}}, 400, codeMissingInput, "messages"},
		{"cc: temperature", "/v1/chat/completions", map[string]any{"messages": user, "temperature": -2}, 400, codeInvalidValue, "temperature"},
		{"cc: max_tokens", "/v1/chat/completions", map[string]any{"messages": user, "max_tokens": 0}, 400, codeInvalidValue, "max_tokens"},
		{"cc: max_completion_tokens", "/v1/chat/completions", map[string]any{"messages": user, "max_completion_tokens": 1000}, 400, codeInvalidValue, "max_completion_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkError(t, ts.post(t, tc.path, tc.body), tc.status, tc.code, tc.param)
		})
	}

	t.Run("routes", func(t *testing.T) {
		checkError(t, ts.do(t, context.Background(), http.MethodGet, "/v1/nothing", nil), 404, codeNotFound, "")
		checkError(t, ts.do(t, context.Background(), http.MethodGet, "/v1/audio/chat", nil), 405, codeMethodNotAllowed, "")
	})
	// Errors are counted by kind.
	resp := ts.do(t, context.Background(), http.MethodGet, "/metrics", nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`omnipipe_errors_total{kind="invalid_base64"} 2`, `omnipipe_errors_total{kind="body_too_large"} 1`,
		`omnipipe_http_requests_total{code="413",route="/v1/audio/chat"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestRateLimit(t *testing.T) {
	ts := startServer(t, Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute, RetryAfter: 3 * time.Second, MaxNewTokens: 30000})
	// A holds the only slot (30000 steps: minutes, it is cancelled below).
	ctxA, cancelA := context.WithCancel(context.Background())
	a := ts.do(t, ctxA, http.MethodPost, "/v1/audio/chat", map[string]any{"text": "Talk.", "max_new_tokens": 30000})
	defer a.Body.Close()
	if _, ok := newSSEReader(a.Body).next(); !ok {
		t.Fatal("no event from A")
	}
	// B waits in the queue.
	bc := make(chan *http.Response, 1)
	go func() {
		bc <- ts.post(t, "/v1/audio/chat", map[string]any{"text": "Me next.", "max_new_tokens": 5, "stream": false})
	}()
	waitFor(t, "B to queue", 30*time.Second, func() bool { return ts.lim.queued() == 1 })
	var h struct {
		Sessions struct{ Active, Queued int } `json:"sessions"`
	}
	if code := ts.getJSON(t, "/health", &h); code != 200 || h.Sessions.Active != 1 || h.Sessions.Queued != 1 {
		t.Errorf("/health %d: %+v, want 1 active, 1 queued", code, h.Sessions)
	}
	// C finds the queue full.
	c := ts.post(t, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	if ra := c.Header.Get("Retry-After"); ra != "3" {
		t.Errorf("Retry-After %q, want 3", ra)
	}
	checkError(t, c, http.StatusTooManyRequests, codeRateLimited, "")
	// A hangs up: B runs.
	cancelA()
	b := <-bc
	defer b.Body.Close()
	var d wireDone
	if err := json.NewDecoder(b.Body).Decode(&d); err != nil || b.StatusCode != 200 || d.Timings == nil || d.Timings.Steps != 5 {
		t.Fatalf("B: status %d, %+v, %v", b.StatusCode, d, err)
	}
}

func TestLoadingAndHealth(t *testing.T) {
	s := New(Config{Logger: discardLogger(), Version: "v9"})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/health"); code != 503 || !strings.Contains(body, `"status":"loading"`) || !strings.Contains(body, `"version":"v9"`) {
		t.Errorf("/health while loading: %d %s", code, body)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/audio/chat", strings.NewReader(`{"text":"hi"}`)))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), codeModelLoading) || rec.Header().Get("Retry-After") == "" {
		t.Errorf("chat while loading: %d %s", rec.Code, rec.Body)
	}
	if code, _ := get("/metrics"); code != 200 {
		t.Errorf("/metrics while loading: %d", code)
	}

	ts := startServer(t, Config{})
	var h struct {
		Status, Model, Backend, Version string
		Sessions                        struct {
			Active, Queued, MaxActive, Conversations int
		}
	}
	if code := ts.getJSON(t, "/health", &h); code != 200 || h.Status != "ok" || h.Model != "lfm2-audio-tiny" || h.Backend == "" || h.Version != "test" {
		t.Errorf("/health: %d %+v", code, h)
	}
	var models struct {
		Object string
		Data   []struct{ ID, Object string }
	}
	if code := ts.getJSON(t, "/v1/models", &models); code != 200 || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "lfm2-audio-tiny" {
		t.Errorf("/v1/models: %d %+v", code, models)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestMetricsPerServer(t *testing.T) {
	// Two servers in one process keep separate registries.
	a := startServer(t, Config{})
	b := startServer(t, Config{})
	s, _ := streamAudioChat(t, a, map[string]any{"text": "Count.", "max_new_tokens": 10, "temperature": 0})
	if s.err != nil {
		t.Fatal(s.err.Error)
	}
	scrape := func(ts *testServer) string {
		resp := ts.do(t, context.Background(), http.MethodGet, "/metrics", nil)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	ma := scrape(a)
	for _, want := range []string{
		`omnipipe_turns_total{outcome="max_tokens"} 1`,
		`omnipipe_first_text_seconds_count 1`,
		`omnipipe_first_audio_seconds_count 1`,
		`omnipipe_turn_seconds_count 1`,
		`omnipipe_backbone_steps_total 10`,
		`omnipipe_stage_busy_seconds_total{stage="backbone"}`,
		`omnipipe_active_turns 0`,
		`omnipipe_queued_requests 0`,
		`omnipipe_conversations 1`,
		`omnipipe_http_requests_total{code="200",route="/v1/audio/chat"} 1`,
		`omnipipe_build_info{backend=`,
		`go_goroutines`,
	} {
		if !strings.Contains(ma, want) {
			t.Errorf("server A's /metrics lacks %s", want)
		}
	}
	if mb := scrape(b); strings.Contains(mb, "omnipipe_turns_total{") || !strings.Contains(mb, "omnipipe_conversations 0") {
		t.Errorf("server B counts A's turn")
	}
}

func TestMiddleware(t *testing.T) {
	ts := startServer(t, Config{})
	ts.e.GET("/panic", func(echo.Context) error { panic("planted") })

	t.Run("panic recovered", func(t *testing.T) {
		checkError(t, ts.do(t, context.Background(), http.MethodGet, "/panic", nil), 500, codeInternal, "")
		if code := ts.getJSON(t, "/health", nil); code != 200 {
			t.Errorf("/health after a panic: %d", code)
		}
		if !strings.Contains(ts.logs.String(), "planted") {
			t.Error("the panic is not logged")
		}
	})
	t.Run("request id", func(t *testing.T) {
		for _, tc := range []struct{ sent, want string }{
			{"client-id-123", "client-id-123"},
			{"bad id\twith tab", ""},
			{strings.Repeat("x", 200), ""},
		} {
			req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/audio/chat", strings.NewReader("{"))
			req.Header.Set(echo.HeaderXRequestID, tc.sent)
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			e := checkError(t, resp, 400, codeInvalidJSON, "")
			got := e.Error.RequestID
			if tc.want != "" && got != tc.want || tc.want == "" && (got == tc.sent || !strings.HasPrefix(got, "req_")) {
				t.Errorf("sent %.20q: request id %q", tc.sent, got)
			}
			if !strings.Contains(ts.logs.String(), `"request_id":"`+got+`"`) {
				t.Errorf("request id %q not in the logs", got)
			}
		}
	})
	t.Run("CORS off by default", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, ts.url+"/health", nil)
		req.Header.Set("Origin", "https://example.com")
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "" {
			t.Errorf("Access-Control-Allow-Origin %q with CORS off", v)
		}
	})
}

// A client that starts a body and stops sending gets 408 once the body
// timeout passes.
func TestSlowBody(t *testing.T) {
	ts := startServer(t, Config{BodyTimeout: 50 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/audio/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"text\": ")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, resp, http.StatusRequestTimeout, "request_timeout", "")
}

// TestCORSPreflightOpenAISDK: a browser page using the openai npm package
// (dangerouslyAllowBrowser) passes the preflight: every header the SDK
// sends is allowed, as are the server's own.
func TestCORSPreflightOpenAISDK(t *testing.T) {
	ts := startServer(t, Config{CORSOrigins: []string{"https://app.example"}})
	for _, tc := range []struct {
		name, path string
		headers    []string // Access-Control-Request-Headers
	}{
		{"openai sdk chat completion", "/v1/chat/completions", []string{"authorization", "content-type", "x-stainless-arch",
			"x-stainless-lang", "x-stainless-os", "x-stainless-package-version", "x-stainless-retry-count",
			"x-stainless-runtime", "x-stainless-runtime-version", "x-stainless-timeout"}},
		{"plain fetch", "/v1/audio/chat", []string{"content-type", "x-request-id"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodOptions, ts.url+tc.path, nil)
			req.Header.Set("Origin", "https://app.example")
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", strings.Join(tc.headers, ","))
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			allowed := map[string]bool{}
			for h := range strings.SplitSeq(resp.Header.Get("Access-Control-Allow-Headers"), ",") {
				allowed[strings.ToLower(strings.TrimSpace(h))] = true
			}
			for _, h := range tc.headers {
				if !allowed[h] {
					t.Errorf("preflight does not allow %s (Access-Control-Allow-Headers: %q)", h, resp.Header.Get("Access-Control-Allow-Headers"))
				}
			}
			if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://app.example" {
				t.Errorf("Access-Control-Allow-Origin %q", got)
			}
		})
	}
}

func TestCORSAndAPIKeys(t *testing.T) {
	ts := startServer(t, Config{CORSOrigins: []string{"https://app.example"}, APIKeys: []string{"k1", "k2"}})
	req, _ := http.NewRequest(http.MethodOptions, ts.url+"/v1/audio/chat", nil)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "https://app.example" {
		t.Errorf("preflight Access-Control-Allow-Origin %q", v)
	}
	checkError(t, ts.post(t, "/v1/audio/chat", map[string]any{"text": "hi"}), 401, "invalid_api_key", "")
	for _, key := range []string{"k1", "k2"} {
		req, _ := http.NewRequest(http.MethodGet, ts.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("key %s: status %d", key, resp.StatusCode)
		}
	}
	if code := ts.getJSON(t, "/health", nil); code != 200 {
		t.Errorf("/health needs no key, got %d", code)
	}
}
