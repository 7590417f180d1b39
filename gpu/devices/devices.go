// Package devices opens the compute device a command asks for by name:
// "cpu", "cuda" or "auto" (CUDA when a usable GPU is found, else the CPU).
package devices

import (
	"fmt"
	"log/slog"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/cuda"
)

// Kinds lists the device names Open accepts.
var Kinds = []string{"cpu", "cuda", "auto"}

// Options configures Open.
type Options struct {
	// Threads is the CPU backend's worker count (0: one per core). The CUDA
	// backend ignores it.
	Threads int
	// Log hears what opening a device takes time for (the CUDA kernels'
	// first compile); nil: nothing is logged.
	Log *slog.Logger
}

// Open returns the device named kind. For "auto" it returns the CUDA
// device when one can be opened and the CPU device otherwise; why CUDA was
// not taken is in the returned note (empty when it was).
func Open(kind string, o Options) (dev gpu.Device, note string, err error) {
	switch kind {
	case "cpu", "":
		return cpu.New(o.Threads), "", nil
	case "cuda":
		d, err := cuda.New(cuda.Options{Log: o.Log})
		if err != nil {
			return nil, "", err
		}
		return d, "", nil
	case "auto":
		d, err := cuda.New(cuda.Options{Log: o.Log})
		if err != nil {
			return cpu.New(o.Threads), "cuda not used: " + err.Error(), nil
		}
		return d, "", nil
	}
	return nil, "", fmt.Errorf("unknown device %q (want cpu, cuda or auto)", kind)
}
