package testdev

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestRunVisitsEveryKind: Run gives the CPU a device and the CUDA sub-test
// a device or a skip, never a nil device.
func TestRunVisitsEveryKind(t *testing.T) {
	var seen []string
	Run(t, func(t *testing.T, dev gpu.Device) {
		if dev == nil {
			t.Fatal("nil device")
		}
		seen = append(seen, t.Name())
	})
	if len(seen) == 0 || seen[0] != t.Name()+"/cpu" {
		t.Errorf("sub-tests run: %v, want the CPU first", seen)
	}
}
