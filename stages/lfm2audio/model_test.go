package lfm2audio

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const tiny = "../../testdata/lfm2-audio-tiny"

func TestLoadTinyReportsEveryTensor(t *testing.T) {
	dev := cpu.New(0)
	defer dev.Close()
	m, err := Load(dev, tiny)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	f, err := safetensors.Open(filepath.Join(tiny, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Every stored tensor is bound, except those known to be unused at
	// inference (training buffers, the untied audio head, BatchNorm's step
	// counters).
	bound := map[string]bool{}
	var params int64
	for _, n := range m.Bound {
		if bound[n] {
			continue
		}
		bound[n] = true
		params += int64(f.Tensor(n).Len())
	}
	unused := 0
	for _, n := range f.Names() {
		if bound[n] {
			continue
		}
		unused++
		ok := strings.HasPrefix(n, "audio_embedding.embedding_norm") || strings.HasPrefix(n, "audio_embedding.to_logits") ||
			n == "codebook_offsets" || n == "audio_loss_weights" || strings.HasSuffix(n, "num_batches_tracked")
		if !ok {
			t.Errorf("tensor %q is neither bound nor a known unused one", n)
		}
	}
	if m.Params != params || m.Params == 0 {
		t.Errorf("Params = %d, bound tensors hold %d", m.Params, params)
	}
	t.Logf("%s: %d parameters in %d bound tensors (%d stored tensors unused at inference)\n%s", m.Name, m.Params, len(bound), unused, m.Summary())
}

func TestLoadErrors(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	copyDir := func(t *testing.T) string {
		dir := t.TempDir()
		entries, err := os.ReadDir(tiny)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() || (!strings.HasSuffix(e.Name(), ".json") && e.Name() != "model.safetensors" && e.Name() != "mimi.safetensors") {
				continue
			}
			data, err := os.ReadFile(filepath.Join(tiny, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	tests := []struct {
		name string
		edit func(dir string) error
		want string
	}{
		{"truncated weights", func(dir string) error {
			p := filepath.Join(dir, "model.safetensors")
			data, _ := os.ReadFile(p)
			return os.WriteFile(p, data[:len(data)-1000], 0o644)
		}, "truncated: file has"},
		{"no codec", func(dir string) error { return os.Remove(filepath.Join(dir, "mimi.safetensors")) }, "no codec weights"},
		{"no tokenizer", func(dir string) error { return os.Remove(filepath.Join(dir, "tokenizer.json")) }, "tokenizer"},
		{"bad config", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"architectures":["Foo"]}`), 0o644)
		}, "unsupported architecture"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyDir(t)
			if err := tt.edit(dir); err != nil {
				t.Fatal(err)
			}
			m, err := Load(dev, dir)
			if err == nil {
				m.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// editTokens rewrites tokenizer.json's token table: every pair of texts in
// swap trades ids, every text in rename gets a new text.
func editTokens(t *testing.T, data []byte, swap [][2]string, rename map[string]string) []byte {
	t.Helper()
	var tj map[string]any
	if err := json.Unmarshal(data, &tj); err != nil {
		t.Fatal(err)
	}
	vocab := tj["model"].(map[string]any)["vocab"].(map[string]any)
	added := tj["added_tokens"].([]any)
	byText := map[string]map[string]any{}
	for _, a := range added {
		a := a.(map[string]any)
		byText[a["content"].(string)] = a
	}
	for _, p := range swap {
		a, b := byText[p[0]], byText[p[1]]
		if a == nil || b == nil {
			t.Fatalf("no added token %q or %q", p[0], p[1])
		}
		a["id"], b["id"] = b["id"], a["id"]
		vocab[p[0]], vocab[p[1]] = vocab[p[1]], vocab[p[0]]
	}
	for from, to := range rename {
		a := byText[from]
		if a == nil {
			t.Fatalf("no added token %q", from)
		}
		a["content"] = to
		vocab[to] = vocab[from]
		delete(vocab, from)
	}
	out, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tinyWithTokenizer writes a copy of the tiny model folder (weights
// linked) whose tokenizer.json is edited by editTokens.
func tinyWithTokenizer(t *testing.T, swap [][2]string, rename map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(tiny)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"config.json", "model.safetensors", "mimi.safetensors", "mimi_config.json"} {
		if err := os.Symlink(filepath.Join(abs, n), filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(tiny, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), editTokens(t, data, swap, rename), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSpecialFromCheckpoint: the special ids come from tokenizer.json by
// token text, and end-of-audio from the codec's codebook size; a tokenizer
// that lacks one of the tokens the engine needs fails to load, naming it.
func TestSpecialFromCheckpoint(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	tests := []struct {
		name    string
		swap    [][2]string
		rename  map[string]string
		want    Special
		wantErr string
	}{
		{name: "released ids", want: Special{IMEnd: 7, AudioStart: 128, TextEnd: 130, EOA: 2048}},
		{name: "other ids", swap: [][2]string{{TokIMEnd, TokTextEnd}, {TokAudioStart, "<|text_start|>"}},
			want: Special{IMEnd: 130, AudioStart: 129, TextEnd: 7, EOA: 2048}},
		{name: "no text_end", rename: map[string]string{TokTextEnd: "<|text_end_x|>"}, wantErr: "no <|text_end|> token"},
		{name: "no im_end", rename: map[string]string{TokIMEnd: "<|im_end_x|>"}, wantErr: "no <|im_end|> token"},
		{name: "no audio_start", rename: map[string]string{TokAudioStart: "<|audio_start_x|>"}, wantErr: "no <|audio_start|> token"},
		{name: "no im_start", rename: map[string]string{TokIMStart: "<|im_start_x|>"}, wantErr: "no <|im_start|> token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Load(dev, tinyWithTokenizer(t, tt.swap, tt.rename))
			if tt.wantErr != "" {
				if err == nil {
					m.Close()
				}
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "tokenizer.json") {
					t.Fatalf("err = %v, want one naming tokenizer.json and containing %q", err, tt.wantErr)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Special != tt.want {
				t.Errorf("Special = %+v, want %+v", m.Special, tt.want)
			}
		})
	}
}
