package pipeline

import (
	"runtime"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// DefaultMaxBatch is the batch limit the engine takes on dev when
// Options.MaxBatch is not set. On a GPU a step reads the weights once for
// the whole batch and costs about the same for one row or hundreds: 256.
// On the CPU a step is bound by memory bandwidth until the rows' arithmetic
// catches up with the weight reads, which takes a few rows per core: four
// per core, between 4 and 64.
func DefaultMaxBatch(dev gpu.Device) int {
	if gpu.DescribeDevice(dev).Kind == "cuda" {
		return 256
	}
	return min(64, max(4, 4*runtime.NumCPU()))
}

// DefaultPrefillChunk is the prompt rows one backbone step takes on dev
// when Options.PrefillChunk is not set: 512 on a GPU (a chunk costs little
// more than a step there), 64 on the CPU (about a quarter of a second of
// LFM2-Audio-1.5B's backbone on 16 cores; a whole 93-row reference prompt
// is two chunks).
func DefaultPrefillChunk(dev gpu.Device) int {
	if gpu.DescribeDevice(dev).Kind == "cuda" {
		return 512
	}
	return 64
}
