package cpu

import (
	"sync"
	"sync/atomic"
)

// pool runs parallel loops on a fixed set of helper goroutines that live as
// long as the device. A loop is cut into chunks that the participants take
// one at a time from an atomic counter, so a core that is busy elsewhere
// (another stage's op, another process) simply takes fewer chunks. The
// submitting goroutine always takes part, so a loop makes progress even when
// every helper is busy; helpers that are busy when a loop is posted skip it.
//
// Participant 0 is the submitting goroutine and participant i ≥ 1 is helper
// i, which runs one loop at a time: per-participant scratch indexed by that
// number is never shared.
type pool struct {
	workers int
	helpers []chan *job // helper i+1's inbox; buffered so posting never blocks
	wg      sync.WaitGroup
	mu      sync.RWMutex // held for reading while submitting, for writing by close
	shut    bool
	// jobs recycles this pool's jobs (never another pool's: a helper that
	// joins a recycled job must be one of its submitter's participants).
	jobs sync.Pool
}

// job is one parallel loop. Jobs are recycled: a helper may still find a
// finished job in its inbox, sees it closed and drops it, or finds it
// reopened for a later loop and takes part in that one (its fields are
// written before the reopening state store, which a successful join
// observes), which is as good.
type job struct {
	fn       func(w, lo, hi int)
	fn2      func(lo, hi int)
	n, grain int
	next     atomic.Int64
	state    atomic.Int64 // closed bit | helpers inside
	done     chan struct{}
}

const closed = 1 << 62

func newJob() any {
	j := &job{done: make(chan struct{}, 1)}
	j.state.Store(closed)
	return j
}

func newPool(workers int) *pool {
	p := &pool{workers: workers}
	p.jobs.New = newJob
	for i := 1; i < workers; i++ { // the submitter is the last worker
		ch := make(chan *job, 1)
		p.helpers = append(p.helpers, ch)
		p.wg.Add(1)
		go p.help(i, ch)
	}
	return p
}

func (p *pool) help(id int, inbox chan *job) {
	defer p.wg.Done()
	for j := range inbox {
		if j.join() {
			j.work(id)
			j.leave()
		}
	}
}

// join admits a helper unless the loop has already ended.
func (j *job) join() bool {
	for {
		s := j.state.Load()
		if s&closed != 0 {
			return false
		}
		if j.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

func (j *job) leave() {
	if j.state.Add(-1) == closed {
		j.done <- struct{}{}
	}
}

// work takes chunks until none is left.
func (j *job) work(w int) {
	g := int64(j.grain)
	for {
		lo := int(j.next.Add(g) - g)
		if lo >= j.n {
			return
		}
		hi := min(lo+j.grain, j.n)
		if j.fn != nil {
			j.fn(w, lo, hi)
		} else {
			j.fn2(lo, hi)
		}
	}
}

func (p *pool) close() {
	p.mu.Lock()
	if !p.shut {
		p.shut = true
		for _, ch := range p.helpers {
			close(ch)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// For calls fn over [0, n) cut into chunks of grain items (the last may be
// shorter), in parallel, and returns when all have finished.
func (p *pool) For(n, grain int, fn func(lo, hi int)) {
	p.run(n, grain, nil, fn)
}

// ForW is For whose fn also receives the participant number w, in
// [0, workers), for per-participant scratch.
func (p *pool) ForW(n, grain int, fn func(w, lo, hi int)) {
	p.run(n, grain, fn, nil)
}

func (p *pool) run(n, grain int, fn func(w, lo, hi int), fn2 func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	p.mu.RLock()
	defer p.mu.RUnlock()
	if chunks <= 1 || p.shut || len(p.helpers) == 0 {
		if fn != nil {
			fn(0, 0, n)
		} else {
			fn2(0, n)
		}
		return
	}
	j := p.jobs.Get().(*job)
	j.fn, j.fn2, j.n, j.grain = fn, fn2, n, grain
	j.next.Store(0)
	j.state.Store(0) // reopen: publishes the fields to joining helpers
	for _, ch := range p.helpers[:min(len(p.helpers), chunks-1)] {
		select {
		case ch <- j:
		default: // busy with a loop posted earlier: it will find this one closed
		}
	}
	j.work(0)
	if j.state.Or(closed) != 0 {
		<-j.done // helpers still inside: the last one out signals
	}
	j.fn, j.fn2 = nil, nil
	p.jobs.Put(j)
}
