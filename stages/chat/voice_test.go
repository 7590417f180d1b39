package chat

import "testing"

func TestVoicePrompt(t *testing.T) {
	for _, tc := range []struct{ voice, want string }{
		{"us_male", "Perform TTS. Use the US male voice."},
		{"US female", "Perform TTS. Use the US female voice."},
		{"uk-male", "Perform TTS. Use the UK male voice."},
		{" UK_Female ", "Perform TTS. Use the UK female voice."},
		{"alloy", ""},
		{"", ""},
	} {
		got, ok := VoicePrompt(tc.voice)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("VoicePrompt(%q) = %q, %v; want %q", tc.voice, got, ok, tc.want)
		}
	}
}
