package cuda

import (
	"os"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cuda/cudaemu"
)

// TestMain points the backend at the host emulator (package cudaemu) when
// OMNIPIPE_CUDA_EMU=1, so that the GPU tests run on machines without a GPU
// (CI runs the kernel contract this way); without it they need a GPU and
// skip where there is none.
func TestMain(m *testing.M) { os.Exit(cudaemu.RunTests(m)) }
