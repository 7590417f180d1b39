package family_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/stages/family"
)

var testVoices = family.ChatML{TTS: []family.Voice{
	{Name: "us_male", Prompt: "Perform TTS. Use the US male voice."},
	{Name: "us_female", Prompt: "Perform TTS. Use the US female voice."},
	{Name: "uk_male", Prompt: "Perform TTS. Use the UK male voice."},
	{Name: "uk_female", Prompt: "Perform TTS. Use the UK female voice."},
}}

func TestVoicePrompt(t *testing.T) {
	for _, tc := range []struct {
		tmpl        family.Template
		voice, want string
	}{
		{testVoices, "us_male", "Perform TTS. Use the US male voice."},
		{testVoices, "US female", "Perform TTS. Use the US female voice."},
		{testVoices, "uk-male", "Perform TTS. Use the UK male voice."},
		{testVoices, " UK_Female ", "Perform TTS. Use the UK female voice."},
		{testVoices, "alloy", ""},
		{testVoices, "", ""},
		{family.ChatML{}, "us_male", ""}, // a family without voices
	} {
		got, ok := family.VoicePrompt(tc.tmpl, tc.voice)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("VoicePrompt(%q) = %q, %v; want %q", tc.voice, got, ok, tc.want)
		}
	}
	if got, want := family.VoiceNames(testVoices), []string{"us_male", "us_female", "uk_male", "uk_female"}; !slices.Equal(got, want) {
		t.Errorf("VoiceNames %v, want %v", got, want)
	}
	if got := family.VoiceNames(family.ChatML{}); len(got) != 0 {
		t.Errorf("VoiceNames of no voices: %v", got)
	}
}

// TestChatML: the framing of a ChatML template and its prompts by mode.
func TestChatML(t *testing.T) {
	c := family.ChatML{BOS: "<s>", Prompts: map[family.Mode]string{family.Interleaved: "talk", family.Sequential: "listen"}}
	for _, tc := range []struct{ got, want string }{
		{c.Begin(), "<s>"},
		{c.TurnStart(family.System), "<|im_start|>system\n"},
		{c.TurnStart(family.Assistant), "<|im_start|>assistant\n"},
		{c.TurnEnd(), "<|im_end|>\n"},
		{c.SystemPrompt(family.Interleaved), "talk"},
		{c.SystemPrompt(family.Sequential), "listen"},
		{c.SystemPrompt(0), ""},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	want := family.Defaults{SystemPrompts: map[string]string{"interleaved": "talk", "sequential": "listen"}}
	if got := family.DefaultsOf(c); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultsOf %+v, want %+v", got, want)
	}
	if got := family.DefaultsOf(family.ChatML{}); got.SystemPrompts != nil || got.Voices != nil {
		t.Errorf("DefaultsOf an empty template: %+v", got)
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[family.Mode]string{family.Interleaved: "interleaved", family.Sequential: "sequential", 7: "Mode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", uint8(m), got, want)
		}
	}
}
