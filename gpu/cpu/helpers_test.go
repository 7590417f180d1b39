package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// u is the unit roundoff of float32 (round to nearest).
const u = 1.0 / (1 << 24)

// gamma is Higham's γ_n = n·u/(1−n·u): the relative error bound of a chain
// of n float32 roundings.
func gamma(n int) float64 { return float64(n) * u / (1 - float64(n)*u) }

// poison is the bit pattern every test writes into outputs and padding
// before an op runs: a quiet NaN no op produces from finite inputs.
var poison = math.Float32frombits(0x7fc0_dead)

// kernelSet selects the assembly or the Go kernels.
type kernelSet struct {
	name string
	asm  bool
}

// kernelSets lists the kernel sets this machine runs: both where the CPU has
// AVX2+FMA+F16C, else only Go. Every op test runs once per set.
func kernelSets(t testing.TB) []kernelSet {
	if !haveAsm {
		t.Logf("assembly kernels unavailable on this CPU/arch: testing the Go kernels only")
		return []kernelSet{{"go", false}}
	}
	return []kernelSet{{"asm", true}, {"go", false}}
}

func newTestDevice(t testing.TB, workers int, asm bool) (*Device, *Queue) {
	d := newDevice(workers, asm)
	t.Cleanup(func() { d.Close() })
	return d, d.NewQueue("test").(*Queue)
}

// view allocates a [rows, cols] tensor of dt inside a larger buffer: the
// view starts at offset off and its rows are cols+pad apart. Everything
// outside the view holds the poison (F32) or a NaN bit pattern (BF16, F16),
// so a kernel that reads outside a view poisons its result, and one that
// writes outside it is caught by checkPadding.
func view(d *Device, dt gpu.DType, rows, cols, pad, off int) gpu.Tensor {
	stride := cols + pad
	n := off + rows*stride + pad
	full := d.Alloc(dt, 1, n)
	b := buf(full)
	switch dt {
	case gpu.F32:
		for i := range b.f32 {
			b.f32[i] = poison
		}
	case gpu.BF16:
		for i := range b.u16 {
			b.u16[i] = 0x7fc1
		}
	case gpu.F16:
		for i := range b.u16 {
			b.u16[i] = 0x7e01
		}
	}
	return gpu.Tensor{Buf: full.Buf, Off: off, Rows: rows, Cols: cols, Stride: stride}
}

// fillRandom writes random values of magnitude about 2^-3 … 2 (and some
// zeros and exact small integers, which exercise signed zero and exact
// cancellation) into the view.
func fillRandom(rng *rand.Rand, t gpu.Tensor) {
	b := buf(t)
	for r := 0; r < t.Rows; r++ {
		for c := 0; c < t.Cols; c++ {
			i := t.Off + r*t.Stride + c
			v := float32(rng.Float64()*2 - 1)
			switch rng.IntN(16) {
			case 0:
				v = 0
			case 1:
				v = float32(rng.IntN(5) - 2)
			}
			switch b.dt {
			case gpu.F32:
				b.f32[i] = v
			case gpu.BF16:
				b.u16[i] = gpu.F32ToBF16(v)
			case gpu.F16:
				b.u16[i] = f32ToF16(v)
			}
		}
	}
}

// f32ToF16 rounds a float32 of magnitude below 65504 to the nearest half,
// truncating subnormal results toward zero (the tests only need some valid
// F16 bit pattern near v: values are read back with gpu.F16ToF32).
func f32ToF16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	if exp <= 0 {
		return sign
	}
	h := uint32(exp)<<10 | mant>>13
	if mant&0x1fff > 0x1000 || (mant&0x1fff == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// at returns element (r, c) of a view as float64.
func at(t gpu.Tensor, r, c int) float64 {
	b := buf(t)
	i := t.Off + r*t.Stride + c
	switch b.dt {
	case gpu.F32:
		return float64(b.f32[i])
	case gpu.BF16:
		return float64(gpu.BF16ToF32(b.u16[i]))
	case gpu.F16:
		return float64(gpu.F16ToF32(b.u16[i]))
	}
	panic("at")
}

// poisonView fills an F32 view with the poison.
func poisonView(t gpu.Tensor) {
	s := f32s(t)
	for r := 0; r < t.Rows; r++ {
		for c := 0; c < t.Cols; c++ {
			s[r*t.Stride+c] = poison
		}
	}
}

// checkPadding fails unless every F32 element outside the view still holds
// the poison.
func checkPadding(t testing.TB, v gpu.Tensor) {
	t.Helper()
	all := buf(v).f32
	inView := func(i int) bool {
		i -= v.Off
		return i >= 0 && i/v.Stride < v.Rows && i%v.Stride < v.Cols
	}
	for i, x := range all {
		if !inView(i) && math.Float32bits(x) != math.Float32bits(poison) {
			t.Fatalf("element %d outside the view %v (off %d stride %d) was overwritten: %v", i, v, v.Off, v.Stride, x)
		}
	}
}

// bitsEqual reports the first element where two F32 views differ in bits.
func bitsEqual(a, b gpu.Tensor) (r, c int, ok bool) {
	for r := 0; r < a.Rows; r++ {
		for c := 0; c < a.Cols; c++ {
			if math.Float32bits(float32(at(a, r, c))) != math.Float32bits(float32(at(b, r, c))) {
				return r, c, false
			}
		}
	}
	return 0, 0, true
}

// errStats accumulates |got − want| ≤ bound checks.
type errStats struct {
	n, bad   int
	maxRatio float64 // max |err|/bound
	maxErr   float64
	first    string
}

func (s *errStats) add(got float32, want, bound float64, where func() string) {
	s.n++
	g := float64(got)
	err := math.Abs(g - want)
	if math.IsNaN(g) || math.IsInf(g, 0) {
		err = math.Inf(1)
	}
	s.maxErr = max(s.maxErr, err)
	if bound > 0 {
		s.maxRatio = max(s.maxRatio, err/bound)
	} else if err > 0 {
		s.maxRatio = math.Inf(1)
	}
	if err > bound {
		if s.bad == 0 {
			s.first = where()
		}
		s.bad++
	}
}
