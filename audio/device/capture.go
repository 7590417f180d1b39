package device

import (
	"fmt"
	"sync"
	"time"

	"github.com/jfreymuth/pulse"
)

// CaptureOptions configure a Capture. Zero values take the defaults.
type CaptureOptions struct {
	// Device is a PulseAudio source name (see List); empty: the server's
	// default source.
	Device string
	// Server is a PulseAudio server string (default: $PULSE_SERVER, then
	// the user's runtime socket).
	Server string
	// SampleRate to record at (default 16000, the model's input rate: the
	// server resamples). Ignored with DeviceRate.
	SampleRate int
	// DeviceRate records at the source's own rate (no resampling in the
	// server; the pipeline resamples exactly as the reference does).
	DeviceRate bool
	// Chunk is the length of each chunk delivered (default 20 ms).
	Chunk time.Duration
	// Queue is the number of chunks held for a reader that falls behind
	// before the oldest is dropped (default 100).
	Queue int
	// Stall is how long the source may deliver nothing before Capture
	// gives up with an error (default 5 s): a server that went away, or a
	// suspended source.
	Stall time.Duration
}

// Capture records from a PulseAudio source.
type Capture struct {
	c     *pulse.Client
	s     *pulse.RecordStream
	rate  int
	chunk int
	stall time.Duration
	ch    chan []float32

	mu      sync.Mutex
	closed  bool
	part    []float32
	last    time.Time
	dropped int64
	err     error

	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

var _ Source = (*Capture)(nil)

// OpenCapture connects to the PulseAudio server and starts recording.
func OpenCapture(opts CaptureOptions) (*Capture, error) {
	if opts.SampleRate == 0 {
		opts.SampleRate = 16000
	}
	if opts.Chunk == 0 {
		opts.Chunk = 20 * time.Millisecond
	}
	if opts.Queue == 0 {
		opts.Queue = 100
	}
	if opts.Stall == 0 {
		opts.Stall = 5 * time.Second
	}
	switch {
	case opts.SampleRate < 8000 || opts.SampleRate > 192000:
		return nil, fmt.Errorf("device: capture sample rate %d Hz: want 8000 to 192000", opts.SampleRate)
	case opts.Chunk < time.Millisecond || opts.Chunk > time.Second:
		return nil, fmt.Errorf("device: capture chunk %v: want 1ms to 1s", opts.Chunk)
	case opts.Queue < 1:
		return nil, fmt.Errorf("device: capture queue %d: want at least 1", opts.Queue)
	}
	c, err := pulse.NewClient(pulse.ClientApplicationName("omni-pipe"), pulse.ClientServerString(opts.Server))
	if err != nil {
		return nil, noServer("connect to PulseAudio for the microphone", err)
	}
	var src *pulse.Source
	if opts.Device != "" {
		src, err = c.SourceByID(opts.Device)
	} else {
		src, err = c.DefaultSource()
	}
	if err != nil {
		c.Close()
		name := opts.Device
		if name == "" {
			name = "(default)"
		}
		return nil, fmt.Errorf("input device %s: %w (omni-pipe mic --list-devices shows the sources)", name, err)
	}
	rate := opts.SampleRate
	if opts.DeviceRate {
		rate = src.SampleRate()
	}
	k := &Capture{c: c, rate: rate, chunk: max(1, samples(opts.Chunk, rate)), stall: opts.Stall,
		ch: make(chan []float32, opts.Queue), done: make(chan struct{}), last: time.Now()}
	k.part = make([]float32, 0, k.chunk)
	k.s, err = c.NewRecord(pulse.Float32Writer(k.write), pulse.RecordSource(src), pulse.RecordMono,
		pulse.RecordSampleRate(rate), pulse.RecordLatency(opts.Chunk.Seconds()))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("record from %s: %w", src.ID(), err)
	}
	if got := k.s.SampleRate(); got != 0 && got != rate {
		k.s.Close()
		c.Close()
		return nil, fmt.Errorf("record from %s: the server gave %d Hz, asked %d Hz", src.ID(), got, rate)
	}
	k.s.Start()
	k.wg.Add(1)
	go k.watch()
	return k, nil
}

// write is the record callback (the pulse client's goroutine): it cuts the
// audio into chunks and never blocks.
func (k *Capture) write(buf []float32) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return len(buf), nil
	}
	k.last = time.Now()
	for rest := buf; len(rest) > 0; {
		n := min(k.chunk-len(k.part), len(rest))
		k.part = append(k.part, rest[:n]...)
		rest = rest[n:]
		if len(k.part) < k.chunk {
			break
		}
		c := k.part
		k.part = make([]float32, 0, k.chunk)
		select {
		case k.ch <- c:
		default: // the reader is behind: drop the oldest chunk
			select {
			case <-k.ch:
				k.dropped++
			default:
			}
			k.ch <- c
		}
	}
	return len(buf), nil
}

// watch ends the capture with an error when the source stops delivering.
func (k *Capture) watch() {
	defer k.wg.Done()
	t := time.NewTicker(k.stall / 10)
	defer t.Stop()
	for {
		select {
		case <-k.done:
			return
		case now := <-t.C:
			k.mu.Lock()
			if !k.closed && now.Sub(k.last) > k.stall {
				k.err = fmt.Errorf("microphone: no audio from PulseAudio for %v (server gone, or the source suspended)", k.stall)
				k.closed = true
				close(k.ch)
			}
			k.mu.Unlock()
		}
	}
}

// SampleRate returns the recording's sample rate.
func (k *Capture) SampleRate() int { return k.rate }

// Chunks delivers the recording in chunks of CaptureOptions.Chunk.
func (k *Capture) Chunks() <-chan []float32 { return k.ch }

// Err reports why Chunks closed: nil after Close.
func (k *Capture) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Dropped returns the number of chunks dropped because the reader fell
// behind.
func (k *Capture) Dropped() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dropped
}

// Close stops recording and disconnects.
func (k *Capture) Close() error {
	k.once.Do(func() {
		k.mu.Lock()
		if !k.closed {
			k.closed = true
			close(k.ch)
		}
		k.mu.Unlock()
		close(k.done)
		k.wg.Wait()
		k.s.Stop()
		k.s.Close()
		k.c.Close()
	})
	return nil
}
