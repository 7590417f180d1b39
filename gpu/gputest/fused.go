package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The fused ops of gpu.NormFuser (through gpu.NormMatMul and
// gpu.HeadNormRoPE, so a queue without them is checked on the sequence they
// stand for). Their bit-equality with that sequence on a backend is the
// backend's own test; here each output is held to a float64 replay.

// normReplay returns x's rows normalised in float64 (weight w, or none),
// and the bound of each: rmsnorm's (γ_n + 8u)·|ref| and one more rounding
// for the weight's product.
func normReplay(x, w []float32, rows, cols int, eps float32) (want, bound []float64) {
	want, bound = make([]float64, rows*cols), make([]float64, rows*cols)
	for r := 0; r < rows; r++ {
		xr := x[r*cols : (r+1)*cols]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		inv := 1 / math.Sqrt(ss/float64(cols)+float64(eps))
		for k, v := range xr {
			y := float64(v) * inv
			if w != nil {
				y *= float64(w[k])
			}
			want[r*cols+k] = y
			bound[r*cols+k] = (gamma(cols) + 9*u) * math.Abs(y)
		}
	}
	return want, bound
}

// checkNormMatMul: h is checked against the norm's replay, dst against
// the product replayed from the h the op wrote (the kernel's own rounding
// point between the two). One-row shapes with 16-byte rows (what a fused
// kernel takes), a ragged K and several rows (the separate launches); eps
// 0.5 makes a norm that drops eps fail by a factor.
func checkNormMatMul(h *harness) {
	for i, c := range []struct {
		M, K, N int
		eps     float32
		weight  bool
		aligned bool // the weight's view from its first row (a GPU's tiled copy serves it)
	}{{1, 1024, 33, 1e-5, true, false}, {1, 2048, 300, 0.5, true, false}, {1, 64, 1029, 0.5, false, false},
		{1, 264, 5, 0.5, true, false}, {1, 1030, 7, 0.5, true, false}, {3, 296, 5, 0.5, true, false},
		{1, 304, 2110, 0.5, true, false}, {1, 264, 4220, 0.5, false, false}, {1, 264, 4220, 0.5, true, true}} {
		xv, x, nw, wv := h.normInput(c.M, c.K, c.weight)
		w := h.alignedWeight(c.aligned, gpu.BF16, c.N, c.K)
		var b operand
		bt := gpu.Tensor{}
		if i%2 == 0 {
			b = h.vector(gpu.F32, c.N, 1)
			bt = b.view
		}
		hv, dst := h.f32(c.M, c.K, false), h.f32(c.M, c.N, i%3 == 1)
		gpu.NormMatMul(h.q, dst.view, hv.view, x.view, gpu.RowNorm{Eps: c.eps, W: nw.view}, w.view, bt)
		name := fmt.Sprintf("M=%d/K=%d/N=%d/eps=%g/weight=%v", c.M, c.K, c.N, c.eps, c.weight)
		hk, ok := h.verifyNorm(name, hv, xv, wv, c.M, c.K, c.eps, x, nw)
		if !ok {
			continue
		}
		want, bound := matmulReplay(hk, w.vals, b.vals, c.M, c.K, c.N)
		h.verify(name+"/product", dst, want, bound, x, w, b)
	}
}

// checkHeadNormRoPE: every head normalised (normReplay over rows·heads
// rows of hd), then rotated as checkRoPE replays a rotation (cos and sin of
// the fp32 angle, rounded to fp32) in float64; a rotated value adds to the
// norm's relative error two products and a sum, so the bound is
// (γ_hd + 12u)·(|y₀·cos| + |y₁·sin|). Into another buffer (the copy the op
// replaces), from a strided source, and in place.
func checkHeadNormRoPE(h *harness) {
	for _, c := range []struct {
		style     gpu.RoPEStyle
		hd, heads int
		pos       []int32
		mode      string
		eps       float32
		weight    bool
		theta     float64
	}{
		{gpu.Interleaved, 64, 2, []int32{5}, "", 1e-5, true, 1e6},
		{gpu.RotateHalf, 64, 3, []int32{3, 900, 17}, "strided", 0.5, true, 1e4},
		{gpu.RotateHalf, 128, 1, []int32{4000}, "inplace", 0.5, false, 1e6},
		{gpu.Interleaved, 6, 3, []int32{0, 7}, "inplace", 0.5, true, 1e4},
	} {
		rows, cols := len(c.pos), c.hd*c.heads
		half := c.hd / 2
		invf := make([]float32, half)
		for j := range invf {
			invf[j] = float32(math.Pow(c.theta, -2*float64(j)/float64(c.hd)))
		}
		xv := h.values(rows*cols, 1)
		src := h.input(rows, cols, c.mode == "strided", xv)
		var nw operand
		var wv []float32
		if c.weight {
			nw = h.weight(gpu.BF16, 1, c.hd, false, 1)
			wv = nw.vals
		}
		dst, srcs := src, []operand{nw}
		if c.mode != "inplace" {
			dst, srcs = h.f32(rows, cols, false), []operand{src, nw}
		}
		rp := gpu.RoPEParams{Style: c.style, HeadDim: c.hd, InvFreq: invf, Pos: c.pos}
		gpu.HeadNormRoPE(h.q, dst.view, src.view, gpu.RowNorm{Eps: c.eps, W: nw.view}, rp, false)
		y, _ := normReplay(xv, wv, rows*c.heads, c.hd, c.eps)
		want, bound := headRoPEReplay(y, rows, cols, c.hd, c.pos, invf, c.style)
		h.verify(fmt.Sprintf("%s/hd=%d/heads=%d/rows=%d/%s/eps=%g/weight=%v", styleName(c.style), c.hd, c.heads, rows, c.mode, c.eps, c.weight),
			dst, want, bound, srcs...)
	}
	checkPrepHeads(h)
}

// checkPrepHeads: an attention's q, k and v in one PrepHeads from one
// packed qkv row set (q in place, k into another buffer, v copied), each
// held to checkHeadNormRoPE's replay (the copy exactly).
func checkPrepHeads(h *harness) {
	const hd, hq, hk = 64, 4, 2
	pos := []int32{6, 300}
	rows, cols := len(pos), (hq+2*hk)*hd
	invf := make([]float32, hd/2)
	for j := range invf {
		invf[j] = float32(math.Pow(1e6, -2*float64(j)/float64(hd)))
	}
	xv := h.values(rows*cols, 1)
	qkv := h.input(rows, cols, false, xv)
	qn, kn := h.weight(gpu.BF16, 1, hd, false, 1), h.weight(gpu.BF16, 1, hd, false, 1)
	kd, vd := h.f32(rows, hk*hd, false), h.f32(rows, hk*hd, true)
	q := qkv.view.ColSlice(0, hq*hd)
	rp := gpu.RoPEParams{Style: gpu.Interleaved, HeadDim: hd, InvFreq: invf, Pos: pos}
	gpu.PrepHeads(h.q, rp, false,
		gpu.HeadPrep{Dst: q, Src: q, Norm: gpu.RowNorm{Eps: 0.5, W: qn.view}},
		gpu.HeadPrep{Dst: kd.view, Src: qkv.view.ColSlice(hq*hd, (hq+hk)*hd), Norm: gpu.RowNorm{Eps: 1e-5, W: kn.view}},
		gpu.HeadPrep{Dst: vd.view, Src: qkv.view.ColSlice((hq+hk)*hd, cols), Copy: true})
	part := func(c0, n int) []float32 {
		out := make([]float32, rows*n)
		for r := 0; r < rows; r++ {
			copy(out[r*n:(r+1)*n], xv[r*cols+c0:r*cols+c0+n])
		}
		return out
	}
	rotate := func(x, w []float32, heads int, eps float32) (want, bound []float64) {
		y, _ := normReplay(x, w, rows*heads, hd, eps)
		return headRoPEReplay(y, rows, heads*hd, hd, pos, invf, gpu.Interleaved)
	}
	// q lives in qkv: verify reads the whole row set, so the replay holds
	// q's rotated heads and k, v's untouched source columns.
	qw, qb := rotate(part(0, hq*hd), qn.vals, hq, 0.5)
	want, bound := make([]float64, rows*cols), make([]float64, rows*cols)
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			if c < hq*hd {
				want[r*cols+c], bound[r*cols+c] = qw[r*hq*hd+c], qb[r*hq*hd+c]
			} else {
				want[r*cols+c] = float64(xv[r*cols+c])
			}
		}
	}
	h.verify("prep/q-in-qkv", qkv, want, bound, qn)
	kw, kb := rotate(part(hq*hd, hk*hd), kn.vals, hk, 1e-5)
	h.verify("prep/k", kd, kw, kb, kn)
	vv := part((hq+hk)*hd, hk*hd)
	vw := make([]float64, len(vv))
	for i, v := range vv {
		vw[i] = float64(v)
	}
	h.verify("prep/v-copy", vd, vw, make([]float64, len(vv)))
}

// headRoPEReplay rotates the normalised heads y ([rows, cols], heads of hd
// columns) as checkRoPE's replay rotates (cos and sin of the fp32 angle,
// rounded to fp32, then float64), and bounds each value: the norm's
// relative error (normReplay: γ_hd + 9u) and three roundings more (two
// products and a sum) over |y₀·cos| + |y₁·sin|.
func headRoPEReplay(y []float64, rows, cols, hd int, pos []int32, invf []float32, style gpu.RoPEStyle) (want, bound []float64) {
	want, bound = make([]float64, rows*cols), make([]float64, rows*cols)
	e := gamma(hd) + 12*u
	half := hd / 2
	for r := 0; r < rows; r++ {
		for j := 0; j < half; j++ {
			ang := float32(pos[r]) * invf[j]
			cs, sn := float64(float32(math.Cos(float64(ang)))), float64(float32(math.Sin(float64(ang))))
			for hh := 0; hh < cols; hh += hd {
				i0, i1 := r*cols+hh+j, r*cols+hh+j+half
				if style == gpu.Interleaved {
					i0, i1 = r*cols+hh+2*j, r*cols+hh+2*j+1
				}
				y0, y1 := y[i0], y[i1]
				want[i0], want[i1] = y0*cs-y1*sn, y1*cs+y0*sn
				bound[i0] = e * (math.Abs(y0*cs) + math.Abs(y1*sn))
				bound[i1] = e * (math.Abs(y1*cs) + math.Abs(y0*sn))
			}
		}
	}
	return want, bound
}

func styleName(s gpu.RoPEStyle) string {
	if s == gpu.Interleaved {
		return "interleaved"
	}
	return "half"
}

// checkNormGLU: gpu.NormGLU's h as checkNormMatMul checks it, then dst =
// (h·w3ᵀ) ⊙ silu(h·w1ᵀ) replayed in float64 from the h the queue wrote.
// Each rounding to bfloat16 (round) is a relative error of at most uB on
// the value it rounds; the bound carries the products' bounds (the tensor
// cores' where the queue sums there), silu's slope (at most 1.1) and its
// 8 ulps, and the ⊙'s own rounding through every step. One row takes a
// GPU's fused kernel, three rows its sequence.
func checkNormGLU(h *harness) {
	const uB = 1.0 / (1 << 8) // bfloat16's unit roundoff
	for _, c := range []struct {
		M, K, F int
		eps     float32
		weight  bool
		round   bool
		aligned bool // w1 and w3 viewed from their first rows (a GPU's tiled copies serve them)
	}{{1, 1024, 33, 1e-5, true, true, false}, {1, 2048, 300, 0.5, true, false, false},
		{1, 264, 4220, 0.5, false, true, false}, {1, 264, 4220, 0.5, true, true, true},
		{1, 1030, 17, 0.5, true, true, false}, {3, 296, 5, 0.5, true, true, false}} {
		xv, x, nw, wv := h.normInput(c.M, c.K, c.weight)
		w1 := h.alignedWeight(c.aligned, gpu.BF16, c.F, c.K)
		w3 := h.alignedWeight(c.aligned, gpu.BF16, c.F, c.K)
		hv, dst, a := h.f32(c.M, c.K, false), h.f32(c.M, c.F, false), h.f32(c.M, c.F, false)
		gpu.NormGLU(h.q, dst.view, a.view, hv.view, x.view, gpu.RowNorm{Eps: c.eps, W: nw.view}, w1.view, w3.view, c.round)
		name := fmt.Sprintf("M=%d/K=%d/F=%d/eps=%g/weight=%v/round=%v", c.M, c.K, c.F, c.eps, c.weight, c.round)
		hk, ok := h.verifyNorm(name, hv, xv, wv, c.M, c.K, c.eps, x, nw)
		if !ok {
			continue
		}
		replay := matmulReplay
		if h.opts.TensorCoreMatMul {
			replay = matmulReplayTC
		}
		v1, e1 := replay(hk, w1.vals, nil, c.M, c.K, c.F)
		v3, e3 := replay(hk, w3.vals, nil, c.M, c.K, c.F)
		ub := 0.0
		if c.round {
			ub = uB
		}
		want, bound := make([]float64, c.M*c.F), make([]float64, c.M*c.F)
		for i := range want {
			s := activation(gpu.SiLU, v1[i])
			E1 := e1[i] + ub*(math.Abs(v1[i])+e1[i])  // h·w1ᵀ, rounded
			Es := 1.1*E1 + 8*u*math.Abs(s)*2 + 8*u*E1 // silu of it
			Ea := Es + ub*(math.Abs(s)+Es)            // rounded
			E3 := e3[i] + ub*(math.Abs(v3[i])+e3[i])  // h·w3ᵀ, rounded
			p := v3[i] * s
			Ep := math.Abs(v3[i])*Ea + math.Abs(s)*E3 + E3*Ea
			Ep += u * (math.Abs(p) + Ep) // the ⊙ in fp32
			want[i], bound[i] = p, Ep+ub*(math.Abs(p)+Ep)
		}
		h.verify(name+"/glu", dst, want, bound, x, w1, w3)
	}
}

// verifyNorm checks hv, the rows × cols norm a fused op wrote of x's
// values xv (norm weight values wv), against normReplay, and returns
// hv's values row after row — what the products after the norm are
// replayed from — or false, the case failed, where they cannot be read.
func (h *harness) verifyNorm(name string, hv operand, xv, wv []float32, rows, cols int, eps float32, x, nw operand) ([]float32, bool) {
	want, bound := normReplay(xv, wv, rows, cols, eps)
	h.verify(name+"/norm", hv, want, bound, x, nw)
	got, err := h.read(hv)
	if err != nil {
		h.fail(name, "%v", err)
		return nil, false
	}
	v := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		for k := 0; k < cols; k++ {
			v[r*cols+k] = got[hv.at(r, k)]
		}
	}
	return v, true
}

// normInput makes a fused norm's input: x's M × K values and x itself, and,
// when weight, the norm's bf16 weight and its values (else zero operands).
func (h *harness) normInput(M, K int, weight bool) (xv []float32, x, nw operand, wv []float32) {
	xv = h.values(M*K, 1)
	x = h.input(M, K, false, xv)
	if weight {
		nw = h.weight(gpu.BF16, 1, K, false, 1)
		wv = nw.vals
	}
	return xv, x, nw, wv
}

// alignedWeight is weight (unscaled, unstrided) whose view starts at the
// first row of its buffer where aligned, else at a random top row as
// weight places it: a GPU keeps a tiled copy of a loaded bf16 matrix for
// its few-row products, which serves only views from a multiple of 16
// rows, so aligned cases take those kernels' tiled paths.
func (h *harness) alignedWeight(aligned bool, dt gpu.DType, rows, cols int) operand {
	if aligned {
		h.top = 1
		defer func() { h.top = 0 }()
	}
	return h.weight(dt, rows, cols, false, 1)
}
