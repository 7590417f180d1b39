package detok

import (
	"errors"
	"fmt"

	"github.com/omni-pipe/omni-pipe/stages/lfm2"
)

// Stream is one utterance's streaming decode: the network's cache and the
// overlap-add's tail. After code frame t (counting from 0) it has emitted
// FrameSamples()·(t+1) − Lag() samples; Flush emits the last Lag(). The
// concatenated output equals Decoder.Decode of all the frames, bit for bit.
// A Stream must not be used from two goroutines at once.
type Stream struct {
	d     *Decoder
	cache *lfm2.Cache
	// ola and env hold the overlap-added windowed frames and squared
	// windows of the untrimmed samples [emitted, emitted+n_fft).
	ola, env []float64
	drop     int // leading samples still to drop ("same" padding)
	frames   int
	flushed  bool
	f        []float64
	z        []complex128
}

// NewStream starts an utterance.
func (d *Decoder) NewStream() *Stream {
	return &Stream{
		d:     d,
		cache: d.net.NewCache(d.dev),
		ola:   make([]float64, d.nfft),
		env:   make([]float64, d.nfft),
		drop:  d.pad,
		f:     make([]float64, d.nfft),
		z:     make([]complex128, d.nfft),
	}
}

// Frames returns the number of code frames decoded so far.
func (s *Stream) Frames() int { return s.frames }

// Decode decodes the next code frames and returns the samples they
// complete. Codes outside 0..Bins()−1 (the end-of-audio frame included)
// are refused before anything runs, leaving the stream as it was.
func (s *Stream) Decode(codes [][]int) ([]float32, error) {
	return s.AppendDecode(nil, codes)
}

// AppendDecode is Decode appending the samples to dst.
func (s *Stream) AppendDecode(dst []float32, codes [][]int) ([]float32, error) {
	d := s.d
	if err := d.CheckCodes(codes); err != nil {
		return dst, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case s.cache == nil:
		return dst, errors.New("detokenizer: decode on a closed stream")
	case s.flushed:
		return dst, errors.New("detokenizer: decode after Flush")
	case d.ctx == nil:
		return dst, errors.New("detokenizer: decode after the decoder's Close")
	}
	if len(codes) == 0 {
		return dst, nil
	}
	spec, err := d.forward(s.cache, codes, nil, false)
	if err != nil {
		return dst, fmt.Errorf("detokenizer stream: %w", err)
	}
	s.frames += len(codes)
	return s.overlapAdd(dst, spec), nil
}

// overlapAdd adds the windowed inverse FFTs of the head's rows spec (whole
// rows of n_fft+2 values) to the stream's tail and appends the samples
// they complete to dst. d.mu is held.
func (s *Stream) overlapAdd(dst []float32, spec []float32) []float32 {
	d := s.d
	W := d.cfg.OutputSize
	for m := range len(spec) / W {
		d.frame(s.f, spec[m*W:(m+1)*W], s.z)
		for j := range d.nfft {
			s.ola[j] += s.f[j]
			s.env[j] += d.win2[j]
		}
		dst = s.emit(dst, d.hop)
	}
	return dst
}

// emit normalises and shifts out the first n samples of the buffers,
// dropping the leading padding.
func (s *Stream) emit(dst []float32, n int) []float32 {
	for i := range n {
		if s.drop > 0 {
			s.drop--
			continue
		}
		dst = append(dst, sample(s.ola[i], s.env[i]))
	}
	copy(s.ola, s.ola[n:])
	copy(s.env, s.env[n:])
	clear(s.ola[len(s.ola)-n:])
	clear(s.env[len(s.env)-n:])
	return dst
}

// Flush ends the utterance and returns its last Lag() samples (none when
// no frame was decoded). Decoding afterwards is an error; flushing again
// returns nothing.
func (s *Stream) Flush() []float32 {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.flushed || s.frames == 0 {
		s.flushed = true
		return nil
	}
	s.flushed = true
	return s.emit(nil, s.d.pad)
}

// Close releases the stream's memory; closing twice is harmless.
func (s *Stream) Close() {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.cache != nil {
		s.cache.Free()
		s.cache = nil
	}
}
