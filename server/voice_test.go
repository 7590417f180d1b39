package server

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestVoiceTTS: audio.voice naming one of the served family's TTS voices
// (LFM2.5-Audio's) makes the turn sequential with that voice's system
// prompt (a system message wins over it); other voices, and every voice
// for a family without preset voices (LFM2-Audio), change nothing.
func TestVoiceTTS(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		tmpl       family.Template
		system     string
		mode       pipeline.Mode
	}{
		{"us male", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"us_male","format":"wav"}}`,
			lfm2audio.TemplateLFM25Audio, "Perform TTS. Use the US male voice.", pipeline.Sequential},
		{"uk female", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"UK female"}}`,
			lfm2audio.TemplateLFM25Audio, "Perform TTS. Use the UK female voice.", pipeline.Sequential},
		{"system message wins", `{"messages":[{"role":"system","content":"Perform TTS."},{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"us_female"}}`,
			lfm2audio.TemplateLFM25Audio, "Perform TTS.", pipeline.Sequential},
		{"alloy", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"alloy"}}`,
			lfm2audio.TemplateLFM25Audio, "", 0},
		{"no audio", `{"messages":[{"role":"user","content":"Hello."}]}`, lfm2audio.TemplateLFM25Audio, "", 0},
		{"LFM2-Audio has no preset voices", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"us_male"}}`,
			lfm2audio.TemplateLFM2Audio, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := decodeChatCompletion([]byte(tc.body), fuzzLimits, func() int64 { return 1 })
			if err != nil {
				t.Fatal(err)
			}
			job.applyVoice(tc.tmpl)
			if job.req.System != tc.system || job.req.Mode != tc.mode {
				t.Errorf("system %q mode %v, want %q %v", job.req.System, job.req.Mode, tc.system, tc.mode)
			}
		})
	}
}
