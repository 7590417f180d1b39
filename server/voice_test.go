package server

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// TestVoiceTTS: audio.voice naming one of LFM2.5-Audio's TTS voices makes
// the turn sequential with that voice's system prompt (a system message
// wins over it); other voices change nothing.
func TestVoiceTTS(t *testing.T) {
	for _, tc := range []struct {
		name, body, system string
		mode               pipeline.Mode
	}{
		{"us male", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"us_male","format":"wav"}}`,
			"Perform TTS. Use the US male voice.", pipeline.Sequential},
		{"uk female", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"UK female"}}`,
			"Perform TTS. Use the UK female voice.", pipeline.Sequential},
		{"system message wins", `{"messages":[{"role":"system","content":"Perform TTS."},{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"us_female"}}`,
			"Perform TTS.", pipeline.Sequential},
		{"alloy", `{"messages":[{"role":"user","content":"Hello."}],"modalities":["text","audio"],"audio":{"voice":"alloy"}}`,
			"", 0},
		{"no audio", `{"messages":[{"role":"user","content":"Hello."}]}`, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := decodeChatCompletion([]byte(tc.body), fuzzLimits, func() int64 { return 1 })
			if err != nil {
				t.Fatal(err)
			}
			if job.req.System != tc.system || job.req.Mode != tc.mode {
				t.Errorf("system %q mode %v, want %q %v", job.req.System, job.req.Mode, tc.system, tc.mode)
			}
		})
	}
}
