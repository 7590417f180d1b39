package bench

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/stages/family"
)

// TestReportCommit: a model that came by its Hugging Face name is named
// with its commit in the text report and the JSON one.
func TestReportCommit(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	r := &Report{Model: ModelInfo{Name: "LiquidAI/LFM2-Audio-1.5B", Commit: commit, Params: 1}}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(b.String(), "\n"); !strings.HasPrefix(first, "model      LiquidAI/LFM2-Audio-1.5B@"+commit+":") {
		t.Errorf("report's first line %q, want the repo id and commit", first)
	}
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"commit":"`+commit+`"`) {
		t.Errorf("JSON report lacks the commit: %.200s", j)
	}
}

// TestReportCodec: the text and JSON reports name the model's family and
// codec.
func TestReportCodec(t *testing.T) {
	r := &Report{Model: ModelInfo{Name: "LFM2.5-Audio-1.5B", Params: 1, Family: "lfm2.5-audio", Codec: "detokenizer"}}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(b.String(), "\n"); !strings.Contains(first, "lfm2.5-audio with codec detokenizer") {
		t.Errorf("report's first line %q lacks the family and codec", first)
	}
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"family":"lfm2.5-audio","codec":"detokenizer"`) {
		t.Errorf("JSON report lacks the family and codec: %.300s", j)
	}
}

// TestReportDefaults: the reports list the family's default system
// prompts and voices.
func TestReportDefaults(t *testing.T) {
	r := &Report{Model: ModelInfo{Name: "LFM2.5-Audio-1.5B", Params: 1, Family: "lfm2.5-audio", Codec: "detokenizer",
		Defaults: family.Defaults{
			SystemPrompts: map[string]string{"interleaved": "Respond with interleaved text and audio.", "sequential": "Perform ASR."},
			Voices:        []family.Voice{{Name: "us_male", Prompt: "Perform TTS. Use the US male voice."}, {Name: "uk_female", Prompt: "Perform TTS. Use the UK female voice."}},
		}}}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`defaults   system prompt interleaved "Respond with interleaved text and audio.", sequential "Perform ASR."; voices us_male, uk_female`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"defaults":{"system_prompts":{"interleaved":"Respond with interleaved text and audio.","sequential":"Perform ASR."},"voices":[{"name":"us_male"`) {
		t.Errorf("JSON report lacks the defaults: %.500s", j)
	}
	// A family without voices says so in the text.
	r.Model.Defaults.Voices = nil
	b.Reset()
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `sequential "Perform ASR."; no preset voices`+"\n") {
		t.Errorf("report without voices:\n%s", b.String())
	}
}
