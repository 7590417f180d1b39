package main

import (
	"os"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cuda/cudaemu"
)

// TestMain puts the CUDA backend on the host emulator (package cudaemu)
// when OMNIPIPE_CUDA_EMU=1: the device tests then run their CUDA cases
// (--device auto takes it, a turn runs on it) on machines without a GPU.
func TestMain(m *testing.M) { os.Exit(cudaemu.RunTests(m)) }
