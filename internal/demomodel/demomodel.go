// Package demomodel embeds the tiny random-weight LFM2-Audio checkpoint (a
// copy of testdata/lfm2-audio-tiny's model files) so that `omni-pipe serve`
// runs with no download. Its weights are random: every route works, but its
// words and its speech are noise.
package demomodel

import (
	"embed"
	"io/fs"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// Name is the demo model's name, as /health and /v1/models report it.
const Name = "lfm2-audio-tiny-demo"

//go:embed config.json model.safetensors tokenizer.json tokenizer_config.json mimi.safetensors mimi_config.json
var files embed.FS

// FS returns the checkpoint folder: config.json, model.safetensors,
// tokenizer.json, tokenizer_config.json, mimi.safetensors, mimi_config.json.
func FS() fs.FS { return files }

// Load loads the demo model onto dev.
func Load(dev gpu.Device) (*lfm2audio.Model, error) {
	return lfm2audio.LoadFS(dev, files, Name)
}
