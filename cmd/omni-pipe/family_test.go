package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnknownFamily: every command that loads a model does it through the
// family registry, so a checkpoint of a family omni-pipe does not run
// fails on one line that names what its config.json says and the
// families it knows.
func TestUnknownFamily(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"architectures": ["Qwen2AudioForConditionalGeneration"], "model_type": "qwen2_audio"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	const want = `config.json: no registered model family for architectures ["Qwen2AudioForConditionalGeneration"], model_type "qwen2_audio" (registered: Lfm2AudioForConditionalGeneration)`
	for _, args := range [][]string{
		{"generate", "--text", "hi", "--out", ""},
		{"generate", "--text", "hi", "--out", "", "--no-mmap"},
		{"serve", "--addr", "127.0.0.1:0"},
		{"bench", "--seconds", "0.5"},
		{"decode", "--codes", detokCase, "--out", ""},
		{"parity", "--reference", tiny + "/case3_text_only.safetensors"},
		{"mic", "--wav", filepath.Join(dir, "in.wav"), "--out", filepath.Join(dir, "r.wav")},
	} {
		t.Run(args[0], func(t *testing.T) {
			code, _, errOut := runCmd(t, "", append(args, "--model", dir)...)
			if code != exitError {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitError, errOut)
			}
			var line string
			for _, l := range strings.Split(errOut, "\n") {
				if strings.HasPrefix(l, "omni-pipe "+args[0]+": ") {
					line = l
				}
			}
			if !strings.Contains(line, "load model "+dir+": "+want) {
				t.Errorf("error line %q, want one naming the family found:\n%s", line, errOut)
			}
		})
	}
}
