package lfm2audio_test

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// BenchmarkLoad loads a real-size LFM2-Audio-1.5B folder (bench's synthetic
// checkpoint: 2.94 GB model.safetensors, the Mimi decoder's weights,
// config.json, a 65536-id tokenizer.json), written once to a temporary
// folder: the cost of starting a server with the file in the page cache
// (mapping, header parsing, binding every tensor by name, the tokenizer,
// the codebook tables and folded constants).
func BenchmarkLoad(b *testing.B) {
	ck := bench.Real()
	dir := b.TempDir()
	if err := ck.WriteDir(dir); err != nil {
		b.Fatal(err)
	}
	dev := cpu.New(0)
	defer dev.Close()
	for b.Loop() {
		m, err := lfm2audio.Load(dev, dir)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/load")
}
