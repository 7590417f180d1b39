package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// std_block_f32's float64 replay, a phase at a time: the kernel runs one
// launch a phase, its intermediates (the scratch, the caches, the row)
// are read after each, and every value a phase wrote must lie in the
// interval that a float64 replay of that phase — from the values the
// earlier phases actually wrote — gives it. The intervals carry the fp32
// arithmetic's bounds (Higham's γ for sums, the tensor cores' γ′ with unit
// roundoff 2u for products, as gputest bounds the single ops) through
// every step, and a bf16 rounding point maps an interval to the rounded
// ends (rounding is monotone): where fp32's error cannot cross a rounding
// boundary the interval is one value and the kernel must hit it exactly.

const u32 = 1.0 / (1 << 24) // float32's unit roundoff

// span is the interval a device value must lie in.
type span struct{ lo, hi float64 }

func pt(v float64) span { return span{v, v} }

// widen adds ±e.
func (s span) widen(e float64) span { return span{s.lo - e, s.hi + e} }

func (s span) abs() float64 { return max(math.Abs(s.lo), math.Abs(s.hi)) }

// rnd is a bf16 rounding point.
func (s span) rnd() span {
	return span{float64(gpu.RoundBF16(gputest.Floor32(s.lo))), float64(gpu.RoundBF16(gputest.Ceil32(s.hi)))}
}

func (s span) add(o span) span {
	r := span{s.lo + o.lo, s.hi + o.hi}
	return r.widen(u32 * r.abs())
}

func (s span) mul(o span) span {
	a, b, c, d := s.lo*o.lo, s.lo*o.hi, s.hi*o.lo, s.hi*o.hi
	r := span{min(a, b, c, d), max(a, b, c, d)}
	return r.widen(u32 * r.abs())
}

func (s span) scale(k float64) span { return s.mul(pt(k)) }

func (s span) contains(v float32) bool { return float64(v) >= s.lo && float64(v) <= s.hi }

// tcGamma bounds a K-term tensor-core product's error by tcGamma·Σ|x·w|.
func tcGamma(K int) float64 {
	n := float64(3*K + 17)
	return n*2*u32/(1-n*2*u32) + u32
}

func gamma32(n int) float64 { return float64(n) * u32 / (1 - float64(n)*u32) }

// spanProduct is x·wᵀ for [N, K] weights w over the intervals x.
func spanProduct(x []span, w []float32, N int) []span {
	K := len(x)
	y := make([]span, N)
	for n := range y {
		var lo, hi, sa float64
		for k, xk := range x {
			wk := float64(w[n*K+k])
			a, b := xk.lo*wk, xk.hi*wk
			lo, hi = lo+min(a, b), hi+max(a, b)
			sa += xk.abs() * math.Abs(wk)
		}
		y[n] = span{lo, hi}.widen(tcGamma(K) * sa)
	}
	return y
}

// spanNorm is gpu.NormRows of the device row x (exact inputs) with n,
// weights w (nil: none): rmsnorm's factor within (γ_n + 9u) of its
// float64 value, as gputest bounds it.
func spanNorm(x []float32, w []float32, n gpu.RowNorm) []span {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+float64(n.Eps))
	rel := gamma32(len(x)) + 9*u32
	y := make([]span, len(x))
	for k, v := range x {
		yk := pt(float64(v) * inv).widen(math.Abs(float64(v)*inv) * rel)
		if n.Round {
			yk = yk.rnd()
		}
		if w != nil {
			yk = yk.scale(float64(w[k]))
			if n.RoundW {
				yk = yk.rnd()
			}
		}
		y[k] = yk
	}
	return y
}

// spanRoPE rotates a head of intervals at pos (rope_f32's fp32 angle, cos
// and sin; bf16 rounding of each product and the sum with rp.BF16; the
// result rounded).
func spanRoPE(y []span, pos int, rp gpu.RoPEParams) []span {
	half := len(y) / 2
	out := make([]span, len(y))
	for j := 0; j < half; j++ {
		ang := float32(pos) * rp.InvFreq[j]
		c, s := float64(float32(math.Cos(float64(ang)))), float64(float32(math.Sin(float64(ang))))
		i0, i1 := j, j+half
		if rp.Style == gpu.Interleaved {
			i0, i1 = 2*j, 2*j+1
		}
		x0, x1 := y[i0], y[i1]
		if rp.BF16 {
			c, s = float64(gpu.RoundBF16(float32(c))), float64(gpu.RoundBF16(float32(s)))
			out[i0] = x0.scale(c).rnd().add(x1.scale(-s).rnd()).rnd()
			out[i1] = x1.scale(c).rnd().add(x0.scale(s).rnd()).rnd()
		} else {
			out[i0] = x0.scale(c).add(x1.scale(-s)).rnd()
			out[i1] = x1.scale(c).add(x0.scale(s)).rnd()
		}
	}
	return out
}

// spanAttention is one query head q over keys ks and values vs (device
// values, all visible), its output rounded.
func spanAttention(q []float32, ks, vs [][]float32, scale float64, probBF16 bool) []span {
	L, hd := len(ks), len(q)
	s := make([]span, L)
	mlo, mhi := math.Inf(-1), math.Inf(-1)
	for j, k := range ks {
		var d, da float64
		for e := range q {
			d += float64(q[e]) * float64(k[e])
			da += math.Abs(float64(q[e]) * float64(k[e]))
		}
		s[j] = pt(d).widen(gamma32(hd) * da).scale(scale)
		mlo, mhi = max(mlo, s[j].lo), max(mhi, s[j].hi)
	}
	p, pr := make([]span, L), make([]span, L)
	var l span
	for j, sj := range s {
		lo, hi := sj.lo-mhi, sj.hi-mlo
		lo, hi = lo-u32*math.Abs(lo), hi+u32*math.Abs(hi)
		p[j] = span{math.Exp(lo) * (1 - 4*u32), math.Exp(hi) * (1 + 4*u32)}
		pr[j] = p[j]
		if probBF16 {
			pr[j] = p[j].rnd()
		}
		l = span{l.lo + p[j].lo, l.hi + p[j].hi}
	}
	l = l.widen(gamma32(L) * l.hi)
	out := make([]span, hd)
	for e := range out {
		var n span
		var na float64
		for j := range pr {
			t := pr[j].scale(float64(vs[j][e]))
			n = span{n.lo + t.lo, n.hi + t.hi}
			na += t.abs()
		}
		n = n.widen(gamma32(L) * na)
		a, b, c, d := n.lo/l.lo, n.lo/l.hi, n.hi/l.lo, n.hi/l.hi
		o := span{min(a, b, c, d), max(a, b, c, d)}
		out[e] = o.widen(u32 * o.abs()).rnd()
	}
	return out
}

// spanSiLU is x·σ(x) over an interval (its one minimum at x* ≈ −1.2785)
// with the kernel's fp32 error.
func spanSiLU(x span) span {
	f := func(v float64) float64 { return v / (1 + math.Exp(-v)) }
	const xs = -1.2784645427610738
	var r span
	switch {
	case x.hi <= xs:
		r = span{f(x.hi), f(x.lo)}
	case x.lo >= xs:
		r = span{f(x.lo), f(x.hi)}
	default:
		r = span{f(xs), max(f(x.lo), f(x.hi))}
	}
	return r.widen(4*u32*r.abs() + 0x1p-140)
}

// TestStdBlockPhasesReplay runs std_block_f32 a phase at a time on every
// shape of blockShapes and holds each phase's outputs to the float64
// replay of that phase from what the kernel wrote before it; then the same
// with the planted fault STDBLOCK, which the attention's phase must
// catch.
func TestStdBlockPhasesReplay(t *testing.T) {
	for _, fault := range []string{"", "STDBLOCK"} {
		d := openTestDevice(t, Options{MatMul: "mma", Fault: fault, FusedBlock: true})
		q := d.NewQueue("replay").(*Queue)
		bad := 0
		for i, s := range blockShapes {
			c, err := newBlockCase(d, s, uint64(100+i))
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := c.replayPhases(q)
			if err != nil {
				t.Fatal(err)
			}
			bad += len(msgs)
			if fault == "" {
				for _, m := range msgs {
					t.Errorf("%v: %s", s, m)
				}
			}
			c.close(d)
		}
		if fault != "" && bad == 0 {
			t.Errorf("the planted fault %s passed the replay", fault)
		}
	}
}

// replayPhases runs c's block a phase at a time on q and returns a line
// for each output the replay does not admit (at most a few per output).
func (c *blockCase) replayPhases(q *Queue) ([]string, error) {
	b := c.b
	if why := q.blockUnfusable(b); why != "" {
		return nil, fmt.Errorf("not fusable: %s", why)
	}
	D, hq, kvd, F := b.Dims()
	H, KVH, hd := b.Heads, b.KVHeads, b.HeadDim
	q.Write(b.X, c.x)
	q.Write(b.K, c.kc)
	q.Write(b.V, c.vc)
	offs, _ := blockScratch(b)
	var rdErr error
	read := func(t gpu.Tensor) []float32 {
		v := make([]float32, t.Len())
		if err := q.Read(v, t); err != nil && rdErr == nil {
			rdErr = err
		}
		return v
	}
	scr := func(j, n int) []float32 {
		return read(gpu.Tensor{Buf: q.blk, Off: offs[j], Rows: 1, Cols: n, Stride: n})
	}
	w := func(t gpu.Tensor) []float32 { return c.host[t.Buf] }
	var msgs []string
	check := func(what string, got []float32, want []span) {
		n := 0
		for i := range want {
			if !want[i].contains(got[i]) {
				if n < 3 {
					msgs = append(msgs, fmt.Sprintf("%s[%d] = %v, the replay admits [%v, %v]", what, i, got[i], want[i].lo, want[i].hi))
				}
				n++
			}
		}
		if n > 3 {
			msgs = append(msgs, fmt.Sprintf("%s: %d of %d outside", what, n, len(want)))
		}
	}
	norms := func(n gpu.RowNorm) []float32 {
		if n.W.IsNil() {
			return nil
		}
		return w(n.W)
	}
	// Phase 0: the qkv product from x, then each head prepared from it.
	q.blockLaunch(b, 0, 1)
	qkv := scr(0, hq+2*kvd)
	check("qkv", qkv, rounded(spanProduct(spanNorm(c.x, norms(b.OpNorm), b.OpNorm), w(b.QKV), hq+2*kvd)))
	qs := scr(1, hq)
	kall, vall := read(b.K), read(b.V)
	for h := 0; h < H+2*KVH; h++ {
		head := qkv[h*hd : (h+1)*hd]
		switch {
		case h < H:
			check(fmt.Sprintf("q head %d", h), qs[h*hd:(h+1)*hd], spanRoPE(spanNorm(head, norms(b.QNorm), b.QNorm), b.Pos, b.RoPE))
		case h < H+KVH:
			o := b.Pos*kvd + (h-H)*hd
			check(fmt.Sprintf("k head %d", h-H), kall[o:o+hd], spanRoPE(spanNorm(head, norms(b.KNorm), b.KNorm), b.Pos, b.RoPE))
		default:
			o := b.Pos*kvd + (h-H-KVH)*hd
			want := make([]span, hd)
			for e, v := range head {
				want[e] = pt(float64(v))
			}
			check(fmt.Sprintf("v head %d", h-H-KVH), vall[o:o+hd], want)
		}
	}
	// Phase 1: attention from q and the caches as written.
	q.blockLaunch(b, 1, 2)
	o := scr(2, hq)
	for h := 0; h < H; h++ {
		kh := h / (H / KVH)
		var ks, vs [][]float32
		for j := 0; j <= b.Pos; j++ {
			ks = append(ks, kall[j*kvd+kh*hd:j*kvd+(kh+1)*hd])
			vs = append(vs, vall[j*kvd+kh*hd:j*kvd+(kh+1)*hd])
		}
		check(fmt.Sprintf("o head %d", h), o[h*hd:(h+1)*hd], spanAttention(qs[h*hd:(h+1)*hd], ks, vs, float64(b.Scale), b.ProbBF16))
	}
	// Phase 2: a = round(round(o·Woᵀ) + x).
	q.blockLaunch(b, 2, 3)
	a := scr(3, D)
	check("a", a, residual(spanProduct(exactSpans(o), w(b.Out), D), c.x))
	// Phase 3: g3 = round(round(h·W3ᵀ)·g1), g1 = round(silu(round(h·W1ᵀ)))
	// (held in registers: its interval enters g3's).
	q.blockLaunch(b, 3, 4)
	g3 := scr(4, F)
	hn := spanNorm(a, norms(b.FFNNorm), b.FFNNorm)
	g1 := rounded(spanProduct(hn, w(b.W1), F))
	want3 := rounded(spanProduct(hn, w(b.W3), F))
	for i := range want3 {
		want3[i] = want3[i].mul(spanSiLU(g1[i]).rnd()).rnd()
	}
	check("g3", g3, want3)
	// Phase 4: x = round(round(g3·W2ᵀ) + a).
	q.blockLaunch(b, 4, 5)
	check("x", read(b.X), residual(spanProduct(exactSpans(g3), w(b.W2), D), a))
	return msgs, rdErr
}

func exactSpans(v []float32) []span {
	s := make([]span, len(v))
	for i, f := range v {
		s[i] = pt(float64(f))
	}
	return s
}

func rounded(s []span) []span {
	for i := range s {
		s[i] = s[i].rnd()
	}
	return s
}

// residual is round(round(p) + r) for products p and device values r.
func residual(p []span, r []float32) []span {
	for i := range p {
		p[i] = p[i].rnd().add(pt(float64(r[i]))).rnd()
	}
	return p
}
