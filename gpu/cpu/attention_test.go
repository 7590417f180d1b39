package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

type attnCase struct {
	rows, keys int
	p          gpu.AttnParams
}

var attnCases = []attnCase{
	{1, 37, gpu.AttnParams{Heads: 8, KVHeads: 2, HeadDim: 16, QPos0: 36, Causal: true}},
	{13, 13, gpu.AttnParams{Heads: 4, KVHeads: 4, HeadDim: 8, Causal: true}},
	{5, 20, gpu.AttnParams{Heads: 6, KVHeads: 3, HeadDim: 12, QPos0: 15, Causal: true}},
	{20, 20, gpu.AttnParams{Heads: 4, KVHeads: 1, HeadDim: 64, Causal: true, Window: 6}},
	{7, 9, gpu.AttnParams{Heads: 2, KVHeads: 2, HeadDim: 33}},
	{40, 45, gpu.AttnParams{Heads: 32, KVHeads: 8, HeadDim: 64, QPos0: 5, Causal: true}},
	{3, 10, gpu.AttnParams{Heads: 3, KVHeads: 1, HeadDim: 7, QPos0: 2, Causal: true, Window: 4}},
}

// visible returns the key range of query row i.
func visible(c attnCase, i int) (first, last int) {
	pos := c.p.QPos0 + i
	first, last = 0, c.keys-1
	if c.p.Causal {
		last = min(last, pos)
	}
	if c.p.Window > 0 {
		first = max(first, pos-c.p.Window+1)
	}
	return first, last
}

// checkAttention replays attention in float64. The bound follows the
// float32 pipeline: a score s_j carries an absolute error
// δ_j ≤ γ_n·scale·Σ|q·k| (the dot, n = matmulRoundings(hd)) + u·|s_j| (the
// scale); exp(s_j − m) turns δ_j + u·|s_j − m| (the subtraction) + u (exp's
// own rounding) into a relative error; normalising adds γ_L (the sum) + u
// (the division), so every weight p_j is within ε_p = 2Δ + γ_L + u of its
// exact value (Δ the largest exponent error, doubled: numerator and
// denominator); the weighted sum of values adds γ_L relative to Σ p_j·|v_j|.
// The bound is (ε_p + γ_L)·Σ p_j·|v_j|·(1 + 2Δ), the last factor covering
// exp(Δ) − 1 ≤ Δ(1 + Δ). drop leaves the last visible key out (the planted
// fault).
func checkAttention(dst, qt, k, v gpu.Tensor, c attnCase, drop bool) errStats {
	var st errStats
	hd, G := c.p.HeadDim, c.p.Heads/c.p.KVHeads
	replayHeads(dst, qt, k, c, drop, &st, func(i, h, first int, s []float64, delta float64) {
		kh, L := h/G, len(s)
		var sum float64
		for j := range s {
			sum += s[j]
		}
		epsP := 2*delta + gamma(L) + u
		for d := 0; d < hd; d++ {
			var o, abs float64
			for j := range s {
				vv := at(v, first+j, kh*hd+d)
				o += s[j] / sum * vv
				abs += s[j] / sum * math.Abs(vv)
			}
			bound := (epsP + gamma(L)) * abs * (1 + 2*delta)
			st.add(float32(at(dst, i, h*hd+d)), o, bound, func() string {
				return fmt.Sprintf("row %d head %d dim %d: got %v want %v", i, h, d, at(dst, i, h*hd+d), o)
			})
		}
	})
	return st
}

// replayHeads walks the query rows i and heads h of an attention output
// with the keys first … last that row i sees (drop leaves the last one
// out: the planted fault). A row that sees no key must be 0; otherwise
// check gets the head's float64 weights p_j = exp(s_j − m) for keys
// first … first+len(p)−1 and their exponent-error bound δ (exactScores).
func replayHeads(dst, qt, k gpu.Tensor, c attnCase, drop bool, st *errStats,
	check func(i, h, first int, p []float64, delta float64)) {
	hd := c.p.HeadDim
	gDot := gamma(matmulRoundings(hd))
	for i := 0; i < qt.Rows; i++ {
		first, last := visible(c, i)
		if drop {
			last--
		}
		for h := 0; h < c.p.Heads; h++ {
			if last < first {
				for d := 0; d < hd; d++ {
					st.add(float32(at(dst, i, h*hd+d)), 0, 0, func() string { return "empty" })
				}
				continue
			}
			p, delta := exactScores(qt, k, c, i, h, first, last-first+1, gDot)
			check(i, h, first, p, delta)
		}
	}
}

// exactScores returns the unnormalised weights p_j = exp(s_j − m) of query
// row i, head h against keys first … first+L−1 in float64, and the bound
// δ on the float32 pipeline's exponent error: a score s_j carries an
// absolute error up to γ_n·scale·Σ|q·k| (the dot, n the MatMul roundings
// of hd) + u·|s_j| (the scale), the subtraction of the row max adds
// u·|s_j − m| and exp its own rounding u.
func exactScores(qt, k gpu.Tensor, c attnCase, i, h, first, L int, gDot float64) (p []float64, delta float64) {
	hd, G := c.p.HeadDim, c.p.Heads/c.p.KVHeads
	kh := h / G
	scale := float64(c.p.Scale)
	p = make([]float64, L)
	m := math.Inf(-1)
	for j := range p {
		var dot, abs float64
		for d := 0; d < hd; d++ {
			x := at(qt, i, h*hd+d) * at(k, first+j, kh*hd+d)
			dot += x
			abs += math.Abs(x)
		}
		p[j] = dot * scale
		m = max(m, p[j])
		delta = max(delta, gDot*math.Abs(scale)*abs+u*math.Abs(p[j]))
	}
	spread := 0.0
	for j := range p {
		spread = max(spread, math.Abs(p[j]-m))
		p[j] = math.Exp(p[j] - m)
	}
	return p, delta + u*spread + u
}

// checkAttentionProbBF16 replays the ProbBF16 mode in float64: out =
// Σ bf16(p_j)·v_j / Σ p_j. The float32 p̃_j is within a relative
// ε = expm1(2δ) of the exact p_j (δ from exactScores: the score and the
// row max each carry it), so its bf16 rounding r_j lies between the
// roundings of p_j(1−ε) and p_j(1+ε): almost always one value, replayed
// exactly; where the interval straddles a rounding boundary the replay
// takes the midpoint and the bound adds half the gap times |v_j|. The fp32
// row sum l̃ = l(1+λ) has |λ| ≤ (1+ε)(1+γ_L) − 1, the weighted sum adds
// γ_L·S (S = Σ r_j|v_j|) and the division u, so with κ = (u+|λ|)/(1−|λ|)
// every output is within (S·(κ + γ_L(1+κ)) + Σ_straddling gap_j/2·|v_j|)/l.
// A weight left in fp32 moves outputs by about 2⁻⁹·S/l, far outside that.
// drop leaves the last visible key out (the planted fault).
func checkAttentionProbBF16(dst, qt, k, v gpu.Tensor, c attnCase, drop bool) errStats {
	var st errStats
	hd, G := c.p.HeadDim, c.p.Heads/c.p.KVHeads
	replayHeads(dst, qt, k, c, drop, &st, func(i, h, first int, p []float64, delta float64) {
		kh, L := h/G, len(p)
		eps := math.Expm1(2 * delta)
		mid, half := make([]float64, L), make([]float64, L)
		var l float64
		for j, pj := range p {
			l += pj
			lo := float64(roundBF16(float32(pj * (1 - eps))))
			hi := float64(roundBF16(float32(pj * (1 + eps))))
			mid[j], half[j] = (lo+hi)/2, (hi-lo)/2
		}
		lambda := (1+eps)*(1+gamma(L)) - 1
		kappa := (u + lambda) / (1 - lambda)
		for d := 0; d < hd; d++ {
			var o, S, amb float64
			for j := range p {
				vv := at(v, first+j, kh*hd+d)
				o += mid[j] * vv
				S += (mid[j] + half[j]) * math.Abs(vv)
				amb += half[j] * math.Abs(vv)
			}
			o /= l
			bound := (S*(kappa+gamma(L)*(1+kappa)) + amb) / l
			st.add(float32(at(dst, i, h*hd+d)), o, bound, func() string {
				return fmt.Sprintf("row %d head %d dim %d: got %v want %v", i, h, d, at(dst, i, h*hd+d), o)
			})
		}
	})
	return st
}

// TestAttention checks both weight modes against their float64 replays,
// on outputs poisoned beforehand, and that each replay tells the modes
// apart: the other mode's output (fp32 weights where bf16 ones are due, or
// the reverse) fails it, as does a dropped key.
func TestAttention(t *testing.T) {
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for ci, c := range attnCases {
				for _, probBF16 := range []bool{false, true} {
					c := c
					c.p.ProbBF16 = probBF16
					check := checkAttention
					if probBF16 {
						check = checkAttentionProbBF16
					}
					t.Run(fmt.Sprintf("%s/w%d/case%d/probbf16=%v", ks.name, workers, ci, probBF16), func(t *testing.T) {
						testAttentionCase(t, dev, q, ci, c, check)
					})
				}
			}
		}
	}
}

func testAttentionCase(t *testing.T, dev *Device, q *Queue, ci int, c attnCase,
	check func(dst, qt, k, v gpu.Tensor, c attnCase, drop bool) errStats) {
	rng := rand.New(rand.NewPCG(uint64(ci), 17))
	c.p.Scale = float32(1 / math.Sqrt(float64(c.p.HeadDim)))
	kvw := c.p.KVHeads * c.p.HeadDim
	qt := view(dev, gpu.F32, c.rows, c.p.Heads*c.p.HeadDim, ci%2, 0)
	k := view(dev, gpu.F32, c.keys, kvw, 3, 0)
	v := view(dev, gpu.F32, c.keys, kvw, 0, 2)
	for _, x := range []gpu.Tensor{qt, k, v} {
		fillRandom(rng, x)
	}
	// Larger queries give peaked softmaxes too.
	q.Scale(qt, qt, 3)
	dst := view(dev, gpu.F32, c.rows, c.p.Heads*c.p.HeadDim, 1, 1) // poisoned
	q.Attention(dst, qt, k, v, c.p)
	checkPadding(t, dst)
	st := check(dst, qt, k, v, c, false)
	if st.bad > 0 {
		t.Fatalf("%d of %d outside the bound; first %s", st.bad, st.n, st.first)
	}
	fault := check(dst, qt, k, v, c, true)
	other := view(dev, gpu.F32, c.rows, c.p.Heads*c.p.HeadDim, 0, 0)
	po := c.p
	po.ProbBF16 = !po.ProbBF16
	q.Attention(other, qt, k, v, po)
	wrong := check(other, qt, k, v, c, false)
	t.Logf("max |err|/bound %.3g; a dropped key is flagged in %d of %d elements, the other weight mode in %d",
		st.maxRatio, fault.bad, fault.n, wrong.bad)
	if fault.bad < fault.n/2 {
		t.Fatalf("a dropped key was caught in only %d of %d elements", fault.bad, fault.n)
	}
	if wrong.bad < wrong.n/2 {
		t.Fatalf("the other weight mode (ProbBF16=%v) was caught in only %d of %d elements", po.ProbBF16, wrong.bad, wrong.n)
	}

	// Each row alone (a decode step) gives the same floats.
	for i := 0; i < c.rows; i++ {
		one := view(dev, gpu.F32, 1, dst.Cols, 0, 0)
		p := c.p
		p.QPos0 += i
		q.Attention(one, qt.Row(i), k, v, p)
		if _, col, ok := bitsEqual(one, dst.Row(i)); !ok {
			t.Fatalf("row %d alone differs at column %d", i, col)
		}
	}

	// Invisible keys and values may hold NaN: nothing changes.
	for i := 0; i < c.rows; i++ {
		first, last := visible(c, i)
		for j := 0; j < c.keys; j++ {
			if j >= first && j <= last {
				continue
			}
			seen := false // visible to another row of this call?
			for i2 := 0; i2 < c.rows; i2++ {
				f2, l2 := visible(c, i2)
				seen = seen || (j >= f2 && j <= l2)
			}
			if seen {
				continue
			}
			for col := 0; col < kvw; col++ {
				f32s(k)[j*k.Stride+col] = float32(math.NaN())
				f32s(v)[j*v.Stride+col] = float32(math.NaN())
			}
		}
	}
	again := view(dev, gpu.F32, c.rows, dst.Cols, 0, 0)
	q.Attention(again, qt, k, v, c.p)
	if r, col, ok := bitsEqual(again, dst); !ok {
		t.Fatalf("NaN in invisible keys changed [%d,%d] to %v", r, col, at(again, r, col))
	}
}

// TestAttentionInPlace: dst may be q itself.
func TestAttentionInPlace(t *testing.T) {
	for _, ks := range kernelSets(t) {
		dev, q := newTestDevice(t, 2, ks.asm)
		c := attnCases[5]
		c.p.Scale = 0.125
		rng := rand.New(rand.NewPCG(1, 1))
		qt := view(dev, gpu.F32, c.rows, c.p.Heads*c.p.HeadDim, 0, 0)
		k := view(dev, gpu.F32, c.keys, c.p.KVHeads*c.p.HeadDim, 0, 0)
		v := view(dev, gpu.F32, c.keys, c.p.KVHeads*c.p.HeadDim, 0, 0)
		for _, x := range []gpu.Tensor{qt, k, v} {
			fillRandom(rng, x)
		}
		want := view(dev, gpu.F32, qt.Rows, qt.Cols, 0, 0)
		q.Attention(want, qt, k, v, c.p)
		q.Attention(qt, qt, k, v, c.p)
		if r, col, ok := bitsEqual(qt, want); !ok {
			t.Fatalf("%s: in place differs at [%d,%d]", ks.name, r, col)
		}
	}
}
