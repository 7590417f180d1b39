package lfm2audio

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// TestTemplate: each family frames its conversations as liquid-audio's
// ChatState (<|startoftext|>, then ChatML turns) with the official system
// prompts; LFM2.5-Audio lists its four TTS voices, LFM2-Audio (whose TTS
// prompt describes a voice in free text) none. The template follows the
// folder's family, not its codec.
func TestTemplate(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	lfm25 := testmodel.LFM25Tiny(t, true)
	for _, tc := range []struct {
		dir, codec string
		voices     []string
	}{
		{tiny, "", nil},
		{lfm25, "", []string{"us_male", "us_female", "uk_male", "uk_female"}},
		{lfm25, CodecMimi, []string{"us_male", "us_female", "uk_male", "uk_female"}},
	} {
		m, err := LoadWith(dev, tc.dir, Options{Codec: tc.codec})
		if err != nil {
			t.Fatal(err)
		}
		tm := m.Template()
		for _, c := range []struct{ got, want string }{
			{tm.Begin(), "<|startoftext|>"},
			{tm.TurnStart(family.User), "<|im_start|>user\n"},
			{tm.TurnEnd(), "<|im_end|>\n"},
			{tm.SystemPrompt(family.Interleaved), "Respond with interleaved text and audio."},
			{tm.SystemPrompt(family.Sequential), "Perform ASR."},
		} {
			if c.got != c.want {
				t.Errorf("%s: %q, want %q", m.Family, c.got, c.want)
			}
		}
		if got := family.VoiceNames(tm); !slices.Equal(got, tc.voices) {
			t.Errorf("%s: voices %v, want %v", m.Family, got, tc.voices)
		}
		if p, _ := family.VoicePrompt(tm, "uk_female"); len(tc.voices) > 0 && p != "Perform TTS. Use the UK female voice." {
			t.Errorf("%s: uk_female prompt %q", m.Family, p)
		}
		m.Close()
	}
}
