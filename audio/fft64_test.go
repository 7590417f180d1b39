package audio

import (
	"math"
	"math/bits"
	"math/cmplx"
	"math/rand/v2"
	"testing"

	"github.com/mjibson/go-dsp/fft"

	"github.com/omni-pipe/omni-pipe/stages/config"
)

// TestFFTPlanSizes: every power of two 1..4096 gets a plan that transforms
// a unit impulse into all ones and a constant into one spike; other sizes
// are refused with an error, not a panic.
func TestFFTPlanSizes(t *testing.T) {
	for n := 1; n <= 4096; n *= 2 {
		p, err := newFFTPlan(n)
		if err != nil {
			t.Fatalf("n %d: %v", n, err)
		}
		z := make([]complex128, n)
		z[0] = 1
		p.transform(z)
		for k, v := range z {
			if v != 1 {
				t.Fatalf("n %d: impulse spectrum[%d] = %v, want 1", n, k, v)
			}
		}
		for i := range z {
			z[i] = 1
		}
		p.transform(z)
		for k, v := range z {
			want := complex(0, 0)
			if k == 0 {
				want = complex(float64(n), 0)
			}
			if cmplx.Abs(v-want) > 1e-12*float64(n) {
				t.Fatalf("n %d: constant spectrum[%d] = %v, want %v", n, k, v, want)
			}
		}
	}
	for _, n := range []int{0, -1, -8, 3, 6, 12, 400, 500, 1000, maxFFT64 + 1, maxFFT64 * 2} {
		if p, err := newFFTPlan(n); err == nil {
			t.Errorf("n %d: got a plan of %d points, want an error", n, p.n)
		}
	}
	p, _ := newFFTPlan(8)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("an 8-point plan transformed 16 points")
			}
		}()
		p.transform(make([]complex128, 16))
	}()
}

// naiveDFT is the O(n²) float64 DFT, its angles reduced exactly (k·t mod n)
// before the one rounding of 2π·m/n, summed with compensation.
func naiveDFT(x []complex128) []complex128 {
	n := len(x)
	out := make([]complex128, n)
	for k := range n {
		var re, im, cre, cim float64
		add := func(s *float64, c *float64, v float64) { // Neumaier
			t := *s + v
			if math.Abs(*s) >= math.Abs(v) {
				*c += (*s - t) + v
			} else {
				*c += (v - t) + *s
			}
			*s = t
		}
		for t, v := range x {
			sin, cos := math.Sincos(-2 * math.Pi * float64(k*t%n) / float64(n))
			add(&re, &cre, real(v)*cos)
			add(&re, &cre, -imag(v)*sin)
			add(&im, &cim, real(v)*sin)
			add(&im, &cim, imag(v)*cos)
		}
		out[k] = complex(re+cre, im+cim)
	}
	return out
}

// TestFFT64DFT: the plan agrees with a direct DFT to float64 precision, the
// relative L2 error within 2⁻⁵³·log2 n times a small constant (measured ≤
// about 0.6 of it).
func TestFFT64DFT(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for n := 2; n <= 4096; n *= 2 {
		p, err := newFFTPlan(n)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]complex128, n)
		for i := range x {
			x[i] = complex(rng.NormFloat64(), rng.NormFloat64())
		}
		want := naiveDFT(x)
		z := append([]complex128(nil), x...)
		p.transform(z)
		var num, den float64
		for k := range z {
			num += math.Pow(cmplx.Abs(z[k]-want[k]), 2)
			den += math.Pow(cmplx.Abs(want[k]), 2)
		}
		rel := math.Sqrt(num / den)
		lg := float64(bits.Len(uint(n)) - 1)
		bound := 4 * lg * 0x1p-53
		t.Logf("n %4d: relative L2 error %.3g (%.2f of %.3g)", n, rel, rel/bound, bound)
		if rel > bound {
			t.Errorf("n %d: relative L2 error %.3g, want ≤ %.3g", n, rel, bound)
		}
	}
}

// mulAdd is x·y + z as the compiler builds it: fused into one rounding
// where it fuses (arm64, GOAMD64=v3), two otherwise.
//
//go:noinline
func mulAdd(x, y, z float64) float64 { return x*y + z }

// unfused reports whether this build rounds products before sums: then
// fftPlan and go-dsp, the same operations, agree exactly; a fusing compiler
// may fuse the two codes' products differently.
func unfused() bool {
	const e = 0x1p-30
	return mulAdd(1+e, 1-e, -1) == 0 // fused: -e²
}

// TestFFT64GoDSP: the plan computes go-dsp's radix-2 FFT, operation for
// operation: where the compiler fuses no multiply-add (amd64 v1/v2) the two
// agree exactly (== so zeros of either sign match); elsewhere within
// float64 rounding.
func TestFFT64GoDSP(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	exact := unfused()
	t.Logf("products rounded before sums: %v (exact comparison)", exact)
	for n := 1; n <= 4096; n *= 2 {
		p, err := newFFTPlan(n)
		if err != nil {
			t.Fatal(err)
		}
		for trial := range 3 {
			x := make([]complex128, n)
			for i := range x {
				switch trial {
				case 0:
					x[i] = complex(rng.NormFloat64(), rng.NormFloat64())
				case 1: // real, as the front end packs it (two real frames)
					x[i] = complex(float64(float32(rng.NormFloat64())), 0)
				case 2: // wide dynamic range
					x[i] = complex(math.Ldexp(rng.NormFloat64(), rng.IntN(60)-30), rng.NormFloat64())
				}
			}
			want := fft.FFT(x)
			z := append([]complex128(nil), x...)
			p.transform(z)
			var norm float64
			for _, v := range want {
				norm = max(norm, cmplx.Abs(v))
			}
			for k := range z {
				d := cmplx.Abs(z[k] - want[k])
				if exact && d != 0 || d > 1e-14*norm {
					t.Fatalf("n %d trial %d bin %d: %v, go-dsp %v", n, trial, k, z[k], want[k])
				}
			}
		}
	}
}

// ulpDiff is the distance between two float32 values in units in the last
// place (adjacent floats are 1 apart, ±0 are equal).
func ulpDiff(a, b float32) int64 {
	ord := func(f float32) int64 {
		u := int64(math.Float32bits(f))
		if u&(1<<31) != 0 {
			return -(u &^ (1 << 31))
		}
		return u
	}
	d := ord(a) - ord(b)
	if d < 0 {
		d = -d
	}
	return d
}

// TestLogMelFFT64GoDSP: features through fftPlan match those through
// go-dsp's FFT (the plan forced off) within one float32 ulp, with a tiny
// fraction differing at all (none without fused multiply-adds), for several configurations,
// signals and lengths, and do not depend on the number of workers.
func TestLogMelFFT64GoDSP(t *testing.T) {
	type cfg struct {
		name string
		p    config.Preprocessor
	}
	p16 := lfm2Preprocessor()
	p8 := lfm2Preprocessor()
	p8.SampleRate, p8.NFFT = 8000, 256 // 200-sample window
	p8h := p8
	p8h.Window, p8h.Normalize, p8h.Features = "hamming", "all_features", 64
	p16w := lfm2Preprocessor()
	p16w.NFFT = 1024
	p16n := lfm2Preprocessor()
	p16n.Normalize, p16n.PadTo = "none", 16
	cfgs := []cfg{{"16k/512", p16}, {"8k/256", p8}, {"8k/256/hamming/all", p8h}, {"16k/1024", p16w}, {"16k/512/none/pad16", p16n}}
	rng := rand.New(rand.NewPCG(15, 16))
	type clip struct {
		name string
		gen  func(i, rate int) float32
	}
	clips := []clip{
		{"noise", func(int, int) float32 { return float32(0.1 * rng.NormFloat64()) }},
		{"tones", func(i, rate int) float32 {
			tt := float64(i) / float64(rate)
			return float32(0.4*math.Sin(2*math.Pi*440*tt) + 0.2*math.Sin(2*math.Pi*1234.5*tt) + 0.05*math.Sin(2*math.Pi*3000*tt))
		}},
		{"impulse", func(i, rate int) float32 {
			if i == rate/3 {
				return 0.9
			}
			return 0
		}},
		{"loud", func(int, int) float32 { return float32(rng.Float64()*2 - 1) }},
	}
	var diff, total int
	var worst int64
	for _, c := range cfgs {
		fast, err := NewLogMel(c.p, LogMelOptions{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fast.plan == nil {
			t.Fatalf("%s: no FFT plan for n_fft %d", c.name, fast.nFFT)
		}
		slow, _ := NewLogMel(c.p, LogMelOptions{})
		slow.plan = nil // go-dsp's FFT
		par, _ := NewLogMel(c.p, LogMelOptions{Workers: 3})
		rate := c.p.SampleRate
		for _, cl := range clips {
			for _, n := range []int{rate/50 + 1, rate / 10, rate/2 + 7, rate + 1, 3*rate + 333} {
				x := make([]float32, n)
				for i := range x {
					x[i] = cl.gen(i, rate)
				}
				a, err := fast.Compute(x)
				if err != nil {
					t.Fatalf("%s %s %d: %v", c.name, cl.name, n, err)
				}
				b, err := slow.Compute(x)
				if err != nil {
					t.Fatal(err)
				}
				d, err := par.Compute(x)
				if err != nil {
					t.Fatal(err)
				}
				for i := range a.Data {
					if math.Float32bits(a.Data[i]) != math.Float32bits(d.Data[i]) {
						t.Fatalf("%s %s %d: value %d is %v with 1 worker, %v with 3", c.name, cl.name, n, i, a.Data[i], d.Data[i])
					}
					u := ulpDiff(a.Data[i], b.Data[i])
					worst = max(worst, u)
					if u > 1 {
						t.Errorf("%s %s %d: value %d (frame %d bin %d) is %v, go-dsp's %v (%d ulp)",
							c.name, cl.name, n, i, i/a.Bins, i%a.Bins, a.Data[i], b.Data[i], u)
					}
					if u != 0 {
						diff++
					}
					total++
				}
			}
		}
	}
	frac := float64(diff) / float64(total)
	t.Logf("%d of %d features differ from the go-dsp path (fraction %.3g), worst %d ulp", diff, total, frac, worst)
	if frac > 1e-4 || unfused() && diff != 0 {
		t.Errorf("%d of %d features differ from go-dsp's (fraction %.3g)", diff, total, frac)
	}
}

// TestLogMelFFTPlanChoice: NewLogMel builds a plan exactly for power-of-two
// n_fft, keeps go-dsp's Bluestein FFT for the others, and refuses a size
// past the plan's range with an error instead of a panic.
func TestLogMelFFTPlanChoice(t *testing.T) {
	for _, c := range []struct {
		nfft int
		plan bool
	}{{0, true}, {400, false}, {500, false}, {512, true}, {600, false}, {1024, true}, {2048, true}} {
		p := lfm2Preprocessor()
		p.NFFT = c.nfft
		m, err := NewLogMel(p, LogMelOptions{})
		if err != nil {
			t.Fatalf("n_fft %d: %v", c.nfft, err)
		}
		if got := m.plan != nil; got != c.plan {
			t.Errorf("n_fft %d (%d): plan %v, want %v", c.nfft, m.nFFT, got, c.plan)
		}
		if _, err := m.Compute(benchSignal(16000, 0.3)); err != nil {
			t.Errorf("n_fft %d: %v", c.nfft, err)
		}
	}
	if _, err := newFFTPlan(maxFFT64 * 2); err == nil {
		t.Errorf("a plan of %d points accepted", maxFFT64*2)
	}
}
