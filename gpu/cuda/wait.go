package cuda

import (
	"runtime"
	"time"

	"github.com/ebitengine/purego"
)

// Waiting without holding the owner thread.
//
// Every driver call runs on the owner thread, so a blocking
// synchronisation there (cuStreamSynchronize behind a read) stops every
// other queue from launching until the waited-for stream drains: at 256
// sessions on an H200 the owner spent 9 of 21 s blocked so, while the
// codec, the depthformer and the backbone took turns. Instead a queue that
// must wait records an event on its stream (on the owner), hands the event
// to the owner's wait list and blocks on a channel; the owner polls the
// list with cuEventQuery between the closures it runs, so it keeps
// launching other queues' work while one queue waits.

const (
	errNotReady = 600 // CUDA_ERROR_NOT_READY: cuEventQuery's "still pending"
	// spinFor is how long the owner keeps polling with only a yield in
	// between once nothing is ready: a spin answers within a microsecond
	// or two, a nap's timer 50 µs or more later. At 2 ms the H200's
	// single-session audio step (2.4 ms) and depthformer frame (3.8 ms)
	// each paid a nap's wake-up.
	spinFor = 50 * time.Millisecond
	// nap is the owner's sleep between polls after spinFor.
	nap = 20 * time.Microsecond
)

// waiter is a goroutine blocked until ev completes.
type waiter struct {
	ev   uintptr
	done chan error
}

// doWait runs f on the owner thread; f queues work and returns an event
// recorded behind it. doWait then blocks until the event completes,
// without holding the owner thread, and returns f's error or the event's.
func (d *Device) doWait(f func() (uintptr, error)) error {
	done := make(chan error, 1)
	if err := d.do(func() error {
		ev, err := f()
		if err != nil {
			return err
		}
		d.waits = append(d.waits, waiter{ev: ev, done: done})
		return nil
	}); err != nil {
		return err
	}
	return <-done
}

// awaitEvent blocks until ev (already recorded) completes, without
// holding the owner thread.
func (d *Device) awaitEvent(ev uintptr) error {
	return d.doWait(func() (uintptr, error) { return ev, nil })
}

// serve runs the closures sent on d.work until the channel closes, and
// polls the wait list between them (owner thread).
func (d *Device) serve() {
	var idleSince time.Time
	for {
		if len(d.waits) == 0 {
			f, ok := <-d.work
			if !ok {
				return
			}
			f()
			continue
		}
		select {
		case f, ok := <-d.work:
			if !ok {
				d.endWaits()
				return
			}
			f()
			idleSince = time.Time{}
			continue
		default:
		}
		if d.pollWaits() {
			idleSince = time.Time{}
			continue
		}
		now := time.Now()
		if idleSince.IsZero() {
			idleSince = now
		}
		if now.Sub(idleSince) < spinFor {
			runtime.Gosched()
			continue
		}
		// A long wait (a big prefill, the first compile): poll less
		// often, but still run closures as they come.
		if d.napT == nil {
			d.napT = time.NewTimer(nap)
		} else {
			d.napT.Reset(nap)
		}
		select {
		case f, ok := <-d.work:
			d.napT.Stop()
			if !ok {
				d.endWaits()
				return
			}
			f()
			idleSince = time.Time{}
		case <-d.napT.C:
		}
	}
}

// pollWaits releases the waiters whose events completed (or failed) and
// reports whether any did (owner thread).
func (d *Device) pollWaits() bool {
	released := false
	kept := d.waits[:0]
	for _, w := range d.waits {
		res := d.query(w.ev)
		switch res {
		case errNotReady:
			kept = append(kept, w)
			continue
		case cudaSuccess:
			w.done <- nil
		default:
			w.done <- d.drv.err("cuEventQuery", res)
		}
		released = true
	}
	clear(d.waits[len(kept):])
	d.waits = kept
	return released
}

// endWaits releases every waiter once its event completes (owner thread,
// when the device closes: the work channel is closed, so nothing else
// can run meanwhile).
func (d *Device) endWaits() {
	for len(d.waits) > 0 {
		if !d.pollWaits() {
			runtime.Gosched()
		}
	}
}

// queryEvent is cuEventQuery: cudaSuccess, errNotReady or a failure.
func (c *driver) queryEvent(ev uintptr) result {
	res, _, _ := purego.SyscallN(c.cuEventQuery, ev)
	return result(res)
}
