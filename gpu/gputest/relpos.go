package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The relative-position attention core of package gpu (RelPosScores and
// HeadsMatMul, through the package functions, so a queue without the
// fused ops is checked on the sequences they stand for). Shapes: one row
// (T = 1), T not a multiple of 8, an encoder clip (T = 63, 8 heads of
// 64), head dims 64, 80, 128 and one past a warp's 256-term chunk (300),
// 8, 3 and 1 heads; inputs as strided views (a clip's rows of wider
// tensors, column-sliced per head by the op).

// relPosCase is one RelPosScores check.
type relPosCase struct {
	T, heads, hd int
	round        bool
	strided      bool
}

var relPosCases = []relPosCase{
	{1, 8, 64, true, false}, {1, 3, 80, false, true},
	{7, 3, 64, true, true}, {7, 3, 64, false, false},
	{9, 8, 64, false, true}, {13, 3, 80, true, false},
	{20, 2, 128, true, true}, {5, 1, 300, true, false},
	{63, 8, 64, true, false}, {63, 8, 64, false, true},
}

// checkRelPosScores holds every score to an interval replay: each dot
// product is known within γ_hd·Σ|terms| of its float64 value, so its
// float32 result lies in [Floor32(s − b), Ceil32(s + b)]; every later
// step (the bf16 roundings when Round, the float32 sum and the product
// with Scale) is monotone, so applying it to both ends bounds its result.
// The check then asks for the middle of the final interval within half
// its width: an element whose roundings the inputs determine must match
// exactly (a kernel that drops a rounding, reads a neighbouring position
// or another head fails by far more).
func checkRelPosScores(h *harness) {
	for _, c := range relPosCases {
		T, d := c.T, c.heads*c.hd
		quv, qvv, kv := h.values(T*d, 1), h.values(T*d, 1), h.values(T*d, 1)
		pv := h.values((2*T-1)*d, 1)
		qu, qv := h.input(T, d, c.strided, quv), h.input(T, d, c.strided, qvv)
		k, p := h.input(T, d, c.strided, kv), h.input(2*T-1, d, c.strided, pv)
		scores := h.f32(c.heads*T, T, c.strided)
		work := h.f32(T, 2*T-1, false)
		rp := gpu.RelPosParams{Heads: c.heads, HeadDim: c.hd, Scale: 1 / float32(math.Sqrt(float64(c.hd))), Round: c.round}
		gpu.RelPosScores(h.q, scores.view, work.view, qu.view, qv.view, k.view, p.view, rp)
		want, bound := relPosReplay(c, quv, qvv, kv, pv, rp.Scale)
		prec := "f32"
		if c.round {
			prec = "bf16"
		}
		h.verify(fmt.Sprintf("T=%d/heads=%d/hd=%d/%s%s", T, c.heads, c.hd, prec, tag(c.strided)), scores, want, bound, qu, qv, k, p)
	}
}

// relPosReplay returns the middle and half-width of each score's interval
// (checkRelPosScores).
func relPosReplay(c relPosCase, qu, qv, k, p []float32, scale float32) (want, bound []float64) {
	T, hd, d := c.T, c.hd, c.heads*c.hd
	want, bound = make([]float64, c.heads*T*T), make([]float64, c.heads*T*T)
	rnd := func(lo, hi float32) (float32, float32) {
		if c.round {
			return gpu.RoundBF16(lo), gpu.RoundBF16(hi)
		}
		return lo, hi
	}
	dot := func(x []float32, xr int, y []float32, yr, h int) (float32, float32) {
		var s, a float64
		for e := h * hd; e < (h+1)*hd; e++ {
			t := float64(x[xr*d+e]) * float64(y[yr*d+e])
			s += t
			a += math.Abs(t)
		}
		b := gamma(hd)*a*(1+0x1p-40) + 0x1p-149
		return Floor32(s - b), Ceil32(s + b)
	}
	for h := range c.heads {
		for i := range T {
			for j := range T {
				alo, ahi := rnd(dot(qu, i, k, j, h))
				blo, bhi := rnd(dot(qv, i, p, T-1-i+j, h))
				lo, hi := rnd(float32(float64(alo)+float64(blo)), float32(float64(ahi)+float64(bhi)))
				slo, shi := float32(float64(lo)*float64(scale)), float32(float64(hi)*float64(scale))
				lo, hi = rnd(min(slo, shi), max(slo, shi))
				n := (h*T+i)*T + j
				want[n], bound[n] = (float64(lo)+float64(hi))/2, (float64(hi)-float64(lo))/2
			}
		}
	}
	return want, bound
}

// Floor32 and Ceil32 return the float32 values next to x below and above
// (x itself when it is one).
func Floor32(x float64) float32 {
	f := float32(x)
	if float64(f) > x {
		f = math.Nextafter32(f, float32(math.Inf(-1)))
	}
	return f
}

func Ceil32(x float64) float32 {
	f := float32(x)
	if float64(f) < x {
		f = math.Nextafter32(f, float32(math.Inf(1)))
	}
	return f
}

// checkHeadsMatMul: each output is one head's product of L terms,
// matmulReplay's bound γ_{L+1}·Σ|terms|; a kernel that takes another
// head's rows or columns fails by far more.
func checkHeadsMatMul(h *harness) {
	for _, c := range []struct {
		T, L, heads, hd int
		strided         bool
	}{
		{1, 1, 8, 64, false}, {1, 1, 3, 80, true}, {7, 7, 3, 64, true}, {9, 9, 8, 80, false},
		{13, 13, 3, 128, true}, {4, 11, 2, 64, false}, {300, 300, 1, 8, true}, {63, 63, 8, 64, false},
	} {
		d := c.heads * c.hd
		pv, vv := h.values(c.heads*c.T*c.L, 1), h.values(d*c.L, 1)
		probs, vt := h.input(c.heads*c.T, c.L, c.strided, pv), h.input(d, c.L, true, vv)
		o := h.f32(c.T, d, c.strided)
		gpu.HeadsMatMul(h.q, o.view, probs.view, vt.view, c.heads)
		want, bound := make([]float64, c.T*d), make([]float64, c.T*d)
		for hh := range c.heads {
			ph := pv[hh*c.T*c.L : (hh+1)*c.T*c.L]
			vh := vv[hh*c.hd*c.L : (hh+1)*c.hd*c.L]
			w, b := matmulReplay(ph, vh, nil, c.T, c.L, c.hd)
			for i := range c.T {
				copy(want[i*d+hh*c.hd:][:c.hd], w[i*c.hd:(i+1)*c.hd])
				copy(bound[i*d+hh*c.hd:][:c.hd], b[i*c.hd:(i+1)*c.hd])
			}
		}
		h.verify(fmt.Sprintf("T=%d/L=%d/heads=%d/hd=%d%s", c.T, c.L, c.heads, c.hd, tag(c.strided)), o, want, bound, probs, vt)
	}
}
