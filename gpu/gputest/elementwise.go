package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Data movement and elementwise ops.
//
// Bounds: fill, copy, write, transpose, add, mul, addrow, mulrow, scale,
// roundbf16 and relu are exact: the float32 rounding of the float64 result,
// bit for bit (a sum or product of two float32 values is exact in float64,
// so rounding it once gives IEEE float32 arithmetic's result). silu, gelu,
// elu, sigmoid and glu may be off by 8 ulps of the result: a float32 exp is
// within 2 ulps (CUDA's expf; Cephes' expf about 1), and the at most three
// further roundings (1 + e, the division, the product) add half an ulp each,
// scaled by factors ≤ 1, so a correct kernel stays within about 4 ulps;
// 8 leaves a margin and still fails a wrong formula or a wrong operand.
// ELU's contract is relative to its result near zero, as PyTorch's expm1:
// exp(x) − 1 evaluated in float32 cancels for small |x| and fails. GELU
// adds |x|·2⁻⁵² absolute for the documented float64 1 + erf (see checkAct).

func checkFill(h *harness) {
	for _, c := range []struct {
		rows, cols int
		strided    bool
		v          float32
		name       string
	}{
		{1, 1, false, h.value(), "1x1"},
		{3, 7, true, h.value(), "3x7/strided"},
		{17, 33, true, h.value(), "17x33/strided"},
		{5, 64, false, h.value(), "5x64"},
		{4, 9, true, float32(math.Copysign(0, -1)), "4x9/strided/v=-0"},
		{2, 5, false, 3, "2x5/v=3"},
	} {
		dst := h.f32(c.rows, c.cols, c.strided)
		h.q.Fill(dst.view, c.v)
		want := make([]float64, c.rows*c.cols)
		for i := range want {
			want[i] = float64(c.v)
		}
		h.verify(c.name, dst, want, nil)
	}
}

func checkCopy(h *harness) {
	for _, c := range []struct {
		rows, cols     int
		srcStr, dstStr bool
	}{
		{1, 1, false, false}, {5, 7, true, true}, {33, 40, false, true}, {4, 9, true, false},
	} {
		vals := h.values(c.rows*c.cols, 1)
		src := h.input(c.rows, c.cols, c.srcStr, vals)
		dst := h.f32(c.rows, c.cols, c.dstStr)
		h.q.Copy(dst.view, src.view)
		name := fmt.Sprintf("f32/%dx%d", c.rows, c.cols)
		if c.srcStr {
			name += "/src-strided"
		}
		if c.dstStr {
			name += "/dst-strided"
		}
		h.verify(name, dst, widen(vals), nil, src)
	}
	// Half-precision copies, read back through Embed with one id per row
	// (0 + x is exact), which widens the whole destination buffer.
	for _, c := range []struct {
		dt         gpu.DType
		rows, cols int
	}{{gpu.BF16, 3, 9}, {gpu.F16, 4, 5}, {gpu.BF16, 1, 33}} {
		src := h.weight(c.dt, c.rows, c.cols, true, 1)
		dst := h.load(c.dt, c.rows, c.cols, true, nil, nil)
		h.q.Copy(dst.view, src.view)
		wr, wc := dst.whole.Rows, dst.whole.Cols
		out := h.f32(wr, wc, false)
		ids := make([]int32, wr)
		for i := range ids {
			ids[i] = int32(i)
		}
		h.q.Embed(out.view, dst.whole, ids)
		want := make([]float64, wr*wc)
		for i := range want {
			want[i] = math.NaN()
		}
		for r := 0; r < c.rows; r++ {
			for k := 0; k < c.cols; k++ {
				want[dst.at(r, k)] = float64(src.vals[r*c.cols+k])
			}
		}
		h.verify(fmt.Sprintf("%s/%dx%d/strided/read-via-embed", dtName(c.dt), c.rows, c.cols), out, want, nil)
	}
}

func checkWrite(h *harness) {
	for _, c := range []struct {
		rows, cols int
		strided    bool
	}{{1, 1, false}, {3, 5, true}, {9, 33, true}, {2, 257, false}} {
		vals := h.values(c.rows*c.cols, 1)
		dst := h.f32(c.rows, c.cols, c.strided)
		h.q.Write(dst.view, vals)
		h.verify(fmt.Sprintf("%dx%d%s", c.rows, c.cols, tag(c.strided)), dst, widen(vals), nil)
	}
	// Read of a strided view returns its rows packed.
	for _, c := range []struct{ rows, cols int }{{4, 6}, {1, 3}, {7, 33}} {
		vals := h.values(c.rows*c.cols, 1)
		src := h.input(c.rows, c.cols, true, vals)
		got := make([]float32, c.rows*c.cols)
		cs := fmt.Sprintf("read-strided/%dx%d", c.rows, c.cols)
		if err := h.q.Read(got, src.view); err != nil {
			h.fail(cs, "Read: %v", err)
			continue
		}
		bad, first := 0, -1
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(vals[i]) {
				if bad == 0 {
					first = i
				}
				bad++
			}
		}
		detail := ""
		if bad > 0 {
			detail = fmt.Sprintf("%d/%d elements differ (first [%d,%d]: got %g want %g)",
				bad, len(got), first/c.cols, first%c.cols, got[first], vals[first])
		}
		h.record(cs, bad == 0, 0, 0, detail)
	}
}

func checkTranspose(h *harness) {
	for _, c := range []struct {
		rows, cols int
		strided    bool
	}{{1, 5, true}, {5, 1, false}, {3, 7, true}, {33, 70, true}, {37, 41, false}, {64, 3, true}} {
		vals := h.values(c.rows*c.cols, 1)
		src := h.input(c.rows, c.cols, c.strided, vals)
		dst := h.f32(c.cols, c.rows, c.strided)
		h.q.Transpose(dst.view, src.view)
		want := make([]float64, c.rows*c.cols)
		for r := 0; r < c.rows; r++ {
			for k := 0; k < c.cols; k++ {
				want[k*c.rows+r] = float64(vals[r*c.cols+k])
			}
		}
		h.verify(fmt.Sprintf("%dx%d%s", c.rows, c.cols, tag(c.strided)), dst, want, nil, src)
	}
}

// binaryShapes are the shapes of the elementwise ops; mode "strided" makes
// every operand a strided view, "mixed" some of them, "inplace" writes dst
// over the first source.
var binaryShapes = []struct {
	rows, cols int
	mode       string
}{
	{1, 1, ""}, {1, 7, "strided"}, {3, 5, ""}, {4, 33, "strided"}, {17, 9, "mixed"}, {2, 257, "strided"},
	{5, 3, "inplace"},
}

func caseName(rows, cols int, mode string) string {
	if mode == "" {
		return fmt.Sprintf("%dx%d", rows, cols)
	}
	return fmt.Sprintf("%dx%d/%s", rows, cols, mode)
}

func checkBinary(h *harness, mul bool) {
	for _, c := range binaryShapes {
		n := c.rows * c.cols
		av, bv := h.values(n, 1), h.values(n, 1)
		a := h.input(c.rows, c.cols, c.mode != "", av)
		b := h.input(c.rows, c.cols, c.mode == "strided" || c.mode == "inplace", bv)
		dst, srcs := h.output(a, c.mode, b)
		want := make([]float64, n)
		for i := range want {
			if mul {
				want[i] = float64(av[i]) * float64(bv[i])
			} else {
				want[i] = float64(av[i]) + float64(bv[i])
			}
		}
		if mul {
			h.q.Mul(dst.view, a.view, b.view)
		} else {
			h.q.Add(dst.view, a.view, b.view)
		}
		h.verify(caseName(c.rows, c.cols, c.mode), dst, want, nil, srcs...)
	}
}

func checkRowOp(h *harness, mul bool) {
	for _, c := range []struct {
		rows, cols int
		mode       string
		vdt        gpu.DType
	}{
		{1, 3, "", gpu.F32}, {5, 33, "strided", gpu.F32}, {5, 33, "strided", gpu.BF16}, {3, 257, "", gpu.BF16},
		{4, 2, "inplace", gpu.F32}, {2, 7, "strided", gpu.F16}, {1, 9, "inplace", gpu.BF16},
	} {
		n := c.rows * c.cols
		av := h.values(n, 1)
		a := h.input(c.rows, c.cols, c.mode != "", av)
		v := h.vector(c.vdt, c.cols, 1)
		dst, srcs := h.output(a, c.mode, v)
		want := make([]float64, n)
		for i := range want {
			x, y := float64(av[i]), float64(v.vals[i%c.cols])
			if mul {
				want[i] = x * y
			} else {
				want[i] = x + y
			}
		}
		if mul {
			h.q.MulRow(dst.view, a.view, v.view)
		} else {
			h.q.AddRow(dst.view, a.view, v.view)
		}
		h.verify(fmt.Sprintf("v=%s/%s", dtName(c.vdt), caseName(c.rows, c.cols, c.mode)), dst, want, nil, srcs...)
	}
}

func checkScale(h *harness) {
	for i, c := range binaryShapes {
		s, sname := [...]float32{h.value(), 3, -0.5, 0, 1e-3, h.value(), 0.1}[i%7], ""
		if i%7 == 0 || i%7 == 5 {
			sname = "random"
		}
		n := c.rows * c.cols
		av := h.values(n, 1)
		a := h.input(c.rows, c.cols, c.mode != "", av)
		dst, srcs := h.output(a, c.mode)
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(av[i]) * float64(s)
		}
		h.q.Scale(dst.view, a.view, s)
		if sname == "" {
			sname = fmt.Sprint(s)
		}
		h.verify(fmt.Sprintf("%s/s=%s", caseName(c.rows, c.cols, c.mode), sname), dst, want, nil, srcs...)
	}
}

// roundInputs returns n values that exercise bf16 rounding: full-mantissa
// randoms of several magnitudes, exact ties to even (both parities), halves
// already exact, values that round up to the next binade or to infinity,
// infinities, NaN and subnormals.
func (h *harness) roundInputs(n int) []float32 {
	special := []uint32{
		0x3f808000, 0x3f818000, 0xbf808000, 0x3f80_7fff, 0x3f80_8001, 0x3fff_ffff, 0x7f7f_ffff, 0xff7f_ffff,
		0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x0001_2345, 0x0000_8000, 0x0001_8000, 0x8000_0000, 0x4049_0fdb,
	}
	v := make([]float32, n)
	for i := range v {
		switch {
		case i < len(special):
			v[i] = math.Float32frombits(special[i])
		case i%5 == 0:
			v[i] = h.value()
		default:
			v[i] = float32(math.Ldexp(2*h.rng.Float64()-1, h.rng.IntN(40)-20))
		}
	}
	h.rng.Shuffle(n, func(i, j int) { v[i], v[j] = v[j], v[i] })
	return v
}

func checkRoundBF16(h *harness) {
	for _, c := range []struct {
		rows, cols int
		strided    bool
	}{{7, 13, true}, {1, 3, false}, {4, 40, true}, {3, 16, false}} {
		vals := h.roundInputs(c.rows * c.cols)
		dst := h.input(c.rows, c.cols, c.strided, vals)
		want := make([]float64, len(vals))
		for i, x := range vals {
			want[i] = float64(gpu.RoundBF16(x))
		}
		h.q.RoundBF16(dst.view)
		h.verify(fmt.Sprintf("%dx%d%s", c.rows, c.cols, tag(c.strided)), dst, want, nil)
	}
}

// activation is the float64 replay of f.
func activation(f gpu.Activation, x float64) float64 {
	switch f {
	case gpu.SiLU:
		return x / (1 + math.Exp(-x))
	case gpu.GELU:
		return 0.5 * x * math.Erfc(-x/math.Sqrt2)
	case gpu.ReLU:
		return math.Max(x, 0)
	case gpu.ELU:
		if x > 0 {
			return x
		}
		return math.Expm1(x)
	case gpu.Sigmoid:
		return 1 / (1 + math.Exp(-x))
	}
	panic(fmt.Sprintf("gputest: activation %v", f))
}

// actInputs returns n inputs of an activation: ±6·value (integers up to
// ±12) mixed with small magnitudes near zero, where cancellation shows.
func (h *harness) actInputs(n int) []float32 {
	v := h.values(n, 6)
	for i := range v {
		if h.rng.IntN(6) == 0 {
			v[i] = float32(math.Ldexp(2*h.rng.Float64()-1, -h.rng.IntN(20)))
		}
	}
	return v
}

// ulpBound returns the bound k·ulp(ref) of every element.
func ulpBound(want []float64, k float64) []float64 {
	b := make([]float64, len(want))
	for i, w := range want {
		b[i] = k * ulp(w)
	}
	return b
}

func checkAct(h *harness) {
	for _, f := range []gpu.Activation{gpu.SiLU, gpu.GELU, gpu.ReLU, gpu.ELU, gpu.Sigmoid} {
		for _, c := range []struct {
			rows, cols int
			mode       string
		}{{3, 17, "strided"}, {1, 5, ""}, {8, 33, "inplace"}} {
			n := c.rows * c.cols
			av := h.actInputs(n)
			a := h.input(c.rows, c.cols, c.mode != "", av)
			dst, srcs := h.output(a, c.mode)
			want := make([]float64, n)
			for i, x := range av {
				want[i] = activation(f, float64(x))
			}
			var bound []float64 // relu: exact
			if f != gpu.ReLU {
				bound = ulpBound(want, 8)
			}
			if f == gpu.GELU {
				// x·Φ(x) with Φ = (1 + erf(x/√2))/2 evaluated in float64, as
				// documented: 1 + erf rounds to 2⁻⁵³ absolute, which in the
				// far negative tail (Φ below 1e-16) exceeds the ulps of the
				// tiny result.
				for i, x := range av {
					bound[i] += math.Abs(float64(x)) * 0x1p-52
				}
			}
			h.q.Act(dst.view, a.view, f)
			h.verify(fmt.Sprintf("%v/%s", f, caseName(c.rows, c.cols, c.mode)), dst, want, bound, srcs...)
		}
	}
}

func checkGLU(h *harness) {
	for _, c := range []struct {
		rows, n int
		strided bool
	}{{1, 1, false}, {3, 5, true}, {4, 33, true}, {2, 64, false}} {
		av := make([]float32, c.rows*2*c.n)
		for r := 0; r < c.rows; r++ {
			copy(av[r*2*c.n:], h.values(c.n, 1))
			copy(av[r*2*c.n+c.n:], h.actInputs(c.n))
		}
		a := h.input(c.rows, 2*c.n, c.strided, av)
		dst := h.f32(c.rows, c.n, c.strided)
		want := make([]float64, c.rows*c.n)
		for r := 0; r < c.rows; r++ {
			for k := 0; k < c.n; k++ {
				x, g := float64(av[r*2*c.n+k]), float64(av[r*2*c.n+c.n+k])
				want[r*c.n+k] = x / (1 + math.Exp(-g))
			}
		}
		h.q.GLU(dst.view, a.view)
		h.verify(fmt.Sprintf("%dx%d->%dx%d%s", c.rows, 2*c.n, c.rows, c.n, tag(c.strided)), dst, want, ulpBound(want, 8), a)
	}
}
