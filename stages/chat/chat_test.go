package chat_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/chat"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

const fixtures = "../../testdata/lfm2-audio-tiny/"

// melFrames counts a clip's log-mel frames the way the front end will:
// resampled to 16 kHz, then T = L16//160 + 1.
func melFrames(t *testing.T, mel *audio.LogMel, c *audio.Clip) int {
	n := audio.ResampledLen(len(c.Samples), c.SampleRate, mel.SampleRate())
	frames, _ := mel.Frames(n)
	return frames
}

// TestPromptMatchesReference rebuilds every fixture case's conversation
// from its recorded metadata and checks the prompt's text ids, modality
// flags and audio-out codes against ChatState's.
func TestPromptMatchesReference(t *testing.T) {
	tok, err := tokenizer.Load(fixtures + "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ReadAudio(fixtures + "config.json")
	if err != nil {
		t.Fatal(err)
	}
	mel, err := audio.NewLogMel(cfg.Preprocessor, audio.LogMelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"case1_question_16k", "case2_tone_noise_24k", "case3_text_only", "case4_two_turn"} {
		t.Run(name, func(t *testing.T) {
			rc, err := refcase.Open(fixtures + name + ".safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			c := chat.New(tok, lfm2audio.TemplateLFM2Audio)
			c.NewTurn(chat.System)
			c.AddText(rc.System)
			c.EndTurn()
			for _, turn := range rc.Turns {
				c.NewTurn(chat.Role(turn.Role))
				switch {
				case turn.Audio != "":
					clip, err := rc.Clip(turn.Audio)
					if err != nil {
						t.Fatal(err)
					}
					c.AddAudio(&chat.Clip{MelFrames: melFrames(t, mel, clip)})
				case turn.Text != "":
					c.AddText(turn.Text)
				case turn.Trace != "":
					tr, err := rc.Trace(turn.Trace)
					if err != nil {
						t.Fatal(err)
					}
					for s := range tr.Steps() {
						if tr.Yielded[s] == 0 {
							continue
						}
						if tr.Modality[s] == 1 {
							c.AppendToken(tr.Tokens[s])
						} else {
							c.AppendFrame(tr.Codes[s])
						}
					}
				}
				c.EndTurn()
			}
			c.NewTurn(chat.Assistant)

			wantIDs, _ := rc.Ints("prompt_text_ids")
			if got := c.TextIDs(); !slices.Equal(got, wantIDs) {
				t.Errorf("text ids\n got %v\nwant %v", got, wantIDs)
			}
			wantMod, _ := rc.Ints("prompt_modality")
			gotMod := c.Modalities()
			if len(gotMod) != len(wantMod) {
				t.Fatalf("%d rows (%v), want %d", len(gotMod), c, len(wantMod))
			}
			for i, m := range gotMod {
				if int(m) != wantMod[i] {
					t.Fatalf("row %d: modality %v, want %d (%v)", i, m, wantMod[i], c)
				}
			}
			out, _ := rc.Ints("prompt_audio_out") // [8, n]
			frames := c.AudioOut()
			n := len(frames)
			if len(out) != 8*n {
				t.Fatalf("%d audio-out frames, reference has %d", n, len(out)/8)
			}
			for f, codes := range frames {
				for cb, code := range codes {
					if out[cb*n+f] != code {
						t.Fatalf("audio-out frame %d codebook %d: %d, want %d", f, cb, code, out[cb*n+f])
					}
				}
			}
			t.Logf("%v: %d rows", c, c.Len())
		})
	}
}

func TestRowsRule(t *testing.T) {
	for _, tt := range []struct{ frames, rows int }{{1, 1}, {8, 1}, {9, 2}, {401, 51}, {491, 62}, {201, 26}} {
		if got := chat.Rows(tt.frames); got != tt.rows {
			t.Errorf("Rows(%d) = %d, want %d", tt.frames, got, tt.rows)
		}
	}
}

// wordIDs encodes each space-separated word as one id: its length.
type wordIDs struct{}

func (wordIDs) Encode(text string) []int {
	var ids []int
	for _, w := range strings.Fields(text) {
		ids = append(ids, len(w))
	}
	return ids
}

func TestCloneGrowsIndependently(t *testing.T) {
	c := chat.New(wordIDs{}, lfm2audio.TemplateLFM2Audio)
	c.AddText("a bb")
	d := c.Clone()
	c.AppendToken(7)
	d.AppendFrame([]int{1, 2})
	d.AddText("ccc")
	if got, want := c.TextIDs(), []int{15, 1, 2, 7}; !slices.Equal(got, want) {
		t.Errorf("original's ids %v, want %v", got, want)
	}
	if got, want := d.TextIDs(), []int{15, 1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("clone's ids %v, want %v", got, want)
	}
	if c.String() != "T×4" || d.String() != "T×3 O×1 T×1" {
		t.Errorf("rows: original %v, clone %v", c, d)
	}
}
