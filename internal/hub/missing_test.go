package hub

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestMissingFilesCodec: a folder's codec is Mimi's weights or, for
// LFM2.5-Audio, a complete audio_detokenizer folder (config and weights).
func TestMissingFilesCodec(t *testing.T) {
	base := []string{"config.json", "tokenizer.json", "model.safetensors"}
	for _, tc := range []struct {
		name    string
		files   []string
		missing string // "" for complete
	}{
		{"mimi", []string{"mimi.safetensors"}, ""},
		{"official codec name", []string{"tokenizer-e351c8d8-checkpoint125.safetensors"}, ""},
		{"detokenizer", []string{"audio_detokenizer/config.json", "audio_detokenizer/model.safetensors"}, ""},
		{"detokenizer without weights", []string{"audio_detokenizer/config.json"}, "audio_detokenizer/model.safetensors"},
		{"detokenizer without config", []string{"audio_detokenizer/model.safetensors"}, "audio_detokenizer/config.json"},
		{"no codec", nil, "the codec's weights"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range slices.Concat(base, tc.files) {
				p := filepath.Join(dir, filepath.FromSlash(f))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got := strings.Join(missingFiles(dir), "; ")
			if tc.missing == "" && got != "" || !strings.Contains(got, tc.missing) {
				t.Errorf("missing %q, want %q", got, tc.missing)
			}
		})
	}
}
