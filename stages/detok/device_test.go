package detok

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
)

// The device tests run on "cpu" always and on "cuda" when a GPU opens
// (internal/testdev; skipped, with its error, otherwise). The test binary
// needs only the fixture folder, read relative to the package directory
// (fixtureDir), so `go test -c ./stages/detok` gives a binary that runs
// from stages/detok on a GPU host: ./detok.test -test.v.

// forEachDevice runs f as a sub-test per device kind, with the fixture's
// decoder loaded on that device.
func forEachDevice(t *testing.T, f func(t *testing.T, d *Decoder)) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) { f(t, loadFixtureOn(t, dev)) })
}
