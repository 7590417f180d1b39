package cpu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestPoolPollsAndParks: loops posted back to back (found by polling
// helpers), after pauses shorter and longer than spinFor (helpers parked
// on their inboxes, woken by a send) and from several submitters at once
// each cover every index exactly once, and no participant number is ever
// in use by two goroutines at the same time (per-participant scratch).
func TestPoolPollsAndParks(t *testing.T) {
	const workers = 4
	p := newPool(workers)
	defer p.close()
	var inUse [workers]atomic.Int32
	var bad atomic.Int32
	loop := func(n int) {
		seen := make([]atomic.Int32, n)
		p.ForW(n, 3, func(w, lo, hi int) {
			if !inUse[w].CompareAndSwap(0, 1) {
				bad.Add(1)
			}
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
			busy(5 * time.Microsecond) // hold the number long enough to collide
			inUse[w].Store(0)
		})
		for i := range seen {
			if seen[i].Load() != 1 {
				bad.Add(1)
			}
		}
	}
	pauses := []time.Duration{0, 0, 0, spinFor / 4, 3 * spinFor}
	for i := range 200 {
		loop(1 + i%50)
		time.Sleep(pauses[i%len(pauses)])
	}
	if bad.Load() != 0 {
		t.Fatalf("one submitter: %d bad visits or shared participants", bad.Load())
	}
	// Joining by polling needs a helper to get a core within spinFor of a
	// loop's start, which a loaded machine (other test binaries on two
	// cores) may deny for a while: back-to-back loops give it more chances,
	// for up to 10 s. A pool that never polls fails either way.
	for deadline := time.Now().Add(10 * time.Second); p.polled.Load() == 0 && time.Now().Before(deadline); {
		loop(50)
	}
	if p.polled.Load() == 0 {
		t.Error("no helper joined a loop by polling: every loop waited for a wake-up")
	}
	// Several submitters: participant 0 is each submitter's own, so only
	// the helpers' numbers are checked for sharing here.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for i := range 100 {
				n := 1 + i%40
				seen := make([]atomic.Int32, n)
				p.ForW(n, 2, func(w, lo, hi int) {
					if w > 0 && !inUse[w].CompareAndSwap(0, 1) {
						bad.Add(1)
					}
					for i := lo; i < hi; i++ {
						seen[i].Add(1)
					}
					busy(5 * time.Microsecond)
					if w > 0 {
						inUse[w].Store(0)
					}
				})
				for i := range seen {
					if seen[i].Load() != 1 {
						bad.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("three submitters: %d bad visits or shared helpers", bad.Load())
	}
}

// busy spins for d (a chunk's work, without sleeping).
func busy(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
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
