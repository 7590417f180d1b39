// Package testdev runs a test on every compute device the machine has: the
// CPU always, and CUDA where a GPU opens (the sub-test is skipped with the
// reason elsewhere). The CUDA device is opened once per test binary (a
// context and its kernels take a while) and left open until the process
// ends. Test binaries built with `go test -c` run the CUDA sub-tests on a
// GPU machine without a Go toolchain. With OMNIPIPE_CUDA_EMU=1 the CUDA
// sub-tests run on the host emulator (package cudaemu) instead: slow, and
// a check of what the kernels compute, not of a GPU.
package testdev

import (
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/cuda/cudaemu"
	"github.com/omni-pipe/omni-pipe/gpu/devices"
)

var cuda struct {
	once sync.Once
	emu  bool // the emulator was asked for (OMNIPIPE_CUDA_EMU=1)
	dev  gpu.Device
	err  error
}

// Kinds are the device kinds Run tries, in order.
var Kinds = []string{"cpu", "cuda"}

// Open returns a device of kind for t ("cpu": a fresh two-worker CPU
// device, closed when t ends; "cuda": the process's GPU), skipping t when
// it cannot be opened.
func Open(t testing.TB, kind string) gpu.Device {
	t.Helper()
	switch kind {
	case "cpu":
		dev := cpu.New(2)
		t.Cleanup(func() { dev.Close() })
		return dev
	case "cuda":
		cuda.once.Do(func() {
			if cuda.emu, cuda.err = cudaemu.EnableIfAsked(); cuda.err != nil {
				return
			}
			cuda.dev, _, cuda.err = devices.Open("cuda", devices.Options{})
		})
		if cuda.err != nil {
			if cuda.emu {
				t.Fatalf("the CUDA emulator was asked for (%s=1) and did not open: %v", cudaemu.Env, cuda.err)
			}
			t.Skipf("no CUDA device: %v", cuda.err)
		}
		return cuda.dev
	}
	t.Fatalf("testdev: unknown device kind %q", kind)
	return nil
}

// Run runs fn as a sub-test per device kind.
func Run(t *testing.T, fn func(t *testing.T, dev gpu.Device)) {
	t.Helper()
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) { fn(t, Open(t, kind)) })
	}
}
