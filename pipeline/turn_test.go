package pipeline

import (
	"strconv"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// released are the special ids of the released checkpoints (and of the
// tiny fixture model).
var released = lfm2audio.Special{IMEnd: 7, AudioStart: 128, TextEnd: 130, EOA: 2048}

// runScript drives a Turn for a model with special ids sp with a script of
// samples: "5" is a text token, "a" an audio frame, "e" a frame whose first
// code is EOA (sp.EOA), "x" an audio frame with EOA in a later codebook
// only. It returns the trace: per step
// "T5"/"t5" (text emitted / not), "A", "E" (frame forced to EOA), then
// "|" and the stop reason. A sample of the wrong kind for the step is a
// test failure.
func runScript(t *testing.T, sp lfm2audio.Special, turn *Turn, script string) string {
	EOA := sp.EOA
	t.Helper()
	var out []string
	for _, s := range strings.Fields(script) {
		k, ok := turn.Step()
		if !ok {
			t.Fatalf("script continues after the turn stopped (%v) at %q; trace %v", turn.Stopped(), s, out)
		}
		switch s {
		case "a", "e", "x":
			if k != AudioStep {
				t.Fatalf("step %d samples %v, script gives audio %q; trace %v", turn.Steps(), k, s, out)
			}
			codes := []int{1, 2, 3, 4, 5, 6, 7, 8}
			if s == "e" {
				codes[0] = EOA
			}
			if s == "x" {
				codes[3] = EOA
			}
			o := turn.OnAudio(codes)
			tag := "A"
			if codes[0] == EOA {
				for _, c := range codes {
					if c != EOA {
						t.Fatalf("EOA frame not forced: %v", codes)
					}
				}
				tag = "E"
			} else if s == "x" && codes[3] != EOA {
				t.Fatalf("later-codebook EOA was rewritten: %v", codes)
			}
			if !o.Emit || o.Stop {
				t.Fatalf("audio outcome %+v", o)
			}
			out = append(out, tag)
		default:
			tok, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			if k != TextStep {
				t.Fatalf("step %d samples %v, script gives text %d; trace %v", turn.Steps(), k, tok, out)
			}
			o := turn.OnText(tok)
			tag := "t"
			if o.Emit {
				tag = "T"
			}
			out = append(out, tag+s)
			if o.Stop {
				if turn.Stopped() != EndOfTurn {
					t.Fatalf("stop with reason %v", turn.Stopped())
				}
			}
		}
	}
	if turn.Stopped() == NotStopped {
		if _, ok := turn.Step(); ok {
			out = append(out, "|more")
			return strings.Join(out, " ")
		}
	}
	out = append(out, "|"+turn.Stopped().String())
	return strings.Join(out, " ")
}

func TestTurnTransitions(t *testing.T) {
	tests := []struct {
		name          string
		mode          Mode
		nText, nAudio int
		maxNew        int
		script        string
		want          string
	}{
		{"interleaved blocks", Interleaved, 2, 3, 100,
			"5 6 a a a 8 9 a a a 7",
			"T5 T6 A A A T8 T9 A A A t7 |end_of_turn"},
		{"text_end switches to audio at once", Interleaved, 2, 3, 100,
			"130 a a a a a e 7",
			"T130 A A A A A E t7 |end_of_turn"},
		{"text_end mid block, audio runs past its block until EOA", Interleaved, 3, 2, 100,
			"5 130 a a a a e 7",
			"T5 T130 A A A A E t7 |end_of_turn"},
		{"text after text_end goes straight back to audio", Interleaved, 2, 3, 100,
			"5 130 a e 9 a a e 7",
			"T5 T130 A E T9 A A E t7 |end_of_turn"},
		{"EOA before text_end keeps the counter", Interleaved, 2, 3, 100,
			// After 5 6 the audio block has 3 frames left; EOA on the first
			// returns to text with modality_left 2: two more steps to 0 …
			"5 6 e 8 9 a a a 7",
			"T5 T6 E T8 T9 A A A t7 |end_of_turn"},
		{"audio block boundary hands back to text", Interleaved, 1, 1, 100,
			"5 a 6 a 7",
			"T5 A T6 A t7 |end_of_turn"},
		{"im_end first", Interleaved, 6, 12, 100, "7", "t7 |end_of_turn"},
		{"EOA in a later codebook does not end speech", Interleaved, 1, 2, 100,
			"5 x a 6 x a 7",
			"T5 A A T6 A A t7 |end_of_turn"},
		{"max tokens mid text", Interleaved, 6, 12, 3, "5 6 8", "T5 T6 T8 |max_tokens"},
		{"max tokens mid audio", Interleaved, 1, 12, 4, "5 a a a", "T5 A A A |max_tokens"},
		{"max tokens zero", Interleaved, 6, 12, 0, "", "|max_tokens"},
		{"sequential TTS", Sequential, 6, 12, 100,
			"5 128 a a a a a a a a a a a a a a e 7",
			"T5 T128 A A A A A A A A A A A A A A E T7 |end_of_turn"},
		{"sequential ASR", Sequential, 6, 12, 100, "5 6 9 7", "T5 T6 T9 T7 |end_of_turn"},
		{"sequential text after EOA, then audio again", Sequential, 6, 12, 100,
			"128 a e 5 128 a e 7",
			"T128 A E T5 T128 A E T7 |end_of_turn"},
		{"sequential max tokens", Sequential, 6, 12, 2, "128 a", "T128 A |max_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runScript(t, released, NewTurn(released, tt.mode, tt.nText, tt.nAudio, tt.maxNew), tt.script)
			if got != tt.want {
				t.Errorf("trace\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestTurnUsesTheModelsSpecialIDs: a model whose special tokens and
// end-of-audio code have other ids: those act, and the released ones are
// ordinary tokens and codes.
func TestTurnUsesTheModelsSpecialIDs(t *testing.T) {
	other := lfm2audio.Special{IMEnd: 50, AudioStart: 60, TextEnd: 70, EOA: 1024}
	tests := []struct {
		name          string
		mode          Mode
		nText, nAudio int
		script        string
		want          string
	}{
		{"released ids are plain text", Interleaved, 6, 12,
			"7 128 130 5 6 8 a",
			"T7 T128 T130 T5 T6 T8 A |more"},
		{"text_end", Interleaved, 2, 3,
			"70 a a a a e 50",
			"T70 A A A A E t50 |end_of_turn"},
		{"im_end first", Interleaved, 6, 12, "50", "t50 |end_of_turn"},
		{"sequential", Sequential, 6, 12,
			"5 7 60 a a e 50",
			"T5 T7 T60 A A E T50 |end_of_turn"},
		{"sequential: 128 is text", Sequential, 6, 12, "128 5 50", "T128 T5 T50 |end_of_turn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runScript(t, other, NewTurn(other, tt.mode, tt.nText, tt.nAudio, 100), tt.script)
			if got != tt.want {
				t.Errorf("trace\n got %s\nwant %s", got, tt.want)
			}
		})
	}
	// The released end-of-audio code is an ordinary code for this model.
	turn := NewTurn(other, Interleaved, 1, 2, 100)
	turn.Step()
	turn.OnText(5)
	turn.Step()
	codes := []int{2048, 1, 2, 3}
	turn.OnAudio(codes)
	if codes[1] != 1 || turn.Kind() != AudioStep {
		t.Errorf("code 2048 ended the speech of a model whose end-of-audio is %d: %v, next %v", other.EOA, codes, turn.Kind())
	}
}

// TestTurnFollowsFixturePattern replays the fixtures' 60-step pattern
// (6 text / 12 audio, no text_end): the step kinds must be
// TTTTTTAAAAAAAAAAAATTTTTT… exactly.
func TestTurnFollowsFixturePattern(t *testing.T) {
	want := "TTTTTTAAAAAAAAAAAATTTTTTAAAAAAAAAAAATTTTTTAAAAAAAAAAAATTTTTT"
	turn := NewTurn(released, Interleaved, 6, 12, 60)
	var got strings.Builder
	for {
		k, ok := turn.Step()
		if !ok {
			break
		}
		if k == TextStep {
			got.WriteByte('T')
			turn.OnText(500)
		} else {
			got.WriteByte('A')
			turn.OnAudio([]int{1, 2, 3, 4, 5, 6, 7, 8})
		}
	}
	if got.String() != want || turn.Stopped() != MaxTokens {
		t.Errorf("pattern %s (%v), want %s", got.String(), turn.Stopped(), want)
	}
}

func TestTurnMisuse(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("observing audio on a text step did not panic")
		}
	}()
	turn := NewTurn(released, Interleaved, 6, 12, 10)
	turn.Step()
	turn.OnAudio(make([]int, 8))
}
