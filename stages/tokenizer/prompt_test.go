package tokenizer

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// TestFixturePrompts rebuilds the prompt of every lfm2-audio-tiny case the
// way liquid-audio's ChatState does (one encode call per segment, no
// special tokens added) and checks it against the recorded
// prompt_text_ids.
func TestFixturePrompts(t *testing.T) {
	dir := filepath.Join(fixtures, "lfm2-audio-tiny")
	tok := mustLoad(t, filepath.Join(dir, "tokenizer.json"))
	cases, err := filepath.Glob(filepath.Join(dir, "case*_*.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, path := range cases {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		want := f.Tensor("prompt_text_ids")
		if want == nil {
			continue // the float64 companion files hold no prompt
		}
		t.Run(filepath.Base(path), func(t *testing.T) {
			wantIDs, err := want.Int64s()
			if err != nil {
				t.Fatal(err)
			}
			var turns []struct {
				Role  string `json:"role"`
				Text  string `json:"text"`
				Audio string `json:"audio"`
				Trace string `json:"trace"`
			}
			if err := json.Unmarshal([]byte(f.Metadata["turns"]), &turns); err != nil {
				t.Fatalf("turns metadata: %v", err)
			}
			var got []int
			add := func(s string) { got = append(got, tok.Encode(s)...) }
			add("<|startoftext|>")
			add("<|im_start|>system\n")
			add(f.Metadata["system"])
			add("<|im_end|>\n")
			for _, turn := range turns {
				add("<|im_start|>" + turn.Role + "\n")
				switch {
				case turn.Text != "":
					add(turn.Text)
				case turn.Trace != "":
					// The recorded assistant turn: its text tokens as
					// generated (audio frames hold no text ids).
					trace, err := f.Tensor(turn.Trace[:len(turn.Trace)-1] + "text_token").Int64s()
					if err != nil {
						t.Fatal(err)
					}
					for _, id := range trace {
						if id >= 0 {
							got = append(got, int(id))
						}
					}
				}
				add("<|im_end|>\n")
			}
			add("<|im_start|>assistant\n")
			gotIDs := make([]int64, len(got))
			for i, id := range got {
				gotIDs[i] = int64(id)
			}
			if !reflect.DeepEqual(gotIDs, wantIDs) {
				t.Errorf("prompt ids\n got %v\nwant %v", gotIDs, wantIDs)
			}
			t.Logf("%d prompt text ids match", len(gotIDs))
		})
		checked++
	}
	if checked < 4 {
		t.Fatalf("checked %d case files, want at least 4", checked)
	}
}

// TestFixtureSegments pins the per-segment ids of the prompt pieces, so a
// failure names the segment rather than the whole prompt.
func TestFixtureSegments(t *testing.T) {
	tok := mustLoad(t, filepath.Join(fixtures, "lfm2-audio-tiny", "tokenizer.json"))
	for _, c := range []struct {
		text string
		want []int
	}{
		// From case3_text_only's prompt_text_ids, cut at the segments.
		{"<|startoftext|>", []int{1}},
		{"<|im_start|>system\n", []int{6, 218, 224, 483, 204, 212, 334}},
		{"Respond with interleaved text and audio.", []int{914, 450, 970, 504, 409, 937, 149}},
		{"<|im_end|>\n", []int{7, 334}},
		{"<|im_start|>user\n", []int{6, 535, 402, 334}},
		{"What is the capital of France?", []int{624, 219, 426, 398, 608, 449, 601, 166}},
		{"<|im_start|>assistant\n", []int{6, 200, 688, 412, 219, 424, 219, 334}},
		// From case4_two_turn.
		{"Now answer in one short sentence.", []int{181, 525, 936, 423, 589, 899, 496, 522, 204, 213, 511, 149}},
	} {
		if got := tok.Encode(c.text); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
		if got := tok.Decode(c.want); got != c.text {
			t.Errorf("Decode(%v) = %q, want %q", c.want, got, c.text)
		}
	}
}
