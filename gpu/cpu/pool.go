package cpu

import "sync"

// pool runs parallel loops on a fixed set of worker goroutines that live as
// long as the device. The submitting goroutine always takes part, so a loop
// makes progress even when every worker is busy with another stage's op.
type pool struct {
	workers int
	tasks   chan task
	wg      sync.WaitGroup
	mu      sync.RWMutex // held for reading while submitting, for writing by close
	shut    bool
}

type task struct {
	fn     func(lo, hi int)
	lo, hi int
	done   *sync.WaitGroup
}

func newPool(workers int) *pool {
	p := &pool{workers: workers, tasks: make(chan task, 4*workers)}
	for i := 0; i < workers-1; i++ { // the caller is the last worker
		p.wg.Add(1)
		go p.work()
	}
	return p
}

func (p *pool) work() {
	defer p.wg.Done()
	for t := range p.tasks {
		t.fn(t.lo, t.hi)
		t.done.Done()
	}
}

func (p *pool) close() {
	p.mu.Lock()
	if !p.shut {
		p.shut = true
		close(p.tasks)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// For calls fn over [0, n) split into contiguous chunks of at least grain
// items, in parallel, and returns when all have finished.
func (p *pool) For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := p.workers
	if c := n / grain; c < chunks {
		chunks = c
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if chunks <= 1 || p.shut {
		fn(0, n)
		return
	}
	var done sync.WaitGroup
	step := (n + chunks - 1) / chunks
	lo := 0
	first := 0
	for i := 0; i < chunks && lo < n; i++ {
		hi := min(lo+step, n)
		if i == 0 {
			first = hi // the caller runs [0, first)
		} else {
			done.Add(1)
			select {
			case p.tasks <- task{fn: fn, lo: lo, hi: hi, done: &done}:
			default: // queue full: run it here
				fn(lo, hi)
				done.Done()
			}
		}
		lo = hi
	}
	fn(0, first)
	done.Wait()
}
