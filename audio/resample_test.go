package audio

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// u is float32's unit roundoff.
const u = 1.0 / (1 << 24)

// torchRef opens testdata/torch_ref.safetensors (made by
// testdata/refgen/gen_torch_ref.py; see testdata/README.md).
func torchRef(t testing.TB) *safetensors.File {
	t.Helper()
	f, err := safetensors.Open("testdata/torch_ref.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func f32s(t testing.TB, f *safetensors.File, name string) []float32 {
	t.Helper()
	tn, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tn.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ulps returns the distance between a and b in float32 units in the last
// place (0 when equal).
func ulps(a, b float32) int64 {
	key := func(x float32) int64 {
		v := int64(math.Float32bits(x) &^ (1 << 31))
		if math.Signbit(float64(x)) {
			return -v
		}
		return v
	}
	d := key(a) - key(b)
	return max(d, -d)
}

// resamplePairs are the rate pairs in torch_ref.safetensors.
var resamplePairs = [][2]int{
	{24000, 16000}, {48000, 16000}, {44100, 16000}, {22050, 16000}, {11025, 16000},
	{8000, 16000}, {32000, 16000}, {16000, 24000}, {44100, 48000},
}

// The kernel matches the one torchaudio builds on the GPU tap for tap.
func TestResampleKernelMatchesTorch(t *testing.T) {
	f := torchRef(t)
	for _, p := range resamplePairs {
		key := fmt.Sprintf("%d_%d", p[0], p[1])
		t.Run(key, func(t *testing.T) {
			r, err := NewResampler(p[0], p[1])
			if err != nil {
				t.Fatal(err)
			}
			rowsT, _ := f.Lookup("kernel/" + key + "/rows")
			rows, _ := rowsT.Int64s()
			ref := f32s(t, f, "kernel/"+key+"/cuda")
			k := len(ref) / len(rows)
			if want := 2*r.width + r.orig; k != want {
				t.Fatalf("torch kernel has %d taps, ours spans %d", k, want)
			}
			var worst int64
			exact, kept := 0, 0
			maxDropped := 0.0
			for i, j := range rows {
				ph := r.phases[j]
				for m := range k {
					c := ref[i*k+m]
					if m < ph.off || m >= ph.off+len(ph.taps) {
						maxDropped = max(maxDropped, math.Abs(float64(c)))
						continue
					}
					d := ulps(ph.taps[m-ph.off], c)
					worst = max(worst, d)
					kept++
					if d == 0 {
						exact++
					}
				}
			}
			t.Logf("%d of %d kept taps bit-exact, worst %d ulp; largest dropped tap %.3g", exact, kept, worst, maxDropped)
			// CUDA's sinf and cosf are within 2 ulp (CUDA C Programming
			// Guide, single-precision functions), ours within 0.5: the
			// window cos² doubles cos's error (≤5 ulp), sin(t)/t adds 2.5,
			// and three float32 roundings 1.5, so taps agree within 10 ulp.
			if worst > 10 {
				t.Errorf("a tap is %d ulp from torch's (bound 10)", worst)
			}
			// Dropped taps are those torch clamps to t = ±6, a Hann window's
			// zero: cos(π/2 in float32)² ≈ 1.9e-15 times sinc(6π) < 1e-7.
			if maxDropped > 1e-20 {
				t.Errorf("dropped a tap of %g", maxDropped)
			}
		})
	}
}

// convBound returns, for every output sample of r over x, the distance
// within which a float32 convolution with torch's kernel must agree with
// ours: torch's kernel taps are within 10 ulp (≤ 20u relative) of ours, and
// a K-term float32 sum is off by at most γ_K·Σ|k·x| ≈ K·u·Σ|k·x| (Higham,
// Accuracy and Stability of Numerical Algorithms, §3.1); our float64 sum is
// rounded once (u·|y|).
func convBound(r *Resampler, x []float32, y []float32) []float64 {
	pad := append(make([]float32, r.width), x...)
	pad = append(pad, make([]float32, r.width+r.orig)...)
	k := 2*r.width + r.orig
	bound := make([]float64, len(y))
	for i := range y {
		b, j := i/r.new, i%r.new
		ph := r.phases[j]
		var s float64
		for m, tap := range ph.taps {
			s += math.Abs(float64(tap) * float64(pad[b*r.orig+ph.off+m]))
		}
		bound[i] = (float64(k)+21)*u*s + u*math.Abs(float64(y[i]))
	}
	return bound
}

// checkResampled compares got with torch's output ref under convBound and
// logs the distance.
func checkResampled(t *testing.T, r *Resampler, x, got, ref []float32) {
	t.Helper()
	if len(got) != len(ref) {
		t.Fatalf("%d samples, torch gave %d", len(got), len(ref))
	}
	bound := convBound(r, x, got)
	var maxAbs, worst, sig, noise float64
	exact := 0
	for i := range ref {
		d := math.Abs(float64(got[i]) - float64(ref[i]))
		maxAbs = max(maxAbs, d)
		worst = max(worst, d/bound[i])
		sig += float64(ref[i]) * float64(ref[i])
		noise += d * d
		if got[i] == ref[i] {
			exact++
		}
		if d > bound[i] {
			t.Errorf("sample %d: %v, torch %v (|Δ| %.3g > bound %.3g)", i, got[i], ref[i], d, bound[i])
			return
		}
	}
	t.Logf("%d samples: max |Δ| %.3g, SNR %.1f dB, %d bit-exact, worst |Δ|/bound %.3f",
		len(ref), maxAbs, 10*math.Log10(sig/noise), exact, worst)
}

// Resampling matches torchaudio.functional.resample on CUDA (the fixture's
// wav_16k and torch_ref's other rates) to float32 rounding.
func TestResampleMatchesTorch(t *testing.T) {
	t.Run("fixture case2 24k", func(t *testing.T) {
		f, err := safetensors.Open("../testdata/lfm2-audio-tiny/case2_tone_noise_24k.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		x, ref := f32s(t, f, "input_wav"), f32s(t, f, "wav_16k")
		r, err := NewResampler(24000, 16000)
		if err != nil {
			t.Fatal(err)
		}
		checkResampled(t, r, x, r.Resample(x), ref)
	})
	f := torchRef(t)
	for _, p := range resamplePairs {
		key := fmt.Sprintf("%d_%d", p[0], p[1])
		t.Run(key, func(t *testing.T) {
			r, err := NewResampler(p[0], p[1])
			if err != nil {
				t.Fatal(err)
			}
			x := f32s(t, f, "resample/"+key+"/input")
			checkResampled(t, r, x, r.Resample(x), f32s(t, f, "resample/"+key+"/cuda"))
		})
	}
}

// The output length is torch's ceil(new·L/orig) for every rate pair and
// length, and a stream fed in random pieces gives the whole-clip output
// bit for bit.
func TestResampleLengthAndStream(t *testing.T) {
	rates := []int{8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000, 96000, 7350, 12345}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, from := range rates {
		for _, to := range []int{16000, 24000, 44100} {
			r, err := NewResampler(from, to)
			if err != nil {
				t.Fatal(err)
			}
			g := gcd(from, to)
			orig, nw := from/g, to/g
			for _, n := range []int{0, 1, 2, 3, orig - 1, orig, orig + 1, 2*orig + 3, 4999} {
				if n < 0 {
					continue
				}
				want := (nw*n + orig - 1) / orig // exact integer ceil; float32 rounding is exact at these sizes
				if got := r.OutputLen(n); got != want {
					t.Errorf("%d→%d, %d samples: OutputLen %d, want %d", from, to, n, got, want)
				}
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				whole := r.Resample(x)
				if len(whole) != want {
					t.Errorf("%d→%d, %d samples: %d out, want %d", from, to, n, len(whole), want)
				}
				s := r.NewStream()
				var streamed []float32
				for rest := x; len(rest) > 0; {
					k := min(len(rest), rng.IntN(3*orig+50))
					streamed = s.Append(streamed, rest[:k])
					rest = rest[k:]
				}
				streamed = s.Flush(streamed)
				if !equalF32(whole, streamed) {
					t.Errorf("%d→%d, %d samples: stream differs from whole-clip output", from, to, n)
				}
			}
		}
	}
}

func TestResampleSameRateAndErrors(t *testing.T) {
	x := []float32{1, 2, 3}
	y, err := Resample(x, 16000, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if !equalF32(x, y) {
		t.Errorf("same-rate resample changed the samples: %v", y)
	}
	y[0] = 9
	if x[0] != 1 {
		t.Error("same-rate resample aliases its input")
	}
	for _, p := range [][2]int{{0, 16000}, {16000, 0}, {-8000, 16000}, {MaxSampleRate + 1, 16000}, {16000, 10_000_000}} {
		if _, err := NewResampler(p[0], p[1]); err == nil || !strings.Contains(err.Error(), strconv.Itoa(p[0])) {
			t.Errorf("NewResampler(%d, %d): error %v", p[0], p[1], err)
		}
	}
	// The largest kernel a valid pair can need (coprime, near the bound).
	r, err := NewResampler(767999, 16000)
	if err != nil {
		t.Fatal(err)
	}
	taps := 0
	for _, p := range r.phases {
		taps += len(p.taps)
	}
	t.Logf("767999→16000: %d phases, %d taps", len(r.phases), taps)
	if taps > 10_000_000 {
		t.Errorf("%d taps, above the documented 9.3M", taps)
	}
}

// toneLevel returns the amplitude of frequency f in x (at rate), measured by
// projection on a Hann-windowed sine/cosine pair over the middle of x.
func toneLevel(x []float32, rate int, f float64) float64 {
	lo, hi := len(x)/4, 3*len(x)/4
	var re, im, wsum float64
	for i := lo; i < hi; i++ {
		w := 0.5 - 0.5*math.Cos(2*math.Pi*float64(i-lo)/float64(hi-lo))
		ph := 2 * math.Pi * f * float64(i) / float64(rate)
		re += w * float64(x[i]) * math.Cos(ph)
		im += w * float64(x[i]) * math.Sin(ph)
		wsum += w
	}
	return 2 * math.Hypot(re, im) / wsum
}

func tone(rate int, f, amp float64, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*f*float64(i)/float64(rate)))
	}
	return x
}

// Tones above the new Nyquist frequency do not alias into the band, and
// tones well inside it keep their level.
func TestResampleAntiAliasing(t *testing.T) {
	tests := []struct {
		from, to int
		tone     float64 // at least 1.25 × to/2
		alias    float64 // where it would fold to
	}{
		{24000, 16000, 10000, 6000},
		{44100, 16000, 12000, 4000},
		{48000, 16000, 10000, 6000},
		{48000, 16000, 20000, 4000},
		{22050, 16000, 10000, 6000},
		{32000, 16000, 11000, 5000},
		{24000, 8000, 5000, 3000},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d→%d at %.0f", tc.from, tc.to, tc.tone), func(t *testing.T) {
			x := tone(tc.from, tc.tone, 0.5, tc.from) // 1 s
			y, err := Resample(x, tc.from, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			alias := 20 * math.Log10(toneLevel(y, tc.to, tc.alias)/0.5)
			// torchaudio's filter (Hann-windowed sinc, 6 zero crossings,
			// cut-off 0.99 × Nyquist) attenuates a tone 25% above the new
			// Nyquist frequency by about 45 dB, more further out; a
			// resampler without the filter leaves 0 dB (as Go's
			// tphakala/go-audio-resampler v1.6.0 does at 24k → 16k: a
			// 10 kHz tone comes out at 6 kHz undamped).
			t.Logf("%.0f Hz tone: alias at %.0f Hz is %.1f dB", tc.tone, tc.alias, alias)
			if alias > -40 {
				t.Errorf("alias at %.0f Hz is %.1f dB, want below -40 dB", tc.alias, alias)
			}
			pass := 1000.0
			y, _ = Resample(tone(tc.from, pass, 0.5, tc.from), tc.from, tc.to)
			gain := toneLevel(y, tc.to, pass) / 0.5
			// The windowed sinc's passband gain differs from 1 by a few
			// 1e-4 (its taps' sum is not exactly 1); a wrong scale or
			// roll-off moves it by percents.
			t.Logf("1 kHz gain %.6f", gain)
			if math.Abs(gain-1) > 1e-3 {
				t.Errorf("1 kHz gain %.6f, want 1 ± 1e-3", gain)
			}
		})
	}
}

func TestResampledLenMatchesOutputLen(t *testing.T) {
	for _, pair := range [][2]int{{24000, 16000}, {44100, 16000}, {8000, 16000}, {16000, 16000}, {48000, 22050}} {
		r, err := NewResampler(pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, 7, 1000, 44101, 1 << 20} {
			if got, want := ResampledLen(n, pair[0], pair[1]), r.OutputLen(n); got != want {
				t.Errorf("%v, %d samples: ResampledLen %d, OutputLen %d", pair, n, got, want)
			}
		}
	}
}

// kernelSize returns the taps of r's kernel and the bytes it holds.
func kernelSize(r *Resampler) (taps, bytes int) {
	for _, p := range r.phases {
		taps += len(p.taps)
	}
	return taps, 4*taps + int(unsafe.Sizeof(phase{}))*len(r.phases)
}

// The usual rates keep their exact gcd-reduced ratio, so their kernels and
// output are unchanged (TestResampleMatchesTorch checks the output).
func TestResampleCommonRatesExact(t *testing.T) {
	common := []int{8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 176400, 192000}
	for _, from := range common {
		for _, to := range common {
			g := gcd(from, to)
			orig, nw, ok := ratio(from, to)
			if !ok || orig != from/g || nw != to/g {
				t.Errorf("%d→%d: terms %d/%d (ok %v), want the exact %d/%d", from, to, orig, nw, ok, from/g, to/g)
			}
		}
	}
}

// A rate that shares no factor with the other builds a bounded kernel:
// the exact one for 767999→16000 had 9.3M taps (37 MB).
func TestResampleKernelBounded(t *testing.T) {
	tests := []struct {
		from, to   int
		orig, new  int // the terms ratio picks
		exactTerms bool
	}{
		{767999, 16000, 48, 1, false},
		{16000, 767999, 1, 48, false},
		{767999, 24000, 32, 1, false},
		{655990, 16000, 41, 1, false},
		{44101, 16000, 27836, 10099, false},
		{96001, 24000, 4, 1, false},
		{32767, 32768, 32767, 32768, true}, // the largest exact terms
		{32768, 32769, 32767, 32768, false},
		{767999, 767998, 1, 1, false},
		{1000, 767999, 1, 768, false},
		{MinSampleRate, MaxSampleRate, 1, 768, true},
	}
	const maxBytes = 3 << 20 // the taps and the phase table
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d→%d", tc.from, tc.to), func(t *testing.T) {
			r, err := NewResampler(tc.from, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			taps, bytes := kernelSize(r)
			t.Logf("terms %d/%d: %d phases, %d taps, %d bytes", r.orig, r.new, len(r.phases), taps, bytes)
			if r.orig != tc.orig || r.new != tc.new {
				t.Errorf("terms %d/%d, want %d/%d", r.orig, r.new, tc.orig, tc.new)
			}
			if g := gcd(tc.from, tc.to); (r.orig == tc.from/g) != tc.exactTerms {
				t.Errorf("exact terms: %v, want %v", r.orig == tc.from/g, tc.exactTerms)
			}
			if taps > maxKernelTaps || bytes > maxBytes {
				t.Errorf("%d taps, %d bytes; want at most %d taps, %d bytes", taps, bytes, maxKernelTaps, maxBytes)
			}
		})
	}
}

// Across the accepted rates, the terms stay within maxRatioTerm and the
// time scale within maxRatioError of the exact one, and ResampledLen agrees
// with the resampler.
func TestResampleRatioBound(t *testing.T) {
	check := func(from, to int) (approximated bool) {
		orig, nw, ok := ratio(from, to)
		if !ok {
			t.Fatalf("%d→%d: not approximated", from, to)
		}
		if max(orig, nw) > maxRatioTerm || gcd(orig, nw) != 1 {
			t.Fatalf("%d→%d: terms %d/%d", from, to, orig, nw)
		}
		// from' = to·orig/new
		e := math.Abs(float64(to)*float64(orig)/(float64(from)*float64(nw)) - 1)
		if e > maxRatioError {
			t.Fatalf("%d→%d: terms %d/%d, rate error %.3g > %.3g", from, to, orig, nw, e, maxRatioError)
		}
		return orig*to != nw*from
	}
	approximated := 0
	for _, to := range []int{8000, 16000, 24000, 44100, 48000} {
		for from := MinSampleRate; from <= MaxSampleRate; from += 97 {
			if check(from, to) {
				approximated++
			}
			if check(to, from) {
				approximated++
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		from := MinSampleRate + rng.IntN(MaxSampleRate-MinSampleRate+1)
		to := MinSampleRate + rng.IntN(MaxSampleRate-MinSampleRate+1)
		if check(from, to) {
			approximated++
		}
	}
	t.Logf("%d approximated pairs", approximated)
	if approximated == 0 {
		t.Error("no pair was approximated")
	}
	if _, err := NewResampler(1, maxRatioTerm+1); err == nil || !strings.Contains(err.Error(), "times apart") {
		t.Errorf("NewResampler(1, %d): error %v, want the rates refused as too far apart", maxRatioTerm+1, err)
	}
}

// A sine through an approximated ratio comes out as the ideal sine at the
// new rate within the filter's passband error (1e-3 of the amplitude) plus
// the phase the time scale's error accumulates (2π·f·t·maxRatioError), and
// as the sine at the input rate the terms stand for (from' = to·orig/new)
// within the passband error alone. The stream gives the whole-clip output
// and ResampledLen its length.
func TestResampleOddRateSine(t *testing.T) {
	const (
		f        = 440.0
		amp      = 0.5
		seconds  = 0.25
		passband = 1e-3 // TestResampleAntiAliasing's gain bound
		edge     = 0.02 // s skipped at each end (the filter's zero padding)
	)
	pairs := [][2]int{{767999, 16000}, {655990, 16000}, {44101, 16000}, {16000, 44101}, {96001, 24000}, {767999, 24000}}
	for _, p := range pairs {
		from, to := p[0], p[1]
		t.Run(fmt.Sprintf("%d→%d", from, to), func(t *testing.T) {
			r, err := CachedResampler(from, to)
			if err != nil {
				t.Fatal(err)
			}
			if r.From() != from || r.To() != to {
				t.Fatalf("From/To %d/%d, want %d/%d", r.From(), r.To(), from, to)
			}
			x := tone(from, f, amp, int(seconds*float64(from)))
			y := r.Resample(x)
			if want := ResampledLen(len(x), from, to); len(y) != want {
				t.Errorf("%d samples out, ResampledLen %d", len(y), want)
			}
			if want := int(math.Ceil(float64(len(x)) * float64(to) / float64(from))); abs(len(y)-want) > 1+int(float64(want)*maxRatioError) {
				t.Errorf("%d samples out, want %d within the time scale's error", len(y), want)
			}
			fromPrime := float64(to) * float64(r.orig) / float64(r.new)
			bound := amp * (passband + 2*math.Pi*f*seconds*maxRatioError)
			var worstIdeal, worstScaled float64
			for i := int(edge * float64(to)); i < len(y)-int(edge*float64(to)); i++ {
				tt := float64(i) / float64(to) // the output sample's time
				ideal := amp * math.Sin(2*math.Pi*f*tt)
				scaled := amp * math.Sin(2*math.Pi*f*tt*fromPrime/float64(from))
				worstIdeal = max(worstIdeal, math.Abs(float64(y[i])-ideal))
				worstScaled = max(worstScaled, math.Abs(float64(y[i])-scaled))
			}
			t.Logf("terms %d/%d (from' %.3f Hz): max |Δ| %.3g from the ideal sine (bound %.3g), %.3g from the scaled one",
				r.orig, r.new, fromPrime, worstIdeal, bound, worstScaled)
			if worstIdeal > bound {
				t.Errorf("max |Δ| %.3g from the ideal sine, above the stated %.3g", worstIdeal, bound)
			}
			if worstScaled > amp*passband {
				t.Errorf("max |Δ| %.3g from the sine at from', above the passband's %.3g", worstScaled, amp*passband)
			}
			s := r.NewStream()
			var streamed []float32
			for rest := x; len(rest) > 0; {
				k := min(len(rest), 4999)
				streamed = s.Append(streamed, rest[:k])
				rest = rest[k:]
			}
			if streamed = s.Flush(streamed); !equalF32(y, streamed) {
				t.Error("the stream differs from the whole-clip output")
			}
		})
	}
}
