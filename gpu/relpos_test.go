package gpu_test

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// fusingQueue records the fused relative-position ops it is given instead
// of running them.
type fusingQueue struct {
	gpu.Queue
	calls []string
}

func (f *fusingQueue) RelPosScores(scores, work, qu, qv, k, p gpu.Tensor, rp gpu.RelPosParams) {
	f.calls = append(f.calls, "RelPosScores")
}

func (f *fusingQueue) HeadsMatMul(o, probs, vt gpu.Tensor, heads int) {
	f.calls = append(f.calls, "HeadsMatMul")
}

// opQueue records the names of the plain ops it runs.
type opQueue struct {
	gpu.Queue
	ops []string
}

func (o *opQueue) MatMul(dst, x, w, b gpu.Tensor) {
	o.ops = append(o.ops, "MatMul")
	o.Queue.MatMul(dst, x, w, b)
}
func (o *opQueue) Add(dst, a, b gpu.Tensor) { o.ops = append(o.ops, "Add"); o.Queue.Add(dst, a, b) }
func (o *opQueue) RoundBF16(t gpu.Tensor)   { o.ops = append(o.ops, "Round"); o.Queue.RoundBF16(t) }
func (o *opQueue) Scale(dst, a gpu.Tensor, s float32) {
	o.ops = append(o.ops, "Scale")
	o.Queue.Scale(dst, a, s)
}

// TestRelPosDispatch: a queue with the fused ops gets one call each; one
// without runs the op sequences, with the roundings only when asked.
func TestRelPosDispatch(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	const T, heads, hd = 3, 2, 4
	d := heads * hd
	qu, qv, k := dev.Alloc(gpu.F32, T, d), dev.Alloc(gpu.F32, T, d), dev.Alloc(gpu.F32, T, d)
	p, work := dev.Alloc(gpu.F32, 2*T-1, d), dev.Alloc(gpu.F32, T, 2*T-1)
	scores, o, vt := dev.Alloc(gpu.F32, heads*T, T), dev.Alloc(gpu.F32, T, d), dev.Alloc(gpu.F32, d, T)
	rp := gpu.RelPosParams{Heads: heads, HeadDim: hd, Scale: 0.5}

	f := &fusingQueue{Queue: dev.NewQueue("f")}
	gpu.RelPosScores(f, scores, work, qu, qv, k, p, rp)
	gpu.HeadsMatMul(f, o, scores, vt, heads)
	if want := []string{"RelPosScores", "HeadsMatMul"}; !slices.Equal(f.calls, want) {
		t.Errorf("fusing queue got %v, want %v", f.calls, want)
	}

	for _, round := range []bool{false, true} {
		q := &opQueue{Queue: dev.NewQueue("q")}
		rp.Round = round
		gpu.RelPosScores(q, scores, work, qu, qv, k, p, rp)
		head := []string{"MatMul", "MatMul", "Add"}
		tail := []string{"Scale"}
		if round {
			head = []string{"MatMul", "Round", "MatMul", "Round", "Add", "Round"}
			tail = []string{"Scale", "Round"}
		}
		want := slices.Concat(head, head, tail)
		if !slices.Equal(q.ops, want) {
			t.Errorf("round=%v: scores ran %v, want %v", round, q.ops, want)
		}
		q.ops = nil
		gpu.HeadsMatMul(q, o, scores, vt, heads)
		if want := []string{"MatMul", "MatMul"}; !slices.Equal(q.ops, want) {
			t.Errorf("heads matmul ran %v, want %v", q.ops, want)
		}
	}
}

// TestRelPosShapes: shapes that do not fit panic before anything runs.
func TestRelPosShapes(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	q := dev.NewQueue("q")
	a := func(r, c int) gpu.Tensor { return dev.Alloc(gpu.F32, r, c) }
	rp := gpu.RelPosParams{Heads: 2, HeadDim: 4, Scale: 1}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"p rows", func() { gpu.RelPosScores(q, a(6, 3), a(3, 5), a(3, 8), a(3, 8), a(3, 8), a(4, 8), rp) }},
		{"scores rows", func() { gpu.RelPosScores(q, a(3, 3), a(3, 5), a(3, 8), a(3, 8), a(3, 8), a(5, 8), rp) }},
		{"work strided", func() {
			gpu.RelPosScores(q, a(6, 3), a(3, 6).ColSlice(0, 5), a(3, 8), a(3, 8), a(3, 8), a(5, 8), rp)
		}},
		{"head dim", func() { gpu.RelPosScores(q, a(6, 3), a(3, 5), a(3, 9), a(3, 9), a(3, 9), a(5, 9), rp) }},
		{"no rows", func() { gpu.RelPosScores(q, a(0, 0), a(0, 0), a(0, 8), a(0, 8), a(0, 8), a(0, 8), rp) }},
		{"vt rows", func() { gpu.HeadsMatMul(q, a(3, 8), a(6, 3), a(7, 3), 2) }},
		{"probs rows", func() { gpu.HeadsMatMul(q, a(3, 8), a(5, 3), a(8, 3), 2) }},
		{"heads", func() { gpu.HeadsMatMul(q, a(3, 8), a(9, 3), a(8, 3), 3) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.fn()
		}()
	}
}
