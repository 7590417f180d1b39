package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
)

// checkLogMel checks a device's log-mel front end (gpu.LogMeler; devices
// without one compute it on the host and have no checks here) against its
// replay, package audio's LogMel.Compute: the same float32 and float64
// operations in the same order (the FFT on the host plan's twiddles, the
// powers, the filterbank's sums, the normalisation's sums in frame order).
// Only the float64 log may differ, in its last bit (the device's libm
// against Go's), which turns into a float32 ulp of a log value about once
// in 10⁸ and, through the normalisation, moves that bin by far less than
// 2⁻²⁰·(1 + |v|); so every value must lie within that of the replay's, and
// at least 99.9 % of them must be bit-identical (a wrong twiddle or an
// order changed would move most of them by ulps). Clips: lengths with odd
// and even frame counts, one of two hops only, a 30 s one, signals with
// silence (the log guard) and full-scale noise; front ends of 128 and 80
// mels, n_fft 512 and 1024, pad_to 16, log off.
func checkLogMel(h *harness) {
	if _, ok := h.q.(gpu.LogMeler); !ok {
		return
	}
	pp := func(rate int, win, hop float64, mels, nfft, padTo int, log bool) config.Preprocessor {
		return config.Preprocessor{SampleRate: rate, Normalize: "per_feature", WindowSize: win, WindowStride: hop,
			Window: "hann", Features: mels, NFFT: nfft, Log: log, FrameSplicing: 1, PadTo: padTo}
	}
	for _, c := range []struct {
		name    string
		p       config.Preprocessor
		seconds []float64
	}{
		{"lfm2-audio", pp(16000, 0.025, 0.01, 128, 512, 0, true), []float64{0.02, 0.5, 1.003, 4.9, 30}},
		{"80-mels/pad16", pp(16000, 0.025, 0.01, 80, 512, 16, true), []float64{0.7, 3.21}},
		{"nfft1024/24k", pp(24000, 0.04, 0.015, 96, 1024, 0, true), []float64{1.5}},
		{"no-log", pp(16000, 0.025, 0.01, 64, 512, 0, false), []float64{0.9}},
	} {
		m, err := audio.NewLogMel(c.p, audio.LogMelOptions{Workers: 1})
		if err != nil {
			h.fail(c.name, "front end: %v", err)
			continue
		}
		spec := m.DeviceSpec()
		if spec == nil {
			h.fail(c.name, "no device spec")
			continue
		}
		for k, sec := range c.seconds {
			n := int(sec * float64(c.p.SampleRate))
			x := make([]float32, n)
			for i := range x {
				t := float64(i) / float64(c.p.SampleRate)
				switch {
				case k%3 == 1 && i < n/3: // a silent stretch: the log guard
				case k%3 == 2:
					x[i] = float32(2*h.rng.Float64() - 1)
				default:
					x[i] = float32(0.3*math.Sin(2*math.Pi*220*t*(1+0.5*t)) + 0.05*h.rng.NormFloat64())
				}
			}
			name := fmt.Sprintf("%s/%gs", c.name, sec)
			want, err := m.Compute(x)
			in, err2 := m.PrepareDevice(x)
			if err != nil || err2 != nil {
				h.fail(name, "host: %v %v", err, err2)
				continue
			}
			dst := h.f32(in.Frames, want.Bins, k%2 == 1)
			xs := h.f32(1, n, false)
			m.ComputeOn(h.q, dst.view, xs.view, in)
			got, err := h.readView(dst)
			if err != nil {
				h.fail(name, "%v", err)
				continue
			}
			same, worst, bad := 0, 0.0, -1
			for i, g := range got {
				w := want.Data[i]
				if math.Float32bits(g) == math.Float32bits(w) {
					same++
					continue
				}
				d := math.Abs(float64(g) - float64(w))
				if b := math.Ldexp(1+math.Abs(float64(w)), -20); !(d <= b) && bad < 0 {
					bad = i
				}
				worst = max(worst, d)
			}
			detail := fmt.Sprintf("%d frames (%d valid): %d of %d values bit-identical, worst |Δ| %.3g", in.Frames, in.Valid, same, len(got), worst)
			pass := bad < 0 && float64(same) >= 0.999*float64(len(got))
			if bad >= 0 {
				detail += fmt.Sprintf("; frame %d bin %d: %.9g, the host's %.9g", bad/want.Bins, bad%want.Bins, got[bad], want.Data[bad])
			}
			h.record(name, pass, worst, 0, detail)
		}
	}
}
