package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// A convolution's reference: every output element is b + Σ terms. replay
// returns the float64 sum, Σ|terms| + |b|, and the number of terms; drop
// leaves out the first nonzero term (the planted fault: one contribution
// missing).
type convRef func(r, c int, drop bool) (sum, abs float64, terms int)

// checkConv compares every element of dst against ref with the bound
// γ_n·(Σ|terms| + |b|), where n bounds the roundings any term passes
// through: the GEMM order (matmulRoundings) or a sequential sum (terms + 2:
// rounded product, the adds after it, the bias) plus extra roundings after
// the sum (a transposed convolution's gather).
func checkConvOut(dst gpu.Tensor, ref convRef, extra int, drop bool) errStats {
	var st errStats
	for r := 0; r < dst.Rows; r++ {
		for c := 0; c < dst.Cols; c++ {
			want, abs, n := ref(r, c, drop)
			g := gamma(max(matmulRoundings(n), n+2) + extra)
			st.add(float32(at(dst, r, c)), want, g*abs, func() string {
				return fmt.Sprintf("[%d,%d] got %v want %v", r, c, at(dst, r, c), want)
			})
		}
	}
	return st
}

func biasAt(bias gpu.Tensor, o int) float64 {
	if bias.IsNil() {
		return 0
	}
	return at(bias, 0, o)
}

// conv1dRef is PyTorch's Conv1d on time-major rows.
func conv1dRef(x, w, bias gpu.Tensor, p gpu.ConvParams, cout int) convRef {
	cg, og := x.Cols/p.Groups, cout/p.Groups
	return func(t, o int, drop bool) (float64, float64, int) {
		g := o / og
		s := biasAt(bias, o)
		a := math.Abs(s)
		for c := 0; c < cg; c++ {
			for k := 0; k < p.K; k++ {
				src := t*p.Stride + k*p.Dilation - p.PadLeft
				if src < 0 || src >= x.Rows {
					continue
				}
				v := at(w, o, c*p.K+k) * at(x, src, g*cg+c)
				if drop && v != 0 {
					drop = false
					continue
				}
				s += v
				a += math.Abs(v)
			}
		}
		return s, a, cg * p.K
	}
}

// convT1dRef is PyTorch's ConvTranspose1d, output rows from PadLeft on.
func convT1dRef(x, w, bias gpu.Tensor, p gpu.ConvParams, cout int) convRef {
	cg, og := x.Cols/p.Groups, cout/p.Groups
	return func(r, o int, drop bool) (float64, float64, int) {
		u := r + p.PadLeft
		g, ol := o/og, o%og
		s := biasAt(bias, o)
		a := math.Abs(s)
		for t := 0; t < x.Rows; t++ {
			k := u - t*p.Stride
			if k < 0 || k >= p.K {
				continue
			}
			for c := 0; c < cg; c++ {
				v := at(x, t, g*cg+c) * at(w, g*cg+c, ol*p.K+k)
				if drop && v != 0 {
					drop = false
					continue
				}
				s += v
				a += math.Abs(v)
			}
		}
		return s, a, cg
	}
}

func conv2dRef(x, w, bias gpu.Tensor, p gpu.Conv2DParams, cout int) convRef {
	cg, og := p.Cin/p.Groups, cout/p.Groups
	return func(oh, col int, drop bool) (float64, float64, int) {
		o, ow := col/p.Wout, col%p.Wout
		g := o / og
		s := biasAt(bias, o)
		a := math.Abs(s)
		for c := 0; c < cg; c++ {
			for i := 0; i < p.KH; i++ {
				for j := 0; j < p.KW; j++ {
					h, wi := oh*p.StrideH+i-p.PadH, ow*p.StrideW+j-p.PadW
					if h < 0 || h >= x.Rows || wi < 0 || wi >= p.W {
						continue
					}
					v := at(w, o, (c*p.KH+i)*p.KW+j) * at(x, h, (g*cg+c)*p.W+wi)
					if drop && v != 0 {
						drop = false
						continue
					}
					s += v
					a += math.Abs(v)
				}
			}
		}
		return s, a, cg * p.KH * p.KW
	}
}

// requireConv runs the accuracy check, then the planted fault (the same
// check against a reference with one term dropped must fail for most
// elements).
func requireConv(t *testing.T, dst gpu.Tensor, ref convRef, extra int) {
	t.Helper()
	st := checkConvOut(dst, ref, extra, false)
	if st.bad > 0 {
		t.Fatalf("%d of %d outside the float32 bound; first %s", st.bad, st.n, st.first)
	}
	fault := checkConvOut(dst, ref, extra, true)
	t.Logf("max |err|/bound %.3g; a dropped term is flagged in %d of %d elements", st.maxRatio, fault.bad, fault.n)
	if fault.bad < fault.n/2 {
		t.Fatalf("the check caught a dropped term in only %d of %d elements", fault.bad, fault.n)
	}
}

type conv1dCase struct {
	tin, cin, cout int
	p              gpu.ConvParams
	extra          int // output rows beyond the last full window (read zeros)
}

var conv1dCases = []conv1dCase{
	{50, 16, 24, gpu.ConvParams{K: 7, Stride: 1, Dilation: 1, Groups: 1, PadLeft: 6}, 0},
	{33, 8, 12, gpu.ConvParams{K: 3, Stride: 2, Dilation: 1, Groups: 1, PadLeft: 1}, 1},
	{40, 12, 12, gpu.ConvParams{K: 3, Stride: 1, Dilation: 2, Groups: 3, PadLeft: 4}, 0},
	{30, 16, 16, gpu.ConvParams{K: 4, Stride: 1, Dilation: 1, Groups: 16, PadLeft: 3}, 0},
	{100, 1, 8, gpu.ConvParams{K: 7, Stride: 1, Dilation: 1, Groups: 1, PadLeft: 3}, 2},
	{9, 64, 1, gpu.ConvParams{K: 7, Stride: 1, Dilation: 1, Groups: 1, PadLeft: 6}, 0},
	{200, 32, 40, gpu.ConvParams{K: 7, Stride: 1, Dilation: 3, Groups: 1, PadLeft: 18}, 0},
	{130, 17, 9, gpu.ConvParams{K: 5, Stride: 4, Dilation: 1, Groups: 1, PadLeft: 0}, 0},
	{70, 24, 24, gpu.ConvParams{K: 9, Stride: 1, Dilation: 1, Groups: 24, PadLeft: 4}, 4},
	{12, 6, 4, gpu.ConvParams{K: 3, Stride: 1, Dilation: 1, Groups: 2, PadLeft: 2}, 0},
}

func (c conv1dCase) tout() int {
	p := c.p
	return (c.tin+p.PadLeft-p.Dilation*(p.K-1)-1)/p.Stride + 1 + c.extra
}

func TestConv1D(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for i, c := range conv1dCases {
				for _, dt := range weightTypes {
					t.Run(fmt.Sprintf("%s/w%d/case%d/%v", ks.name, workers, i, dt), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(i), uint64(dt)))
						x := view(dev, gpu.F32, c.tin, c.cin, i%2, 1)
						w := view(dev, dt, c.cout, c.cin/c.p.Groups*c.p.K, 0, 0)
						var bias gpu.Tensor
						if i%2 == 0 {
							bias = view(dev, dt, 1, c.cout, 0, 0)
							fillRandom(rng, bias)
						}
						fillRandom(rng, x)
						fillRandom(rng, w)
						dst := view(dev, gpu.F32, c.tout(), c.cout, 3, 2)
						q.Conv1D(dst, x, w, bias, c.p)
						checkPadding(t, dst)
						requireConv(t, dst, conv1dRef(x, w, bias, c.p, c.cout), 0)
						// Output rows computed in pieces, each call seeing only
						// what it needs, equal the whole call bit for bit.
						for _, cut := range cuts(rng, dst.Rows) {
							a, b := cut[0], cut[1]
							start := a*c.p.Stride - c.p.PadLeft
							xp, p := x, c.p
							if start >= 0 {
								xp, p.PadLeft = x.Slice(start, x.Rows), 0
							} else {
								p.PadLeft = -start
							}
							part := view(dev, gpu.F32, b-a, c.cout, 0, 0)
							q.Conv1D(part, xp, w, bias, p)
							if r, col, ok := bitsEqual(part, dst.Slice(a, b)); !ok {
								t.Fatalf("rows [%d,%d) alone differ at [%d,%d]: %v vs %v", a, b, a+r, col, at(part, r, col), at(dst, a+r, col))
							}
						}
					})
				}
			}
		}
	}
}

// cuts returns a few row ranges of [0, n): single rows, pieces, all.
func cuts(rng *rand.Rand, n int) [][2]int {
	out := [][2]int{{0, 1}, {n - 1, n}, {0, n}}
	for range 3 {
		a := rng.IntN(n)
		b := a + 1 + rng.IntN(n-a)
		out = append(out, [2]int{a, b})
	}
	return out
}

type convT1dCase struct {
	tin, cin, cout int
	p              gpu.ConvParams
	rows           int // 0: the full output less PadLeft
}

var convT1dCases = []convT1dCase{
	{10, 16, 8, gpu.ConvParams{K: 16, Stride: 8, Dilation: 1, Groups: 1}, 0},
	{3, 12, 20, gpu.ConvParams{K: 4, Stride: 2, Dilation: 1, Groups: 1, PadLeft: 1}, 0},
	{7, 8, 8, gpu.ConvParams{K: 4, Stride: 2, Dilation: 1, Groups: 8}, 0},
	{6, 6, 9, gpu.ConvParams{K: 5, Stride: 3, Dilation: 1, Groups: 3, PadLeft: 2}, 12},
	{40, 32, 16, gpu.ConvParams{K: 8, Stride: 4, Dilation: 1, Groups: 1}, 0},
	{25, 9, 33, gpu.ConvParams{K: 3, Stride: 1, Dilation: 1, Groups: 1, PadLeft: 2}, 0},
}

func TestConvTranspose1D(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for i, c := range convT1dCases {
				for _, dt := range weightTypes {
					t.Run(fmt.Sprintf("%s/w%d/case%d/%v", ks.name, workers, i, dt), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(i), 11))
						x := view(dev, gpu.F32, c.tin, c.cin, i%2, 0)
						w := view(dev, dt, c.cin, c.cout/c.p.Groups*c.p.K, 0, 0)
						var bias gpu.Tensor
						if i%2 == 1 {
							bias = view(dev, dt, 1, c.cout, 0, 0)
							fillRandom(rng, bias)
						}
						fillRandom(rng, x)
						fillRandom(rng, w)
						rows := c.rows
						if rows == 0 {
							rows = (c.tin-1)*c.p.Stride + c.p.K - c.p.PadLeft
						}
						dst := view(dev, gpu.F32, rows, c.cout, 1, 1)
						q.ConvTranspose1D(dst, x, w, bias, c.p)
						checkPadding(t, dst)
						// The gather adds up to ceil(K/stride) partial sums.
						requireConv(t, dst, convT1dRef(x, w, bias, c.p, c.cout), (c.p.K+c.p.Stride-1)/c.p.Stride+1)
						for _, cut := range cuts(rng, rows) {
							a, b := cut[0], cut[1]
							p := c.p
							p.PadLeft += a
							part := view(dev, gpu.F32, b-a, c.cout, 0, 0)
							q.ConvTranspose1D(part, x, w, bias, p)
							if r, col, ok := bitsEqual(part, dst.Slice(a, b)); !ok {
								t.Fatalf("rows [%d,%d) alone differ at [%d,%d]", a, b, a+r, col)
							}
						}
					})
				}
			}
		}
	}
}

type conv2dCase struct {
	h, cout int
	p       gpu.Conv2DParams
}

var conv2dCases = []conv2dCase{
	{20, 8, gpu.Conv2DParams{Cin: 1, W: 16, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, Groups: 1}},
	{10, 8, gpu.Conv2DParams{Cin: 8, W: 8, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, Groups: 8}},
	{9, 16, gpu.Conv2DParams{Cin: 8, W: 6, KH: 1, KW: 1, StrideH: 1, StrideW: 1, Groups: 1}},
	{12, 6, gpu.Conv2DParams{Cin: 4, W: 10, KH: 3, KW: 2, StrideH: 1, StrideW: 2, PadH: 1, Groups: 2}},
	{70, 8, gpu.Conv2DParams{Cin: 2, W: 12, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, Groups: 1}},
	{15, 12, gpu.Conv2DParams{Cin: 6, W: 7, KH: 2, KW: 3, StrideH: 1, StrideW: 1, PadW: 2, Groups: 3}},
	{6, 4, gpu.Conv2DParams{Cin: 4, W: 2, KH: 2, KW: 5, StrideH: 1, StrideW: 2, PadW: 1, Groups: 4}},
	{7, 2, gpu.Conv2DParams{Cin: 3, W: 9, KH: 3, KW: 3, StrideH: 2, StrideW: 3, PadH: 1, PadW: 1, Groups: 1}},
}

func TestConv2D(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for i, c := range conv2dCases {
				for _, dt := range weightTypes {
					t.Run(fmt.Sprintf("%s/w%d/case%d/%v", ks.name, workers, i, dt), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(i), 13))
						p := c.p
						p.Wout = (p.W+2*p.PadW-p.KW)/p.StrideW + 1
						hout := (c.h+2*p.PadH-p.KH)/p.StrideH + 1
						x := view(dev, gpu.F32, c.h, p.Cin*p.W, i%2, 0)
						w := view(dev, dt, c.cout, p.Cin/p.Groups*p.KH*p.KW, 0, 0)
						var bias gpu.Tensor
						if i%2 == 0 {
							bias = view(dev, gpu.F32, 1, c.cout, 0, 0)
							fillRandom(rng, bias)
						}
						fillRandom(rng, x)
						fillRandom(rng, w)
						dst := view(dev, gpu.F32, hout, c.cout*p.Wout, 2, 0)
						q.Conv2D(dst, x, w, bias, p)
						checkPadding(t, dst)
						requireConv(t, dst, conv2dRef(x, w, bias, p, c.cout), 0)
						for _, cut := range cuts(rng, hout) {
							a, b := cut[0], cut[1]
							start := a*p.StrideH - p.PadH
							xp, pp := x, p
							if start >= 0 {
								xp, pp.PadH = x.Slice(start, x.Rows), 0
							} else {
								pp.PadH = -start
							}
							part := view(dev, gpu.F32, b-a, c.cout*p.Wout, 0, 0)
							q.Conv2D(part, xp, w, bias, pp)
							if r, col, ok := bitsEqual(part, dst.Slice(a, b)); !ok {
								t.Fatalf("rows [%d,%d) alone differ at [%d,%d]", a, b, a+r, col)
							}
						}
					})
				}
			}
		}
	}
}
