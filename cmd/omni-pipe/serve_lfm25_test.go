package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// TestServeLFM25: serve runs a tiny LFM2.5-Audio folder end to end: the
// detokenizer by default, Mimi with --codec mimi; /health and /v1/models
// name the family, the codec and the family's defaults (its system
// prompts and four voices), the load log names them too, and a turn's
// reply holds 1920 samples per decoded frame.
func TestServeLFM25(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	for _, tc := range []struct{ codec, want string }{{"", "detokenizer"}, {"mimi", "mimi"}} {
		t.Run(tc.want, func(t *testing.T) {
			args := []string{"serve", "--addr", "127.0.0.1:0", "--threads", "1", "--model", model}
			if tc.codec != "" {
				args = append(args, "--codec", tc.codec)
			}
			stderr := &lockedBuffer{}
			e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" }}
			exit := make(chan int, 1)
			go func() { exit <- run(args, e) }()
			addr := waitListening(t, exit, stderr)
			defer func() {
				syscall.Kill(os.Getpid(), syscall.SIGTERM)
				if code := <-exit; code != exitOK {
					t.Errorf("serve exited with %d:\n%s", code, stderr.String())
				}
			}()
			base := "http://" + addr
			get := func(path string, v any) {
				t.Helper()
				resp, err := http.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
			}
			checkDefaults := func(route string, d family.Defaults) {
				t.Helper()
				if d.SystemPrompts["interleaved"] != "Respond with interleaved text and audio." || len(d.Voices) != 4 || d.Voices[0].Name != "us_male" {
					t.Errorf("%s defaults %+v: want the interleaved prompt and LFM2.5-Audio's four voices", route, d)
				}
			}
			var h struct {
				Family   string          `json:"model_family"`
				Codec    string          `json:"codec"`
				Defaults family.Defaults `json:"defaults"`
			}
			get("/health", &h)
			if h.Family != "lfm2.5-audio" || h.Codec != tc.want {
				t.Errorf("/health family %q codec %q, want lfm2.5-audio %s", h.Family, h.Codec, tc.want)
			}
			checkDefaults("/health", h.Defaults)
			var l struct {
				Data []struct {
					Family, Codec string
					Defaults      family.Defaults
				}
			}
			get("/v1/models", &l)
			if len(l.Data) != 1 || l.Data[0].Family != "lfm2.5-audio" || l.Data[0].Codec != tc.want {
				t.Fatalf("/v1/models %+v, want lfm2.5-audio with %s", l.Data, tc.want)
			}
			checkDefaults("/v1/models", l.Data[0].Defaults)
			if log := stderr.String(); !strings.Contains(log, "family=lfm2.5-audio codec="+tc.want) {
				t.Errorf("the load log does not name the family and codec:\n%s", log)
			}

			resp, err := http.Post(base+"/v1/audio/chat", "application/json",
				strings.NewReader(`{"text": "Say something.", "stream": false, "max_new_tokens": 30, "seed": 3}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var reply struct {
				Audio   string `json:"audio"`
				Timings struct {
					Frames int `json:"audio_frames"`
				} `json:"timings"`
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("/v1/audio/chat: %d %s", resp.StatusCode, b)
			}
			if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
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
			if n := len(clip.Samples); n == 0 || n%1920 != 0 || clip.SampleRate != 24000 {
				t.Errorf("reply: %d samples at %d Hz (%d frames), want a positive multiple of 1920 at 24 kHz", n, clip.SampleRate, reply.Timings.Frames)
			}
		})
	}
}
