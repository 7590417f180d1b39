package parity

import (
	"errors"
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

const (
	// resampleSNR bounds the resampler against torchaudio's: both are
	// float32 sums of a ~100-tap windowed sinc (≈1e-7 relative each), far
	// above 120 dB apart; a wrong kernel, phase or length is far below.
	resampleSNR = 120
	// melFFTFactor bounds the log-mel distance to the reference by this many
	// times the distance a plain float32 FFT alone (audio's FFT32: radix 2,
	// exact twiddles) puts between the features and float64 ones on the
	// same waveform. omni-pipe's FFT is float64 and the reference's is
	// cuFFT's float32 one, so the distance to the reference is the
	// reference's own STFT noise: 1.5 to 2.7 times the radix-2 FFT's on the
	// fixtures (cuFFT's transform is not the textbook one; the reference's
	// other float32 steps add little: summing the filterbank in float32
	// changes the emulation's distance by under 1%). A wrong window, hop or
	// filter is orders of magnitude farther.
	melFFTFactor = 4
)

// frontEnd checks the resampler, the log-mel features, the encoder and the
// adapter.
func (c *comparer) frontEnd(m *lfm2audio.Model) error {
	if c.ref.Has("wav_16k") {
		c.resample()
	}
	if c.ref.Has("mel_f32") {
		if err := c.mel(m); err != nil {
			return err
		}
	}
	if c.ref.Has("encoder_out") {
		c.compareNoisy("encoder out", "encoder_out")
		c.compareNoisy("adapter out", "adapter_out")
	}
	return nil
}

// resample compares omni-pipe's resampling of the reference's input clip
// with the reference's own 16 kHz waveform.
func (c *comparer) resample() {
	want, _ := c.ref.Floats("wav_16k")
	got, _, ok := c.bf.Floats("wav_16k")
	if !ok || len(got) != len(want) {
		c.rep.add(Row{Stage: "resample 16k", Value: fmt.Sprintf("%d samples, reference %d", len(got), len(want))})
		return
	}
	d := numcmp.Compare(got, want)
	c.rep.add(Row{Stage: "resample 16k", Value: fmt.Sprintf("max|Δ| %.3g, SNR %.1f dB", d.MaxAbs, d.SNRdB),
		Bound: fmt.Sprintf("SNR ≥ %d dB", resampleSNR), OK: d.SNRdB >= resampleSNR && d.NaNs == 0})
}

// melCheck holds the log-mel comparison on the reference's own 16 kHz
// waveform: ours are omni-pipe's features and fft32 those of the same
// front end with a float32 FFT, both [bins, frames] as the reference's.
type melCheck struct {
	ours, fft32 []float32
	got         numcmp.Diff // ours vs the reference's mel_f32
	fftNoise    float64     // relative L2 of fft32 vs ours
}

// ok applies the rule: within melFFTFactor times the float32 FFT's
// distance.
func (mc *melCheck) ok() bool { return mc.got.RelL2 <= melFFTFactor*mc.fftNoise && mc.got.NaNs == 0 }

// checkMel computes the log-mel features of the reference's own 16 kHz
// waveform (its wav_16k, or its input when that is at 16 kHz), with
// omni-pipe's front end and with a float32 FFT, and compares them with its
// mel_f32.
func checkMel(m *lfm2audio.Model, ref *refcase.Case) (*melCheck, error) {
	name := "wav_16k"
	if !ref.Has(name) {
		rate, err := ref.Ints("input_sample_rate")
		if err != nil || len(rate) != 1 || rate[0] != m.Mel.SampleRate() {
			return nil, errors.New("no 16 kHz waveform (wav_16k, or input_wav at 16 kHz) to compute the features from")
		}
		name = "input_wav"
	}
	wav, err := ref.Floats(name)
	if err != nil {
		return nil, err
	}
	want, err := ref.Floats("mel_f32")
	if err != nil {
		return nil, err
	}
	emu, err := audio.NewLogMel(m.Cfg.Preprocessor, audio.LogMelOptions{FFT32: true})
	if err != nil {
		return nil, err
	}
	f, err := m.Mel.Compute(wav)
	if err != nil {
		return nil, fmt.Errorf("log-mel of the reference's %s: %w", name, err)
	}
	f32, err := emu.Compute(wav)
	if err != nil {
		return nil, fmt.Errorf("float32-FFT log-mel of the reference's %s: %w", name, err)
	}
	mc := &melCheck{ours: binMajor(f), fft32: binMajor(f32)}
	if len(mc.ours) != len(want) {
		return nil, fmt.Errorf("log-mel of the reference's %s: %d values, reference %d", name, len(mc.ours), len(want))
	}
	mc.got = numcmp.Compare(mc.ours, want)
	mc.fftNoise = numcmp.Compare(mc.fft32, mc.ours).RelL2
	return mc, nil
}

// binMajor returns features as the reference stores them, [bins, frames].
func binMajor(f *audio.Features) []float32 {
	out := make([]float32, len(f.Data))
	for t := range f.Frames {
		for b := range f.Bins {
			out[b*f.Frames+t] = f.Data[t*f.Bins+b]
		}
	}
	return out
}

// mel compares the front end on the reference's own 16 kHz waveform (the
// resampler has its own row): the float32 features, then their bf16 cast,
// which the encoder receives.
func (c *comparer) mel(m *lfm2audio.Model) error {
	mc, err := checkMel(m, c.ref)
	if err != nil {
		c.rep.add(Row{Stage: "mel (f32)", Value: err.Error()})
		return nil
	}
	c.rep.add(Row{Stage: "mel (f32)", Value: fmt.Sprintf("rel L2 %.3g, max|Δ| %.3g", mc.got.RelL2, mc.got.MaxAbs),
		Bound: fmt.Sprintf("rel L2 ≤ %d×%.3g (a float32 FFT's, measured)", melFFTFactor, mc.fftNoise), OK: mc.ok()})
	want, err := c.ref.Floats("mel")
	if err != nil {
		return nil
	}
	// Casting to bf16 turns the float32 disagreement into at most one bf16
	// ulp where a value sits at a rounding boundary: each element must be
	// within one ulp of the larger magnitude plus the float32 distance.
	flips, bad := 0, 0
	for i, v := range mc.ours {
		g := float64(gpu.RoundBF16(v))
		w := float64(want[i])
		if g == w {
			continue
		}
		flips++
		if math.Abs(g-w) > ulp(math.Max(math.Abs(g), math.Abs(w)))+mc.got.MaxAbs {
			bad++
		}
	}
	c.rep.add(Row{Stage: "mel (bf16)", Value: fmt.Sprintf("%d of %d differ (bf16 rounding flips)", flips, len(want)),
		Bound: "each ≤ 1 ulp + f32 distance", OK: bad == 0})
	return nil
}
