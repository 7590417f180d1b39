package device

import (
	"io"
	"sync"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
)

// Recorder is a Sink that keeps everything written to it: for tests, and
// to save a conversation's replies to a WAV file instead of playing them.
// It "plays" at once: Queued is always zero and Flush has nothing to drop.
// It is safe for concurrent use.
type Recorder struct {
	rate int

	mu      sync.Mutex
	samples []float32
	writes  int
	flushes []int64 // sample counts at each Flush
}

var _ Sink = (*Recorder)(nil)

// NewRecorder returns an empty Recorder that reports rate as its sample
// rate.
func NewRecorder(rate int) *Recorder { return &Recorder{rate: rate} }

// SampleRate returns the rate given to NewRecorder.
func (r *Recorder) SampleRate() int { return r.rate }

// Write appends a copy of pcm.
func (r *Recorder) Write(pcm []float32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, pcm...)
	r.writes++
	return nil
}

// Flush notes the flush (see Flushes); nothing is queued to drop.
func (r *Recorder) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushes = append(r.flushes, int64(len(r.samples)))
}

// Queued is zero: a Recorder has nothing waiting to play.
func (r *Recorder) Queued() time.Duration { return 0 }

// Samples returns a copy of everything written.
func (r *Recorder) Samples() []float32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]float32(nil), r.samples...)
}

// Writes returns the number of Write calls.
func (r *Recorder) Writes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

// Flushes returns, for each Flush so far, how many samples had been
// written before it.
func (r *Recorder) Flushes() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.flushes...)
}

// Duration returns the length of the audio written.
func (r *Recorder) Duration() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return duration(int64(len(r.samples)), r.rate)
}

// WriteWAV writes everything recorded as a 16-bit mono WAV file.
func (r *Recorder) WriteWAV(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return audio.WriteWAV(w, r.rate, r.samples)
}
