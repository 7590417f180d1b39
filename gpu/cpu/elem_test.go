package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// specials are inputs every elementwise kernel meets in the parity test.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0.5, -0.3465736, 0.3465736, -0.34657, 1e-30, -1e-30,
	1e-40, -1e-40, 88, 88.8, 89, 100, -87, -87.5, -103, -104, -110, 3.4e38, -3.4e38,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0x1.fffep+127}

func randomInputs(rng *rand.Rand, n int) []float32 {
	a := make([]float32, n)
	for i := range a {
		switch rng.IntN(4) {
		case 0:
			a[i] = specials[rng.IntN(len(specials))]
		case 1:
			a[i] = float32(rng.NormFloat64() * 30)
		default:
			a[i] = float32(rng.NormFloat64())
		}
	}
	return a
}

// sameBits compares results, treating any two NaNs as equal (payloads
// follow each machine's NaN rules).
func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// TestElemParity: the assembly and Go elementwise kernels agree bit for bit
// (fmaRow excepted: it fuses in assembly), at every length, on random and
// special inputs.
func TestElemParity(t *testing.T) {
	if !haveAsm {
		t.Skip("no assembly kernels on this CPU/arch: nothing to compare")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	type unary struct {
		name string
		fn   func(asm bool, d, a []float32)
	}
	unaries := []unary{
		{"exp", func(asm bool, d, a []float32) { vExpShift(asm, d, a, 0.75) }},
		{"silu", vSiLU},
		{"sigmoid", vSigmoid},
		{"elu", vELU},
		{"round", func(asm bool, d, a []float32) { copy(d, a); vRound(asm, d) }},
		{"scale", func(asm bool, d, a []float32) { vScale(asm, d, a, -1.7) }},
		{"divs", func(asm bool, d, a []float32) { copy(d, a); vDivs(asm, d, 3.3) }},
		{"add", func(asm bool, d, a []float32) { vAdd(asm, d, a, a[1:]) }},
		{"mul", func(asm bool, d, a []float32) { vMul(asm, d, a, a[1:]) }},
		{"glu", func(asm bool, d, a []float32) { vGLU(asm, d, a, a[1:]) }},
		{"lnorm", func(asm bool, d, a []float32) { vLNorm(asm, d, a, a[1:], a[2:], 0.25, 1.5) }},
		{"lnorm-nobias", func(asm bool, d, a []float32) { vLNorm(asm, d, a, a[1:], nil, -0.25, 0.5) }},
		{"sum", func(asm bool, d, a []float32) { d[0] = vSum(asm, a[:len(d)]) }},
		{"sumsq", func(asm bool, d, a []float32) { d[0] = vSumSq(asm, a[:len(d)], 0.1) }},
	}
	for _, u := range unaries {
		for n := 1; n <= 70; n++ {
			for range 4 {
				a := randomInputs(rng, n+2)
				if u.name == "sum" || u.name == "sumsq" {
					for i := range a {
						if math.IsNaN(float64(a[i])) || math.IsInf(float64(a[i]), 0) || math.Abs(float64(a[i])) > 1e30 {
							a[i] = 1
						}
					}
				}
				d1, d2 := make([]float32, n), make([]float32, n)
				u.fn(true, d1, a)
				u.fn(false, d2, a)
				for i := range d1 {
					if !sameBits(d1[i], d2[i]) {
						t.Fatalf("%s n=%d: element %d of %v: asm %v (%#x), go %v (%#x)", u.name, n, i, a[i],
							d1[i], math.Float32bits(d1[i]), d2[i], math.Float32bits(d2[i]))
					}
				}
			}
		}
	}
	// max: exact whatever the order (NaN-free input).
	for n := 1; n < 50; n++ {
		a := randomInputs(rng, n)
		for i := range a {
			if a[i] != a[i] {
				a[i] = 0
			}
		}
		if m1, m2 := vMax(true, a), vMax(false, a); m1 != m2 {
			t.Fatalf("max n=%d: asm %v go %v", n, m1, m2)
		}
	}
}

// ulps returns the distance of got from the float64 value want in units of
// float32's ulp at want.
func ulps(got float32, want float64) float64 {
	if math.IsInf(want, 0) || math.IsNaN(want) {
		if float64(got) == want || (math.IsNaN(want) && got != got) {
			return 0
		}
		return math.Inf(1)
	}
	w := float32(want)
	ulp := float64(math.Nextafter32(float32(math.Abs(float64(w))), float32(math.Inf(1)))) - math.Abs(float64(w))
	if math.IsInf(ulp, 0) {
		ulp = math.Ldexp(1, 104)
	}
	ulp = max(ulp, math.Ldexp(1, -149))
	return math.Abs(float64(got)-want) / ulp
}

// TestExp32Accuracy sweeps exp32 and expm132 against float64 and bounds
// their error: Cephes' expf is within 1 ulp plus the final scaling's
// rounding; below the normal range only the absolute error 2⁻¹⁴⁹ of that
// rounding is possible. The planted fault (a coefficient perturbed by one
// ulp) must exceed the bound somewhere, which shows it is sharp.
func TestExp32Accuracy(t *testing.T) {
	worst, worstAt := 0.0, float32(0)
	worstM1, worstM1At := 0.0, float32(0)
	for i := 0; i <= 2_000_000; i++ {
		x := float32(-104 + 193*float64(i)/2_000_000)
		e := ulps(exp32(x), math.Exp(float64(x)))
		if math.Exp(float64(x)) < 0x1p-126 { // subnormal result: absolute
			e = math.Abs(float64(exp32(x))-math.Exp(float64(x))) / 0x1p-149
		}
		if e > worst {
			worst, worstAt = e, x
		}
		y := float32(-3 + 3*float64(i)/2_000_000)
		if m := ulps(expm132(y), math.Expm1(float64(y))); m > worstM1 {
			worstM1, worstM1At = m, y
		}
	}
	t.Logf("exp32: max %.3f ulp at %v; expm132 on [-3, 0]: max %.3f ulp at %v", worst, worstAt, worstM1, worstM1At)
	if worst > 2 {
		t.Errorf("exp32 error %.3f ulp at %v exceeds 2 ulp", worst, worstAt)
	}
	// exp(x) − 1 below −cut: e = exp(x) < 0.71 carries ≤ 2 ulp(e); for
	// e ≥ 1/2 the subtraction is exact (Sterbenz) and ulp(e) = 2·ulp(e−1),
	// for e < 1/2 it rounds by ½ ulp while ulp(e) ≤ ulp(e−1): at most 4 ulp
	// of the result. The polynomial above −cut stays within 2 ulp (its
	// truncation is below 0.3 ulp).
	if worstM1 > 4 {
		t.Errorf("expm132 error %.3f ulp at %v exceeds 4 ulp", worstM1, worstM1At)
	}
	for _, x := range []float32{0, -0.0, 1e-30, -1e-30, -1e-40} {
		if got := expm132(x); got != x && !(x == 0 && got == 0) {
			t.Errorf("expm132(%v) = %v, want %v", x, got, x)
		}
	}
	if exp32(89) != float32(math.Inf(1)) || exp32(-104) != 0 || exp32(float32(math.Inf(-1))) != 0 {
		t.Errorf("exp32 range: exp(89)=%v exp(-104)=%v exp(-Inf)=%v", exp32(89), exp32(-104), exp32(float32(math.Inf(-1))))
	}
	if v := exp32(float32(math.NaN())); v == v {
		t.Errorf("exp32(NaN) = %v", v)
	}
	// Planted fault: the r⁶ term dropped.
	bad := expCoef
	bad[1] = 0
	faultWorst := 0.0
	for i := 0; i <= 200_000; i++ {
		x := float32(-80 + 160*float64(i)/200_000)
		faultWorst = max(faultWorst, ulps(exp32c(x, &bad), math.Exp(float64(x))))
	}
	t.Logf("planted fault (r^6 term dropped): max %.1f ulp", faultWorst)
	if faultWorst <= 2 {
		t.Errorf("the 2-ulp check missed a dropped polynomial term (max %.2f ulp)", faultWorst)
	}
}
