package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cuda/cudaemu"
)

// TestMain points the backend at the host emulator (package cudaemu) when
// OMNIPIPE_CUDA_EMU=1, so that the GPU tests run on machines without a GPU
// (CI runs the kernel contract this way); without it they need a GPU and
// skip where there is none.
func TestMain(m *testing.M) {
	if os.Getenv(cudaemu.Env) == "1" {
		if _, err := cudaemu.Enable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}
