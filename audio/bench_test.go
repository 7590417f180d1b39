package audio

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mjibson/go-dsp/fft"

	"github.com/omni-pipe/omni-pipe/stages/config"
)

// benchSignal returns seconds of noisy tones at rate.
func benchSignal(rate int, seconds float64) []float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, int(float64(rate)*seconds))
	for i := range x {
		t := float64(i) / float64(rate)
		x[i] = float32(0.3*math.Sin(2*math.Pi*220*t) + 0.05*rng.NormFloat64())
	}
	return x
}

// lfm2Preprocessor is LFM2-Audio's released preprocessor section.
func lfm2Preprocessor() config.Preprocessor {
	return config.Preprocessor{
		SampleRate: 16000, Normalize: "per_feature", WindowSize: 0.025, WindowStride: 0.01,
		Window: "hann", Features: 128, NFFT: 512, Log: true, FrameSplicing: 1, Dither: 1e-5,
	}
}

// BenchmarkResample reports the cost of resampling one second of audio to
// 16 kHz (ns/op is per second of input).
func BenchmarkResample(b *testing.B) {
	for _, rate := range []int{24000, 44100, 48000, 8000} {
		b.Run(fmt.Sprintf("%dto16k", rate), func(b *testing.B) {
			r, err := NewResampler(rate, 16000)
			if err != nil {
				b.Fatal(err)
			}
			x := benchSignal(rate, 10)
			b.SetBytes(int64(4 * len(x) / 10))
			b.ResetTimer()
			for b.Loop() {
				r.Resample(x[:rate])
			}
		})
	}
}

// BenchmarkLogMel reports the front end's cost for clips of 1, 4.9 and 10 s on 1–16 workers
// (ns/op is per clip; the sec/s metric is audio seconds per wall second).
func BenchmarkLogMel(b *testing.B) {
	for _, workers := range []int{1, 2, 4, 8, 16} {
		for _, sec := range []float64{1, 4.9, 10} {
			b.Run(fmt.Sprintf("%gs/workers%d", sec, workers), func(b *testing.B) {
				m, err := NewLogMel(lfm2Preprocessor(), LogMelOptions{Workers: workers})
				if err != nil {
					b.Fatal(err)
				}
				x := benchSignal(16000, sec)
				b.ResetTimer()
				for b.Loop() {
					if _, err := m.Compute(x); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(sec*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
			})
		}
	}
}

// BenchmarkGoDSPFFT512 measures one go-dsp FFT of 512 points with its
// default worker pool (GOMAXPROCS goroutines per call) and with one worker.
func BenchmarkGoDSPFFT512(b *testing.B) {
	z := make([]complex128, 512)
	for i := range z {
		z[i] = complex(math.Sin(float64(i)), 0)
	}
	for _, workers := range []int{0, 1} {
		b.Run(fmt.Sprintf("pool%d", workers), func(b *testing.B) {
			fft.SetWorkerPoolSize(workers)
			defer fft.SetWorkerPoolSize(1)
			b.ReportAllocs()
			for b.Loop() {
				fft.FFT(z)
			}
		})
	}
}

// BenchmarkFFT64 measures one 512-point transform of the front end's
// float64 FFT plan (in place, no allocation), to set against
// BenchmarkGoDSPFFT512.
func BenchmarkFFT64(b *testing.B) {
	p, err := newFFTPlan(512)
	if err != nil {
		b.Fatal(err)
	}
	x := make([]complex128, 512)
	for i := range x {
		x[i] = complex(math.Sin(float64(i)), 0)
	}
	z := make([]complex128, 512)
	b.ReportAllocs()
	for b.Loop() {
		copy(z, x)
		p.transform(z)
	}
}

// BenchmarkDecode reports WAV decoding of 10 s of 16-bit audio.
func BenchmarkDecode(b *testing.B) {
	for _, ch := range []int{1, 2} {
		b.Run(fmt.Sprintf("pcm16_24k_%dch_10s", ch), func(b *testing.B) {
			x := benchSignal(24000, 10)
			inter := make([]float32, 0, len(x)*ch)
			for _, v := range x {
				for range ch {
					inter = append(inter, v)
				}
			}
			var buf bytes.Buffer
			if err := writeTestWAV(&buf, wavSpec{tag: tagPCM, channels: ch, rate: 24000, bits: 16}, inter); err != nil {
				b.Fatal(err)
			}
			data := buf.Bytes()
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := DecodeBytes(data, DecodeOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFrontEnd24k is the whole audio front end for 10 s of 24 kHz
// input (the demo's mic rate): resample to 16 kHz, then log-mel in bf16.
func BenchmarkFrontEnd24k(b *testing.B) {
	m, err := NewLogMel(lfm2Preprocessor(), LogMelOptions{RoundBF16: true})
	if err != nil {
		b.Fatal(err)
	}
	clip := &Clip{SampleRate: 24000, Samples: benchSignal(24000, 10)}
	for b.Loop() {
		if _, err := m.ComputeClip(clip); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(10*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
}
