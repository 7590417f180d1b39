package lfm2audio

import (
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
