package server

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/audio"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestModelFamilyAndCodec: /health and /v1/models name the served model's
// family and codec: LFM2-Audio with Mimi, and a tiny LFM2.5-Audio folder
// (the LFM2-Audio tiny fixture plus the detokenizer fixture, made with the
// official liquid-audio code, see testdata/lfm25-detok-tiny/README.md)
// with the detokenizer by default or Mimi when asked; both list the
// family's defaults (its system prompts and voices). The model is loaded
// as the commands load it, through the family registry.
func TestModelFamilyAndCodec(t *testing.T) {
	lfm25 := testmodel.LFM25Tiny(t, true)
	dev := cpu.New(1)
	defer dev.Close()
	for _, c := range []struct {
		dir, codec, family, want string
		voices                   int
	}{
		{tinyModel, "", lfm2audio.FamilyLFM2Audio, lfm2audio.CodecMimi, 0},
		{lfm25, "", lfm2audio.FamilyLFM25Audio, lfm2audio.CodecDetokenizer, 4},
		{lfm25, lfm2audio.CodecMimi, lfm2audio.FamilyLFM25Audio, lfm2audio.CodecMimi, 4},
	} {
		m, err := family.Load(dev, c.dir, family.Options{Codec: c.codec})
		if err != nil {
			t.Fatal(err)
		}
		eng := pipeline.New(m, dev, pipeline.Options{})
		s := New(Config{Logger: discardLogger()})
		s.SetBackend(&Backend{Engine: eng, Model: m.Info().Name, Device: "cpu"})
		checkDefaults := func(route string, d family.Defaults) {
			t.Helper()
			if d.SystemPrompts["interleaved"] != "Respond with interleaved text and audio." || d.SystemPrompts["sequential"] != "Perform ASR." || len(d.Voices) != c.voices {
				t.Errorf("%s %q: %s defaults %+v, want the official prompts and %d voices", c.dir, c.codec, route, d, c.voices)
			}
		}
		var h struct {
			Family   string          `json:"model_family"`
			Codec    string          `json:"codec"`
			Defaults family.Defaults `json:"defaults"`
		}
		getJSON(t, s, "/health", &h)
		if h.Family != c.family || h.Codec != c.want {
			t.Errorf("%s %q: /health family %v codec %v, want %s %s", c.dir, c.codec, h.Family, h.Codec, c.family, c.want)
		}
		checkDefaults("/health", h.Defaults)
		var l struct {
			Data []struct {
				Family   string          `json:"family"`
				Codec    string          `json:"codec"`
				Defaults family.Defaults `json:"defaults"`
			} `json:"data"`
		}
		getJSON(t, s, "/v1/models", &l)
		if len(l.Data) != 1 || l.Data[0].Family != c.family || l.Data[0].Codec != c.want {
			t.Fatalf("%s %q: /v1/models %+v, want family %s codec %s", c.dir, c.codec, l.Data, c.family, c.want)
		}
		checkDefaults("/v1/models", l.Data[0].Defaults)
		// A whole turn: the reply's WAV holds 1920 samples per frame.
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/audio/chat",
			strings.NewReader(`{"text": "Say something.", "stream": false, "max_new_tokens": 40, "seed": 3}`)))
		var reply struct {
			Audio   string `json:"audio"`
			Timings struct {
				Frames       int     `json:"audio_frames"`
				AudioSeconds float64 `json:"audio_seconds"`
			} `json:"timings"`
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("/v1/audio/chat: %d %s", rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &reply); err != nil {
			t.Fatal(err)
		}
		wav, err := base64.StdEncoding.DecodeString(reply.Audio)
		if err != nil {
			t.Fatal(err)
		}
		clip, err := audio.DecodeBytes(wav, audio.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(clip.Samples); n == 0 || n%1920 != 0 || math.Abs(float64(n)/24000-reply.Timings.AudioSeconds) > 1e-9 {
			t.Errorf("%s %q: %d samples, %v s of audio in the timings (%d frames)", c.dir, c.codec, n, reply.Timings.AudioSeconds, reply.Timings.Frames)
		}
		eng.Close()
		m.Close()
	}
}
