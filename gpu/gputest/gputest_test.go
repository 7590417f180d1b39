package gputest

import (
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

func TestCPU(t *testing.T) {
	dev := cpu.New(2)
	defer dev.Close()
	start := time.Now()
	rep := Run(dev, 1)
	t.Logf("%s in %v", rep.Summary(), time.Since(start))
	for _, c := range rep.Failed() {
		t.Errorf("%s %s: %s", c.Op, c.Case, c.Detail)
	}
}
