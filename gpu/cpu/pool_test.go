package cpu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestPoolCoversOnce: every index is visited exactly once, participant
// numbers stay below the pool size, and chunks respect the grain.
func TestPoolCoversOnce(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		p := newPool(workers)
		for _, c := range []struct{ n, grain int }{{0, 1}, {1, 1}, {7, 3}, {100, 1}, {1000, 64}, {65, 64}, {5, 0}} {
			seen := make([]atomic.Int32, c.n)
			var bad atomic.Int32
			p.ForW(c.n, c.grain, func(w, lo, hi int) {
				if w < 0 || w >= workers || lo >= hi || (c.grain > 0 && hi-lo > c.grain && hi-lo != c.n) {
					bad.Add(1)
				}
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			if bad.Load() != 0 {
				t.Fatalf("workers %d %+v: bad chunk or participant", workers, c)
			}
			for i := range seen {
				if seen[i].Load() != 1 {
					t.Fatalf("workers %d %+v: index %d visited %d times", workers, c, i, seen[i].Load())
				}
			}
		}
		p.close()
		// A closed pool runs loops on the caller.
		var sum atomic.Int64
		p.For(10, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
		if sum.Load() != 10 {
			t.Fatalf("closed pool covered %d of 10", sum.Load())
		}
	}
}

// TestConcurrentQueues: stages share a device, each with its own queue;
// concurrent ops give exactly the floats of the same ops run alone.
func TestConcurrentQueues(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q0 := newTestDevice(t, 3, ks.asm)
		rng := rand.New(rand.NewPCG(1, 1))
		const stages = 4
		type job struct{ x, w, want gpu.Tensor }
		jobs := make([]job, stages)
		for i := range jobs {
			m := 1 + 3*i
			x := view(dev, gpu.F32, m, 300, 0, 0)
			w := view(dev, gpu.BF16, 500, 300, 0, 0)
			fillRandom(rng, x)
			fillRandom(rng, w)
			want := view(dev, gpu.F32, m, 500, 0, 0)
			q0.MatMul(want, x, w, gpu.Tensor{})
			q0.Act(want, want, gpu.SiLU)
			jobs[i] = job{x, w, want}
		}
		var wg sync.WaitGroup
		errs := make(chan string, stages)
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := dev.NewQueue(fmt.Sprint("stage", i))
				got := dev.Alloc(gpu.F32, j.want.Rows, j.want.Cols)
				for range 20 {
					q.MatMul(got, j.x, j.w, gpu.Tensor{})
					q.Act(got, got, gpu.SiLU)
					if r, c, ok := bitsEqual(got, j.want); !ok {
						errs <- fmt.Sprintf("stage %d: [%d,%d] differs", i, r, c)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("%s: %s", ks.name, e)
		}
	}
}

// TestOpAllocations: in steady state a parallel op allocates at most its
// loop closure (the pool recycles its jobs; queues keep their scratch).
func TestOpAllocations(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		x := dev.Alloc(gpu.F32, 1, 2048)
		w := dev.Alloc(gpu.BF16, 1024, 2048)
		b := dev.Alloc(gpu.BF16, 1, 1024)
		y := dev.Alloc(gpu.F32, 1, 1024)
		big := dev.Alloc(gpu.F32, 32, 1024)
		xs := dev.Alloc(gpu.F32, 32, 2048)
		ops := []struct {
			name  string
			limit float64
			fn    func()
		}{
			{"gemv", 2, func() { q.MatMul(y, x, w, b) }},
			{"gemm", 2, func() { q.MatMul(big, xs, w, gpu.Tensor{}) }},
			{"rmsnorm", 2, func() { q.RMSNorm(big, big, 1e-5) }},
			{"silu", 2, func() { q.Act(big, big, gpu.SiLU) }},
			{"add", 2, func() { q.Add(big, big, big) }},
		}
		for _, o := range ops {
			o.fn()
			if n := testing.AllocsPerRun(20, o.fn); n > o.limit {
				t.Errorf("%s %s: %.1f allocations per call, want ≤ %v", ks.name, o.name, n, o.limit)
			} else {
				t.Logf("%s %s: %.1f allocations per call", ks.name, o.name, n)
			}
		}
	}
}
