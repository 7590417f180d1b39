package cpu

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
//
// A helper that has finished a loop polls for the next one for spinFor
// before it parks on its inbox: a decode step is hundreds of small loops
// back to back (a 1024-wide product is a few microseconds of work), and
// waking a parked goroutine costs about as much, so without the poll most
// helpers arrive after the loop is done (the depthformer frame of 4
// sessions kept about 4 of 16 cores busy).
type pool struct {
	workers int
	helpers []chan *job   // helper i+1's inbox; buffered so posting never blocks
	parked  []atomic.Bool // helper i+1 is (about to be) blocked on its inbox
	post    atomic.Pointer[job]
	seq     atomic.Uint64 // loops posted: a polling helper joins post when it moves
	polled  atomic.Int64  // loops helpers joined by polling, not woken (tests)
	stopped atomic.Bool
	wg      sync.WaitGroup
	mu      sync.RWMutex // held for reading while submitting, for writing by close
	shut    bool
	// free recycles this pool's jobs (never another pool's: a helper that
	// joins a recycled job must be one of its submitter's participants). A
	// channel, not a sync.Pool: a loop allocates nothing whichever core its
	// submitter runs on.
	free chan *job
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

func newJob() *job {
	j := &job{done: make(chan struct{}, 1)}
	j.state.Store(closed)
	return j
}

var (
	// spinFor is how long a helper polls for the next loop before it
	// parks.
	spinFor = envDuration("OMNIPIPE_CPU_SPIN", 500*time.Microsecond)
	// yieldEvery is how often a polling helper yields its P (never when
	// zero).
	yieldEvery = envDuration("OMNIPIPE_CPU_YIELD", 20*time.Microsecond)
)

const (
	// looksPerClock is how many looks at the loop counter a polling
	// helper takes between readings of the clock.
	looksPerClock = 64
)

func newPool(workers int) *pool {
	p := &pool{workers: workers}
	p.free = make(chan *job, 64)
	if workers > 1 {
		p.parked = make([]atomic.Bool, workers-1)
	}
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
	park := &p.parked[id-1]
	seen := p.seq.Load()
	looks := 0
	for {
		// Poll: take the loops posted while this helper is awake. The
		// counter is read in a tight loop and the helper yields its P only
		// every yieldEvery: yielding at every look put a third of a
		// 16-core depthformer frame's CPU profile in the scheduler's lock
		// (every 2 µs still put a fifth there: 15 helpers through the
		// global run queue's lock half a million times a second each),
		// and never yielding starved the goroutines that post the loops
		// (they wait for a P once they have parked on a loop's end — the
		// last helper out of such a loop now hands its P over, leave).
		// Measured on 16 Xeon cores (docs/performance.md): every 20 µs
		// with 500 µs of polling took one session's frame from
		// 13.4–19.4 to 10.8–11.9 ms and four sessions' from 20.0–27.4 to
		// 18.6–23.0 ms against every 2 µs with 50 µs.
		now := time.Now()
		until, yield := now.Add(spinFor), now.Add(yieldEvery)
		for {
			if s := p.seq.Load(); s != seen {
				seen = s
				if j := p.post.Load(); j != nil && j.join() {
					p.polled.Add(1)
					j.work(id)
					j.leave()
				}
				now = time.Now()
				until, yield = now.Add(spinFor), now.Add(yieldEvery)
				continue
			}
			if looks++; looks%looksPerClock != 0 {
				continue
			}
			if p.stopped.Load() {
				return
			}
			if now = time.Now(); !now.Before(until) {
				break
			}
			if yieldEvery > 0 && !now.Before(yield) {
				runtime.Gosched()
				yield = time.Now().Add(yieldEvery)
			}
		}
		// Park. The flag is set before the last look at seq and a poster
		// publishes seq before it reads the flag (both sequentially
		// consistent), so a loop posted now is either seen here or sent.
		park.Store(true)
		if p.seq.Load() != seen {
			park.Store(false)
			continue
		}
		j, ok := <-inbox
		park.Store(false)
		if !ok {
			return
		}
		seen = p.seq.Load()
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
		if handOff {
			// The submitter, if it parked on done, is now this P's next
			// goroutine: let it run at once rather than after this
			// helper's next yield.
			runtime.Gosched()
		}
	}
}

// handOff makes the last helper out of a loop whose submitter waits yield
// its P to it (env OMNIPIPE_CPU_HANDOFF=off: not; a tuning knob).
var handOff = os.Getenv("OMNIPIPE_CPU_HANDOFF") != "off"

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
		p.stopped.Store(true)
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
	var j *job
	select {
	case j = <-p.free:
	default:
		j = newJob()
	}
	j.fn, j.fn2, j.n, j.grain = fn, fn2, n, grain
	j.next.Store(0)
	j.state.Store(0) // reopen: publishes the fields to joining helpers
	p.post.Store(j)
	p.seq.Add(1) // polling helpers join now
	for i, ch := range p.helpers[:min(len(p.helpers), chunks-1)] {
		if !p.parked[i].Load() {
			continue // polling, or busy with a loop posted earlier
		}
		select {
		case ch <- j:
		default: // its inbox holds a loop posted earlier: it will find that closed
		}
	}
	j.work(0)
	if j.state.Or(closed) != 0 {
		// Helpers still inside: the last one out signals. They are
		// usually a chunk away, so look for that before parking (a parked
		// submitter then waits for a P to be woken on).
		waitLeft(j)
		<-j.done
	}
	j.fn, j.fn2 = nil, nil
	select {
	case p.free <- j:
	default: // more loops in flight than kept: let it go
	}
}

// joinFor is how long a submitter looks for its loop's last helper to
// leave before it parks on the loop's end.
var joinFor = envDuration("OMNIPIPE_CPU_JOIN", 20*time.Microsecond)

// envDuration returns the duration in the environment variable name, or def
// when it is unset or not a duration (a tuning knob for measurements).
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d >= 0 {
		return d
	}
	return def
}

// envInt returns the positive integer in the environment variable name, or
// def (a tuning knob for measurements).
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// waitLeft returns once every helper has left j, or after joinFor.
func waitLeft(j *job) {
	var until time.Time
	for looks := 1; j.state.Load() != closed; looks++ {
		if looks%looksPerClock != 0 {
			continue
		}
		now := time.Now()
		if until.IsZero() {
			until = now.Add(joinFor)
		} else if !now.Before(until) {
			return
		}
	}
}
