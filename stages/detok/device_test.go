package detok

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/devices"
)

// The device tests run on "cpu" always and on "cuda" when
// devices.Open("cuda") opens one (skipped, with its error, otherwise). The
// test binary needs only the fixture folder, read relative to the package
// directory (fixtureDir), so `go test -c ./stages/detok` gives a binary
// that runs from stages/detok on a GPU host: ./detok.test -test.v.

// cudaDevice is opened once for the whole test binary (opening a CUDA
// context and loading its kernels is slow) and closed by TestMain.
var cudaDevice struct {
	once sync.Once
	dev  gpu.Device
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if d := cudaDevice.dev; d != nil {
		if err := d.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the CUDA device:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testDevice returns the device of kind for t, or skips t when it cannot
// be opened.
func testDevice(t *testing.T, kind string) gpu.Device {
	t.Helper()
	switch kind {
	case "cpu":
		dev := cpu.New(2)
		t.Cleanup(func() { dev.Close() })
		return dev
	case "cuda":
		cudaDevice.once.Do(func() {
			cudaDevice.dev, _, cudaDevice.err = devices.Open("cuda", devices.Options{})
		})
		if cudaDevice.err != nil {
			t.Skipf("no CUDA device: %v", cudaDevice.err)
		}
		return cudaDevice.dev
	}
	t.Fatalf("unknown device kind %q", kind)
	return nil
}

// deviceKinds are the devices the device tests run on.
var deviceKinds = []string{"cpu", "cuda"}

// forEachDevice runs f as a sub-test per device kind, with the fixture's
// decoder loaded on that device.
func forEachDevice(t *testing.T, f func(t *testing.T, d *Decoder)) {
	for _, kind := range deviceKinds {
		t.Run(kind, func(t *testing.T) {
			f(t, loadFixtureOn(t, testDevice(t, kind)))
		})
	}
}
