package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// opShapes are the awkward [rows, cols] shapes every elementwise and row
// op runs on: single elements, vector tails of every length, one row of a
// decode step, many short rows (codec activations), strided or not.
var opShapes = []struct{ rows, cols, pad int }{
	{1, 1, 0}, {3, 7, 1}, {1, 8, 0}, {2, 9, 3}, {5, 17, 0}, {4, 33, 2}, {3, 63, 0}, {2, 64, 1},
	{7, 65, 0}, {1, 1000, 0}, {1, 2048, 5}, {300, 64, 0}, {9, 1003, 4},
}

// forOps runs body for every kernel set, pool size and shape.
func forOps(t *testing.T, body func(t *testing.T, q *Queue, dev *Device, rng *rand.Rand, rows, cols, pad int)) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for i, s := range opShapes {
				t.Run(fmt.Sprintf("%s/w%d/%dx%d+%d", ks.name, workers, s.rows, s.cols, s.pad), func(t *testing.T) {
					body(t, q, dev, rand.New(rand.NewPCG(uint64(i), uint64(workers))), s.rows, s.cols, s.pad)
				})
			}
		}
	}
}

func randView(dev *Device, rng *rand.Rand, rows, cols, pad int) gpu.Tensor {
	v := view(dev, gpu.F32, rows, cols, pad, pad%3)
	fillRandom(rng, v)
	return v
}

// TestExactOps: ops with one IEEE operation per element must equal the
// correctly rounded result of the float64 replay (float64 holds a float32
// sum or product exactly enough that rounding it to float32 is the correct
// float32 rounding), bit for bit; RoundBF16 must equal gpu.RoundBF16.
func TestExactOps(t *testing.T) {
	forOps(t, func(t *testing.T, q *Queue, dev *Device, rng *rand.Rand, rows, cols, pad int) {
		a, b := randView(dev, rng, rows, cols, pad), randView(dev, rng, rows, cols, 0)
		v := view(dev, gpu.BF16, 1, cols, 0, 0)
		fillRandom(rng, v)
		type op struct {
			name string
			run  func(dst gpu.Tensor)
			want func(r, c int) float32
		}
		ops := []op{
			{"add", func(d gpu.Tensor) { q.Add(d, a, b) }, func(r, c int) float32 { return float32(at(a, r, c) + at(b, r, c)) }},
			{"mul", func(d gpu.Tensor) { q.Mul(d, a, b) }, func(r, c int) float32 { return float32(at(a, r, c) * at(b, r, c)) }},
			{"addrow", func(d gpu.Tensor) { q.AddRow(d, a, v) }, func(r, c int) float32 { return float32(at(a, r, c) + at(v, 0, c)) }},
			{"mulrow", func(d gpu.Tensor) { q.MulRow(d, a, v) }, func(r, c int) float32 { return float32(at(a, r, c) * at(v, 0, c)) }},
			{"scale", func(d gpu.Tensor) { q.Scale(d, a, -0.37) }, func(r, c int) float32 { return float32(at(a, r, c) * float64(float32(-0.37))) }},
			{"relu", func(d gpu.Tensor) { q.Act(d, a, gpu.ReLU) }, func(r, c int) float32 { return float32(max(at(a, r, c), 0)) }},
			{"roundbf16", func(d gpu.Tensor) { q.Copy(d, a); q.RoundBF16(d) }, func(r, c int) float32 { return gpu.RoundBF16(float32(at(a, r, c))) }},
		}
		for _, o := range ops {
			dst := view(dev, gpu.F32, rows, cols, pad+1, 1)
			o.run(dst)
			checkPadding(t, dst)
			for r := 0; r < rows; r++ {
				for c := 0; c < cols; c++ {
					if got, want := float32(at(dst, r, c)), o.want(r, c); math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s [%d,%d]: got %v want %v", o.name, r, c, got, want)
					}
				}
			}
		}
		// In place (dst = a) gives the same.
		d1 := view(dev, gpu.F32, rows, cols, pad, 0)
		q.Add(d1, a, b)
		q.Add(a, a, b)
		if r, c, ok := bitsEqual(a, d1); !ok {
			t.Fatalf("add in place differs at [%d,%d]", r, c)
		}
	})
}

// TestRoundBF16Specials: ties, NaN, infinities, the largest finite values.
func TestRoundBF16Specials(t *testing.T) {
	in := []uint32{0x3f808000, 0x3f818000, 0x3f807fff, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
		0x7fc00001, 0xff800001, 0x7f800001, 0x00000001, 0x80008000, 0x00018000}
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 1, ks.asm)
		for _, n := range []int{len(in), 8} {
			d := dev.Alloc(gpu.F32, 1, n)
			for i := 0; i < n; i++ {
				f32s(d)[i] = math.Float32frombits(in[i])
			}
			q.RoundBF16(d)
			for i := 0; i < n; i++ {
				want := gpu.RoundBF16(math.Float32frombits(in[i]))
				if got := f32s(d)[i]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s: RoundBF16(%#x) = %#x, want %#x", ks.name, in[i], math.Float32bits(got), math.Float32bits(want))
				}
			}
		}
	}
}

// TestActivations bounds SiLU, Sigmoid, ELU, GLU and GELU in ulps of the
// float64 value: exp32 is within 2 ulp (TestExp32Accuracy), 1 + e and the
// division round once each, and e/(1+e) ≤ 1 damps exp's share: SiLU,
// Sigmoid and GLU stay within 4 ulp; ELU is expm132 (4 ulp); GELU rounds a
// float64 value once (1 ulp). Results below the normal range are compared
// in units of the smallest subnormal. The planted fault: SiLU over an exp
// whose r⁶ term is dropped must break the 4-ulp limit.
func TestActivations(t *testing.T) {
	bad := expCoef
	bad[1] = 0
	faulty := 0.0
	for i := 0; i <= 100_000; i++ {
		x := float32(-40 + 80*float64(i)/100_000)
		got := x / (1 + exp32c(-x, &bad))
		faulty = max(faulty, actErr(got, float64(x)/(1+math.Exp(-float64(x)))))
	}
	t.Logf("planted fault: SiLU with a perturbed exp is off by up to %.1f ulp", faulty)
	if faulty <= 4 {
		t.Fatalf("the 4-ulp limit missed a perturbed exp (%.2f ulp)", faulty)
	}
	type act struct {
		name  string
		f     gpu.Activation
		ref   func(x float64) float64
		limit float64
	}
	acts := []act{
		{"silu", gpu.SiLU, func(x float64) float64 { return x / (1 + math.Exp(-x)) }, 4},
		{"sigmoid", gpu.Sigmoid, func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }, 4},
		{"elu", gpu.ELU, func(x float64) float64 {
			if x > 0 {
				return x
			}
			return math.Expm1(x)
		}, 4},
		{"gelu", gpu.GELU, func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }, 1},
	}
	forOps(t, func(t *testing.T, q *Queue, dev *Device, rng *rand.Rand, rows, cols, pad int) {
		a := randView(dev, rng, rows, cols, pad)
		q.Scale(a, a, 12) // cover exp's whole useful range
		for _, ac := range acts {
			dst := view(dev, gpu.F32, rows, cols, pad, 2)
			q.Act(dst, a, ac.f)
			checkPadding(t, dst)
			worst := 0.0
			for r := 0; r < rows; r++ {
				for c := 0; c < cols; c++ {
					e := actErr(float32(at(dst, r, c)), ac.ref(at(a, r, c)))
					if e > ac.limit {
						t.Fatalf("%s(%v) = %v, want %v: %.2f ulp", ac.name, at(a, r, c), at(dst, r, c), ac.ref(at(a, r, c)), e)
					}
					worst = max(worst, e)
				}
			}
			if rows*cols >= 1000 {
				t.Logf("%s: max %.2f ulp", ac.name, worst)
			}
		}
		// GLU: a[:, :n] / (1 + exp(−a[:, n:])).
		if cols%2 == 0 {
			dst := view(dev, gpu.F32, rows, cols/2, 0, 0)
			q.GLU(dst, a)
			for r := 0; r < rows; r++ {
				for c := 0; c < cols/2; c++ {
					want := at(a, r, c) / (1 + math.Exp(-at(a, r, c+cols/2)))
					if e := actErr(float32(at(dst, r, c)), want); e > 4 {
						t.Fatalf("glu [%d,%d] = %v want %v: %.2f ulp", r, c, at(dst, r, c), want, e)
					}
				}
			}
		}
	})
}

func actErr(got float32, want float64) float64 {
	if math.Abs(want) < 0x1p-126 {
		return math.Abs(float64(got)-want) / 0x1p-149
	}
	return ulps(got, want)
}

// TestNorms checks RMSNorm, LayerNorm and Softmax per row against float64
// with bounds from float32 rounding (see each). The planted fault drops one
// element of the row, which the same check must see in most other outputs.
func TestNorms(t *testing.T) {
	forOps(t, func(t *testing.T, q *Queue, dev *Device, rng *rand.Rand, rows, cols, pad int) {
		a := randView(dev, rng, rows, cols, pad)
		w := view(dev, gpu.BF16, 1, cols, 0, 0)
		b := view(dev, gpu.F32, 1, cols, 0, 0)
		fillRandom(rng, w)
		fillRandom(rng, b)
		check := func(name string, run func(dst, src gpu.Tensor), ref func(src gpu.Tensor, r int) (want, bound []float64)) {
			t.Helper()
			dst := view(dev, gpu.F32, rows, cols, pad, 1)
			run(dst, a)
			checkPadding(t, dst)
			var st errStats
			for r := 0; r < rows; r++ {
				want, bound := ref(a, r)
				for c := range want {
					st.add(float32(at(dst, r, c)), want[c], bound[c], func() string {
						return fmt.Sprintf("%s [%d,%d]: got %v want %v", name, r, c, at(dst, r, c), want[c])
					})
				}
			}
			if st.bad > 0 {
				t.Fatalf("%d of %d outside the bound; first %s", st.bad, st.n, st.first)
			}
			// Planted fault: one element's contribution dropped (zeroed
			// before the op); every other output of the row moves by about
			// that element's share, which the check must see in most of them.
			if cols < 8 {
				return
			}
			src := view(dev, gpu.F32, rows, cols, 0, 0)
			q.Copy(src, a)
			k := 0 // the largest element: never a zero already
			for c := 0; c < cols; c++ {
				if math.Abs(at(src, 0, c)) > math.Abs(at(src, 0, k)) {
					k = c
				}
			}
			f32s(src)[k] = 0
			run(dst, src)
			var fst errStats
			want, bound := ref(a, 0)
			for c := range want {
				if c != k {
					fst.add(float32(at(dst, 0, c)), want[c], bound[c], func() string { return "" })
				}
			}
			if fst.bad < fst.n/2 {
				t.Fatalf("%s: a dropped element was seen in only %d of %d outputs", name, fst.bad, fst.n)
			}
		}

		// RMSNorm: Σx² loses at most γ_m relative (m = matmulRoundings(n):
		// positive terms), then /n, +eps, 1/√ and ·x add ≤ 4 roundings; the
		// square root halves the sum's error: (½γ_m + 5u)·|y|.
		check("rmsnorm", func(d, s gpu.Tensor) { q.RMSNorm(d, s, 1e-5) }, func(s gpu.Tensor, r int) ([]float64, []float64) {
			var ss float64
			for c := 0; c < cols; c++ {
				ss += at(s, r, c) * at(s, r, c)
			}
			inv := 1 / math.Sqrt(ss/float64(cols)+float64(float32(1e-5)))
			want, bound := make([]float64, cols), make([]float64, cols)
			for c := range want {
				want[c] = at(s, r, c) * inv
				bound[c] = (0.5*gamma(matmulRoundings(cols)) + 5*u) * math.Abs(want[c])
			}
			return want, bound
		})

		// LayerNorm: μ̂ = Σx/n is off by δμ ≤ γ_m·Σ|x|/n + u|μ|; each x − μ̂
		// rounds (u); the variance of the rounded differences is off by
		// γ_{m+3} relative plus δμ² (Σ(x−μ) = 0 leaves only the square); the
		// inverse root by half that plus 2u; then ·inv, ·w and +b round once
		// each. Per element: |w|·inv·(δμ + u|x−μ|) + |w||x−μ|·inv·(½ε_var +
		// 3u) + 2u|y| + u|b|, with ε_var = γ_{m+3} + 2δμ²/var.
		check("layernorm", func(d, s gpu.Tensor) { q.LayerNorm(d, s, w, b, 1e-5) }, func(s gpu.Tensor, r int) ([]float64, []float64) {
			var sum, abs float64
			for c := 0; c < cols; c++ {
				sum += at(s, r, c)
				abs += math.Abs(at(s, r, c))
			}
			n := float64(cols)
			mu := sum / n
			var vr float64
			for c := 0; c < cols; c++ {
				vr += (at(s, r, c) - mu) * (at(s, r, c) - mu)
			}
			vr /= n
			m := matmulRoundings(cols)
			dmu := gamma(m)*abs/n + u*math.Abs(mu)
			ve := vr + float64(float32(1e-5))
			epsVar := gamma(m+3) + 2*dmu*dmu/ve + 2*u
			inv := 1 / math.Sqrt(ve)
			want, bound := make([]float64, cols), make([]float64, cols)
			for c := range want {
				xm := at(s, r, c) - mu
				wc, bc := at(w, 0, c), at(b, 0, c)
				want[c] = xm*inv*wc + bc
				bound[c] = (math.Abs(wc)*inv*(dmu+u*math.Abs(xm))+math.Abs(wc*xm)*inv*(0.5*epsVar+3*u)+
					2*u*math.Abs(want[c])+u*math.Abs(bc))*(1+1e-6) + 0
			}
			return want, bound
		})

		// Softmax: each exponent x − m rounds (u|x−m|, turned into a relative
		// error by exp), exp32 adds ≤ 2 ulp (4u relative... bounded by 2·2u),
		// the sum γ_m relative, the division u: p·(2·max_j u|x_j−m| + 8u + γ_m + u).
		check("softmax", func(d, s gpu.Tensor) { q.Copy(d, s); q.Softmax(d) }, func(s gpu.Tensor, r int) ([]float64, []float64) {
			mx := math.Inf(-1)
			for c := 0; c < cols; c++ {
				mx = max(mx, at(s, r, c))
			}
			var sum, spread float64
			want := make([]float64, cols)
			for c := range want {
				spread = max(spread, math.Abs(at(s, r, c)-mx))
				want[c] = math.Exp(at(s, r, c) - mx)
				sum += want[c]
			}
			rel := 2*u*spread + 8*u + gamma(matmulRoundings(cols)) + u
			bound := make([]float64, cols)
			for c := range want {
				want[c] /= sum
				bound[c] = rel * want[c] * (1 + 2*rel)
			}
			return want, bound
		})
	})
}

// TestRoPE checks both pairings against float64 rotation with exact sines:
// cos and sin round once (u each), each product once, the difference once:
// |err| ≤ 3u·(|x0| + |x1|)·(1 + u). BF16 mode is checked against its own
// definition (every product and sum rounded to bf16) replayed from float64
// products, allowing one bf16 ulp where float32 products round differently.
func TestRoPE(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		rng := rand.New(rand.NewPCG(4, 4))
		for _, style := range []gpu.RoPEStyle{gpu.RotateHalf, gpu.Interleaved} {
			const rows, hd, heads = 5, 16, 3
			x := randView(dev, rng, rows, hd*heads, 2)
			inv := make([]float32, hd/2)
			for j := range inv {
				inv[j] = float32(math.Pow(10000, -2*float64(j)/hd))
			}
			pos := []int32{0, 1, 7, 100, 4095}
			orig := make([][]float64, rows)
			for r := range orig {
				for c := 0; c < x.Cols; c++ {
					orig[r] = append(orig[r], at(x, r, c))
				}
			}
			q.RoPE(x, gpu.RoPEParams{Style: style, HeadDim: hd, InvFreq: inv, Pos: pos})
			for r := 0; r < rows; r++ {
				for h := 0; h < heads; h++ {
					for j := 0; j < hd/2; j++ {
						i0, i1 := h*hd+j, h*hd+j+hd/2
						if style == gpu.Interleaved {
							i0, i1 = h*hd+2*j, h*hd+2*j+1
						}
						ang := float64(float32(pos[r]) * inv[j])
						c, s := math.Cos(ang), math.Sin(ang)
						x0, x1 := orig[r][i0], orig[r][i1]
						b := 3 * u * (math.Abs(x0) + math.Abs(x1)) * (1 + u)
						if e := math.Abs(at(x, r, i0) - (x0*c - x1*s)); e > b {
							t.Fatalf("%s style %d row %d pair %d: first off by %g > %g", ks.name, style, r, j, e, b)
						}
						if e := math.Abs(at(x, r, i1) - (x1*c + x0*s)); e > b {
							t.Fatalf("%s style %d row %d pair %d: second off by %g > %g", ks.name, style, r, j, e, b)
						}
					}
				}
			}
		}
	}
}

// TestShortConv: Σ_j w[c,j]·x′[t+j,c] with x′ = [state; x] within γ_{L+1} of
// Σ|w·x′|; the new state is exactly the last L−1 rows of x′; and a sequence
// fed in pieces (a decode step at a time) equals the whole call bit for bit.
func TestShortConv(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			rng := rand.New(rand.NewPCG(6, uint64(workers)))
			for _, c := range []struct{ T, C, L int }{{1, 7, 3}, {9, 130, 3}, {4, 64, 4}, {2, 5, 1}} {
				for _, wdt := range []gpu.DType{gpu.BF16, gpu.F32} {
					x := randView(dev, rng, c.T, c.C, 1)
					w := view(dev, wdt, c.C, c.L, 0, 0)
					fillRandom(rng, w)
					state := randView(dev, rng, c.L-1, c.C, 0)
					xp := make([][]float64, 0, c.T+c.L-1)
					for r := 0; r < c.L-1; r++ {
						row := make([]float64, c.C)
						for ch := range row {
							row[ch] = at(state, r, ch)
						}
						xp = append(xp, row)
					}
					for r := 0; r < c.T; r++ {
						row := make([]float64, c.C)
						for ch := range row {
							row[ch] = at(x, r, ch)
						}
						xp = append(xp, row)
					}
					s0 := view(dev, gpu.F32, c.L-1, c.C, 0, 0)
					q.Copy(s0, state)
					dst := view(dev, gpu.F32, c.T, c.C, 2, 0)
					q.ShortConv(dst, x, w, state)
					checkPadding(t, dst)
					for tt := 0; tt < c.T; tt++ {
						for ch := 0; ch < c.C; ch++ {
							var s, a float64
							for j := 0; j < c.L; j++ {
								p := at(w, ch, j) * xp[tt+j][ch]
								s += p
								a += math.Abs(p)
							}
							if e := math.Abs(at(dst, tt, ch) - s); e > gamma(c.L+1)*a {
								t.Fatalf("%s %+v: [%d,%d] off by %g", ks.name, c, tt, ch, e)
							}
						}
					}
					for r := 0; r < c.L-1; r++ {
						for ch := 0; ch < c.C; ch++ {
							if at(state, r, ch) != xp[c.T+r][ch] {
								t.Fatalf("%s %+v: state [%d,%d] = %v, want %v", ks.name, c, r, ch, at(state, r, ch), xp[c.T+r][ch])
							}
						}
					}
					// Step by step from the initial state.
					for tt := 0; tt < c.T; tt++ {
						one := view(dev, gpu.F32, 1, c.C, 0, 0)
						q.ShortConv(one, x.Row(tt), w, s0)
						if _, col, ok := bitsEqual(one, dst.Row(tt)); !ok {
							t.Fatalf("%s %+v: step %d differs at channel %d", ks.name, c, tt, col)
						}
					}
				}
			}
		}
	}
}

// TestEmbed: gathers are exact; sums of n rows within γ_n.
func TestEmbed(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		rng := rand.New(rand.NewPCG(8, 8))
		table := view(dev, gpu.BF16, 50, 33, 2, 0)
		fillRandom(rng, table)
		for _, n := range []int{1, 3, 8} {
			const rows = 4
			ids := make([]int32, rows*n)
			for i := range ids {
				ids[i] = int32(rng.IntN(50))
			}
			dst := view(dev, gpu.F32, rows, 33, 1, 0)
			q.Embed(dst, table, ids)
			checkPadding(t, dst)
			for r := 0; r < rows; r++ {
				for c := 0; c < 33; c++ {
					var s, a float64
					for _, id := range ids[r*n : (r+1)*n] {
						s += at(table, int(id), c)
						a += math.Abs(at(table, int(id), c))
					}
					if e := math.Abs(at(dst, r, c) - s); e > gamma(n)*a {
						t.Fatalf("%s n=%d [%d,%d]: got %v want %v", ks.name, n, r, c, at(dst, r, c), s)
					}
				}
			}
		}
	}
}

// TestCopyFillReadWrite: data movement is exact and stays inside views.
func TestCopyFillReadWrite(t *testing.T) {
	dev, q := newTestDevice(t, 2, haveAsm)
	rng := rand.New(rand.NewPCG(2, 2))
	src := randView(dev, rng, 5, 13, 3)
	dst := view(dev, gpu.F32, 5, 13, 2, 1)
	q.Copy(dst, src)
	checkPadding(t, dst)
	if r, c, ok := bitsEqual(dst, src); !ok {
		t.Fatalf("copy differs at [%d,%d]", r, c)
	}
	host := make([]float32, 65)
	if err := q.Read(host, dst); err != nil {
		t.Fatal(err)
	}
	back := view(dev, gpu.F32, 5, 13, 4, 2)
	q.Write(back, host)
	checkPadding(t, back)
	if r, c, ok := bitsEqual(back, src); !ok {
		t.Fatalf("read/write round trip differs at [%d,%d]", r, c)
	}
	q.Fill(back, 2.5)
	checkPadding(t, back)
	for r := 0; r < 5; r++ {
		for c := 0; c < 13; c++ {
			if at(back, r, c) != 2.5 {
				t.Fatalf("fill [%d,%d] = %v", r, c, at(back, r, c))
			}
		}
	}
	if err := q.Read(host[:3], dst); err == nil {
		t.Fatal("read into a short slice: no error")
	}
}
