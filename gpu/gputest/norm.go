package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Row reductions, RoPE, Embed and ShortConv.

// normShapes are the row shapes of the norms: one column, odd widths, and
// widths that are not multiples of 8, 32 or 256.
var normShapes = []struct {
	rows, cols int
	mode       string
}{{1, 1, ""}, {3, 7, "strided"}, {2, 300, ""}, {5, 33, "strided"}, {1, 1030, "inplace"}, {4, 64, "inplace"}}

// checkRMSNorm: the sum of squares is a dot product of n terms (γ_n·Σx²,
// all terms positive, so relative), the division by n, the addition of eps
// and the final rounding of 1/√· add a rounding each (the square root
// halves the relative error of its argument) and x·inv one more: in all
// |err| ≤ (γ_n/2 + 3u)·|ref|; the bound is (γ_n + 8u)·|ref|. eps 0.5 makes
// a kernel that ignores eps fail by a factor, eps 1e-5 by about 10⁻⁵
// relative, far beyond the bound too.
func checkRMSNorm(h *harness) {
	for _, eps := range []float32{1e-5, 0.5} {
		for _, c := range normShapes {
			n := c.rows * c.cols
			av := h.values(n, 1)
			a := h.input(c.rows, c.cols, c.mode != "", av)
			dst, srcs := h.output(a, c.mode)
			want, bound := make([]float64, n), make([]float64, n)
			for r := 0; r < c.rows; r++ {
				x := av[r*c.cols : (r+1)*c.cols]
				var ss float64
				for _, v := range x {
					ss += float64(v) * float64(v)
				}
				inv := 1 / math.Sqrt(ss/float64(c.cols)+float64(eps))
				for k, v := range x {
					want[r*c.cols+k] = float64(v) * inv
					bound[r*c.cols+k] = (gamma(c.cols) + 8*u) * math.Abs(want[r*c.cols+k])
				}
			}
			h.q.RMSNorm(dst.view, a.view, eps)
			h.verify(fmt.Sprintf("%s/eps=%g", caseName(c.rows, c.cols, c.mode), eps), dst, want, bound, srcs...)
		}
	}
}

// checkLayerNorm: let m be the exact mean and S = Σ|x|. The kernel's mean
// is off by at most Em = (γ_n·S + 2u·|Σx|)/n. Its variance sums the squares
// of x − mean_k: that is the exact variance plus (m − mean_k)² ≤ Em², with
// the relative error of a dot product of n terms, γ_n, plus 3u for the
// subtraction, the square and the division; so var+eps is off by ε_v =
// ((γ_n+3u)(v+Em²) + Em²)/(v+eps) + u relative, and inv = 1/√ by ε_v/2 + 2u.
// With T = (x−m)·inv·w the output is then within |w|·inv·Em + |T|·(ε_inv +
// 3u) + 2u·(|T| + |b|) (the subtraction, the two products, the bias
// addition), taken with a 1% margin.
func checkLayerNorm(h *harness) {
	type variant struct {
		wdt, bdt gpu.DType // bdt 0: no bias
		eps      float32
	}
	variants := []variant{
		{gpu.F32, gpu.F32, 1e-5}, {gpu.BF16, gpu.BF16, 1e-5}, {gpu.F32, 0, 1e-5}, {gpu.BF16, 0, 1e-6},
		{gpu.F32, gpu.BF16, 0.5},
	}
	for vi, vr := range variants {
		for si, c := range normShapes {
			if (vi+si)%2 == 1 && c.cols != 1030 { // every variant sees half the shapes, and the widest
				continue
			}
			n := c.rows * c.cols
			av := h.values(n, 1)
			a := h.input(c.rows, c.cols, c.mode != "", av)
			w := h.vector(vr.wdt, c.cols, 1)
			var b operand
			bt := gpu.Tensor{}
			if vr.bdt != 0 {
				b = h.vector(vr.bdt, c.cols, 1)
				bt = b.view
			}
			dst, srcs := h.output(a, c.mode, w, b)
			want, bound := make([]float64, n), make([]float64, n)
			for r := 0; r < c.rows; r++ {
				x := av[r*c.cols : (r+1)*c.cols]
				nf := float64(c.cols)
				var sum, sabs float64
				for _, v := range x {
					sum += float64(v)
					sabs += math.Abs(float64(v))
				}
				m := sum / nf
				var sq float64
				for _, v := range x {
					sq += (float64(v) - m) * (float64(v) - m)
				}
				vv := sq / nf
				inv := 1 / math.Sqrt(vv+float64(vr.eps))
				g := gamma(c.cols)
				em := (g*sabs + 2*u*math.Abs(sum)) / nf
				ev := ((g+3*u)*(vv+em*em)+em*em)/(vv+float64(vr.eps)) + u
				einv := ev/2 + 2*u
				for k, v := range x {
					wk := float64(w.vals[k])
					t := (float64(v) - m) * inv * wk
					var bk float64
					if vr.bdt != 0 {
						bk = float64(b.vals[k])
					}
					i := r*c.cols + k
					want[i] = t + bk
					bound[i] = 1.01*(math.Abs(wk)*inv*em+math.Abs(t)*(einv+3*u)) + 2*u*(math.Abs(t)+math.Abs(bk))
				}
			}
			h.q.LayerNorm(dst.view, a.view, w.view, bt, vr.eps)
			bias := "nobias"
			if vr.bdt != 0 {
				bias = "b=" + dtName(vr.bdt)
			}
			h.verify(fmt.Sprintf("w=%s/%s/eps=%g/%s", dtName(vr.wdt), bias, vr.eps, caseName(c.rows, c.cols, c.mode)),
				dst, want, bound, srcs...)
		}
	}
}

// checkSoftmax: every output is e_i/Σe with e_i = exp(x_i − max), the
// subtraction in float32 (both backends round it; the replay does the
// same). The exp is within 2 ulps (4u relative), the sum of L positive
// terms within γ_L plus the exps' 4u, the division adds u: the bound is
// (γ_L + 16u)·ref, i.e. γ_L plus 8 ulps. A sum off by 10⁻⁴ fails it.
func checkSoftmax(h *harness) {
	for _, c := range []struct {
		rows, cols int
		strided    bool
	}{{2, 1, false}, {3, 2, true}, {1, 3, false}, {4, 8, true}, {3, 33, true}, {2, 100, false}, {3, 257, true}} {
		vals := h.values(c.rows*c.cols, 4)
		dst := h.input(c.rows, c.cols, c.strided, vals)
		want, bound := make([]float64, len(vals)), make([]float64, len(vals))
		for r := 0; r < c.rows; r++ {
			x := vals[r*c.cols : (r+1)*c.cols]
			m := float32(math.Inf(-1))
			for _, v := range x {
				m = max(m, v)
			}
			var s float64
			e := make([]float64, len(x))
			for k, v := range x {
				e[k] = math.Exp(float64(v - m)) // v − m rounded to float32, as the kernels do
				s += e[k]
			}
			for k := range x {
				want[r*c.cols+k] = e[k] / s
				bound[r*c.cols+k] = (gamma(c.cols) + 16*u) * want[r*c.cols+k]
			}
		}
		h.q.Softmax(dst.view)
		h.verify(fmt.Sprintf("len=%d/rows=%d%s", c.cols, c.rows, tag(c.strided)), dst, want, bound)
	}
}

// checkRoPE: the replay takes cos and sin as the documented float32
// roundings of float64 cos/sin of the float32 angle pos·invfreq. Without
// BF16 an output is a two-term dot product (γ_2·(|x0·c| + |x1·s|)), plus
// 2u·(|x0| + |x1|) for a cos or sin that differs in its last bit. With BF16
// every step is rounded as documented (cos, sin, each product first to
// float32 then to bf16, the float32 sum to bf16) and the replay is exact.
func checkRoPE(h *harness) {
	type rc struct {
		style     gpu.RoPEStyle
		hd, heads int
		bf16      bool
		pos       []int32
		theta     float64
		strided   bool
	}
	seq := func(p0, n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(p0 + i)
		}
		return p
	}
	var cases []rc
	for _, style := range []gpu.RoPEStyle{gpu.RotateHalf, gpu.Interleaved} {
		for _, bf := range []bool{false, true} {
			cases = append(cases,
				rc{style, 2, 3, bf, seq(7, 4), 10000, true},
				rc{style, 6, 3, bf, seq(1000, 3), 10000, false},
				rc{style, 64, 2, bf, []int32{3, 9, 4000, 17, 0}, 1e6, true},
				rc{style, 64, 1, bf, seq(131, 1), 10000, false},
			)
		}
	}
	for _, c := range cases {
		half := c.hd / 2
		invf := make([]float32, half)
		for j := range invf {
			invf[j] = float32(math.Pow(c.theta, -2*float64(j)/float64(c.hd)))
		}
		rows, cols := len(c.pos), c.hd*c.heads
		vals := h.values(rows*cols, 1)
		dst := h.input(rows, cols, c.strided, vals)
		want, bound := make([]float64, len(vals)), make([]float64, len(vals))
		for r := 0; r < rows; r++ {
			x := vals[r*cols : (r+1)*cols]
			for j := 0; j < half; j++ {
				ang := float32(c.pos[r]) * invf[j]
				cs, sn := float32(math.Cos(float64(ang))), float32(math.Sin(float64(ang)))
				if c.bf16 {
					cs, sn = gpu.RoundBF16(cs), gpu.RoundBF16(sn)
				}
				for hh := 0; hh < cols; hh += c.hd {
					i0, i1 := hh+j, hh+j+half
					if c.style == gpu.Interleaved {
						i0, i1 = hh+2*j, hh+2*j+1
					}
					x0, x1 := float64(x[i0]), float64(x[i1])
					c64, s64 := float64(cs), float64(sn)
					o0, o1 := r*cols+i0, r*cols+i1
					if c.bf16 {
						rb := func(v float64) float64 { return float64(gpu.RoundBF16(float32(v))) }
						want[o0] = rb(rb(x0*c64) - rb(x1*s64)) // each difference of bf16 values is exact in float64
						want[o1] = rb(rb(x1*c64) + rb(x0*s64))
						continue
					}
					want[o0] = x0*c64 - x1*s64
					want[o1] = x1*c64 + x0*s64
					slack := 2 * u * (math.Abs(x0) + math.Abs(x1))
					bound[o0] = gamma(2)*(math.Abs(x0*c64)+math.Abs(x1*s64)) + slack
					bound[o1] = gamma(2)*(math.Abs(x1*c64)+math.Abs(x0*s64)) + slack
				}
			}
		}
		var b []float64
		if !c.bf16 {
			b = bound
		}
		h.q.RoPE(dst.view, gpu.RoPEParams{Style: c.style, HeadDim: c.hd, InvFreq: invf, Pos: c.pos, BF16: c.bf16})
		style := "rotate-half"
		if c.style == gpu.Interleaved {
			style = "interleaved"
		}
		prec := "f32"
		if c.bf16 {
			prec = "bf16"
		}
		h.verify(fmt.Sprintf("%s/%s/hd=%d/heads=%d/pos=%d..%s", style, prec, c.hd, c.heads, c.pos[0], tag(c.strided)),
			dst, want, b)
	}
}

// checkEmbed: one id per row is a copy (exact); n ids sum n rows, a chain
// of n roundings from zero (γ_n·Σ|t|).
func checkEmbed(h *harness) {
	for _, c := range []struct {
		dt          gpu.DType
		n, rows     int
		trows, cols int
		strided     bool
	}{
		{gpu.F32, 1, 4, 11, 7, true}, {gpu.F32, 3, 4, 11, 33, false}, {gpu.BF16, 1, 1, 9, 33, true},
		{gpu.BF16, 3, 5, 13, 7, true}, {gpu.F16, 1, 3, 6, 5, false}, {gpu.F16, 3, 2, 6, 64, true},
		{gpu.F32, 3, 1, 5, 1, true},
	} {
		table := h.weight(c.dt, c.trows, c.cols, c.strided, 1)
		ids := make([]int32, c.rows*c.n)
		for i := range ids {
			ids[i] = int32(h.rng.IntN(c.trows))
		}
		if c.n > 1 && ids[0] == ids[1] { // the first row sums distinct rows at least
			ids[1] = (ids[0] + 1) % int32(c.trows)
		}
		dst := h.f32(c.rows, c.cols, c.strided)
		want, bound := make([]float64, c.rows*c.cols), make([]float64, c.rows*c.cols)
		for r := 0; r < c.rows; r++ {
			for k := 0; k < c.cols; k++ {
				var s, sa float64
				for _, id := range ids[r*c.n : (r+1)*c.n] {
					v := float64(table.vals[int(id)*c.cols+k])
					s += v
					sa += math.Abs(v)
				}
				want[r*c.cols+k], bound[r*c.cols+k] = s, gamma(c.n)*sa
			}
		}
		var b []float64
		if c.n > 1 {
			b = bound
		}
		h.q.Embed(dst.view, table.view, ids)
		h.verify(fmt.Sprintf("table=%s/n=%d/rows=%d/%dx%d%s", dtName(c.dt), c.n, c.rows, c.trows, c.cols, tag(c.strided)),
			dst, want, b)
	}
}

// shortConvReplay writes the float64 replay of T rows of ShortConv over
// x′ = [state; x] (xp, (L−1+T)·C values) into want and each output's bound
// γ_L·Σ|w·x′| (a dot product of L terms) into bound.
func shortConvReplay(want, bound []float64, w, xp []float32, T, C, L int) {
	for t := 0; t < T; t++ {
		for ch := 0; ch < C; ch++ {
			var s, sa float64
			for k := 0; k < L; k++ {
				p := float64(w[ch*L+k]) * float64(xp[(t+k)*C+ch])
				s += p
				sa += math.Abs(p)
			}
			want[t*C+ch], bound[t*C+ch] = s, gamma(L)*sa
		}
	}
}

// checkShortConv runs several calls in a row on one state and checks both
// outputs after every call: dst within γ_L·Σ|w·x′| (a dot product of L
// terms), the state exactly (a copy of the last L−1 rows of x′).
func checkShortConv(h *harness) {
	for _, c := range []struct {
		L, C    int
		wdt     gpu.DType
		steps   []int
		strided bool
	}{
		{3, 33, gpu.F32, []int{5, 1, 1, 5}, true},
		{4, 5, gpu.BF16, []int{1, 5, 1}, true},
		{4, 130, gpu.F32, []int{5, 2, 1}, false},
		{3, 7, gpu.BF16, []int{1, 1, 5}, false},
		// Longer than the CUDA kernel's chunk of 16 rows (a prefill's
		// rows in chunks of their own): ragged, then one step, then one chunk.
		{3, 40, gpu.BF16, []int{37, 1, 16}, true},
	} {
		w := h.weight(c.wdt, c.C, c.L, false, 1)
		st := h.values((c.L-1)*c.C, 1) // the carried state, exact float32 values
		state := h.input(c.L-1, c.C, c.strided, append([]float32(nil), st...))
		name := fmt.Sprintf("L=%d/C=%d/w=%s%s", c.L, c.C, dtName(c.wdt), tag(c.strided))
		for call, T := range c.steps {
			xv := h.values(T*c.C, 1)
			x := h.input(T, c.C, c.strided, xv)
			dst := h.f32(T, c.C, c.strided)
			xp := append(append([]float32(nil), st...), xv...) // x′ = [state; x]
			want, bound := make([]float64, T*c.C), make([]float64, T*c.C)
			shortConvReplay(want, bound, w.vals, xp, T, c.C, c.L)
			st = append([]float32(nil), xp[T*c.C:]...)
			h.q.ShortConv(dst.view, x.view, w.view, state.view)
			cs := fmt.Sprintf("%s/call%d/T=%d", name, call+1, T)
			h.verify(cs, dst, want, bound, x)
			// The state: exact, padding untouched.
			got, err := h.read(state)
			if err != nil {
				h.fail(cs+"/state", "%v", err)
				continue
			}
			d := compare(state, got, widen(st), nil, true)
			h.record(cs+"/state", d.ok(), d.err, 0, d.String())
		}
	}
}
