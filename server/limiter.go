package server

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

var (
	errQueueFull    = errors.New("every turn slot is taken and the wait queue is full")
	errQueueTimeout = errors.New("no turn slot came free in time")
)

// limiter admits turns: at most cap(slots) run at once, at most maxWait
// more wait for a slot (first come, first served), and the rest are turned
// away at once. Nothing waits without bound.
type limiter struct {
	slots   chan struct{}
	waiting atomic.Int64
	maxWait int64
	timeout time.Duration
}

func newLimiter(slots, maxWait int, timeout time.Duration) *limiter {
	return &limiter{slots: make(chan struct{}, slots), maxWait: int64(maxWait), timeout: timeout}
}

// acquire takes a slot, waiting in the queue when there is room in it; the
// returned function gives the slot back. It fails with errQueueFull,
// errQueueTimeout or ctx's error.
func (l *limiter) acquire(ctx context.Context) (release func(), err error) {
	release = func() { <-l.slots }
	select {
	case l.slots <- struct{}{}:
		return release, nil
	default:
	}
	if l.waiting.Add(1) > l.maxWait {
		l.waiting.Add(-1)
		return nil, errQueueFull
	}
	defer l.waiting.Add(-1)
	timer := time.NewTimer(l.timeout)
	defer timer.Stop()
	select {
	case l.slots <- struct{}{}:
		return release, nil
	case <-timer.C:
		return nil, errQueueTimeout
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// active returns the slots in use.
func (l *limiter) active() int { return len(l.slots) }

// queued returns the requests waiting for a slot.
func (l *limiter) queued() int { return int(l.waiting.Load()) }

// errDecodeBusy is byteBudget.acquire's error when the bytes did not come
// free in time.
var errDecodeBusy = errors.New("the bytes of the request bodies being decoded fill the server's decode budget")

// byteBudget is a semaphore weighted in bytes: its reservations hold at
// most max bytes in all. A reservation that does not fit waits, first
// come first served (golang.org/x/sync/semaphore: a large body is not
// passed over by a stream of small ones), for a bounded time.
type byteBudget struct {
	sem  *semaphore.Weighted
	max  int64
	used atomic.Int64 // for the metrics: the semaphore does not say
}

func newByteBudget(max int64) *byteBudget {
	return &byteBudget{sem: semaphore.NewWeighted(max), max: max}
}

// acquire reserves n bytes, waiting up to wait (none when wait <= 0) for
// them. An n above the whole budget reserves all of it: such a request
// runs alone. It fails with errDecodeBusy or ctx's cause.
func (b *byteBudget) acquire(ctx context.Context, n int64, wait time.Duration) (*reservation, error) {
	n = min(max(n, 0), b.max)
	if b.sem.TryAcquire(n) {
		return b.reserved(n), nil
	}
	if wait <= 0 {
		return nil, errDecodeBusy
	}
	wctx, cancel := context.WithTimeoutCause(ctx, wait, errDecodeBusy)
	defer cancel()
	if err := b.sem.Acquire(wctx, n); err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, errDecodeBusy
	}
	return b.reserved(n), nil
}

// reserved counts n acquired bytes and returns their reservation.
func (b *byteBudget) reserved(n int64) *reservation {
	b.used.Add(n)
	return newReservation(b, n)
}

// giveBack returns n reserved bytes to the budget, waking the waiters they
// let in.
func (b *byteBudget) giveBack(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
	b.sem.Release(n)
}

// inUse returns the bytes reserved.
func (b *byteBudget) inUse() int64 { return b.used.Load() }

// reservation is bytes held in a byteBudget. Its methods are safe for
// concurrent use, and may be called on nil (no bytes held).
type reservation struct {
	b *byteBudget
	n atomic.Int64
}

func newReservation(b *byteBudget, n int64) *reservation {
	r := &reservation{b: b}
	r.n.Store(n)
	return r
}

// shrink gives back the bytes above n.
func (r *reservation) shrink(n int64) {
	if r == nil {
		return
	}
	n = max(n, 0)
	for {
		held := r.n.Load()
		if n >= held {
			return
		}
		if r.n.CompareAndSwap(held, n) {
			r.b.giveBack(held - n)
			return
		}
	}
}

// release gives back every byte; a second call does nothing.
func (r *reservation) release() { r.shrink(0) }

// join moves more's bytes into r and returns r (more itself where r is
// nil); more holds nothing after.
func (r *reservation) join(more *reservation) *reservation {
	if r == nil {
		return more
	}
	if more == nil {
		return r
	}
	r.n.Add(more.n.Swap(0))
	return r
}
