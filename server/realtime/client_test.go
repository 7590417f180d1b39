package realtime

import (
	"encoding/json"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // the event's Go type, or the error code
	}{
		{"update", `{"type":"session.update","event_id":"e1","session":{"type":"realtime","instructions":"x"}}`, "*realtime.SessionUpdate"},
		{"beta update", `{"type":"session.update","session":{"voice":"echo","turn_detection":null,"input_audio_format":"pcm16"}}`, "*realtime.SessionUpdate"},
		{"append", `{"type":"input_audio_buffer.append","audio":"AAABAA=="}`, "*realtime.BufferAppend"},
		{"commit", `{"type":"input_audio_buffer.commit"}`, "*realtime.BufferCommit"},
		{"clear", `{"type":"input_audio_buffer.clear"}`, "*realtime.BufferClear"},
		{"item", `{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}}`, "*realtime.ItemCreate"},
		{"retrieve", `{"type":"conversation.item.retrieve","item_id":"a"}`, "*realtime.ItemRetrieve"},
		{"truncate", `{"type":"conversation.item.truncate","item_id":"a","content_index":0,"audio_end_ms":120}`, "*realtime.ItemTruncate"},
		{"delete", `{"type":"conversation.item.delete","item_id":"a"}`, "*realtime.ItemDelete"},
		{"response", `{"type":"response.create","response":{"max_output_tokens":"inf","output_modalities":["audio"]}}`, "*realtime.ResponseCreate"},
		{"cancel", `{"type":"response.cancel"}`, "*realtime.ResponseCancel"},
		{"not json", `{`, CodeInvalidJSON},
		{"array", `[]`, CodeInvalidJSON},
		{"no type", `{}`, CodeMissingParameter},
		{"type not string", `{"type":3}`, CodeInvalidJSON},
		{"unknown", `{"type":"x"}`, CodeUnknownEvent},
		{"extra field", `{"type":"response.cancel","foo":1}`, CodeUnknownParameter},
		{"odd pcm", `{"type":"input_audio_buffer.append","audio":"AA=="}`, CodeInvalidAudio},
		{"no audio", `{"type":"input_audio_buffer.append"}`, CodeMissingParameter},
		{"truncate index", `{"type":"conversation.item.truncate","item_id":"a","content_index":1,"audio_end_ms":1}`, CodeInvalidValue},
		{"truncate negative", `{"type":"conversation.item.truncate","item_id":"a","content_index":0,"audio_end_ms":-1}`, CodeInvalidValue},
		{"no item id", `{"type":"conversation.item.delete"}`, CodeMissingParameter},
		{"text only", `{"type":"session.update","session":{"output_modalities":["text"]}}`, CodeUnsupported},
		{"tokens 0", `{"type":"session.update","session":{"max_output_tokens":0}}`, CodeInvalidValue},
		{"vad unknown", `{"type":"session.update","session":{"turn_detection":{"type":"server_vad","x":1}}}`, CodeUnknownParameter},
		{"vad no type", `{"type":"session.update","session":{"turn_detection":{"threshold":0.5}}}`, CodeMissingParameter},
		{"tools", `{"type":"session.update","session":{"tools":[{"type":"function"}]}}`, CodeUnsupported},
		{"function item", `{"type":"conversation.item.create","item":{"type":"function_call"}}`, CodeUnsupported},
		{"event id type", `{"type":"response.cancel","event_id":7}`, CodeInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := Decode([]byte(tc.in))
			got := ""
			if err != nil {
				got = err.Code
				if err.Message == "" || err.Type == "" {
					t.Errorf("error %+v lacks a type or message", err)
				}
			} else {
				got = typeName(ev)
			}
			if got != tc.want {
				t.Errorf("Decode(%s) = %s (%v), want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestDecodeErrorMessages: an error names the field and what JSON it
// wants in the client's terms, never encoding/json's Go types.
func TestDecodeErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		name, in, code, param, message string
	}{
		{"array", `[1]`, CodeInvalidJSON, "", "the event is not a JSON object: got array"},
		{"type not string", `{"type":3}`, CodeInvalidJSON, "type", "type must be a string naming the event (such as \"session.update\"), not number"},
		{"fractional ms", `{"type":"conversation.item.truncate","item_id":"a","content_index":0,"audio_end_ms":1234.5}`,
			CodeInvalidValue, "audio_end_ms", "audio_end_ms must be a JSON integer, not number 1234.5"},
		{"index as string", `{"type":"conversation.item.truncate","item_id":"a","content_index":"0","audio_end_ms":1}`,
			CodeInvalidValue, "content_index", "content_index must be a JSON integer, not string"},
		{"response not object", `{"type":"response.create","response":[]}`, CodeInvalidValue, "response", "response must be an object: got array"},
		{"session not object", `{"type":"session.update","session":"x"}`, CodeInvalidValue, "session", "session must be an object: got string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.in))
			if err == nil {
				t.Fatalf("Decode(%s) decoded, want error %s", tc.in, tc.code)
			}
			param := ""
			if err.Param != nil {
				param = *err.Param
			}
			if err.Code != tc.code || param != tc.param || err.Message != tc.message {
				t.Errorf("Decode(%s) = %s (param %q): %q\nwant %s (param %q): %q", tc.in, err.Code, param, err.Message, tc.code, tc.param, tc.message)
			}
		})
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *SessionUpdate:
		return "*realtime.SessionUpdate"
	case *BufferAppend:
		return "*realtime.BufferAppend"
	case *BufferCommit:
		return "*realtime.BufferCommit"
	case *BufferClear:
		return "*realtime.BufferClear"
	case *ItemCreate:
		return "*realtime.ItemCreate"
	case *ItemRetrieve:
		return "*realtime.ItemRetrieve"
	case *ItemTruncate:
		return "*realtime.ItemTruncate"
	case *ItemDelete:
		return "*realtime.ItemDelete"
	case *ResponseCreate:
		return "*realtime.ResponseCreate"
	case *ResponseCancel:
		return "*realtime.ResponseCancel"
	}
	return "?"
}

// TestDecodeFields: the values a decoded event carries.
func TestDecodeFields(t *testing.T) {
	ev, err := Decode([]byte(`{"type":"input_audio_buffer.append","event_id":"a1","audio":"AIAAAP9/"}`))
	if err != nil {
		t.Fatal(err)
	}
	a := ev.(*BufferAppend)
	if a.ID() != "a1" || len(a.Samples) != 3 || a.Samples[0] != -1 || a.Samples[1] != 0 || a.Samples[2] != 32767.0/32768 {
		t.Errorf("append %+v", a)
	}
	ev, err = Decode([]byte(`{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"type":"server_vad","silence_duration_ms":300}},"output":{"voice":"cedar"}},"temperature":0.7}}`))
	if err != nil {
		t.Fatal(err)
	}
	s := Session{Voice: DefaultVoice, VAD: &VAD{Threshold: 0.9, PrefixPaddingMS: 100, SilenceDurationMS: 900}}
	s.Apply(ev.(*SessionUpdate).Session)
	if s.Voice != "cedar" || s.Temperature != 0.7 || *s.VAD != (VAD{Threshold: 0.9, PrefixPaddingMS: 100, SilenceDurationMS: 300}) {
		t.Errorf("session after the update %+v, VAD %+v", s, *s.VAD)
	}
	ev, _ = Decode([]byte(`{"type":"session.update","session":{"turn_detection":null}}`))
	s.Apply(ev.(*SessionUpdate).Session)
	if s.VAD != nil {
		t.Error("turn_detection null left detection on")
	}
	ev, _ = Decode([]byte(`{"type":"session.update","session":{"turn_detection":{"type":"server_vad"}}}`))
	s.Apply(ev.(*SessionUpdate).Session)
	if s.VAD == nil || *s.VAD != DefaultVAD {
		t.Errorf("switched on again: %+v, want the defaults", s.VAD)
	}
}

// FuzzDecode: any input decodes to an event or to an error with a code,
// type and message; it never panics, and an error's param, when set, is
// not empty.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"type":"session.update","session":{"type":"realtime","audio":{"input":{"turn_detection":{"type":"server_vad","threshold":0.5}}}}}`,
		`{"type":"input_audio_buffer.append","audio":"AAAA"}`,
		`{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_audio","audio":"AAAA"},{"type":"input_text","text":"x"}]}}`,
		`{"type":"conversation.item.truncate","item_id":"i","content_index":0,"audio_end_ms":5}`,
		`{"type":"response.create","response":{"instructions":"x","temperature":1,"max_output_tokens":5}}`,
		`{"type":"response.cancel","response_id":"r"}`, `{}`, `[`, `null`, `{"type":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := Decode(data)
		if (ev == nil) == (err == nil) {
			t.Fatalf("Decode(%q) = %v, %v: want exactly one", data, ev, err)
		}
		if err != nil {
			if err.Code == "" || err.Type == "" || err.Message == "" || (err.Param != nil && *err.Param == "") {
				t.Fatalf("Decode(%q): error %+v", data, err)
			}
			if _, jerr := json.Marshal(err); jerr != nil {
				t.Fatalf("the error does not encode: %v", jerr)
			}
			return
		}
		if su, ok := ev.(*SessionUpdate); ok {
			var s Session
			s.Apply(su.Session)
			if _, jerr := json.Marshal(s.JSON(GA)); jerr != nil {
				t.Fatalf("the session does not encode: %v", jerr)
			}
		}
	})
}
