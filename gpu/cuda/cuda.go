// Package cuda is the NVIDIA backend of package gpu. It loads libcuda,
// libnvrtc at run time through purego (the binary stays CGO_ENABLED=0 and
// runs unchanged where there is no GPU), compiles its CUDA C kernels with
// NVRTC for the device's own architecture and caches the machine code on
// disk.
package cuda

import (
	"fmt"
	"os"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Options configures New.
type Options struct {
	// Ordinal selects the GPU (0: the first).
	Ordinal int
	// CacheDir holds compiled kernels ("": the user's cache directory,
	// os.UserCacheDir()/omni-pipe/cuda; "-": no disk cache).
	CacheDir string
	// Fault compiles the kernels with a planted fault (the kernel contract's
	// controls; see faults.go). Empty for the real kernels.
	Fault string
	// NoGraphs launches every batch kernel by kernel instead of replaying
	// recurring batches as CUDA graphs (for measurements and debugging;
	// env OMNIPIPE_CUDA_GRAPHS=off does the same).
	NoGraphs bool
	// MatMul selects the kernels of BF16-weight products: "fma" (the
	// default: CUDA cores, fp32 FMA) or "mma" (tensor cores, x split into
	// three bf16 parts); env OMNIPIPE_CUDA_MATMUL.
	MatMul string
}

// New opens the GPU.
func New(o Options) (*Device, error) {
	if _, err := loadDriver(); err != nil {
		return nil, err
	}
	if os.Getenv("OMNIPIPE_CUDA_GRAPHS") == "off" {
		o.NoGraphs = true
	}
	if v := os.Getenv("OMNIPIPE_CUDA_MATMUL"); v != "" && o.MatMul == "" {
		o.MatMul = v
	}
	switch o.MatMul {
	case "", "fma", "mma":
	default:
		return nil, fmt.Errorf("cuda: matmul kernels %q (want fma or mma)", o.MatMul)
	}
	return openDevice(o)
}

var _ gpu.Device = (*Device)(nil)
