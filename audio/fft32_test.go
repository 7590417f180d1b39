package audio

import (
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"

	"github.com/mjibson/go-dsp/fft"
)

// TestFFT32: the float32 FFT agrees with the float64 one to float32
// precision (relative L2 error a few times 2⁻²⁴·log2 n), and is exact where
// the arithmetic is (a unit impulse).
func TestFFT32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 8, 512} {
		z := make([]complex64, n)
		x := make([]complex128, n)
		for i := range z {
			z[i] = complex(float32(rng.NormFloat64()), float32(rng.NormFloat64()))
			x[i] = complex128(z[i])
		}
		fft32(z)
		want := fft.FFT(x)
		var num, den float64
		for i := range z {
			num += math.Pow(cmplx.Abs(complex128(z[i])-want[i]), 2)
			den += math.Pow(cmplx.Abs(want[i]), 2)
		}
		rel := math.Sqrt(num / den)
		if bound := 4 * math.Log2(float64(max(n, 2))) / (1 << 24); rel > bound {
			t.Errorf("n %d: relative L2 error %.3g, want ≤ %.3g", n, rel, bound)
		}
		if n > 8 && rel == 0 {
			t.Errorf("n %d: no rounding at all: not a float32 transform", n)
		}
		imp := make([]complex64, n)
		imp[0] = 1
		fft32(imp)
		for i, v := range imp {
			if v != 1 {
				t.Fatalf("n %d: impulse spectrum[%d] = %v, want 1", n, i, v)
			}
		}
	}
}

// TestLogMelFFT32: the float32-FFT features differ from the float64 ones by
// float32 noise only, and do differ.
func TestLogMelFFT32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 16000)
	for i := range x {
		x[i] = float32(0.3*math.Sin(2*math.Pi*440*float64(i)/16000) + 0.01*rng.NormFloat64())
	}
	f64, err := NewLogMel(lfm2Preprocessor(), LogMelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f32, err := NewLogMel(lfm2Preprocessor(), LogMelOptions{FFT32: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f64.Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f32.Compute(x)
	if err != nil {
		t.Fatal(err)
	}
	var num, den float64
	for i := range a.Data {
		num += math.Pow(float64(a.Data[i]-b.Data[i]), 2)
		den += math.Pow(float64(a.Data[i]), 2)
	}
	rel := math.Sqrt(num / den)
	t.Logf("float32 FFT vs float64: relative L2 %.3g", rel)
	if rel == 0 || rel > 1e-4 {
		t.Errorf("relative L2 %.3g: want float32 noise (0 < rel ≤ 1e-4)", rel)
	}
	p := lfm2Preprocessor()
	p.NFFT = 500
	if _, err := NewLogMel(p, LogMelOptions{FFT32: true}); err == nil {
		t.Error("FFT32 with n_fft 500 accepted")
	}
}
