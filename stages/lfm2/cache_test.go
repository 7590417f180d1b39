package lfm2

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"

	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// TestCacheGrow: a cache grown once to a turn's positions allocates
// nothing more until it reaches them, holds exactly BytesFor(positions)
// (a whole number of KVBlock blocks), computes the same rows as a cache
// that grew pass by pass, and holds nothing after Free.
func TestCacheGrow(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
	const N, k, positions = 40, 30, 300
	x, _ := randomRows(tm.dev, c.Q, N+k, H, 5)
	// run passes N rows then k single rows (the arena reset before each,
	// as the engine's stages do).
	run := func(cache *Cache) []float32 {
		c.A.Reset()
		out := read(t, c, tm.m.Forward(c, x.Slice(0, N), []Seq{{Cache: cache, Rows: N}}))
		for s := 0; s < k; s++ {
			c.A.Reset()
			out = append(out, read(t, c, tm.m.Forward(c, x.Row(N+s), []Seq{{Cache: cache, Rows: 1}}))...)
		}
		return out
	}
	plain := tm.m.NewCache(tm.dev)
	want := run(plain)

	grown := tm.m.NewCache(tm.dev)
	grown.Grow(c.Q, positions)
	if got, want := grown.Bytes(), tm.m.BytesFor(positions); got != want {
		t.Errorf("grown cache holds %d bytes, BytesFor(%d) = %d", got, positions, want)
	}
	if got, want := tm.m.BytesFor(positions), tm.m.BytesFor(5*KVBlock); got != want {
		t.Errorf("BytesFor(%d) = %d, want five blocks' %d", positions, got, want)
	}
	if tm.m.BytesFor(5*KVBlock+1) == tm.m.BytesFor(5*KVBlock) {
		t.Errorf("BytesFor(%d) is five blocks' bytes", 5*KVBlock+1)
	}
	used := gpu.DescribeDevice(tm.dev).MemUsed
	got := run(grown)
	if after := gpu.DescribeDevice(tm.dev).MemUsed; after != used {
		t.Errorf("device memory went from %d to %d bytes during passes within the grown size", used, after)
	}
	if !slices.Equal(got, want) {
		t.Error("a grown cache computes different rows")
	}
	if plain.Bytes() != tm.m.BytesFor(N+k) {
		t.Errorf("a cache of %d positions holds %d bytes, want %d (block-rounded, not doubled)", N+k, plain.Bytes(), tm.m.BytesFor(N+k))
	}
	grown.Free()
	plain.Free()
	if grown.Bytes() != 0 {
		t.Errorf("a freed cache holds %d bytes", grown.Bytes())
	}
}
