package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cuda/cudaemu"
)

// TestMain puts the CUDA backend on the host emulator (package cudaemu)
// when OMNIPIPE_CUDA_EMU=1: the device tests then run their CUDA cases
// (--device auto takes it, a turn runs on it) on machines without a GPU.
func TestMain(m *testing.M) {
	if os.Getenv(cudaemu.Env) == "1" {
		if _, err := cudaemu.Enable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}
