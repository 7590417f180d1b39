package gputest

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestCountingQueue: plain ops count by name, a batched op counts once
// and still does its work on the queue underneath.
func TestCountingQueue(t *testing.T) {
	dev := newCPU(t)
	q := NewCountingQueue(dev.NewQueue("count"))
	a, b := dev.Alloc(gpu.F32, 3, 2), dev.Alloc(gpu.F32, 3, 2)
	q.Write(b, []float32{1, 2, 3, 4, 5, 6})
	q.Fill(a, 0)
	gpu.CopyRows(q, a, b, []int32{0, 2}, []int32{2, 0})
	gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Row(1), Src: b.Row(1)}})
	got := make([]float32, 6)
	if err := q.Read(got, a); err != nil {
		t.Fatal(err)
	}
	if want := []float32{5, 6, 3, 4, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
	want := map[string]int{"Write": 1, "Fill": 1, "CopyRows": 1, "CopyMany": 1, "Read": 1}
	for k, v := range want {
		if q.Ops[k] != v {
			t.Errorf("%s counted %d times, want %d (all: %v)", k, q.Ops[k], v, q.Ops)
		}
	}
	if q.Ops["Copy"] != 0 {
		t.Errorf("the batched ops' copies were counted: %v", q.Ops)
	}
}
