package device

import (
	"sync"
	"time"
)

// jitter is the queue between a producer that writes audio in bursts (a
// decoded frame at a time) and a device that pulls it at a steady rate.
// After it runs dry it holds its output until prebuffer samples are queued,
// or until the oldest of them has waited hold, so that a reply that is
// generated barely faster than real time plays without a gap after every
// frame. It is safe for concurrent use.
type jitter struct {
	prebuffer int
	hold      time.Duration
	now       func() time.Time

	mu      sync.Mutex
	q       []float32
	head    int // q[head:] is queued
	holding bool
	since   time.Time // when the oldest held sample arrived

	written, pulled, dropped int64
}

func newJitter(prebuffer int, hold time.Duration) *jitter {
	return &jitter{prebuffer: prebuffer, hold: hold, now: time.Now, holding: true}
}

// write queues a copy of pcm.
func (j *jitter) write(pcm []float32) {
	if len(pcm) == 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.head == len(j.q) {
		j.q, j.head = j.q[:0], 0
		if j.holding {
			j.since = j.now()
		}
	} else if j.head > 4096 && j.head > len(j.q)/2 {
		n := copy(j.q, j.q[j.head:])
		j.q, j.head = j.q[:n], 0
	}
	j.q = append(j.q, pcm...)
	j.written += int64(len(pcm))
}

// read moves up to len(dst) queued samples into dst and returns how many;
// zero while holding.
func (j *jitter) read(dst []float32) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	queued := len(j.q) - j.head
	if queued == 0 {
		j.holding = true
		return 0
	}
	if j.holding {
		if queued < j.prebuffer && j.now().Sub(j.since) < j.hold {
			return 0
		}
		j.holding = false
	}
	n := copy(dst, j.q[j.head:])
	j.head += n
	j.pulled += int64(n)
	if j.head == len(j.q) {
		j.holding = true
	}
	return n
}

// flush drops the queue and returns how many samples it held.
func (j *jitter) flush() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := len(j.q) - j.head
	j.q, j.head = j.q[:0], 0
	j.holding = true
	j.dropped += int64(n)
	return n
}

// queued returns the number of samples waiting.
func (j *jitter) queued() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.q) - j.head
}

// counts returns the samples written, pulled by the device and dropped by
// flushes so far.
func (j *jitter) counts() (written, pulled, dropped int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.written, j.pulled, j.dropped
}
