package bench

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/omni-pipe/omni-pipe/audio"
)

// vowels are formant triples (Hz) of five vowels (Peterson & Barney's
// adult averages, rounded).
var vowels = [][3]float64{
	{730, 1090, 2440}, // a
	{270, 2290, 3010}, // i
	{300, 870, 2240},  // u
	{530, 1840, 2480}, // e
	{570, 840, 2410},  // o
}

// SpeechClip returns a speech-like signal of the given length at rate Hz:
// syllables of 120–300 ms separated by short pauses, each a voiced vowel
// (the harmonics of a gliding pitch around 120–180 Hz shaped by three
// formant resonances, with a spectral tilt) often preceded by a fricative
// burst of shaped noise. It is deterministic for a seed. Its only use is to
// give the front end and the encoder the work real speech gives them.
func SpeechClip(seconds float64, rate int, seed uint64) (*audio.Clip, error) {
	if !(seconds > 0) || seconds > 3600 || rate < 8000 || rate > 192000 {
		return nil, fmt.Errorf("speech clip: %v s at %d Hz (want 0–3600 s, 8–192 kHz)", seconds, rate)
	}
	rng := rand.New(rand.NewPCG(seed, 0x73706565636821))
	n := int(seconds * float64(rate))
	x := make([]float32, n)
	fs := float64(rate)
	nyq := 0.45 * fs
	phase := 0.0
	var noiseLP float64
	for pos := int(0.05 * fs); pos < n; {
		// An optional fricative: 30–80 ms of high-passed noise.
		if rng.Float64() < 0.5 {
			m := int((0.03 + 0.05*rng.Float64()) * fs)
			for i := 0; i < m && pos+i < n; i++ {
				w := rng.NormFloat64()
				hp := w - noiseLP // first-order high-pass of white noise
				noiseLP = 0.7*noiseLP + 0.3*w
				env := math.Sin(math.Pi * float64(i) / float64(m))
				x[pos+i] += float32(0.04 * env * hp)
			}
			pos += m
		}
		// The vowel.
		m := int((0.12 + 0.18*rng.Float64()) * fs)
		v := vowels[rng.IntN(len(vowels))]
		f0a := 120 + 60*rng.Float64()
		f0b := f0a * (0.85 + 0.25*rng.Float64())
		amp := 0.15 + 0.1*rng.Float64()
		for i := 0; i < m && pos+i < n; i++ {
			t := float64(i) / float64(m)
			f0 := f0a + (f0b-f0a)*t
			phase += 2 * math.Pi * f0 / fs
			var s float64
			for k := 1; float64(k)*f0 < math.Min(4000, nyq); k++ {
				f := float64(k) * f0
				g := 0.0
				for j, fj := range v {
					bw := 60 + 40*float64(j)
					d := (f - fj) / bw
					g += 1 / (1 + d*d) / float64(j+1)
				}
				s += g / math.Sqrt(float64(k)) * math.Sin(float64(k)*phase)
			}
			env := math.Sin(math.Pi * t)
			x[pos+i] += float32(amp * env * env * s)
		}
		pos += m
		pos += int((0.02 + 0.15*rng.Float64()) * fs) // pause
	}
	// Scale to a peak of 0.5 and add a faint noise floor.
	peak := 0.0
	for _, v := range x {
		peak = math.Max(peak, math.Abs(float64(v)))
	}
	g := 1.0
	if peak > 0 {
		g = 0.5 / peak
	}
	for i := range x {
		x[i] = float32(float64(x[i])*g + 1e-3*rng.NormFloat64())
	}
	return &audio.Clip{Samples: x, SampleRate: rate}, nil
}
