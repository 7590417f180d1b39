// Package realtime is the wire format of OpenAI's Realtime API as
// omni-pipe's /v1/realtime speaks it: the client events it decodes
// (Decode), the session configuration a session.update patches (Session,
// SessionPatch), and the names of the server events in the two dialects a
// client may speak (Dialect): the GA format of the current official SDKs,
// and the beta one of clients that connect with "OpenAI-Beta: realtime=v1".
//
// The package does no I/O: the server (package server) owns the socket,
// the voice-activity detection and the turns.
package realtime

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Error types and codes of error events (OpenAI's names where it has one).
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeRateLimit      = "rate_limit_error"

	CodeInvalidJSON      = "invalid_json"
	CodeUnknownEvent     = "unknown_event"
	CodeUnknownParameter = "unknown_parameter"
	CodeMissingParameter = "missing_required_parameter"
	CodeInvalidValue     = "invalid_value"
	CodeUnsupported      = "unsupported_value"
	CodeInvalidAudio     = "invalid_audio"
)

// Error is what an error event carries:
//
//	{"type":"error","event_id":…,"error":{"type":…,"code":…,"message":…,"param":…,"event_id":…}}
//
// EventID is the client event at fault (empty when the client gave it
// none, or when no client event is).
type Error struct {
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	EventID *string `json:"event_id"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Invalid returns an invalid_request_error with code and a message; param
// names the field at fault ("" for none).
func Invalid(code, param, format string, args ...any) *Error {
	e := &Error{Type: TypeInvalidRequest, Code: code, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &param
	}
	return e
}

// WithEventID sets the client event the error answers (none when id is
// empty) and returns e.
func (e *Error) WithEventID(id string) *Error {
	if id != "" {
		e.EventID = &id
	} else {
		e.EventID = nil
	}
	return e
}

// Client event types.
const (
	TypeSessionUpdate      = "session.update"
	TypeBufferAppend       = "input_audio_buffer.append"
	TypeBufferCommit       = "input_audio_buffer.commit"
	TypeBufferClear        = "input_audio_buffer.clear"
	TypeItemCreate         = "conversation.item.create"
	TypeItemRetrieve       = "conversation.item.retrieve"
	TypeItemTruncate       = "conversation.item.truncate"
	TypeItemDelete         = "conversation.item.delete"
	TypeResponseCreate     = "response.create"
	TypeResponseCancel     = "response.cancel"
	TypeOutputBufferClear  = "output_audio_buffer.clear"
	maxEventIDLen          = 512
	maxItemIDLen           = 256
	maxAudioBase64         = 15 << 20 // OpenAI's limit on one append
	defaultMaxOutputTokens = 0        // "inf": the server's own cap
)

// Event is a decoded client event: one of *SessionUpdate, *BufferAppend,
// *BufferCommit, *BufferClear, *ItemCreate, *ItemRetrieve, *ItemTruncate,
// *ItemDelete, *ResponseCreate, *ResponseCancel.
type Event interface {
	// ID is the client's event_id ("" when it sent none).
	ID() string
}

// Header is what every client event has.
type Header struct {
	Type    string `json:"type"`
	EventID string `json:"event_id,omitempty"`
}

// ID implements Event.
func (h Header) ID() string { return h.EventID }

// SessionUpdate changes the fields of the session it names.
type SessionUpdate struct {
	Header
	Session SessionPatch
}

// BufferAppend adds audio (PCM16 24 kHz mono) to the input buffer.
type BufferAppend struct {
	Header
	Samples []float32 // decoded, in [-1, 1)
}

// BufferCommit makes the input buffer a user item.
type BufferCommit struct{ Header }

// BufferClear empties the input buffer.
type BufferClear struct{ Header }

// ItemCreate adds a user message.
type ItemCreate struct {
	Header
	PreviousItemID *string
	Item           Item
}

// Item is a user message: text parts and audio parts, in order.
type Item struct {
	ID      string
	Content []Part
}

// Part is one content part of a user message: Text, or Audio (decoded
// PCM16 24 kHz).
type Part struct {
	Text  *string
	Audio []float32
}

// ItemRetrieve asks for an item.
type ItemRetrieve struct {
	Header
	ItemID string
}

// ItemTruncate says how much of an assistant item's audio was played.
type ItemTruncate struct {
	Header
	ItemID       string
	ContentIndex int
	AudioEndMS   int
}

// ItemDelete removes an item.
type ItemDelete struct {
	Header
	ItemID string
}

// ResponseCreate asks for a response. Nil fields keep the session's value.
type ResponseCreate struct {
	Header
	Instructions    *string
	Temperature     *float64
	MaxOutputTokens *int // 0: "inf"
}

// ResponseCancel stops the response in progress.
type ResponseCancel struct {
	Header
	ResponseID string
}

// Decode parses one client event. A malformed or unknown event is an
// *Error naming the problem (and the event's event_id when it could be
// read).
func Decode(data []byte) (Event, *Error) {
	var h struct {
		Type    *string         `json:"type"`
		EventID json.RawMessage `json:"event_id"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "type" {
			return nil, Invalid(CodeInvalidJSON, "type", "type must be a string naming the event (such as \"session.update\"), not %s", te.Value)
		}
		return nil, Invalid(CodeInvalidJSON, "", "the event is not a JSON object: %v", jsonErr(err))
	}
	var id string
	if len(h.EventID) > 0 && string(h.EventID) != "null" {
		if err := json.Unmarshal(h.EventID, &id); err != nil || len(id) > maxEventIDLen {
			return nil, Invalid(CodeInvalidValue, "event_id", "event_id must be a string of at most %d bytes", maxEventIDLen)
		}
	}
	if h.Type == nil {
		return nil, Invalid(CodeMissingParameter, "type", "the event has no type").WithEventID(id)
	}
	hdr := Header{Type: *h.Type, EventID: id}
	ev, err := decodeBody(hdr, data)
	if err != nil {
		return nil, err.WithEventID(id)
	}
	return ev, nil
}

func decodeBody(h Header, data []byte) (Event, *Error) {
	switch h.Type {
	case TypeSessionUpdate:
		var b struct {
			Session json.RawMessage `json:"session"`
		}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		if len(b.Session) == 0 || string(b.Session) == "null" {
			return nil, Invalid(CodeMissingParameter, "session", "session.update needs a session object")
		}
		p, err := decodePatch(b.Session)
		if err != nil {
			return nil, err
		}
		return &SessionUpdate{Header: h, Session: p}, nil
	case TypeBufferAppend:
		var b struct {
			Audio *string `json:"audio"`
		}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		if b.Audio == nil {
			return nil, Invalid(CodeMissingParameter, "audio", "input_audio_buffer.append needs audio (base64 PCM16, 24 kHz, mono)")
		}
		pcm, err := DecodePCM16(*b.Audio, "audio")
		if err != nil {
			return nil, err
		}
		return &BufferAppend{Header: h, Samples: pcm}, nil
	case TypeBufferCommit, TypeBufferClear, TypeOutputBufferClear:
		var b struct{}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		switch h.Type {
		case TypeBufferCommit:
			return &BufferCommit{h}, nil
		case TypeBufferClear:
			return &BufferClear{h}, nil
		}
		return nil, Invalid(CodeUnsupported, "type", "output_audio_buffer.clear is WebRTC's; over a WebSocket the client owns its playback buffer (send conversation.item.truncate)")
	case TypeItemCreate:
		return decodeItemCreate(h, data)
	case TypeItemRetrieve, TypeItemDelete:
		var b struct {
			ItemID *string `json:"item_id"`
		}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		if err := checkItemID(b.ItemID, "item_id"); err != nil {
			return nil, err
		}
		if h.Type == TypeItemRetrieve {
			return &ItemRetrieve{Header: h, ItemID: *b.ItemID}, nil
		}
		return &ItemDelete{Header: h, ItemID: *b.ItemID}, nil
	case TypeItemTruncate:
		var b struct {
			ItemID       *string `json:"item_id"`
			ContentIndex *int    `json:"content_index"`
			AudioEndMS   *int    `json:"audio_end_ms"`
		}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		if err := checkItemID(b.ItemID, "item_id"); err != nil {
			return nil, err
		}
		switch {
		case b.ContentIndex == nil:
			return nil, Invalid(CodeMissingParameter, "content_index", "conversation.item.truncate needs content_index")
		case *b.ContentIndex != 0:
			return nil, Invalid(CodeInvalidValue, "content_index", "an assistant item has one content part: content_index must be 0, not %d", *b.ContentIndex)
		case b.AudioEndMS == nil:
			return nil, Invalid(CodeMissingParameter, "audio_end_ms", "conversation.item.truncate needs audio_end_ms")
		case *b.AudioEndMS < 0:
			return nil, Invalid(CodeInvalidValue, "audio_end_ms", "audio_end_ms must not be negative (got %d)", *b.AudioEndMS)
		}
		return &ItemTruncate{Header: h, ItemID: *b.ItemID, ContentIndex: *b.ContentIndex, AudioEndMS: *b.AudioEndMS}, nil
	case TypeResponseCreate:
		return decodeResponseCreate(h, data)
	case TypeResponseCancel:
		var b struct {
			ResponseID *string `json:"response_id"`
		}
		if err := strict(data, &b); err != nil {
			return nil, err
		}
		rc := &ResponseCancel{Header: h}
		if b.ResponseID != nil {
			rc.ResponseID = *b.ResponseID
		}
		return rc, nil
	}
	return nil, Invalid(CodeUnknownEvent, "type", "unknown client event type %q", truncate(h.Type, 64))
}

func checkItemID(id *string, param string) *Error {
	switch {
	case id == nil || *id == "":
		return Invalid(CodeMissingParameter, param, "%s is required", param)
	case len(*id) > maxItemIDLen:
		return Invalid(CodeInvalidValue, param, "%s is longer than %d bytes", param, maxItemIDLen)
	}
	return nil
}

func decodeItemCreate(h Header, data []byte) (Event, *Error) {
	type part struct {
		Type       string  `json:"type"`
		Text       *string `json:"text"`
		Audio      *string `json:"audio"`
		Transcript *string `json:"transcript"`
	}
	var b struct {
		PreviousItemID *string `json:"previous_item_id"`
		Item           *struct {
			ID      *string `json:"id"`
			Type    string  `json:"type"`
			Object  string  `json:"object"`
			Role    string  `json:"role"`
			Status  string  `json:"status"`
			Content []part  `json:"content"`
		} `json:"item"`
	}
	if err := strict(data, &b); err != nil {
		return nil, err
	}
	if b.Item == nil {
		return nil, Invalid(CodeMissingParameter, "item", "conversation.item.create needs an item")
	}
	it := b.Item
	switch {
	case it.Type != "message":
		return nil, Invalid(CodeUnsupported, "item.type", "only message items can be created (not %q): omni-pipe has no tools", truncate(it.Type, 64))
	case it.Role == "system" || it.Role == "assistant":
		return nil, Invalid(CodeUnsupported, "item.role", "only user messages can be created: the model's history holds what it said itself, and the system prompt is session.instructions")
	case it.Role != "user":
		return nil, Invalid(CodeInvalidValue, "item.role", "item.role must be \"user\" (got %q)", truncate(it.Role, 64))
	case len(it.Content) == 0:
		return nil, Invalid(CodeMissingParameter, "item.content", "a user message needs content")
	}
	out := &ItemCreate{Header: h, PreviousItemID: b.PreviousItemID}
	if it.ID != nil {
		if err := checkItemID(it.ID, "item.id"); err != nil {
			return nil, err
		}
		out.Item.ID = *it.ID
	}
	for i, p := range it.Content {
		param := fmt.Sprintf("item.content[%d]", i)
		switch p.Type {
		case "input_text", "text":
			if p.Text == nil {
				return nil, Invalid(CodeMissingParameter, param+".text", "an input_text part needs text")
			}
			out.Item.Content = append(out.Item.Content, Part{Text: p.Text})
		case "input_audio":
			if p.Audio == nil {
				return nil, Invalid(CodeMissingParameter, param+".audio", "an input_audio part needs audio (base64 PCM16, 24 kHz, mono)")
			}
			pcm, err := DecodePCM16(*p.Audio, param+".audio")
			if err != nil {
				return nil, err
			}
			out.Item.Content = append(out.Item.Content, Part{Audio: pcm})
		default:
			return nil, Invalid(CodeUnsupported, param+".type", "content part type %q is not supported (input_text, input_audio)", truncate(p.Type, 64))
		}
	}
	return out, nil
}

func decodeResponseCreate(h Header, data []byte) (Event, *Error) {
	var b struct {
		Response json.RawMessage `json:"response"`
	}
	if err := strict(data, &b); err != nil {
		return nil, err
	}
	rc := &ResponseCreate{Header: h}
	if len(b.Response) == 0 || string(b.Response) == "null" {
		return rc, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b.Response, &m); err != nil {
		return nil, Invalid(CodeInvalidValue, "response", "response must be an object: %v", jsonErr(err))
	}
	for _, k := range sortedKeys(m) {
		v := m[k]
		param := "response." + k
		switch k {
		case "instructions":
			s, err := str(v, param)
			if err != nil {
				return nil, err
			}
			rc.Instructions = &s
		case "temperature":
			t, err := temperature(v, param)
			if err != nil {
				return nil, err
			}
			rc.Temperature = &t
		case "max_output_tokens", "max_response_output_tokens":
			n, err := maxTokens(v, param)
			if err != nil {
				return nil, err
			}
			rc.MaxOutputTokens = &n
		case "modalities", "output_modalities":
			if err := modalities(v, param); err != nil {
				return nil, err
			}
		case "voice":
			if _, err := voice(v, param); err != nil {
				return nil, err
			}
		case "audio":
			if err := responseAudio(v, param); err != nil {
				return nil, err
			}
		case "conversation":
			var s string
			if json.Unmarshal(v, &s) != nil || (s != "auto" && s != "default") {
				return nil, Invalid(CodeUnsupported, param, "only the session's conversation (\"auto\") is supported")
			}
		case "metadata", "tool_choice", "prompt":
			// Accepted; nothing in omni-pipe depends on them.
		case "tools", "input":
			if !emptyArray(v) {
				return nil, Invalid(CodeUnsupported, param, "%s is not supported (omni-pipe has no tools; add input with conversation.item.create)", k)
			}
		case "output_audio_format":
			if err := beta16(v, param); err != nil {
				return nil, err
			}
		default:
			return nil, Invalid(CodeUnknownParameter, param, "unknown parameter %s", truncate(param, 80))
		}
	}
	return rc, nil
}

// DecodePCM16 decodes base64 PCM16LE mono audio to samples in [-1, 1);
// param names the field in errors.
func DecodePCM16(b64, param string) ([]float32, *Error) {
	if len(b64) > maxAudioBase64 {
		return nil, Invalid(CodeInvalidAudio, param, "%s is %d bytes of base64; one event carries at most %d", param, len(b64), maxAudioBase64)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, Invalid(CodeInvalidAudio, param, "%s is not valid base64: %v", param, err)
	}
	if len(raw)%2 != 0 {
		return nil, Invalid(CodeInvalidAudio, param, "%s has %d bytes: PCM16 needs an even number", param, len(raw))
	}
	pcm := make([]float32, len(raw)/2)
	for i := range pcm {
		pcm[i] = float32(int16(binary.LittleEndian.Uint16(raw[2*i:]))) / 32768
	}
	return pcm, nil
}

// strict decodes data into v, refusing fields v does not have (type and
// event_id aside).
func strict(data []byte, v any) *Error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return Invalid(CodeInvalidJSON, "", "the event is not a JSON object: %v", jsonErr(err))
	}
	delete(m, "type")
	delete(m, "event_id")
	rest, err := json.Marshal(m)
	if err != nil {
		return Invalid(CodeInvalidJSON, "", "re-encode the event: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(rest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			f = strings.Trim(f, `"`)
			return Invalid(CodeUnknownParameter, f, "unknown parameter %s", truncate(f, 80))
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Invalid(CodeInvalidValue, te.Field, "%s must be a JSON %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return Invalid(CodeInvalidJSON, "", "%v", jsonErr(err))
	}
	return nil
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64":
		return "integer"
	case "float64":
		return "number"
	case "ptr", "struct", "map":
		return "object"
	case "slice":
		return "array"
	case "bool":
		return "boolean"
	}
	return k
}

// jsonErr describes a decoding error for the client: what the JSON held
// where it has the wrong type (encoding/json's own message names Go
// types), else encoding/json's message, shortened.
func jsonErr(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("%s is %s, want %s", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		}
		return "got " + te.Value
	}
	return truncate(strings.TrimPrefix(err.Error(), "json: "), 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func str(v json.RawMessage, param string) (string, *Error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", Invalid(CodeInvalidValue, param, "%s must be a string", param)
	}
	return s, nil
}

func temperature(v json.RawMessage, param string) (float64, *Error) {
	var t float64
	if err := json.Unmarshal(v, &t); err != nil || math.IsNaN(t) || t < 0 || t > 2 {
		return 0, Invalid(CodeInvalidValue, param, "%s must be a number from 0 to 2", param)
	}
	return t, nil
}

// maxTokens reads a number of tokens (1 to 4096) or "inf" (0).
func maxTokens(v json.RawMessage, param string) (int, *Error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "inf" {
			return 0, nil
		}
		return 0, Invalid(CodeInvalidValue, param, "%s must be an integer from 1 to 4096 or \"inf\"", param)
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || f < 1 || f > 4096 {
		return 0, Invalid(CodeInvalidValue, param, "%s must be an integer from 1 to 4096 or \"inf\"", param)
	}
	return int(f), nil
}

func emptyArray(v json.RawMessage) bool {
	var a []json.RawMessage
	return string(v) == "null" || (json.Unmarshal(v, &a) == nil && len(a) == 0)
}
