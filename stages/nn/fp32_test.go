package nn

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// fp32Queue is a CPU queue that records whether it was asked for fp32
// products (gpu.FP32Products), as a CUDA queue would be.
type fp32Queue struct {
	gpu.Queue
	asked bool
}

func (q *fp32Queue) UseFP32Products() { q.asked = true }

// TestNewCtxAsksFP32Products: a context for an fp32 network asks its queue
// for fp32 products (the tensor cores' truncating sums would exceed an
// fp32 reference's tolerances); a bf16 network's does not.
func TestNewCtxAsksFP32Products(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	for _, c := range []struct {
		p    Precision
		want bool
	}{{F32, true}, {BF16, false}} {
		q := &fp32Queue{Queue: dev.NewQueue("fp32")}
		ctx := NewCtx(dev, q, c.p)
		ctx.A.Free()
		if q.asked != c.want {
			t.Errorf("precision %v: asked for fp32 products %v, want %v", c.p, q.asked, c.want)
		}
	}
}
