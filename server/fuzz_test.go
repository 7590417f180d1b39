package server

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
)

var fuzzLimits = limits{maxAudio: time.Second, maxNewTokens: 64, maxTextBytes: 4096}

// tinyWAV is a valid 0.1 s WAV, base64.
func tinyWAV(t testing.TB) string {
	return wavBase64(t, &audio.Clip{SampleRate: 8000, Samples: make([]float32, 800)})
}

// checkDecoded holds for every request a decoder accepts or refuses.
func checkDecoded(t *testing.T, req *turnJob, err *apiError) {
	if err != nil {
		if req != nil {
			t.Fatal("a request and an error")
		}
		if err.Status < 400 || err.Status > 499 || err.Code == "" || err.Message == "" || err.Type != typeInvalidRequest {
			t.Fatalf("error %+v: want a 4xx invalid_request_error with a code and a message", err)
		}
		return
	}
	r := req.req
	if r.Audio == nil && strings.TrimSpace(r.Text) == "" {
		t.Fatal("accepted a request with neither audio nor text")
	}
	if len(r.Text) > fuzzLimits.maxTextBytes || len(r.System) > fuzzLimits.maxTextBytes {
		t.Fatalf("accepted %d bytes of text and %d of system prompt (limit %d)", len(r.Text), len(r.System), fuzzLimits.maxTextBytes)
	}
	if r.Seed > maxSeed {
		t.Fatalf("seed %d above 2^53 − 1", r.Seed)
	}
	if r.MaxNewTokens < 1 || r.MaxNewTokens > fuzzLimits.maxNewTokens {
		t.Fatalf("max_new_tokens %d outside [1, %d]", r.MaxNewTokens, fuzzLimits.maxNewTokens)
	}
	if e := r.TextSampling.Validate(); e != nil {
		t.Fatalf("text sampling: %v", e)
	}
	if e := r.AudioSampling.Validate(); e != nil {
		t.Fatalf("audio sampling: %v", e)
	}
	if r.Audio != nil && (len(r.Audio.Samples) == 0 || r.Audio.Duration() > fuzzLimits.maxAudio) {
		t.Fatalf("clip of %d samples at %d Hz", len(r.Audio.Samples), r.Audio.SampleRate)
	}
}

func FuzzDecodeAudioChat(f *testing.F) {
	wav := tinyWAV(f)
	for _, s := range []string{
		`{"text": "hi"}`,
		`{"audio": "` + wav + `", "text": "and this", "stream": false, "temperature": 0.7, "top_k": 4, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 5, "max_new_tokens": 10}`,
		`{"audio": "data:audio/wav;base64,` + wav + `"}`,
		`{"audio": "` + strings.TrimRight(wav, "=") + `", "text_temperature": 0.5, "text_top_k": 3}`,
		`{"text": "hi", "top_k": "x"}`, `{"audio": "!!"}`, `{`, `[]`, `null`, `{"text": 1}`, `{"max_new_tokens": -1, "text": "a"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeAudioChat(body, fuzzLimits, func() int64 { return 1 })
		checkDecoded(t, req, err)
	})
}

func FuzzDecodeChatCompletion(f *testing.F) {
	wav := tinyWAV(f)
	for _, s := range []string{
		`{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`,
		`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "` + wav + `", "format": "wav"}}, {"type": "text", "text": "x"}]}], "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}, "max_tokens": 8}`,
		`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "audio": {"id": "audio_conv_ab_1"}}, {"role": "user", "content": "b"}], "stream": true, "stream_options": {"include_usage": true}, "modalities": ["audio"]}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, `{"messages": [{"role": "tool"}]}`,
		`{"messages": [{"role": "user", "content": 5}]}`, `{"messages": []}`, `{"n": 2}`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		job, err := decodeChatCompletion(body, fuzzLimits, func() int64 { return 1 })
		if err != nil {
			checkDecoded(t, nil, err)
			return
		}
		checkDecoded(t, &job.turnJob, nil)
		if job.audioOut && job.format != "wav" && job.format != "pcm16" || job.stream && job.audioOut && job.format != "pcm16" {
			t.Fatalf("audio out %v, format %q, stream %v", job.audioOut, job.format, job.stream)
		}
	})
}

func TestDecodeAudioForms(t *testing.T) {
	raw := wavBytes(t, &audio.Clip{SampleRate: 16000, Samples: make([]float32, 1600)})
	if len(raw)%3 == 0 {
		t.Fatal("the WAV's length must leave base64 padding")
	}
	std := base64.StdEncoding.EncodeToString(raw)
	var wrapped strings.Builder // base64(1) wraps at 76 columns
	for i := 0; i < len(std); i += 76 {
		wrapped.WriteString(std[i:min(i+76, len(std))] + "\n")
	}
	for name, s := range map[string]string{
		"standard": std,
		"unpadded": base64.RawStdEncoding.EncodeToString(raw), // 3244 bytes: the padded form ends in "=="
		"data URL": "data:audio/wav;base64," + std,
		"wrapped":  wrapped.String(),
	} {
		clip, err := decodeAudio(s, "audio", limits{maxAudio: time.Minute})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if clip.SampleRate != 16000 || len(clip.Samples) < 1599 {
			t.Errorf("%s: %d samples at %d Hz", name, len(clip.Samples), clip.SampleRate)
		}
	}
}
