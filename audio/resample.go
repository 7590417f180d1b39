package audio

import (
	"fmt"
	"math"
	"sync"
)

// Resampler converts audio between two integer sample rates exactly as
// torchaudio.functional.resample does with its defaults (sinc_interp_hann,
// lowpass_filter_width 6, rolloff 0.99), running on a float32 CUDA tensor as
// liquid-audio's ChatState.add_audio does:
//
//   - the rates are reduced by their gcd to orig/new;
//   - the kernel is built in float32 the way torch evaluates it on the GPU
//     (see NewResampler): one row of 2·width+orig taps per output phase;
//   - the input is zero-padded by width on the left and width+orig on the
//     right and convolved with stride orig (conv1d), the phases interleaved;
//   - the output keeps ceil(new·L/orig) samples.
//
// Taps whose sinc argument torch clamps to ±lowpass_filter_width are left out:
// their weight is below 1e-22 (a Hann window at its zero times a sinc at 6π),
// far under float32 resolution. The products are summed in float64 and
// rounded once, so the output differs from the GPU's float32 convolution by
// that convolution's own rounding.
//
// A Resampler is immutable and safe for concurrent use; Stream gives an
// incremental front end with identical output.
type Resampler struct {
	from, to  int
	orig, new int // gcd-reduced rates
	width     int // zero padding on the left, in input samples
	phases    []phase
	reach     int // input samples past a block's start that its last phase reads
}

// phase is one output phase's kernel row, trimmed to its nonzero taps: it
// reads padded input samples [block·orig+off, block·orig+off+len(taps)).
type phase struct {
	off  int
	taps []float32
}

const (
	lowpassFilterWidth = 6
	rolloff            = 0.99
)

// NewResampler returns a resampler from one rate to another; both must lie
// in [1, MaxSampleRate]. Building it costs one sin and cos per kept tap.
func NewResampler(from, to int) (*Resampler, error) {
	if from < 1 || to < 1 || from > MaxSampleRate || to > MaxSampleRate {
		return nil, fmt.Errorf("resample %d Hz to %d Hz: rates must be in 1..%d", from, to, MaxSampleRate)
	}
	r := &Resampler{from: from, to: to}
	if from == to {
		return r, nil
	}
	g := gcd(from, to)
	r.orig, r.new = from/g, to/g
	orig, nw := r.orig, r.new
	base := float64(min(orig, nw)) * rolloff // python float
	r.width = int(math.Ceil(float64(lowpassFilterWidth*orig) / base))
	// Each phase keeps the taps inside the sinc's support, 12·orig/base
	// input samples, so the kernel holds about 12.1·max(orig, new) taps
	// (at most 9.3M, 37 MB, for rates up to MaxSampleRate).

	// torch evaluates, in float32 on the GPU (a division of a tensor by a
	// Python scalar is a multiplication by the float32 reciprocal there):
	//   idx[m] = (m - width) * (1/orig)              m in [0, 2·width+orig)
	//   t      = (-j * (1/new) + idx[m]) * base       j in [0, new)
	//   t      = clamp(t, -6, 6)
	//   window = cos(t * pi * (1/6) * 0.5) ** 2
	//   t      = t * pi
	//   kernel = (t == 0 ? 1 : sin(t) / t) * (window * (base/orig))
	recipOrig := float32(1) / float32(orig)
	recipNew := float32(1) / float32(nw)
	base32 := float32(base)
	pi32 := float32(math.Pi)
	recipLW := float32(1) / float32(lowpassFilterWidth)
	scale32 := float32(base / float64(orig))
	const lw = float32(lowpassFilterWidth)
	kernelLen := 2*r.width + orig
	tOf := func(j, m int) float32 {
		idx := float32(float32(m-r.width) * recipOrig)
		t := float32(float32(float32(-j)*recipNew) + idx)
		return float32(t * base32)
	}
	r.phases = make([]phase, nw)
	for j := range nw {
		// The taps with |t| < 6 are contiguous in m (t grows with m); find
		// them from the real-valued centre and widen by a margin, then
		// trim with the exact float32 t.
		centre := float64(r.width) + float64(orig)*float64(j)/float64(nw)
		half := float64(lowpassFilterWidth) / base * float64(orig)
		lo := max(0, int(math.Floor(centre-half))-2)
		hi := min(kernelLen, int(math.Ceil(centre+half))+3)
		for lo < hi && tOf(j, lo) <= -lw {
			lo++
		}
		for hi > lo && tOf(j, hi-1) >= lw {
			hi--
		}
		taps := make([]float32, hi-lo)
		for m := lo; m < hi; m++ {
			t := tOf(j, m) // strictly inside (-6, 6): the clamp is a no-op
			c := float32(math.Cos(float64(float32(float32(float32(t*pi32)*recipLW) * 0.5))))
			window := float32(c * c)
			t = float32(t * pi32)
			k := float32(1)
			if t != 0 {
				k = float32(float32(math.Sin(float64(t))) / t)
			}
			taps[m-lo] = float32(k * float32(window*scale32))
		}
		r.phases[j] = phase{off: lo, taps: taps}
		r.reach = max(r.reach, hi)
	}
	return r, nil
}

// From returns the input rate.
func (r *Resampler) From() int { return r.from }

// To returns the output rate.
func (r *Resampler) To() int { return r.to }

// OutputLen returns the number of samples Resample gives for n input
// samples: ceil(new·n/orig), computed as torch does (a Python float rounded
// to a float32 tensor, then ceil), at most the convolution's length.
func (r *Resampler) OutputLen(n int) int {
	if r.orig == 0 {
		return n
	}
	return outputLen(n, r.orig, r.new)
}

// ResampledLen returns the number of samples n input samples become from
// one rate to another (Resampler.OutputLen), without building a kernel.
func ResampledLen(n, from, to int) int {
	if from == to || from < 1 || to < 1 {
		return n
	}
	g := gcd(from, to)
	return outputLen(n, from/g, to/g)
}

func outputLen(n, orig, nw int) int {
	if n <= 0 {
		return 0
	}
	target := int(math.Ceil(float64(float32(float64(nw*n) / float64(orig)))))
	return min(target, (n/orig+1)*nw)
}

// Resample returns x at the output rate. Equal rates return a copy.
func (r *Resampler) Resample(x []float32) []float32 {
	if r.orig == 0 {
		return append([]float32(nil), x...)
	}
	s := r.NewStream()
	out := s.Append(make([]float32, 0, r.OutputLen(len(x))), x)
	return s.Flush(out)
}

// Stream resamples audio that arrives in pieces; the concatenated output of
// its Append calls and the final Flush equals Resample of the whole input,
// sample for sample (up to 2^24 output samples, past which torch's float32
// length rule may end the whole-clip output earlier than a stream that has
// already emitted). Output comes in blocks of new (gcd-reduced) samples, each
// emitted once the input reaches about orig+width samples past the block's
// start: under 1 ms of audio at 24→16 kHz, about 11 ms at 44.1→16 kHz.
// A Stream is not safe for concurrent use.
type Stream struct {
	r     *Resampler
	pad   []float32 // padded input from sample index start·orig (padded coordinates)
	block int       // next output block to compute
	start int       // block whose input pad[0] begins
	n     int       // input samples written
	done  int       // output samples emitted
}

// NewStream starts an incremental resampling.
func (r *Resampler) NewStream() *Stream {
	s := &Stream{r: r}
	if r.orig != 0 {
		s.pad = make([]float32, r.width, r.width+4096) // the left zero padding
	}
	return s
}

// Append feeds x and appends to dst (returned) every output sample whose
// input window is complete.
func (s *Stream) Append(dst, x []float32) []float32 {
	r := s.r
	s.n += len(x)
	if r.orig == 0 {
		s.done += len(x)
		return append(dst, x...)
	}
	s.pad = append(s.pad, x...)
	return s.emit(dst, -1)
}

// Flush ends the input and appends the remaining output samples to out.
// The Stream must not be used afterwards.
func (s *Stream) Flush(out []float32) []float32 {
	r := s.r
	if r.orig == 0 {
		return out
	}
	total := r.OutputLen(s.n)
	// The right zero padding of width+orig samples completes every block
	// that the output length needs.
	s.pad = append(s.pad, make([]float32, r.width+r.orig)...)
	return s.emit(out, total)
}

// emit computes blocks while their input is present; total >= 0 caps the
// output at the final length.
func (s *Stream) emit(out []float32, total int) []float32 {
	r := s.r
	for {
		lo := (s.block - s.start) * r.orig
		if lo+r.reach > len(s.pad) {
			break
		}
		if total >= 0 && s.done >= total {
			break
		}
		for j := range r.phases {
			if total >= 0 && s.done >= total {
				break
			}
			p := &r.phases[j]
			out = append(out, dot(p.taps, s.pad[lo+p.off:lo+p.off+len(p.taps)]))
			s.done++
		}
		s.block++
	}
	// Drop consumed input, keeping the next block's window.
	if keep := (s.block - s.start) * r.orig; keep > 4096 && keep > len(s.pad)/2 {
		s.pad = append(s.pad[:0], s.pad[keep:]...)
		s.start = s.block
	}
	return out
}

// dot returns Σ a[i]·b[i], accumulated in float64 and rounded once.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1 float64
	i := 0
	for ; i+1 < len(a); i += 2 {
		s0 += float64(a[i]) * float64(b[i])
		s1 += float64(a[i+1]) * float64(b[i+1])
	}
	if i < len(a) {
		s0 += float64(a[i]) * float64(b[i])
	}
	return float32(s0 + s1)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// resamplers caches a few recently used resamplers for Resample.
var resamplers struct {
	sync.Mutex
	recent []*Resampler // most recent last
}

const resamplerCacheSize = 4

// Resample converts x from one rate to another (see Resampler), reusing the
// kernels of recently used rate pairs.
func Resample(x []float32, from, to int) ([]float32, error) {
	r, err := CachedResampler(from, to)
	if err != nil {
		return nil, err
	}
	return r.Resample(x), nil
}

// CachedResampler returns a resampler for the rate pair, sharing the kernels
// of recently used pairs (a Resampler is safe for concurrent use; its
// Streams are not).
func CachedResampler(from, to int) (*Resampler, error) {
	c := &resamplers
	c.Lock()
	for i, r := range c.recent {
		if r.from == from && r.to == to {
			c.recent = append(append(c.recent[:i:i], c.recent[i+1:]...), r)
			c.Unlock()
			return r, nil
		}
	}
	c.Unlock()
	r, err := NewResampler(from, to)
	if err != nil {
		return nil, err
	}
	c.Lock()
	defer c.Unlock()
	if len(c.recent) == resamplerCacheSize {
		c.recent = append(c.recent[:0], c.recent[1:]...)
	}
	c.recent = append(c.recent, r)
	return r, nil
}
