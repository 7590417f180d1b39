package audio

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/mjibson/go-dsp/fft"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
)

// LogMelOptions tune a LogMel front end; the zero value is the reference's
// float32 output computed on one goroutine.
type LogMelOptions struct {
	// RoundBF16 rounds the features to bfloat16 values (kept in float32),
	// which is what liquid-audio's ChatState feeds the encoder.
	RoundBF16 bool
	// Workers is the number of goroutines that share the STFT frames of one
	// clip (1 when 0).
	Workers int
	// FFT32 computes each frame's spectrum with a plain radix-2 float32
	// FFT instead of the float64 one: the precision of the reference's
	// cuFFT, for measuring how far that alone moves the features (parity's
	// mel tolerance).
	FFT32 bool
}

// LogMel is LFM2-Audio's log-mel front end, NeMo's
// AudioToMelSpectrogramPreprocessor in eval mode, as liquid-audio runs it:
// pre-emphasis, a centred zero-padded STFT with a symmetric Hann window,
// |X|² as sqrt-then-square, a Slaney mel filterbank, ln(x + 2^-24),
// per-feature normalisation over the valid frames, and masking of the rest.
// Every step is rounded to float32 where the reference stores a float32
// tensor; sums are taken in float64 and rounded once, so the result differs
// from the GPU reference only by that reference's own float32 rounding (its
// cuFFT, GEMM and reductions). The STFT's float64 FFT is fftPlan's radix-2
// transform for power-of-two n_fft and go-dsp's Bluestein one otherwise.
//
// A LogMel is immutable and safe for concurrent use. Dither is a training
// augmentation and is not applied.
type LogMel struct {
	rate, win, hop, nFFT, nMels int
	nBins                       int
	preemph                     float32
	window                      []float32 // [nFFT]: win samples centred, zeros around
	winLo, winHi                int       // the window's span inside nFFT
	fb                          []float32 // [nMels, nBins]
	fbLo, fbHi                  []int     // nonzero span of each filter
	normalize                   string
	log                         bool
	padTo                       int
	padValue                    float32
	opts                        LogMelOptions
	plan                        *fftPlan  // power-of-two nFFT; nil: go-dsp's FFT
	scratch                     sync.Pool // *stftScratch
	specOnce                    sync.Once
	spec                        *gpu.LogMelSpec // DeviceSpec's
}

// Features are log-mel features, time-major: Data[t*Bins+b] is mel bin b of
// frame t.
type Features struct {
	Frames int // T_mel = 1 + L/hop (centred STFT), plus any pad_to padding
	Valid  int // frames computed from the signal, L/hop; the rest hold pad_value
	Bins   int
	Data   []float32 // [Frames, Bins]
}

// At returns mel bin b of frame t.
func (f *Features) At(t, b int) float32 { return f.Data[t*f.Bins+b] }

// RoundBF16 rounds every value to the nearest bfloat16 (ties to even).
func (f *Features) RoundBF16() {
	for i, v := range f.Data {
		f.Data[i] = gpu.RoundBF16(v)
	}
}

// log zero guard (NeMo's log_zero_guard_type "add", value 2^-24) and the
// std guard (NeMo's CONSTANT) of the normalisation.
const (
	logZeroGuard = float32(1.0 / (1 << 24))
	stdGuard     = float32(1e-5)
)

// goDSPWorkers makes go-dsp's radix-2 FFT (inside its Bluestein transform,
// which serves the n_fft that are not powers of two; those use fftPlan)
// run on the calling goroutine's single helper instead of GOMAXPROCS new
// goroutines per call: the front end parallelises over frames itself.
// go-dsp holds this in a package variable; it is set once, before the
// first FFT omni-pipe runs.
var goDSPWorkers sync.Once

// NewLogMel builds the front end that config.json's preprocessor section
// describes. Window and hop lengths are int(seconds·rate) as NeMo computes
// them; n_fft 0 means the next power of two of the window.
func NewLogMel(p config.Preprocessor, opts LogMelOptions) (*LogMel, error) {
	goDSPWorkers.Do(func() { fft.SetWorkerPoolSize(1) })
	m := &LogMel{
		rate:      p.SampleRate,
		win:       int(p.WindowSize * float64(p.SampleRate)),
		hop:       int(p.WindowStride * float64(p.SampleRate)),
		nFFT:      p.NFFT,
		nMels:     p.Features,
		preemph:   float32(p.Preemphasis()),
		normalize: p.Normalize,
		log:       p.Log,
		padTo:     p.PadTo,
		padValue:  float32(p.PadValue),
		opts:      opts,
	}
	if m.opts.Workers <= 0 {
		m.opts.Workers = 1
	}
	err := m.check(p)
	if err != nil {
		return nil, fmt.Errorf("log-mel front end: %w", err)
	}
	m.nBins = m.nFFT/2 + 1
	if m.nFFT&(m.nFFT-1) == 0 {
		if m.plan, err = newFFTPlan(m.nFFT); err != nil {
			return nil, fmt.Errorf("log-mel front end: %w", err)
		}
	}
	window, err := windowFunc(p.Window, m.win)
	if err != nil {
		return nil, fmt.Errorf("log-mel front end: %w", err)
	}
	// torch.stft centres a shorter window inside n_fft.
	m.winLo = (m.nFFT - m.win) / 2
	m.winHi = m.winLo + m.win
	m.window = make([]float32, m.nFFT)
	copy(m.window[m.winLo:], window)

	m.fb = melFilterbank(m.rate, m.nFFT, m.nMels, 0, float64(m.rate)/2)
	m.fbLo, m.fbHi = make([]int, m.nMels), make([]int, m.nMels)
	for j := range m.nMels {
		row := m.fb[j*m.nBins : (j+1)*m.nBins]
		lo, hi := 0, len(row)
		for lo < hi && row[lo] == 0 {
			lo++
		}
		for hi > lo && row[hi-1] == 0 {
			hi--
		}
		m.fbLo[j], m.fbHi[j] = lo, hi
	}
	m.scratch.New = func() any { return m.newScratch() }
	return m, nil
}

func (m *LogMel) check(p config.Preprocessor) error {
	switch {
	case m.rate < MinSampleRate || m.rate > MaxSampleRate:
		return fmt.Errorf("sample_rate %d (want %d..%d)", m.rate, MinSampleRate, MaxSampleRate)
	case m.win <= 0 || m.hop <= 0:
		return fmt.Errorf("window_size %g s and window_stride %g s give %d and %d samples at %d Hz; both must be positive",
			p.WindowSize, p.WindowStride, m.win, m.hop, m.rate)
	case m.nMels <= 0:
		return fmt.Errorf("features %d must be positive", m.nMels)
	case p.FrameSplicing > 1:
		return fmt.Errorf("frame_splicing %d is not supported (only 1)", p.FrameSplicing)
	case m.padTo < 0:
		return fmt.Errorf("pad_to %d must not be negative", m.padTo)
	}
	if m.nFFT == 0 {
		m.nFFT = 1
		for m.nFFT < m.win {
			m.nFFT *= 2
		}
	}
	if m.nFFT < m.win {
		return fmt.Errorf("n_fft %d is shorter than the %d-sample window", m.nFFT, m.win)
	}
	if m.nFFT > MaxNFFT {
		return fmt.Errorf("n_fft %d is larger than %d", m.nFFT, MaxNFFT)
	}
	if m.opts.FFT32 && m.nFFT&(m.nFFT-1) != 0 {
		return fmt.Errorf("n_fft %d: the float32 FFT needs a power of two", m.nFFT)
	}
	switch m.normalize {
	case "per_feature", "all_features", "", "none", "None":
	default:
		return fmt.Errorf("normalize %q is not supported (per_feature, all_features or none)", m.normalize)
	}
	return nil
}

// windowFunc returns torch.<name>_window(n, periodic=False) as NeMo builds
// it: in float32 on the CPU, w[i] = alpha - beta·cos(i · (2π/(n-1))).
func windowFunc(name string, n int) ([]float32, error) {
	var alpha, beta float32
	switch name {
	case "hann", "":
		alpha, beta = 0.5, 0.5
	case "hamming":
		alpha, beta = 0.54, 0.46
	case "ones", "none":
		w := make([]float32, n)
		for i := range w {
			w[i] = 1
		}
		return w, nil
	default:
		return nil, fmt.Errorf("window %q is not supported (hann, hamming or ones)", name)
	}
	w := make([]float32, n)
	if n == 1 {
		w[0] = 1
		return w, nil
	}
	step := float32(math.Pi * 2 / float64(n-1))
	for i := range w {
		c := float32(math.Cos(float64(float32(i) * step)))
		w[i] = float32(float32(c*-beta) + alpha)
	}
	return w, nil
}

// SampleRate returns the rate the front end expects.
func (m *LogMel) SampleRate() int { return m.rate }

// Bins returns the number of mel bins.
func (m *LogMel) Bins() int { return m.nMels }

// Hop returns the hop length in samples.
func (m *LogMel) Hop() int { return m.hop }

// Frames returns (T_mel, valid frames) for n samples, as torch.stft
// (center=True) and NeMo's get_seq_len count them.
func (m *LogMel) Frames(n int) (frames, valid int) {
	pad := m.nFFT / 2 * 2
	frames = 1 + floorDiv(n+pad-m.nFFT, m.hop)
	valid = max(0, floorDiv(n+pad-m.nFFT, m.hop))
	return frames, valid
}

func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// ComputeClip resamples c to the front end's rate when needed (see
// Resampler), then computes its features.
func (m *LogMel) ComputeClip(c *Clip) (*Features, error) {
	x := c.Samples
	if c.SampleRate != m.rate {
		var err error
		if x, err = Resample(x, c.SampleRate, m.rate); err != nil {
			return nil, fmt.Errorf("log-mel: %w", err)
		}
	}
	return m.Compute(x)
}

// MaxNFFT bounds a front end's FFT size (the released models use 512):
// an absurd config.json must not size the window, the plan or a frame's
// scratch.
const MaxNFFT = 1 << 16

// ErrTooShort reports a clip with fewer than two valid frames, for which
// the reference's per-feature normalisation is undefined (NeMo raises).
var ErrTooShort = errors.New("audio too short for the log-mel front end")

// Compute returns the features of samples at SampleRate.
func (m *LogMel) Compute(samples []float32) (*Features, error) {
	x, frames, valid, total, err := m.prepare(samples)
	if err != nil {
		return nil, err
	}
	f := &Features{Frames: total, Valid: valid, Bins: m.nMels, Data: make([]float32, total*m.nMels)}
	// Log-mel of every STFT frame (the reference computes the frames past
	// the valid ones too, then masks them).
	// Frames go to the FFT in pairs.
	m.parallel(frames, minFramesPerWorker, 2, func(lo, hi int) { m.melFrames(x, f.Data, lo, hi) })
	m.normalizeFeatures(f, frames)
	// Frames from Valid on (the terminal centred frame, pad_to padding)
	// hold pad_value.
	for i := valid * m.nMels; i < len(f.Data); i++ {
		f.Data[i] = m.padValue
	}
	if m.opts.RoundBF16 {
		f.RoundBF16()
	}
	return f, nil
}

// prepare checks samples and returns them pre-emphasised, with the number
// of STFT frames, of valid frames and of rows (pad_to padding included).
func (m *LogMel) prepare(samples []float32) (x []float32, frames, valid, total int, err error) {
	n := len(samples)
	frames, valid = m.Frames(n)
	if n == 0 || valid < 2 {
		return nil, 0, 0, 0, fmt.Errorf("%w: %d samples give %d valid frame(s); need at least %d samples (2 hops)",
			ErrTooShort, n, valid, 2*m.hop)
	}
	// Pre-emphasis, in float32 as torch computes x[1:] - 0.97·x[:-1].
	x = make([]float32, n)
	var prev float32
	for i, v := range samples {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 { // NaN or ±Inf
			return nil, 0, 0, 0, fmt.Errorf("log-mel: non-finite sample %v at %d", v, i)
		}
		x[i] = v - float32(m.preemph*prev)
		prev = v
	}
	x[0] = samples[0]
	total = frames
	if m.padTo > 0 && total%m.padTo != 0 {
		total += m.padTo - total%m.padTo
	}
	return x, frames, valid, total, nil
}

// DeviceSpec returns the front end as constants a device can run
// (gpu.LogMeler), or nil where the device path does not reproduce it: an
// n_fft that is not a power of two in 4..2048, a normalisation other than
// per_feature, Options.FFT32 or Options.RoundBF16 (the device's features
// are not rounded). It is built once and shared.
func (m *LogMel) DeviceSpec() *gpu.LogMelSpec {
	m.specOnce.Do(func() {
		if m.plan == nil || m.nFFT < 4 || m.nFFT > 2048 || m.normalize != "per_feature" || m.opts.FFT32 || m.opts.RoundBF16 {
			return
		}
		s := &gpu.LogMelSpec{
			NFFT: m.nFFT, Hop: m.hop, WinLo: m.winLo, WinHi: m.winHi, Window: m.window,
			Swaps: m.plan.swaps, Mels: m.nMels, FB: m.fb,
			Log: m.log, LogGuard: logZeroGuard, StdGuard: stdGuard, PadValue: m.padValue,
		}
		s.Twiddles = make([]float64, 0, 2*m.nFFT)
		for _, w := range m.plan.tw {
			s.Twiddles = append(s.Twiddles, real(w), imag(w))
		}
		for j := range m.nMels {
			s.FBLo = append(s.FBLo, int32(m.fbLo[j]))
			s.FBHi = append(s.FBHi, int32(m.fbHi[j]))
		}
		m.spec = s
	})
	return m.spec
}

// DeviceInput is a clip prepared for the device path: its pre-emphasised
// samples and its frame counts (Features' Frames and Valid, with Computed
// the STFT frames before any pad_to rows).
type DeviceInput struct {
	Samples                       []float32
	Frames, Valid, Computed, Bins int
}

// PrepareDevice checks samples (at SampleRate) and pre-emphasises them for
// the device path (DeviceSpec must not be nil): the host's share of
// Compute.
func (m *LogMel) PrepareDevice(samples []float32) (*DeviceInput, error) {
	x, frames, valid, total, err := m.prepare(samples)
	if err != nil {
		return nil, err
	}
	return &DeviceInput{Samples: x, Frames: total, Valid: valid, Computed: frames, Bins: m.nMels}, nil
}

// ComputeOn writes in's features ([in.Frames, Bins], F32) into dst on q,
// which must be a gpu.LogMeler: the floats of Compute, up to the last bit
// of a float64 log (the device's and Go's may differ there, so about one
// value in 10⁸ may differ by a float32 ulp before the normalisation).
func (m *LogMel) ComputeOn(q gpu.Queue, dst, x gpu.Tensor, in *DeviceInput) {
	lm := q.(gpu.LogMeler)
	q.Write(x, in.Samples)
	lm.LogMel(dst, x, m.DeviceSpec(), in.Computed, in.Valid)
}

// Work shares of one goroutine at the least: about 16 frames take some
// 80 µs on a 2020s core, 16 bins' normalisation some 5 µs per 100 frames,
// against about a microsecond to start a goroutine and wait for it.
const (
	minFramesPerWorker = 16
	minBinsPerWorker   = 16
)

// parallel calls fn on consecutive chunks of [0, n), each a multiple of
// align long (bar the last) and at least minChunk long, from up to Workers
// goroutines (the last chunk on the calling one), and returns when all are
// done.
func (m *LogMel) parallel(n, minChunk, align int, fn func(lo, hi int)) {
	workers := min(m.opts.Workers, n/max(minChunk, 1))
	if workers <= 1 {
		fn(0, n)
		return
	}
	per := (n + workers - 1) / workers
	per = (per + align - 1) / align * align
	var wg sync.WaitGroup
	last := 0
	for lo := 0; lo+per < n; lo += per {
		wg.Go(func() { fn(lo, lo+per) })
		last = lo + per
	}
	fn(last, n)
	wg.Wait()
}

// stftScratch is one goroutine's work space.
type stftScratch struct {
	z     []complex128 // two real frames packed as re + i·im
	z32   []complex64  // one frame (FFT32)
	power []float32    // [2, nBins]
}

func (m *LogMel) newScratch() *stftScratch {
	s := &stftScratch{z: make([]complex128, m.nFFT), power: make([]float32, 2*m.nBins)}
	if m.opts.FFT32 {
		s.z32 = make([]complex64, m.nFFT)
	}
	return s
}

// melFrames writes the log-mel values of frames [lo, hi) into out.
func (m *LogMel) melFrames(x []float32, out []float32, lo, hi int) {
	s := m.scratch.Get().(*stftScratch)
	defer m.scratch.Put(s)
	for t := lo; t < hi; t += 2 {
		pair := min(2, hi-t)
		m.powerSpectra(x, t, pair, s)
		for p := range pair {
			pw := s.power[p*m.nBins : (p+1)*m.nBins]
			row := out[(t+p)*m.nMels : (t+p+1)*m.nMels]
			for j := range m.nMels {
				lo, hi := m.fbLo[j], m.fbHi[j]
				fb := m.fb[j*m.nBins+lo : j*m.nBins+hi]
				var acc float64 // fb · power (zeros of fb skipped: exact)
				for k, v := range pw[lo:hi] {
					acc += float64(fb[k]) * float64(v)
				}
				v := float32(acc)
				if m.log {
					v = float32(math.Log(float64(v + logZeroGuard)))
				}
				row[j] = v
			}
		}
	}
}

// powerSpectra writes |STFT|² of frames t (and t+1 when pair is 2) into
// s.power. The two real frames go through one complex FFT as re + i·im and
// are separated by conjugate symmetry (in float64, far below float32).
func (m *LogMel) powerSpectra(x []float32, t, pair int, s *stftScratch) {
	n := len(x)
	if m.opts.FFT32 {
		for p := range pair {
			z := s.z32
			clear(z)
			start := (t+p)*m.hop - m.nFFT/2
			for k := m.winLo; k < m.winHi; k++ {
				if i := start + k; i >= 0 && i < n {
					z[k] = complex(x[i]*m.window[k], 0)
				}
			}
			fft32(z)
			for k := range m.nBins {
				s.power[p*m.nBins+k] = powerOf(complex128(z[k]))
			}
		}
		return
	}
	z := s.z
	clear(z)
	for p := range pair {
		// Frame t covers padded samples [t·hop, t·hop+n_fft), i.e. x from
		// t·hop - n_fft/2 (centre=True, constant zero padding).
		start := (t+p)*m.hop - m.nFFT/2
		lo, hi := max(m.winLo, -start), min(m.winHi, n-start) // the window's span inside x
		if lo >= hi {
			continue
		}
		// torch multiplies the frame by the window in float32.
		xs, ws, zs := x[start+lo:start+hi], m.window[lo:hi], z[lo:hi]
		if p == 0 {
			for k, v := range xs {
				zs[k] = complex(float64(float32(v*ws[k])), 0)
			}
		} else {
			for k, v := range xs {
				zs[k] = complex(real(zs[k]), float64(float32(v*ws[k])))
			}
		}
	}
	Z := z
	if m.plan != nil {
		m.plan.transform(z)
	} else {
		Z = fft.FFT(z) // Bluestein
	}
	// With c = conj(Z[(N-k) mod N]), frame t's spectrum is (Z[k] + c)/2
	// and frame t+1's (Z[k] - c)·(-i/2), written out in parts: halving
	// and multiplying by ±i are exact.
	N := m.nFFT
	pw0 := s.power[:m.nBins:m.nBins]
	pw1 := s.power[m.nBins:][:m.nBins:m.nBins]
	for k := range pw0 {
		zk, zc := Z[k], Z[0]
		if k > 0 {
			zc = Z[N-k]
		}
		pw0[k] = powerOf(complex((real(zk)+real(zc))*0.5, (imag(zk)-imag(zc))*0.5))
		if pair == 2 {
			pw1[k] = powerOf(complex((imag(zk)+imag(zc))*0.5, (real(zc)-real(zk))*0.5))
		}
	}
}

// powerOf returns |X|² the way NeMo computes it from a complex64 STFT:
// sqrt(re² + im²) then squared, each step rounded to float32.
func powerOf(c complex128) float32 {
	re, im := float32(real(c)), float32(imag(c))
	mag := float32(math.Sqrt(float64(float32(re*re) + float32(im*im))))
	return mag * mag
}

// normalizeBins applies per_feature normalisation to bins [lo, hi). Each
// bin's sums run over t in order, as a loop down the column would; the
// loops go along rows for the cache.
func normalizeBins(f *Features, frames, lo, hi int) {
	nv, nb, w := f.Valid, f.Bins, hi-lo
	acc := make([]float64, w)
	mean, std := make([]float32, w), make([]float32, w)
	for t := range nv {
		for j, v := range f.Data[t*nb+lo : t*nb+hi] {
			acc[j] += float64(v)
		}
	}
	for j := range w {
		mean[j] = float32(float32(acc[j]) / float32(nv))
	}
	clear(acc)
	for t := range nv {
		row := f.Data[t*nb+lo : t*nb+hi]
		for j := range row {
			d := row[j] - mean[j]
			acc[j] += float64(d * d)
		}
	}
	for j := range w {
		std[j] = float32(math.Sqrt(float64(float32(acc[j])/float32(nv-1)))) + stdGuard
	}
	for t := range frames {
		row := f.Data[t*nb+lo : t*nb+hi]
		for j := range row {
			row[j] = (row[j] - mean[j]) / std[j]
		}
	}
}

// normalizeFeatures applies NeMo's normalize_batch over the first Valid
// frames (statistics) to all computed frames, in float32 with float64 sums.
func (m *LogMel) normalizeFeatures(f *Features, frames int) {
	nv, nb := f.Valid, f.Bins
	switch m.normalize {
	case "per_feature":
		m.parallel(nb, minBinsPerWorker, 1, func(lo, hi int) { normalizeBins(f, frames, lo, hi) })
	case "all_features":
		// x[:, :n].mean() and .std() (unbiased) over every bin at once.
		var sum float64
		for _, v := range f.Data[:nv*nb] {
			sum += float64(v)
		}
		cnt := float64(nv * nb)
		mean := float32(sum / cnt)
		var ss float64
		for _, v := range f.Data[:nv*nb] {
			d := float64(v) - float64(mean)
			ss += d * d
		}
		std := float32(math.Sqrt(ss/(cnt-1))) + stdGuard
		for i := range f.Data[:frames*nb] {
			f.Data[i] = (f.Data[i] - mean) / std
		}
	}
}
