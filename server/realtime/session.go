package realtime

import (
	"encoding/json"
	"math"
	"slices"
)

// Session is a connection's effective configuration, as session.created
// and session.updated report it in full.
type Session struct {
	ID    string
	Model string
	// Instructions is the system prompt of the conversation's first turn.
	Instructions string
	// Voice is the voice reported; omni-pipe's model speaks with one voice
	// in a conversation, whichever is named.
	Voice string
	// VAD is the server's turn detection; nil: off (the client commits
	// and asks for responses).
	VAD *VAD
	// Temperature samples the reply's audio codes (text is greedy).
	Temperature float64
	// MaxOutputTokens caps a response's steps (text tokens and audio
	// frames); 0: "inf", the server's own cap.
	MaxOutputTokens int
}

// VAD is server_vad turn detection.
type VAD struct {
	// Threshold (0 to 1) is how loud speech must be above the room's
	// noise floor: the energy detector's onset margin is 30·Threshold dB.
	Threshold float64
	// PrefixPaddingMS is the audio kept before the onset.
	PrefixPaddingMS int
	// SilenceDurationMS is the pause that ends an utterance.
	SilenceDurationMS int
	// CreateResponse: a response starts when an utterance ends.
	CreateResponse bool
	// InterruptResponse: speech cancels the response in progress.
	InterruptResponse bool
}

// Defaults of a new session.
var (
	DefaultVAD = VAD{Threshold: 0.5, PrefixPaddingMS: 300, SilenceDurationMS: 500, CreateResponse: true, InterruptResponse: true}
)

const (
	DefaultVoice       = "alloy"
	DefaultTemperature = 1.0 // the official audio sampling temperature
)

// Voices are the voice names session.update accepts: OpenAI's, and the
// TTS voices of LFM2.5-Audio.
var Voices = []string{"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar",
	"us_male", "us_female", "uk_male", "uk_female"}

// SessionPatch is a session.update: the fields it sent (nil: unchanged).
type SessionPatch struct {
	Instructions    *string
	Voice           *string
	SetVAD          bool // turn detection was sent: VAD (nil turns it off)
	VAD             *VADPatch
	Temperature     *float64
	MaxOutputTokens *int // 0: "inf"
}

// VADPatch is a turn_detection object: the fields it sent.
type VADPatch struct {
	Threshold         *float64
	PrefixPaddingMS   *int
	SilenceDurationMS *int
	CreateResponse    *bool
	InterruptResponse *bool
}

// Apply changes s by p: only the fields p has. A turn_detection object
// that does not name a field takes the default (as OpenAI's does when
// detection is switched on) or, when detection was on, keeps the current
// value.
func (s *Session) Apply(p SessionPatch) {
	if p.Instructions != nil {
		s.Instructions = *p.Instructions
	}
	if p.Voice != nil {
		s.Voice = *p.Voice
	}
	if p.Temperature != nil {
		s.Temperature = *p.Temperature
	}
	if p.MaxOutputTokens != nil {
		s.MaxOutputTokens = *p.MaxOutputTokens
	}
	if !p.SetVAD {
		return
	}
	if p.VAD == nil {
		s.VAD = nil
		return
	}
	v := DefaultVAD
	if s.VAD != nil {
		v = *s.VAD
	}
	set := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	if p.VAD.Threshold != nil {
		v.Threshold = *p.VAD.Threshold
	}
	set(&v.PrefixPaddingMS, p.VAD.PrefixPaddingMS)
	set(&v.SilenceDurationMS, p.VAD.SilenceDurationMS)
	if p.VAD.CreateResponse != nil {
		v.CreateResponse = *p.VAD.CreateResponse
	}
	if p.VAD.InterruptResponse != nil {
		v.InterruptResponse = *p.VAD.InterruptResponse
	}
	s.VAD = &v
}

// decodePatch reads a session object of either dialect: GA's nested
// audio.input / audio.output and output_modalities, or beta's flat voice,
// turn_detection, input_audio_format and modalities.
func decodePatch(raw json.RawMessage) (SessionPatch, *Error) {
	var p SessionPatch
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return p, Invalid(CodeInvalidValue, "session", "session must be an object: %v", jsonErr(err))
	}
	for _, k := range sortedKeys(m) {
		v := m[k]
		param := "session." + k
		var err *Error
		switch k {
		case "type":
			var t string
			if json.Unmarshal(v, &t) != nil || t != "realtime" {
				err = Invalid(CodeUnsupported, param, "only realtime sessions are supported (session.type \"realtime\"), not transcription ones")
			}
		case "instructions":
			var s string
			if s, err = str(v, param); err == nil {
				p.Instructions = &s
			}
		case "voice":
			var s string
			if s, err = voice(v, param); err == nil {
				p.Voice = &s
			}
		case "turn_detection":
			p.SetVAD = true
			p.VAD, err = turnDetection(v, param)
		case "temperature":
			var t float64
			if t, err = temperature(v, param); err == nil {
				p.Temperature = &t
			}
		case "max_output_tokens", "max_response_output_tokens":
			var n int
			if n, err = maxTokens(v, param); err == nil {
				p.MaxOutputTokens = &n
			}
		case "modalities", "output_modalities":
			err = modalities(v, param)
		case "input_audio_format", "output_audio_format":
			err = beta16(v, param)
		case "audio":
			err = sessionAudio(v, param, &p)
		case "tools":
			if !emptyArray(v) {
				err = Invalid(CodeUnsupported, param, "tools are not supported")
			}
		case "input_audio_transcription", "input_audio_noise_reduction":
			if string(v) != "null" {
				err = Invalid(CodeUnsupported, param, "%s is not supported (send null); the reply's own transcript comes with response.output_audio_transcript.delta", k)
			}
		case "model", "object", "id", "expires_at", "tool_choice", "tracing", "truncation", "include", "prompt", "client_secret":
			// Accepted; nothing depends on them.
		default:
			err = Invalid(CodeUnknownParameter, param, "unknown parameter %s", truncate(param, 80))
		}
		if err != nil {
			return SessionPatch{}, err
		}
	}
	return p, nil
}

// sessionAudio reads GA's session.audio {input: {format, turn_detection,
// transcription, noise_reduction}, output: {format, voice, speed}}.
func sessionAudio(raw json.RawMessage, param string, p *SessionPatch) *Error {
	var a map[string]json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return Invalid(CodeInvalidValue, param, "%s must be an object", param)
	}
	for _, dir := range sortedKeys(a) {
		v := a[dir]
		dp := param + "." + dir
		if dir != "input" && dir != "output" {
			return Invalid(CodeUnknownParameter, dp, "unknown parameter %s", truncate(dp, 80))
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return Invalid(CodeInvalidValue, dp, "%s must be an object", dp)
		}
		for _, k := range sortedKeys(m) {
			v := m[k]
			kp := dp + "." + k
			var err *Error
			switch {
			case k == "format":
				err = gaFormat(v, kp)
			case dir == "input" && k == "turn_detection":
				p.SetVAD = true
				p.VAD, err = turnDetection(v, kp)
			case dir == "input" && (k == "transcription" || k == "noise_reduction"):
				if string(v) != "null" {
					err = Invalid(CodeUnsupported, kp, "%s is not supported (send null)", kp)
				}
			case dir == "output" && k == "voice":
				var s string
				if s, err = voice(v, kp); err == nil {
					p.Voice = &s
				}
			case dir == "output" && k == "speed":
				var f float64
				if json.Unmarshal(v, &f) != nil || f != 1 {
					err = Invalid(CodeUnsupported, kp, "only speed 1.0 is supported")
				}
			default:
				err = Invalid(CodeUnknownParameter, kp, "unknown parameter %s", truncate(kp, 80))
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// gaFormat accepts {"type":"audio/pcm","rate":24000}.
func gaFormat(raw json.RawMessage, param string) *Error {
	var f struct {
		Type string   `json:"type"`
		Rate *float64 `json:"rate"`
	}
	if err := json.Unmarshal(raw, &f); err != nil || f.Type != "audio/pcm" || (f.Rate != nil && *f.Rate != 24000) {
		return Invalid(CodeUnsupported, param, "%s: only {\"type\":\"audio/pcm\",\"rate\":24000} (PCM16, 24 kHz, mono) is supported", param)
	}
	return nil
}

// beta16 accepts beta's "pcm16".
func beta16(raw json.RawMessage, param string) *Error {
	var s string
	if json.Unmarshal(raw, &s) != nil || s != "pcm16" {
		return Invalid(CodeUnsupported, param, "%s: only \"pcm16\" (24 kHz, mono) is supported", param)
	}
	return nil
}

func voice(raw json.RawMessage, param string) (string, *Error) {
	var s string
	if json.Unmarshal(raw, &s) != nil || !slices.Contains(Voices, s) {
		return "", Invalid(CodeInvalidValue, param, "%s must be one of %v", param, Voices)
	}
	return s, nil
}

// modalities accepts ["audio"] and ["text","audio"] (the transcript comes
// with the audio either way).
func modalities(raw json.RawMessage, param string) *Error {
	var a []string
	if json.Unmarshal(raw, &a) != nil || !slices.Contains(a, "audio") {
		return Invalid(CodeUnsupported, param, "%s must include \"audio\": the model answers with speech and its transcript", param)
	}
	for _, m := range a {
		if m != "audio" && m != "text" {
			return Invalid(CodeInvalidValue, param, "%s: unknown modality %q", param, truncate(m, 32))
		}
	}
	return nil
}

// responseAudio accepts a response.create's audio.output {format, voice}.
func responseAudio(raw json.RawMessage, param string) *Error {
	var a struct {
		Output map[string]json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return Invalid(CodeInvalidValue, param, "%s must be an object", param)
	}
	for _, k := range sortedKeys(a.Output) {
		v := a.Output[k]
		kp := param + ".output." + k
		switch k {
		case "format":
			if err := gaFormat(v, kp); err != nil {
				return err
			}
		case "voice":
			if _, err := voice(v, kp); err != nil {
				return err
			}
		default:
			return Invalid(CodeUnknownParameter, kp, "unknown parameter %s", truncate(kp, 80))
		}
	}
	return nil
}

// turnDetection reads null (off) or a server_vad object.
func turnDetection(raw json.RawMessage, param string) (*VADPatch, *Error) {
	if string(raw) == "null" {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, Invalid(CodeInvalidValue, param, "%s must be null or an object", param)
	}
	var v VADPatch
	for _, k := range sortedKeys(m) {
		raw := m[k]
		kp := param + "." + k
		switch k {
		case "type":
			var t string
			json.Unmarshal(raw, &t)
			if t != "server_vad" {
				return nil, Invalid(CodeUnsupported, kp, "only server_vad turn detection is supported (not %q)", truncate(t, 32))
			}
		case "threshold":
			var f float64
			if json.Unmarshal(raw, &f) != nil || math.IsNaN(f) || f < 0 || f > 1 {
				return nil, Invalid(CodeInvalidValue, kp, "%s must be a number from 0 to 1", kp)
			}
			v.Threshold = &f
		case "prefix_padding_ms", "silence_duration_ms":
			var n float64
			if json.Unmarshal(raw, &n) != nil || n != math.Trunc(n) || n < 0 || n > 10000 || (k == "silence_duration_ms" && n < 10) {
				return nil, Invalid(CodeInvalidValue, kp, "%s must be an integer of milliseconds (0 to 10000; silence at least 10)", kp)
			}
			i := int(n)
			if k == "prefix_padding_ms" {
				v.PrefixPaddingMS = &i
			} else {
				v.SilenceDurationMS = &i
			}
		case "create_response", "interrupt_response":
			var b bool
			if json.Unmarshal(raw, &b) != nil {
				return nil, Invalid(CodeInvalidValue, kp, "%s must be a boolean", kp)
			}
			if k == "create_response" {
				v.CreateResponse = &b
			} else {
				v.InterruptResponse = &b
			}
		case "idle_timeout_ms":
			if string(raw) != "null" {
				return nil, Invalid(CodeUnsupported, kp, "idle_timeout_ms is not supported (send null)")
			}
		default:
			return nil, Invalid(CodeUnknownParameter, kp, "unknown parameter %s", truncate(kp, 80))
		}
	}
	if _, ok := m["type"]; !ok {
		return nil, Invalid(CodeMissingParameter, param+".type", "turn_detection needs a type (\"server_vad\")")
	}
	return &v, nil
}

// JSON returns the session object of d's session.created and
// session.updated.
func (s *Session) JSON(d Dialect) any {
	var maxTok any = "inf"
	if s.MaxOutputTokens > 0 {
		maxTok = s.MaxOutputTokens
	}
	var td any // null when off
	if s.VAD != nil {
		m := map[string]any{"type": "server_vad", "threshold": s.VAD.Threshold, "prefix_padding_ms": s.VAD.PrefixPaddingMS,
			"silence_duration_ms": s.VAD.SilenceDurationMS, "create_response": s.VAD.CreateResponse,
			"interrupt_response": s.VAD.InterruptResponse}
		if d == GA {
			m["idle_timeout_ms"] = nil
		}
		td = m
	}
	if d == Beta {
		return map[string]any{
			"id": s.ID, "object": "realtime.session", "model": s.Model,
			"modalities": []string{"text", "audio"}, "instructions": s.Instructions, "voice": s.Voice,
			"input_audio_format": "pcm16", "output_audio_format": "pcm16",
			"input_audio_transcription": nil, "turn_detection": td,
			"tools": []any{}, "tool_choice": "auto", "temperature": s.Temperature,
			"max_response_output_tokens": maxTok,
		}
	}
	pcm := map[string]any{"type": "audio/pcm", "rate": 24000}
	return map[string]any{
		"type": "realtime", "object": "realtime.session", "id": s.ID, "model": s.Model,
		"output_modalities": []string{"audio"}, "instructions": s.Instructions,
		"audio": map[string]any{
			"input":  map[string]any{"format": pcm, "transcription": nil, "noise_reduction": nil, "turn_detection": td},
			"output": map[string]any{"format": pcm, "voice": s.Voice, "speed": 1.0},
		},
		"tools": []any{}, "tool_choice": "auto", "temperature": s.Temperature,
		"max_output_tokens": maxTok, "tracing": nil, "truncation": "auto", "prompt": nil, "include": nil,
	}
}
