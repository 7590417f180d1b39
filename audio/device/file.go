package device

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
)

// FileOptions configure a FileSource.
type FileOptions struct {
	// Chunk is the length of each chunk (default 20 ms; the last one may
	// be shorter).
	Chunk time.Duration
	// Realtime sends each chunk when a microphone would have finished
	// recording it; otherwise a chunk is sent as soon as the previous one
	// was taken.
	Realtime bool
	// MaxDuration caps the decoded file (default: audio.DecodeOptions's).
	MaxDuration time.Duration
}

// FileSource plays a recording as a microphone.
type FileSource struct {
	rate  int
	ch    chan []float32
	done  chan struct{}
	close sync.Once
	wg    sync.WaitGroup
}

var _ Source = (*FileSource)(nil)

// OpenFile decodes a WAV file (any rate, format and channel count, mixed
// down to mono) into a Source at its own sample rate.
func OpenFile(path string, opts FileOptions) (*FileSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadFile(f, path, opts)
}

// ReadFile decodes a WAV stream like OpenFile; name labels errors.
func ReadFile(r io.Reader, name string, opts FileOptions) (*FileSource, error) {
	clip, err := audio.Decode(r, audio.DecodeOptions{MaxDuration: opts.MaxDuration})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return NewClipSource(clip, opts)
}

// NewClipSource is a Source that delivers clip's samples (not copied; they
// must not change while the source runs).
func NewClipSource(clip *audio.Clip, opts FileOptions) (*FileSource, error) {
	if clip.SampleRate <= 0 {
		return nil, fmt.Errorf("device: clip sample rate %d Hz", clip.SampleRate)
	}
	if opts.Chunk == 0 {
		opts.Chunk = 20 * time.Millisecond
	}
	n := samples(opts.Chunk, clip.SampleRate)
	if opts.Chunk < 0 || n < 1 {
		return nil, fmt.Errorf("device: chunk %v is less than one sample at %d Hz", opts.Chunk, clip.SampleRate)
	}
	s := &FileSource{rate: clip.SampleRate, ch: make(chan []float32), done: make(chan struct{})}
	s.wg.Add(1)
	go s.run(clip.Samples, n, opts.Realtime)
	return s, nil
}

func (s *FileSource) run(x []float32, n int, realtime bool) {
	defer s.wg.Done()
	defer close(s.ch)
	start := time.Now()
	var timer *time.Timer
	if realtime {
		timer = time.NewTimer(0)
		defer timer.Stop()
		<-timer.C
	}
	for i := 0; i < len(x); i += n {
		c := x[i:min(i+n, len(x)):min(i+n, len(x))]
		if realtime {
			// The chunk is "recorded" once its last sample's time has come.
			timer.Reset(time.Until(start.Add(duration(int64(i+len(c)), s.rate))))
			select {
			case <-timer.C:
			case <-s.done:
				return
			}
		}
		select {
		case s.ch <- c:
		case <-s.done:
			return
		}
	}
}

// SampleRate returns the file's sample rate.
func (s *FileSource) SampleRate() int { return s.rate }

// Chunks delivers the file's audio; it closes at the end of the file.
func (s *FileSource) Chunks() <-chan []float32 { return s.ch }

// Err is always nil: the file was decoded when the source was made.
func (s *FileSource) Err() error { return nil }

// Close stops the source and waits for its goroutine.
func (s *FileSource) Close() error {
	s.close.Do(func() { close(s.done) })
	s.wg.Wait()
	return nil
}
