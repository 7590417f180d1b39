package gpu_test

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// urgentDev is a device with a priority queue.
type urgentDev struct {
	gpu.Device
	asked []string
}

func (u *urgentDev) NewPriorityQueue(name string) gpu.Queue {
	u.asked = append(u.asked, name)
	return u.Device.NewQueue(name)
}

// TestNewUrgentQueue: the priority queue where a device has one, a plain
// queue where it does not.
func TestNewUrgentQueue(t *testing.T) {
	d := cpu.New(1)
	defer d.Close()
	if q := gpu.NewUrgentQueue(d, "plain"); q == nil {
		t.Fatal("no queue from a device without priorities")
	}
	u := &urgentDev{Device: d}
	if q := gpu.NewUrgentQueue(u, "codec"); q == nil || len(u.asked) != 1 || u.asked[0] != "codec" {
		t.Fatalf("priority queue not asked for: %v", u.asked)
	}
}
