package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// tinySwapped writes a copy of the tiny model folder (weights linked)
// whose tokenizer.json gives each pair of token texts in swap the other's
// id.
func tinySwapped(t *testing.T, swap ...[2]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tinyModel, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	if err := json.Unmarshal(data, &tj); err != nil {
		t.Fatal(err)
	}
	vocab := tj["model"].(map[string]any)["vocab"].(map[string]any)
	byText := map[string]map[string]any{}
	for _, a := range tj["added_tokens"].([]any) {
		a := a.(map[string]any)
		byText[a["content"].(string)] = a
	}
	for _, p := range swap {
		a, b := byText[p[0]], byText[p[1]]
		a["id"], b["id"] = b["id"], a["id"]
		vocab[p[0]], vocab[p[1]] = vocab[p[1]], vocab[p[0]]
	}
	if data, err = json.Marshal(tj); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"config.json", "model.safetensors", "mimi.safetensors", "mimi_config.json"} {
		if err := os.Symlink(filepath.Join(abs, n), filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// forceFirst picks tok at the first step and keeps the engine's picks
// after it, noting the steps at which it saw audio.
type forceFirst struct {
	tok   int
	audio map[int]bool
}

func (f *forceFirst) Text(step, picked int, _ []float32) int {
	if step == 0 {
		return f.tok
	}
	return picked
}

func (f *forceFirst) AudioCode(step, _, picked int, _ []float32) int {
	f.audio[step] = true
	return picked
}

// TestEngineActsOnTheTokenizersSpecialIDs: the engine ends a turn on the
// tokenizer's <|im_end|> and switches to speech on its <|text_end|>,
// whatever their ids: with the released ids and with the two traded.
func TestEngineActsOnTheTokenizersSpecialIDs(t *testing.T) {
	dev := cpu.New(0)
	defer dev.Close()
	for _, tc := range []struct {
		name          string
		dir           string
		imEnd, txtEnd int
	}{
		{"released", tinyModel, 7, 130},
		{"traded", tinySwapped(t, [2]string{lfm2audio.TokIMEnd, lfm2audio.TokTextEnd}), 130, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := lfm2audio.Load(dev, tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Special.IMEnd != tc.imEnd || m.Special.TextEnd != tc.txtEnd {
				t.Fatalf("special ids %+v, want <|im_end|> %d and <|text_end|> %d", m.Special, tc.imEnd, tc.txtEnd)
			}
			e := New(m, dev, Options{})
			defer e.Close()
			turn := func(tok int) (*DoneEvent, *forceFirst) {
				f := &forceFirst{tok: tok, audio: map[int]bool{}}
				st, err := e.Start(context.Background(), e.NewSession(), Request{Text: "Hi.", MaxNewTokens: 4, Teacher: f})
				if err != nil {
					t.Fatal(err)
				}
				c := collect(t, st, time.Minute)
				if c.err != nil {
					t.Fatal(c.err)
				}
				return c.done, f
			}
			if done, _ := turn(tc.imEnd); done.Stop != EndOfTurn || done.Timings.Steps != 1 {
				t.Errorf("picking <|im_end|> (%d) first: stop %v after %d steps, want end_of_turn after 1", tc.imEnd, done.Stop, done.Timings.Steps)
			}
			if done, f := turn(tc.txtEnd); done.Stop != MaxTokens || !f.audio[1] || !f.audio[2] || !f.audio[3] {
				t.Errorf("picking <|text_end|> (%d) first: stop %v, audio at steps %v, want speech from step 1 on", tc.txtEnd, done.Stop, f.audio)
			}
		})
	}
}
