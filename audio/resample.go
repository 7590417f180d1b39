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
//   - the rates are reduced by their gcd to orig/new (a pair whose reduced
//     terms exceed maxRatioTerm is approximated instead: see ratio);
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

// maxRatioTerm bounds the reduced rates orig and new, and with them the
// kernel: about 12.1·max(orig, new) taps, so at most maxKernelTaps (1.7 MB;
// under 3 MB with the table of new phases), built in about 10 ms. Every pair of the usual rates (8k, 11.025k, 16k,
// 22.05k, 24k, 32k, 44.1k, 48k, 88.2k, 96k, 176.4k, 192k) reduces far below
// it (44.1k→16k is 441/160) and is resampled exactly; an exact kernel for a
// rate sharing no factor with the other (767999→16k) would take 9.3M taps
// (37 MB, a quarter of a second to build).
const maxRatioTerm = 1 << 15

// maxKernelTaps bounds the taps of any Resampler's kernel.
const maxKernelTaps = 13 * maxRatioTerm

// ratio returns the terms orig/new of the resampler from one rate to the
// other: from/to reduced by their gcd when both terms are at most
// maxRatioTerm, else the fraction with terms at most maxRatioTerm closest to
// from/to. Such a resampler converts exactly as from an input rate
// from' = to·orig/new instead of from: its output is the exact one
// stretched in time by from'/from, which differs from 1 by less than
// maxRatioError (the pitch moves by under 0.06 cent; a 2-minute clip ends
// at most 4 ms early or late). Every ratio x = from/to in [1/maxRatioTerm,
// maxRatioTerm] (any two rates in [MinSampleRate, MaxSampleRate], 1/768 to
// 768 apart) meets that bound: by Dirichlet's approximation theorem some
// denominator q ≤ Q = maxRatioTerm/x brings q·x within 1/(Q+1) of an
// integer p ≤ maxRatioTerm. TestResampleRatioBound checks it across the
// range. ok is false for rates further apart or above MaxSampleRate, which
// are not approximated: orig/new is then the exact reduced ratio.
func ratio(from, to int) (orig, nw int, ok bool) {
	g := gcd(from, to)
	orig, nw = from/g, to/g
	switch {
	case max(orig, nw) <= maxRatioTerm:
		return orig, nw, true
	case from > MaxSampleRate || to > MaxSampleRate ||
		max(from, to) > maxRatioTerm*min(from, to):
		return orig, nw, false
	}
	orig, nw = approxRatio(from, to)
	return orig, nw, true
}

// maxRatioError bounds |from'/from - 1| for the rate pairs ratio
// approximates (see ratio): 3.05e-5.
const maxRatioError = 1.0 / (maxRatioTerm - 1)

// approxRatio returns the fraction orig/new closest to from/to (in the
// relative rate error |to·orig - from·new| / (from·new)) among those whose
// terms are at most maxRatioTerm; the rates are at most MaxSampleRate and
// at most maxRatioTerm times apart. It tries every value of the smaller
// term with the larger one rounded: at most maxRatioTerm steps of integer
// arithmetic (tens of microseconds).
func approxRatio(from, to int) (orig, nw int) {
	lo, hi := int64(min(from, to)), int64(max(from, to))
	bestNum, bestDen := int64(-1), int64(1) // the best error so far, as a fraction
	var bestSmall, bestLarge int64
	for small := int64(1); small <= maxRatioTerm; small++ {
		large := (2*small*hi + lo) / (2 * lo) // round(small·hi/lo) ≥ small
		if large > maxRatioTerm {
			break // large grows with small
		}
		o, n := large, small
		if from < to {
			o, n = small, large
		}
		num := int64(to)*o - int64(from)*n
		num = max(num, -num)
		den := int64(from) * n
		if bestNum < 0 || num*bestDen < bestNum*den {
			bestNum, bestDen, bestSmall, bestLarge = num, den, small, large
		}
	}
	g := int64(gcd(int(bestSmall), int(bestLarge)))
	if from < to {
		return int(bestSmall / g), int(bestLarge / g)
	}
	return int(bestLarge / g), int(bestSmall / g)
}

// NewResampler returns a resampler from one rate to another; both must lie
// in [1, MaxSampleRate]. Building it costs one sin and cos per kept tap, at
// most maxKernelTaps.
func NewResampler(from, to int) (*Resampler, error) {
	if from < 1 || to < 1 || from > MaxSampleRate || to > MaxSampleRate {
		return nil, fmt.Errorf("resample %d Hz to %d Hz: rates must be in 1..%d", from, to, MaxSampleRate)
	}
	r := &Resampler{from: from, to: to}
	if from == to {
		return r, nil
	}
	orig, nw, ok := ratio(from, to)
	if !ok {
		return nil, fmt.Errorf("resample %d Hz to %d Hz: the rates are more than %d times apart", from, to, maxRatioTerm)
	}
	r.orig, r.new = orig, nw
	base := float64(min(orig, nw)) * rolloff // python float
	r.width = int(math.Ceil(float64(lowpassFilterWidth*orig) / base))
	// Each phase keeps the taps inside the sinc's support, 12·orig/base
	// input samples, so the kernel holds about 12.1·max(orig, new) taps
	// (at most maxKernelTaps: ratio bounds orig and new).

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
	orig, nw, _ := ratio(from, to)
	return outputLen(n, orig, nw)
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

// resamplers caches the kernels of a few recently used ratios for
// Resample, by their reduced (or approximated) terms: rates that ratio maps
// to one fraction (767999→16k and 767993→16k both to 48/1) share one.
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
// of recently used ratios (a Resampler is safe for concurrent use; its
// Streams are not).
func CachedResampler(from, to int) (*Resampler, error) {
	if from == to || from < 1 || to < 1 || from > MaxSampleRate || to > MaxSampleRate {
		return NewResampler(from, to) // nothing to share, or an error
	}
	orig, nw, _ := ratio(from, to)
	c := &resamplers
	c.Lock()
	for i, r := range c.recent {
		if r.orig == orig && r.new == nw {
			c.recent = append(append(c.recent[:i:i], c.recent[i+1:]...), r)
			c.Unlock()
			return r.withRates(from, to), nil
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

// withRates returns r for another pair of rates of the same terms: the
// kernel is shared, From and To report the new pair.
func (r *Resampler) withRates(from, to int) *Resampler {
	if r.from == from && r.to == to {
		return r
	}
	cp := *r
	cp.from, cp.to = from, to
	return &cp
}
