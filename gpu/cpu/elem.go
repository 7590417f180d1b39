package cpu

import (
	"math"
	"unsafe"
)

// Elementwise kernels. Each has an AVX2 version (elem_amd64.s) over whole
// vectors of 8 and this Go version, which also handles the last n mod 8
// elements. Both perform the same float32 operations in the same order,
// without fused multiply-adds (the Go conversions float32(a*b) forbid
// fusion), so they agree bit for bit on every machine; the one exception is
// fmaRow, which fuses in assembly like the matrix kernels. Sums use the
// 8-lane order of the matrix products: lane l adds the elements ≡ l
// (mod 8) of the whole vectors, the lanes reduce as
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), and the tail follows in order.
//
// exp32 is Cephes' expf: n = round(x·log2 e); r = x − n·C1 − n·C2 (C1 has
// 9 significant bits, so n·C1 is exact); exp r by a degree-7 polynomial;
// scaled by 2^n in two steps (2^⌊n/2⌋ then 2^(n−⌊n/2⌋)) so that results
// below the normal range round once, correctly. Its error is about 1 ulp.

const (
	expLog2e = float32(1.44269504088896341)
	expC1    = float32(0.693359375)
	expC2    = float32(-2.12194440e-4)
	expLo    = float32(-104) // exp(−104) rounds to zero
	expHi    = float32(89)   // exp(89) overflows
	// expm1 below this magnitude uses its Taylor polynomial (degree 8:
	// truncation below 0.3 ulp); above, exp(x) − 1.
	expm1Cut = float32(0.3465736)
)

// expCoef are Cephes' polynomial coefficients p0 … p5.
var expCoef = [6]float32{1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1}

// expm1 Taylor coefficients 1/k!, k = 2 … 8.
var expm1C = [7]float32{1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320}

func exp32(x float32) float32 { return exp32c(x, &expCoef) }

// exp32c is exp32 with the polynomial coefficients c (tests perturb them).
func exp32c(x float32, c *[6]float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, expLo), expHi)
	n := float32(math.RoundToEven(float64(float32(x * expLog2e))))
	r := x - float32(n*expC1)
	r -= float32(n * expC2)
	z := float32(r * r)
	p := float32(c[0]*r) + c[1]
	p = float32(p*r) + c[2]
	p = float32(p*r) + c[3]
	p = float32(p*r) + c[4]
	p = float32(p*r) + c[5]
	p = float32(p*z) + r
	p++
	ni := int32(n)
	na := ni >> 1
	p *= math.Float32frombits(uint32(na+127) << 23)
	p *= math.Float32frombits(uint32(ni-na+127) << 23)
	return p
}

// expm132 is exp(x) − 1 with a small relative error near zero.
func expm132(x float32) float32 {
	if x > -expm1Cut && x < expm1Cut {
		q := expm1C[6]
		for i := 5; i >= 0; i-- {
			q = float32(q*x) + expm1C[i]
		}
		return float32(float32(x*x)*q) + x
	}
	return exp32(x) - 1
}

func silu32(x float32) float32    { return x / (1 + exp32(-x)) }
func sigmoid32(x float32) float32 { return 1 / (1 + exp32(-x)) }
func elu32(x float32) float32 {
	if x > 0 {
		return x
	}
	return expm132(x)
}

// roundBF16 is gpu.RoundBF16 on bits: ties to even, NaN kept quiet.
func roundBF16(f float32) float32 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return math.Float32frombits(b&0xffff0000 | 0x00400000)
	}
	return math.Float32frombits((b + 0x7fff + (b>>16)&1) & 0xffff0000)
}

// sum8 reduces eight lane sums.
func sum8(a *[8]float32) float32 {
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

// Go kernels over [lo, n): lo is where the assembly stopped (0 without it).

func addGo(d, a, b []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = a[i] + b[i]
	}
}

func mulGo(d, a, b []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = a[i] * b[i]
	}
}

func scaleGo(d, a []float32, s float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = a[i] * s
	}
}

func divsGo(d []float32, s float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] /= s
	}
}

func fmaRowGo(d, a, b []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] += float32(a[i] * b[i])
	}
}

func roundGo(d []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = roundBF16(d[i])
	}
}

func expShiftGo(d, a []float32, shift float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = exp32(a[i] - shift)
	}
}

func siluGo(d, a []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = silu32(a[i])
	}
}

func sigmoidGo(d, a []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = sigmoid32(a[i])
	}
}

func eluGo(d, a []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = elu32(a[i])
	}
}

func gluGo(d, a, g []float32, lo int) {
	for i := lo; i < len(d); i++ {
		d[i] = a[i] / (1 + exp32(-g[i]))
	}
}

func lnormGo(d, a, w, b []float32, mean, inv float32, lo int) {
	for i := lo; i < len(d); i++ {
		y := float32(float32((a[i]-mean)*inv) * w[i])
		if b != nil {
			y += b[i]
		}
		d[i] = y
	}
}

// Sums: whole vectors in 8 lanes, then the tail.

func sumGo(a []float32) float32 {
	var l [8]float32
	n8 := len(a) &^ 7
	for i := 0; i < n8; i += 8 {
		for j := range l {
			l[j] += a[i+j]
		}
	}
	return sumTail(sum8(&l), a, n8)
}

func sumTail(s float32, a []float32, lo int) float32 {
	for _, v := range a[lo:] {
		s += v
	}
	return s
}

func sumSqGo(a []float32, m float32) float32 {
	var l [8]float32
	n8 := len(a) &^ 7
	for i := 0; i < n8; i += 8 {
		for j := range l {
			v := a[i+j] - m
			l[j] += float32(v * v)
		}
	}
	return sumSqTail(sum8(&l), a, m, n8)
}

func sumSqTail(s float32, a []float32, m float32, lo int) float32 {
	for _, v := range a[lo:] {
		v -= m
		s += float32(v * v)
	}
	return s
}

func maxGo(a []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range a {
		m = max(m, v)
	}
	return m
}

// Dispatchers: the assembly over whole vectors (when asm), Go for the rest.
// Slices a, b, w must be at least as long as d.

func p32(s []float32) *float32 { return unsafe.SliceData(s) }

// asmLen returns how many of n elements the assembly handles: the whole
// vectors of 8 when asm is asked for and available, else none.
func asmLen(asm bool, n int) int {
	if asm && haveAsm {
		return n &^ 7
	}
	return 0
}

func vAdd(asm bool, d, a, b []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vadd(p32(d), p32(a[:lo]), p32(b[:lo]), lo)
	}
	addGo(d, a, b, lo)
}

func vMul(asm bool, d, a, b []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vmul(p32(d), p32(a[:lo]), p32(b[:lo]), lo)
	}
	mulGo(d, a, b, lo)
}

func vScale(asm bool, d, a []float32, s float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vscale(p32(d), p32(a[:lo]), s, lo)
	}
	scaleGo(d, a, s, lo)
}

func vDivs(asm bool, d []float32, s float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vdivs(p32(d), s, lo)
	}
	divsGo(d, s, lo)
}

// vFmaRow sets d += a ⊙ b (fused in assembly).
func vFmaRow(asm bool, d, a, b []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vfma(p32(d), p32(a[:lo]), p32(b[:lo]), lo)
	}
	fmaRowGo(d, a, b, lo)
}

func vRound(asm bool, d []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vround(p32(d), lo)
	}
	roundGo(d, lo)
}

// vExpShift sets d = exp(a − shift).
func vExpShift(asm bool, d, a []float32, shift float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vexpshift(p32(d), p32(a[:lo]), shift, lo)
	}
	expShiftGo(d, a, shift, lo)
}

func vSiLU(asm bool, d, a []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vsilu(p32(d), p32(a[:lo]), lo)
	}
	siluGo(d, a, lo)
}

func vSigmoid(asm bool, d, a []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vsigmoid(p32(d), p32(a[:lo]), lo)
	}
	sigmoidGo(d, a, lo)
}

func vELU(asm bool, d, a []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		velu(p32(d), p32(a[:lo]), lo)
	}
	eluGo(d, a, lo)
}

// vGLU sets d = a / (1 + exp(−g)).
func vGLU(asm bool, d, a, g []float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		vglu(p32(d), p32(a[:lo]), p32(g[:lo]), lo)
	}
	gluGo(d, a, g, lo)
}

// vLNorm sets d = ((a − mean)·inv)·w (+ b).
func vLNorm(asm bool, d, a, w, b []float32, mean, inv float32) {
	lo := asmLen(asm, len(d))
	if lo > 0 {
		var pb *float32
		if b != nil {
			pb = p32(b[:lo])
		}
		vlnorm(p32(d), p32(a[:lo]), p32(w[:lo]), pb, mean, inv, lo)
	}
	lnormGo(d, a, w, b, mean, inv, lo)
}

func vSum(asm bool, a []float32) float32 {
	if asm && haveAsm && len(a) >= 8 {
		n8 := len(a) &^ 7
		return sumTail(vsum(p32(a), n8), a, n8)
	}
	return sumGo(a)
}

// vSumSq returns Σ (a − m)², each square rounded.
func vSumSq(asm bool, a []float32, m float32) float32 {
	if asm && haveAsm && len(a) >= 8 {
		n8 := len(a) &^ 7
		return sumSqTail(vsumsq(p32(a), m, n8), a, m, n8)
	}
	return sumSqGo(a, m)
}

func vMax(asm bool, a []float32) float32 {
	if asm && haveAsm && len(a) >= 8 {
		n8 := len(a) &^ 7
		m := vmax(p32(a), n8)
		for _, v := range a[n8:] {
			m = max(m, v)
		}
		return m
	}
	return maxGo(a)
}
