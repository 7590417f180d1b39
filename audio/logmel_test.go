package audio

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

func newLFM2LogMel(t testing.TB, opts LogMelOptions) *LogMel {
	t.Helper()
	cfg, err := config.ReadAudio("../testdata/lfm2-audio-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewLogMel(cfg.Preprocessor, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// melBound returns, time-major like Features.Data, how far the reference's
// float32 GPU log-mel of x may be from ours, by propagating float32
// rounding through every step (first order, with the log taken exactly):
//
//   - STFT: cuFFT's error. For a radix-2 FFT Higham (Accuracy and Stability
//     of Numerical Algorithms, Thm 24.2) bounds ‖ΔX‖₂ ≤ log2(N)·η·‖X‖₂ with
//     η = μ + γ4(√2+μ), μ the twiddle error (≤ 2u here), so every bin is
//     within ε = 9·7.7u·√N·‖x·w‖₂ for N = 512; cuFFT's mixed-radix kernels
//     have constants of that order. Window values torch computes with a
//     vectorised cosf differ from ours by ≤ 1 ulp (2u‖x·w‖₁); our float64
//     FFT of two frames at once leaks ≤ 1e-15·√N·‖both frames‖₂. When the
//     input itself differs (dx, e.g. after resampling), ‖dx·w‖₁ adds.
//   - power: ΔP ≤ 2|X|ε + ε² + 8u·P (six float32 roundings).
//   - mel: Σ fb·ΔP + (n_j+2)·u·mel for the n_j-term float32 dot product.
//   - log: -ln(1 - Δmel/(mel+2^-24)) + 3u·|ln| + 2u (logf within 1 ulp).
//   - normalisation: the mean's float32 sum over n frames adds n·u·mean|ln|
//     (γ_n), the variance likewise; z = (ln - mean)/std gets
//     (Δln + Δmean)/std + |z|·Δstd/std + 3u|z|.
//
// Frames past the valid ones hold pad_value in both and must be equal.
func melBound(m *LogMel, x []float32, dx []float64, f *Features) []float64 {
	n := len(x)
	frames, valid := m.Frames(n)
	y := make([]float32, n)
	y[0] = x[0]
	for i := 1; i < n; i++ {
		y[i] = x[i] - float32(m.preemph*x[i-1])
	}
	// |Δy| from |Δx| through y[i] = x[i] - 0.97·x[i-1] (plus one rounding).
	dy := make([]float64, n)
	if dx != nil {
		for i := range n {
			dy[i] = dx[i] + 2*u*math.Abs(float64(y[i]))
			if i > 0 {
				dy[i] += 0.97 * dx[i-1]
			}
		}
	}
	sqrtN := math.Sqrt(float64(m.nFFT))
	fftC := math.Log2(float64(m.nFFT)) * (2*u + 4*u*(math.Sqrt2+2*u)) * sqrtN
	l2 := make([]float64, frames)
	eps := make([]float64, frames)
	for t := range frames {
		var s2, s1, d1 float64
		for k := m.winLo; k < m.winHi; k++ {
			i := t*m.hop - m.nFFT/2 + k
			if i < 0 || i >= n {
				continue
			}
			v := float64(y[i]) * float64(m.window[k])
			s2 += v * v
			s1 += math.Abs(v)
			d1 += dy[i] * float64(m.window[k])
		}
		l2[t] = math.Sqrt(s2)
		eps[t] = fftC*l2[t] + 2*u*s1 + d1
	}
	for t := range frames { // the packing leak from the frame sharing the FFT
		mate := t ^ 1
		if mate < frames {
			eps[t] += 1e-15 * sqrtN * (l2[t] + l2[mate])
		}
	}

	nb := m.nMels
	logv := make([]float64, frames*nb)
	dlog := make([]float64, frames*nb)
	s := m.newScratch()
	for t := 0; t < frames; t += 2 {
		pair := min(2, frames-t)
		m.powerSpectra(y, t, pair, s)
		for p := range pair {
			pw := s.power[p*m.nBins : (p+1)*m.nBins]
			e := eps[t+p]
			for j := range nb {
				var mel, dmel float64
				for k := m.fbLo[j]; k < m.fbHi[j]; k++ {
					w := float64(m.fb[j*m.nBins+k])
					P := float64(pw[k])
					mel += w * P
					dmel += w * (2*math.Sqrt(P)*e + e*e + 8*u*P)
				}
				dmel += float64(m.fbHi[j]-m.fbLo[j]+2) * u * mel
				g := mel + float64(logZeroGuard)
				lv := math.Log(g)
				d := math.Inf(1)
				if dmel < g {
					d = -math.Log1p(-dmel/g) + 3*u*math.Abs(lv) + 2*u
				}
				logv[(t+p)*nb+j] = lv
				dlog[(t+p)*nb+j] = d
			}
		}
	}

	bound := make([]float64, len(f.Data))
	nv := float64(valid)
	for j := range nb {
		var mean, dmean, absMean float64
		for t := range valid {
			mean += logv[t*nb+j]
			dmean += dlog[t*nb+j]
			absMean += math.Abs(logv[t*nb+j])
		}
		mean, dmean, absMean = mean/nv, dmean/nv, absMean/nv
		dmean += (nv+2)*u*absMean + u*math.Abs(mean)
		var ss, dss float64
		for t := range valid {
			d := logv[t*nb+j] - mean
			e := dlog[t*nb+j] + dmean
			ss += d * d
			dss += 2*math.Abs(d)*e + e*e
		}
		dss += (nv + 3) * u * ss
		std := math.Sqrt(ss/(nv-1)) + float64(stdGuard)
		stdHi := math.Sqrt((ss+dss)/(nv-1)) + float64(stdGuard)
		stdLo := math.Sqrt(max(0, ss-dss)/(nv-1)) + float64(stdGuard)
		dstd := max(stdHi-std, std-stdLo) + 3*u*std
		for t := range valid {
			z := (logv[t*nb+j] - mean) / std
			if dstd < std && !math.IsInf(dlog[t*nb+j], 0) {
				bound[t*nb+j] = (dlog[t*nb+j]+dmean)/(std-dstd) + math.Abs(z)*dstd/(std-dstd) + 3*u*math.Abs(z) + u
			} else {
				// Rounding noise may be as large as the bin's spread (a
				// near-silent bin of a short clip): only |z| ≤ √(n-1)
				// holds, for any normalised value.
				bound[t*nb+j] = math.Abs(z) + math.Sqrt(nv-1)
			}
		}
	}
	return bound
}

// melCheck compares ours with the reference mel_f32 ([bins, T], the
// reference layout) under bound and returns the number of violations.
func melCheck(t *testing.T, f *Features, ref []float32, bound []float64, report bool) int {
	t.Helper()
	T := len(ref) / f.Bins
	if T != f.Frames {
		t.Fatalf("%d frames, reference %d", f.Frames, T)
	}
	var maxAbs, worst, dot, na, nb float64
	bad, exact := 0, 0
	for j := range f.Bins {
		for tt := range T {
			r, g := float64(ref[j*T+tt]), float64(f.At(tt, j))
			d := math.Abs(r - g)
			maxAbs = max(maxAbs, d)
			dot, na, nb = dot+r*g, na+r*r, nb+g*g
			if d == 0 {
				exact++
			}
			b := bound[tt*f.Bins+j]
			if tt >= f.Valid {
				b = 0
			}
			if d > b {
				if report && bad < 5 {
					t.Errorf("frame %d bin %d: %v, reference %v (|Δ| %.3g > bound %.3g)", tt, j, g, r, d, b)
				}
				bad++
				continue
			}
			if b > 0 {
				worst = max(worst, d/b)
			}
		}
	}
	if report {
		t.Logf("%d×%d: max |Δ| %.3g, cosine %.10f, %d bit-exact, worst |Δ|/bound %.3f, %d over the bound",
			T, f.Bins, maxAbs, dot/math.Sqrt(na*nb), exact, worst, bad)
	}
	return bad
}

// bf16Check compares our bf16-rounded features with the reference's bf16
// mel: the float32 values are within bound of each other, and rounding
// moves each by at most half a bf16 step, so the bf16 values may differ by
// bound plus half a step of each.
func bf16Check(t *testing.T, f *Features, bound []float64, refF32, refBF16 []float32) {
	t.Helper()
	T := f.Frames
	diff := 0
	var maxSteps int
	for j := range f.Bins {
		for tt := range T {
			r := refBF16[j*T+tt]
			if r != gpu.RoundBF16(refF32[j*T+tt]) {
				t.Fatalf("fixture: mel is not bf16(mel_f32) at frame %d bin %d", tt, j)
			}
			ours := f.At(tt, j)
			g := gpu.RoundBF16(ours)
			if g == r {
				continue
			}
			diff++
			maxSteps = max(maxSteps, abs(int(int16(gpu.F32ToBF16(g)))-int(int16(gpu.F32ToBF16(r)))))
			if d := math.Abs(float64(g - r)); d > bound[tt*f.Bins+j]+bf16HalfStep(g)+bf16HalfStep(r) {
				t.Errorf("frame %d bin %d: bf16 %v vs reference %v (float32 %v vs %v)", tt, j, g, r, ours, refF32[j*T+tt])
			}
		}
	}
	t.Logf("bf16: %d of %d values differ (at most %d bf16 steps, near zero)", diff, T*f.Bins, maxSteps)
}

// bf16HalfStep returns half the spacing of bfloat16 values around v.
func bf16HalfStep(v float32) float64 {
	_, e := math.Frexp(float64(v))
	return math.Ldexp(1, e-9) // 8 significant bits: spacing 2^(e-8)
}

func abs(x int) int { return max(x, -x) }

// The front end matches liquid-audio's processor (NeMo, float32 on CUDA) on
// every fixture case with audio, fed the same 16 kHz waveform.
func TestLogMelFixtures(t *testing.T) {
	m := newLFM2LogMel(t, LogMelOptions{})
	for _, name := range []string{"case1_question_16k", "case2_tone_noise_24k", "case4_two_turn"} {
		t.Run(name, func(t *testing.T) {
			f, err := safetensors.Open("../testdata/lfm2-audio-tiny/" + name + ".safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			x := f32s(t, f, "input_wav")
			if f.Tensor("wav_16k") != nil {
				x = f32s(t, f, "wav_16k")
			}
			feats, err := m.Compute(x)
			if err != nil {
				t.Fatal(err)
			}
			ref := f32s(t, f, "mel_f32")
			bound := melBound(m, x, nil, feats)
			melCheck(t, feats, ref, bound, true)
			feats.RoundBF16()
			bf16Check(t, feats, bound, ref, f32s(t, f, "mel"))
		})
	}
}

// End to end: the fixture's 24 kHz input, resampled here, gives the
// reference's features; the bound carries our resampling difference.
func TestLogMelEndToEndFixture(t *testing.T) {
	m := newLFM2LogMel(t, LogMelOptions{})
	f, err := safetensors.Open("../testdata/lfm2-audio-tiny/case2_tone_noise_24k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rate, _ := f.Tensor("input_sample_rate").Int64s()
	clip := &Clip{SampleRate: int(rate[0]), Samples: f32s(t, f, "input_wav")}
	feats, err := m.ComputeClip(clip)
	if err != nil {
		t.Fatal(err)
	}
	ref16 := f32s(t, f, "wav_16k")
	ours16, _ := Resample(clip.Samples, clip.SampleRate, 16000)
	dx := make([]float64, len(ref16))
	for i := range dx {
		dx[i] = math.Abs(float64(ours16[i]) - float64(ref16[i]))
	}
	melCheck(t, feats, f32s(t, f, "mel_f32"), melBound(m, ours16, dx, feats), true)
}

// torch_ref's cases: short clips, silence, DC, loud noise, and clips at
// 44.1 and 8 kHz through resampling.
func TestLogMelTorchRef(t *testing.T) {
	m := newLFM2LogMel(t, LogMelOptions{})
	ref := torchRef(t)
	for _, name := range []string{"mel/short320", "mel/short479", "mel/silence", "mel/dc_tone", "mel/loud_noise", "mel/tone_16k", "e2e/44100", "e2e/8000"} {
		t.Run(name, func(t *testing.T) {
			x := f32s(t, ref, name+"/input")
			var dx []float64
			if rate, ok := strings.CutPrefix(name, "e2e/"); ok {
				var from int
				fmt.Sscan(rate, &from)
				ref16 := f32s(t, ref, name+"/wav_16k")
				var err error
				if x, err = Resample(x, from, 16000); err != nil {
					t.Fatal(err)
				}
				dx = make([]float64, len(x))
				for i := range dx {
					dx[i] = math.Abs(float64(x[i]) - float64(ref16[i]))
				}
			}
			feats, err := m.Compute(x)
			if err != nil {
				t.Fatal(err)
			}
			want := f32s(t, ref, name+"/mel_f32")
			melCheck(t, feats, want, melBound(m, x, dx, feats), true)
			if name == "mel/silence" { // every log-mel is ln(2^-24): all normalise to exactly 0
				for i := range want {
					if want[i] != 0 || feats.Data[i] != 0 {
						t.Fatalf("silence: value %d is %v, reference %v; want 0", i, feats.Data[i], want[i])
					}
				}
			}
		})
	}
}

// The bound is tight enough to catch plausible mistakes: each planted
// fault must put many values outside it.
func TestLogMelPlantedFaults(t *testing.T) {
	f, err := safetensors.Open("../testdata/lfm2-audio-tiny/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, ref := f32s(t, f, "input_wav"), f32s(t, f, "mel_f32")
	faults := []struct {
		name  string
		plant func(m *LogMel)
	}{
		{"periodic Hann window", func(m *LogMel) {
			for i := range m.win {
				m.window[m.winLo+i] = float32(0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(m.win)))
			}
		}},
		{"pre-emphasis 0.96", func(m *LogMel) { m.preemph = 0.96 }},
		{"window not centred", func(m *LogMel) {
			copy(m.window, append(m.window[1:], 0))
			m.winLo--
		}},
		{"one filter a bin off", func(m *LogMel) {
			row := m.fb[40*m.nBins : 41*m.nBins]
			copy(row[1:], row)
			m.fbLo[40]++
			m.fbHi[40]++
		}},
		{"all_features normalisation", func(m *LogMel) { m.normalize = "all_features" }},
	}
	for _, fault := range faults {
		t.Run(fault.name, func(t *testing.T) {
			m := newLFM2LogMel(t, LogMelOptions{})
			fault.plant(m)
			feats, err := m.Compute(x)
			if err != nil {
				t.Fatal(err)
			}
			good := newLFM2LogMel(t, LogMelOptions{})
			bad := melCheck(t, feats, ref, melBound(good, x, nil, feats), false)
			t.Logf("%d of %d values outside the bound", bad, len(ref))
			if bad < feats.Valid/2 { // at least half of one filter's frames
				t.Errorf("only %d values outside the bound", bad)
			}
		})
	}
}

func TestLogMelFrames(t *testing.T) {
	m := newLFM2LogMel(t, LogMelOptions{})
	for _, tc := range []struct{ n, frames, valid int }{
		{320, 3, 2}, {479, 3, 2}, {480, 4, 3}, {16000, 101, 100}, {78463, 491, 490}, {32000, 201, 200},
	} {
		frames, valid := m.Frames(tc.n)
		if frames != tc.frames || valid != tc.valid {
			t.Errorf("Frames(%d) = %d, %d; want %d, %d", tc.n, frames, valid, tc.frames, tc.valid)
		}
		x := make([]float32, tc.n)
		for i := range x {
			x[i] = float32(math.Sin(float64(i)))
		}
		f, err := m.Compute(x)
		if err != nil {
			t.Fatal(err)
		}
		if f.Frames != tc.frames || f.Valid != tc.valid || len(f.Data) != tc.frames*128 {
			t.Errorf("%d samples: %d frames (%d valid), %d values", tc.n, f.Frames, f.Valid, len(f.Data))
		}
		// The terminal centred frame is masked to pad_value 0.
		for j := range f.Bins {
			if v := f.At(f.Frames-1, j); v != 0 {
				t.Fatalf("%d samples: last frame bin %d = %v, want 0", tc.n, j, v)
			}
		}
	}
}

// Options change only what they say: workers give identical output, bf16
// rounding is gpu.RoundBF16 of the float32 output, a clip at the front
// end's rate is not resampled.
func TestLogMelOptions(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 16000*3+77)
	for i := range x {
		x[i] = float32(0.2 * rng.NormFloat64())
	}
	base, err := newLFM2LogMel(t, LogMelOptions{}).Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{2, 3, 7} {
		f, err := newLFM2LogMel(t, LogMelOptions{Workers: w}).Compute(x)
		if err != nil {
			t.Fatal(err)
		}
		if !equalF32(f.Data, base.Data) {
			t.Errorf("Workers %d changes the features", w)
		}
	}
	bf, err := newLFM2LogMel(t, LogMelOptions{RoundBF16: true}).Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range base.Data {
		if bf.Data[i] != gpu.RoundBF16(v) {
			t.Fatalf("value %d: %v, want bf16(%v) = %v", i, bf.Data[i], v, gpu.RoundBF16(v))
		}
	}
	m := newLFM2LogMel(t, LogMelOptions{})
	same, err := m.ComputeClip(&Clip{SampleRate: 16000, Samples: x})
	if err != nil {
		t.Fatal(err)
	}
	if !equalF32(same.Data, base.Data) {
		t.Error("ComputeClip at 16 kHz differs from Compute")
	}
	x24 := tone(24000, 440, 0.3, 24000)
	viaClip, err := m.ComputeClip(&Clip{SampleRate: 24000, Samples: x24})
	if err != nil {
		t.Fatal(err)
	}
	x16, _ := Resample(x24, 24000, 16000)
	direct, _ := m.Compute(x16)
	if !equalF32(viaClip.Data, direct.Data) {
		t.Error("ComputeClip at 24 kHz differs from Resample then Compute")
	}
}

// Normalisation: per feature, each bin's valid frames have mean 0 and
// standard deviation std/(std+1e-5); all_features does the same over all
// bins at once. pad_to pads with pad_value.
func TestLogMelNormalisationAndPadding(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	x := make([]float32, 8000)
	for i := range x {
		x[i] = float32(0.1*rng.NormFloat64() + 0.3*math.Sin(float64(i)/7))
	}
	p := lfm2Preprocessor()
	p.PadTo, p.PadValue = 16, -3
	m, err := NewLogMel(p, LogMelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	if f.Frames != 64 || f.Valid != 50 {
		t.Fatalf("%d frames (%d valid), want 64 (50)", f.Frames, f.Valid)
	}
	for i := f.Valid * f.Bins; i < len(f.Data); i++ {
		if f.Data[i] != -3 {
			t.Fatalf("padded value %d = %v, want -3", i, f.Data[i])
		}
	}
	// Values are O(1); float32 rounding of 50 of them sums to < 50·u·4.
	const tol = 50 * u * 4
	for j := range f.Bins {
		var s, ss float64
		for tt := range f.Valid {
			s += float64(f.At(tt, j))
		}
		mean := s / float64(f.Valid)
		for tt := range f.Valid {
			d := float64(f.At(tt, j)) - mean
			ss += d * d
		}
		std := math.Sqrt(ss / float64(f.Valid-1))
		if math.Abs(mean) > tol || std > 1+tol || std < 0.99 {
			t.Errorf("bin %d: mean %g, std %g", j, mean, std)
		}
	}
	p.Normalize, p.PadTo = "all_features", 0
	m, _ = NewLogMel(p, LogMelOptions{})
	f, _ = m.Compute(x)
	vals := f.Data[:f.Valid*f.Bins]
	var s, ss float64
	for _, v := range vals {
		s += float64(v)
	}
	mean := s / float64(len(vals))
	for _, v := range vals {
		ss += (float64(v) - mean) * (float64(v) - mean)
	}
	if std := math.Sqrt(ss / float64(len(vals)-1)); math.Abs(mean) > 1e-4 || math.Abs(std-1) > 1e-4 {
		t.Errorf("all_features: mean %g, std %g", mean, std)
	}
}

// Other configurations: the parameters come from config.json.
func TestLogMelConfig(t *testing.T) {
	p := lfm2Preprocessor()
	p.SampleRate, p.WindowSize, p.WindowStride, p.NFFT, p.Features = 22050, 0.02, 0.01, 0, 80
	m, err := NewLogMel(p, LogMelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// NeMo: int(0.02·22050) = 441, int(0.01·22050) = 220, n_fft the next power of two.
	if m.win != 441 || m.hop != 220 || m.nFFT != 512 || m.nBins != 257 || m.nMels != 80 {
		t.Errorf("win %d hop %d n_fft %d bins %d mels %d", m.win, m.hop, m.nFFT, m.nBins, m.nMels)
	}
	if m.winLo != 35 || m.window[m.winLo] != 0 || m.window[m.winLo+220] != 1 {
		t.Errorf("window at %d: %v … %v", m.winLo, m.window[m.winLo], m.window[m.winLo+220])
	}
	f, err := m.Compute(tone(22050, 1000, 0.5, 22050))
	if err != nil {
		t.Fatal(err)
	}
	if f.Frames != 1+22050/220 || f.Bins != 80 {
		t.Errorf("%d frames × %d bins", f.Frames, f.Bins)
	}
	// The filterbank follows librosa for other sizes too.
	ref := f32s(t, torchRef(t), "fb/shim_22050_400_80")
	if got := melFilterbank(22050, 400, 80, 0, 11025); !equalF32(got, ref) {
		t.Error("filterbank for 22.05 kHz / 400 / 80 differs from librosa's")
	}

	bad := []struct {
		edit func(*config.Preprocessor)
		msg  string
	}{
		{func(p *config.Preprocessor) { p.SampleRate = 0 }, "sample_rate 0"},
		{func(p *config.Preprocessor) { p.WindowStride = 0 }, "window_stride"},
		{func(p *config.Preprocessor) { p.Features = 0 }, "features 0"},
		{func(p *config.Preprocessor) { p.FrameSplicing = 3 }, "frame_splicing 3"},
		{func(p *config.Preprocessor) { p.Window = "kaiser" }, `window "kaiser"`},
		{func(p *config.Preprocessor) { p.Normalize = "per_utterance" }, `normalize "per_utterance"`},
		{func(p *config.Preprocessor) { p.NFFT = 256 }, "n_fft 256"},
		{func(p *config.Preprocessor) { p.NFFT = 1 << 20 }, "n_fft 1048576 is larger"},
		{func(p *config.Preprocessor) { p.NFFT = 1<<16 + 1 }, "n_fft 65537 is larger"},
		{func(p *config.Preprocessor) { p.PadTo = -1 }, "pad_to -1"},
	}
	for _, tc := range bad {
		p := lfm2Preprocessor()
		tc.edit(&p)
		if _, err := NewLogMel(p, LogMelOptions{}); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("error %v, want one naming %q", err, tc.msg)
		}
	}
}

func TestLogMelInputErrors(t *testing.T) {
	m := newLFM2LogMel(t, LogMelOptions{})
	for _, n := range []int{0, 1, 159, 319} {
		if _, err := m.Compute(make([]float32, n)); !errors.Is(err, ErrTooShort) {
			t.Errorf("%d samples: error %v, want ErrTooShort", n, err)
		}
	}
	x := make([]float32, 1000)
	x[500] = float32(math.Inf(-1))
	if _, err := m.Compute(x); err == nil || !strings.Contains(err.Error(), "at 500") {
		t.Errorf("infinite sample: error %v", err)
	}
	if _, err := m.ComputeClip(&Clip{SampleRate: 5, Samples: x}); err == nil {
		t.Error("ComputeClip accepted a 5 Hz clip")
	}
}

// The Slaney filterbank equals librosa's (the fixtures' numpy shim) bit for
// bit, and torchaudio's (a float32 computation) to its float32 rounding.
func TestMelFilterbank(t *testing.T) {
	ref := torchRef(t)
	got := melFilterbank(16000, 512, 128, 0, 8000)
	if shim := f32s(t, ref, "fb/shim"); !equalF32(got, shim) {
		n := 0
		for i := range got {
			if got[i] != shim[i] {
				n++
			}
		}
		t.Errorf("%d of %d weights differ from librosa's", n, len(got))
	}
	ta, err := ref.Tensor("fb/torchaudio_f64").Float64s()
	if err != nil {
		t.Fatal(err)
	}
	// torchaudio.functional.melscale_fbanks works in float32: its bin and
	// mel-point frequencies are each within about 6u·fmax Hz (linspace,
	// then log/exp of the Slaney scale), so a triangle's rising or falling
	// edge (f - f_j)/(f_{j+1} - f_j) is within 16u·fmax/gap of ours, gap
	// the row's narrower side; the Slaney norm scales that by enorm.
	const nBins, fmax = 257, 8000.0
	minMel, maxMel := hzToMelSlaney(0), hzToMelSlaney(fmax)
	pts := make([]float64, 130)
	for i := range pts {
		pts[i] = melToHzSlaney(minMel + (maxMel-minMel)*float64(i)/129)
	}
	var worst float64
	for j := range 128 {
		gap := min(pts[j+1]-pts[j], pts[j+2]-pts[j+1])
		enorm := 2 / (pts[j+2] - pts[j])
		for k := range nBins {
			i := j*nBins + k
			d := math.Abs(float64(got[i]) - ta[i])
			bound := 16*u*fmax/gap*enorm + 2*u*math.Abs(ta[i])
			worst = max(worst, d/bound)
			if d > bound {
				t.Errorf("weight [%d, %d]: %v, torchaudio %v (bound %.3g)", j, k, got[i], ta[i], bound)
			}
		}
	}
	t.Logf("worst |Δ|/bound vs torchaudio: %.3f", worst)
}

// The packed two-frame FFT gives each frame's |X|² as a direct float64 DFT
// does, for power-of-two and Bluestein (n_fft 400) sizes.
func TestPowerSpectraDFT(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, nfft := range []int{512, 400} {
		p := lfm2Preprocessor()
		p.NFFT = nfft
		p.WindowSize = 0.02 // 320 samples
		m, err := NewLogMel(p, LogMelOptions{})
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, 4000)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		x[1000] = 40 // one loud frame next to quiet ones
		s := m.newScratch()
		var worst float64
		exact, total := 0, 0
		for tt := 0; tt+1 < 4000/m.hop; tt += 2 {
			m.powerSpectra(x, tt, 2, s)
			for p := range 2 {
				start := (tt+p)*m.hop - nfft/2
				frame := make([]float64, nfft)
				var norm2 float64
				for k := m.winLo; k < m.winHi; k++ {
					if i := start + k; i >= 0 && i < len(x) {
						frame[k] = float64(float32(x[i] * m.window[k]))
						norm2 += frame[k] * frame[k]
					}
					// The frame sharing the FFT counts too.
					if i := start + k + m.hop*(1-2*p); i >= 0 && i < len(x) {
						v := float64(x[i] * m.window[k])
						norm2 += v * v
					}
				}
				for k := range m.nBins {
					var re, im float64
					for n, v := range frame {
						sn, cs := math.Sincos(-2 * math.Pi * float64(k*n%nfft) / float64(nfft))
						re += v * cs
						im += v * sn
					}
					want := powerOf(complex(re, im))
					got := s.power[p*m.nBins+k]
					// Both sides round the same float32 steps (≤ 4u·P
					// apart when their float64 inputs differ); a float64
					// FFT is within log2(N)·7.7·2^-53·‖X‖ < 1e-14·‖X‖ per
					// bin (Higham Thm 24.2, ‖X‖² = N·‖frame‖², and the
					// packed frame at most doubles it), so |X|² within
					// 2|X|ε + ε².
					eps := 2e-14 * math.Sqrt(float64(nfft)*norm2)
					d := math.Abs(float64(got - want))
					b := 4*u*float64(want) + 2*math.Sqrt(float64(want))*eps + eps*eps
					worst = max(worst, d/b)
					if d == 0 {
						exact++
					}
					total++
					if d > b {
						t.Fatalf("n_fft %d frame %d bin %d: %v, DFT %v", nfft, tt+p, k, got, want)
					}
				}
			}
		}
		t.Logf("n_fft %d: %d of %d powers bit-exact, worst |Δ|/bound %.3f", nfft, exact, total, worst)
	}
}

// TestDeviceSpec: the device path is offered for the power-of-two,
// per_feature front ends it reproduces (its tables the host's), and not
// otherwise; PrepareDevice checks as Compute does and pre-emphasises as it.
func TestDeviceSpec(t *testing.T) {
	p := lfm2Preprocessor()
	m, err := NewLogMel(p, LogMelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := m.DeviceSpec()
	if s == nil || s != m.DeviceSpec() {
		t.Fatal("no device spec for LFM2-Audio's front end, or a new one each call")
	}
	if s.NFFT != 512 || s.Mels != 128 || len(s.Twiddles) != 1024 || len(s.FB) != 128*257 || len(s.FBLo) != 128 || s.WinHi-s.WinLo != 400 {
		t.Errorf("spec n_fft %d, %d mels, %d twiddles, fb %d, window [%d, %d)", s.NFFT, s.Mels, len(s.Twiddles), len(s.FB), s.WinLo, s.WinHi)
	}
	for j := range s.Mels {
		if lo, hi := s.FBLo[j], s.FBHi[j]; lo > 0 && s.FB[j*257+int(lo)-1] != 0 || hi < 257 && s.FB[j*257+int(hi)] != 0 || lo >= hi {
			t.Fatalf("filter %d: span [%d, %d) is not its nonzero span", j, lo, hi)
		}
	}
	for _, c := range []struct {
		name string
		edit func(*config.Preprocessor, *LogMelOptions)
	}{
		{"n_fft 400 (Bluestein)", func(p *config.Preprocessor, _ *LogMelOptions) { p.NFFT = 400 }},
		{"all_features", func(p *config.Preprocessor, _ *LogMelOptions) { p.Normalize = "all_features" }},
		{"FFT32", func(_ *config.Preprocessor, o *LogMelOptions) { o.FFT32 = true }},
		{"RoundBF16", func(_ *config.Preprocessor, o *LogMelOptions) { o.RoundBF16 = true }},
	} {
		p, o := lfm2Preprocessor(), LogMelOptions{}
		c.edit(&p, &o)
		m, err := NewLogMel(p, o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if m.DeviceSpec() != nil {
			t.Errorf("%s: a device spec for a front end the device path does not reproduce", c.name)
		}
	}
	x := benchSignal(16000, 1)
	in, err := m.PrepareDevice(x)
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	if in.Frames != f.Frames || in.Valid != f.Valid || in.Bins != f.Bins || in.Computed != 101 || len(in.Samples) != len(x) ||
		in.Samples[0] != x[0] || in.Samples[5] != x[5]-float32(float32(0.97)*x[4]) {
		t.Errorf("prepared %d/%d/%d rows (computed %d), Compute %d/%d/%d", in.Frames, in.Valid, in.Bins, in.Computed, f.Frames, f.Valid, f.Bins)
	}
	if _, err := m.PrepareDevice(x[:100]); !errors.Is(err, ErrTooShort) {
		t.Errorf("a clip of 100 samples: %v, want ErrTooShort", err)
	}
	bad := slices.Clone(x)
	bad[7] = float32(math.NaN())
	if _, err := m.PrepareDevice(bad); err == nil {
		t.Error("a NaN sample was accepted")
	}
}
