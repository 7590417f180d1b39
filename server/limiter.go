package server

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
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
