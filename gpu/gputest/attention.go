package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// attnCase is one Attention check: nq query rows at positions qpos0 … over
// nk key rows; steps > 0 computes the rows one call at a time (decode
// steps over a cache). paged > 0 pages the keys in blocks of that many
// rows (gpu.AttnParams.Blocks): the logical blocks sit in shuffled blocks
// of a pool with spare, poisoned blocks among them, and the table's view
// sits between entries that name a poisoned block.
type attnCase struct {
	name                   string
	heads, kvheads, hd     int
	nq, nk, qpos0, window  int
	causal, strided, steps bool
	paged                  int
}

// attnCases covers decode rows over a cache (QPos0 > 0), prefill, sliding
// windows narrower than the visible keys, non-causal attention, GQA and
// head dimensions 2, 6 and 64; each runs with ProbBF16 off and on.
var attnCases = []attnCase{
	{name: "causal/qpos0=6", heads: 2, kvheads: 2, hd: 6, nq: 3, nk: 11, qpos0: 6, causal: true, strided: true},
	{name: "causal/prefill/gqa", heads: 4, kvheads: 2, hd: 64, nq: 12, nk: 14, qpos0: 0, causal: true},
	{name: "causal/window=3/qpos0=8", heads: 2, kvheads: 1, hd: 6, nq: 4, nk: 13, qpos0: 8, window: 3, causal: true, strided: true},
	{name: "causal/window=5/prefill/gqa", heads: 4, kvheads: 2, hd: 2, nq: 9, nk: 9, qpos0: 0, window: 5, causal: true},
	{name: "noncausal/gqa", heads: 4, kvheads: 2, hd: 2, nq: 5, nk: 11, qpos0: 0, strided: true},
	{name: "noncausal/qpos0=4", heads: 1, kvheads: 1, hd: 64, nq: 2, nk: 7, qpos0: 4},
	{name: "causal/decode-steps/qpos0=20/gqa", heads: 4, kvheads: 2, hd: 64, nq: 3, nk: 25, qpos0: 20, causal: true, strided: true, steps: true},
	{name: "causal/qpos0=30/long", heads: 2, kvheads: 1, hd: 2, nq: 4, nk: 40, qpos0: 30, causal: true},
	{name: "causal/window=16/qpos0=33/gqa", heads: 4, kvheads: 2, hd: 6, nq: 2, nk: 36, qpos0: 33, window: 16, causal: true, strided: true},
	// Paged keys: ragged last blocks, one-row blocks, a window that starts
	// inside a block, decode steps through the table, a long run of keys
	// (several thread groups per block on a GPU) and a head wider than a
	// GPU block's threads.
	{name: "paged=4/causal/decode-steps/qpos0=20/gqa", heads: 4, kvheads: 2, hd: 64, nq: 3, nk: 25, qpos0: 20, causal: true, strided: true, steps: true, paged: 4},
	{name: "paged=16/causal/qpos0=28/gqa", heads: 4, kvheads: 2, hd: 6, nq: 12, nk: 40, qpos0: 28, causal: true, paged: 16},
	{name: "paged=3/causal/window=7/qpos0=30", heads: 2, kvheads: 1, hd: 6, nq: 4, nk: 34, qpos0: 30, window: 7, causal: true, strided: true, paged: 3},
	{name: "paged=1/noncausal/gqa", heads: 4, kvheads: 2, hd: 2, nq: 5, nk: 11, qpos0: 0, strided: true, paged: 1},
	{name: "paged=64/causal/qpos0=300/long", heads: 2, kvheads: 1, hd: 64, nq: 2, nk: 302, qpos0: 300, causal: true, paged: 64},
	{name: "paged=8/causal/qpos0=18/wide-head", heads: 2, kvheads: 1, hd: 136, nq: 2, nk: 20, qpos0: 18, causal: true, paged: 8},
	// More keys than a GPU block keeps scores for in shared memory (4,096
	// on CUDA: then they go through memory and the table).
	{name: "paged=64/causal/qpos0=4200/beyond-shared", heads: 2, kvheads: 1, hd: 6, nq: 1, nk: 4201, qpos0: 4200, causal: true, paged: 64},
	{name: "causal/qpos0=4150/beyond-shared", heads: 1, kvheads: 1, hd: 2, nq: 1, nk: 4151, qpos0: 4150, causal: true, strided: true},
}

func checkAttention(h *harness) {
	for _, c := range attnCases {
		for _, pb := range []bool{false, true} {
			attentionCase(h, c, pb)
		}
	}
}

// visible returns the first and last key row query position pos sees.
func (c attnCase) visible(pos int) (first, last int) {
	first, last = 0, c.nk-1
	if c.causal {
		last = min(last, pos)
	}
	if c.window > 0 {
		first = max(first, pos-c.window+1)
	}
	return first, last
}

func attentionCase(h *harness, c attnCase, probBF16 bool) {
	qc, kc := c.heads*c.hd, c.kvheads*c.hd
	qv := h.values(c.nq*qc, 1)
	kv, vv := h.values(c.nk*kc, 1), h.values(c.nk*kc, 1)
	// Key rows no query sees hold NaN: the contract says they may.
	lo, hi := c.nk, -1
	for i := 0; i < c.nq; i++ {
		f, l := c.visible(c.qpos0 + i)
		lo, hi = min(lo, f), max(hi, l)
	}
	for j := 0; j < c.nk; j++ {
		if j < lo || j > hi {
			for e := 0; e < kc; e++ {
				kv[j*kc+e], vv[j*kc+e] = float32(math.NaN()), float32(math.NaN())
			}
		}
	}
	q := h.input(c.nq, qc, c.strided, qv)
	scale := float32(1 / math.Sqrt(float64(c.hd)))
	p := gpu.AttnParams{Heads: c.heads, KVHeads: c.kvheads, HeadDim: c.hd, Scale: scale, QPos0: c.qpos0,
		Causal: c.causal, Window: c.window, ProbBF16: probBF16}
	k, v, pg := h.kvOperands(c, kv, vv, kc)
	p.Blocks, p.BlockRows, p.Keys = pg.table, pg.rows, pg.keys
	dst := h.f32(c.nq, qc, c.strided)
	want, bound := attentionReplay(c, qv, kv, vv, scale, probBF16)
	if c.steps {
		for i := 0; i < c.nq; i++ {
			ps := p
			ps.QPos0 = c.qpos0 + i
			h.q.Attention(dst.view.Row(i), q.view.Row(i), k.view, v.view, ps)
		}
	} else {
		h.q.Attention(dst.view, q.view, k.view, v.view, p)
	}
	prec := "/prob=f32"
	if probBF16 {
		prec = "/prob=bf16"
	}
	name := fmt.Sprintf("%s/heads=%d/kv=%d/hd=%d/nq=%d/nk=%d%s%s", c.name, c.heads, c.kvheads, c.hd, c.nq, c.nk, prec, tag(c.strided))
	h.verify(name, dst, want, bound, q, k, v)
}

// pageTable lays out nk keys in blocks of br rows: the ceil(nk/br) logical
// blocks in shuffled blocks of a pool of two more (spares), as an I32 table
// view [1, n] inside a buffer whose other entries name a spare block (a
// kernel that reads beyond the view reads poison). It returns the table,
// br, nk, and for every pool row the key it holds (−1: none, poisoned).
// paging is a paged case's block table, rows per block and key count.
type paging struct {
	table      gpu.Tensor
	rows, keys int
}

// kvOperands makes a case's keys and values of kc columns: a block-paged
// pool and its table when c.paged > 0, else contiguous inputs (and a zero
// paging).
func (h *harness) kvOperands(c attnCase, kv, vv []float32, kc int) (k, v operand, pg paging) {
	if c.paged == 0 {
		return h.input(c.nk, kc, c.strided, kv), h.input(c.nk, kc, c.strided, vv), paging{}
	}
	var pv []int32
	pg.table, pg.rows, pg.keys, pv = h.pageTable(c.nk, c.paged)
	return h.pagedPool(pv, kv, kc, c.strided), h.pagedPool(pv, vv, kc, c.strided), pg
}

func (h *harness) pageTable(nk, br int) (table gpu.Tensor, rows, keys int, poolKey []int32) {
	n := (nk + br - 1) / br
	total := n + 2
	perm := h.rng.Perm(total)
	ids := make([]int32, n+2) // a guard entry either side of the view
	ids[0], ids[n+1] = int32(perm[n]), int32(perm[n+1])
	poolKey = make([]int32, total*br)
	for i := range poolKey {
		poolKey[i] = -1
	}
	for b := 0; b < n; b++ {
		ids[1+b] = int32(perm[b])
		for r := 0; r < br && b*br+r < nk; r++ {
			poolKey[perm[b]*br+r] = int32(b*br + r)
		}
	}
	whole := h.dev.Alloc(gpu.I32, 1, n+2)
	h.owned = append(h.owned, whole)
	h.q.WriteInt(whole, ids)
	return whole.ColSlice(1, n+1), br, nk, poolKey
}

// attentionReplay returns the float64 replay of Attention and its bound.
//
// Replay: s_j = scale·(q·k_j) over the visible keys, m = max s_j, p_j =
// exp(s_j − m), l = Σ p_j; out = Σ r_j·v_j / l with r_j = p_j, or with
// ProbBF16 r_j = bf16(float32(p_j)) (the kernel's fp32 p rounded to bf16).
//
// Bound. A kernel's score is off by δ_j = scale·γ_hd·Σ|q·k_j| + u·|s_j|
// (a dot product and the scaling), its maximum by δ_max = max δ_j, its
// float32 s_j − m by u·|s_j − m|, and its exp by 4 ulps (8u): so its p_j is
// within a relative ε_j = 2·(δ_j + δ_max + u·|s_j − m| + 8u) of p_j (a
// factor 2 of margin). With ProbBF16 the bf16 rounding of a p known to ε_j
// is determined unless [p(1−ε), p(1+ε)] straddles a rounding boundary;
// then the replay allows the whole bf16 step there (unc_j), and nothing
// elsewhere. So
//
//	|out − ref| ≤ (Σ unc_j·|v_j| + Σ_fp32 ε_j·r_j·|v_j| + (γ_L + 2u)·Σ r_j·|v_j|)/l
//	            + |ref|·(Σ ε_j·p_j/l + γ_L + 2u)
//
// (the second sum only without ProbBF16; γ_L for the sums over L keys, 2u
// for the divisions). A kernel that does not round p when asked is off by
// about 2⁻⁹·|v|/√L, orders of magnitude beyond this bound.
func attentionReplay(c attnCase, qv, kv, vv []float32, scale float32, probBF16 bool) (want, bound []float64) {
	qc, kc := c.heads*c.hd, c.kvheads*c.hd
	want, bound = make([]float64, c.nq*qc), make([]float64, c.nq*qc)
	G := c.heads / c.kvheads
	sc := float64(scale)
	for i := 0; i < c.nq; i++ {
		first, last := c.visible(c.qpos0 + i)
		for hh := 0; hh < c.heads; hh++ {
			kh := hh / G
			out := want[i*qc+hh*c.hd:][:c.hd]
			ob := bound[i*qc+hh*c.hd:][:c.hd]
			if last < first {
				continue // no visible key: zero (the CPU's convention), exactly
			}
			L := last - first + 1
			s, d := make([]float64, L), make([]float64, L)
			m, dmax := math.Inf(-1), 0.0
			for j := range s {
				var dot, da float64
				for e := 0; e < c.hd; e++ {
					pr := float64(qv[i*qc+hh*c.hd+e]) * float64(kv[(first+j)*kc+kh*c.hd+e])
					dot += pr
					da += math.Abs(pr)
				}
				s[j] = sc * dot
				d[j] = math.Abs(sc)*gamma(c.hd)*da + u*math.Abs(s[j])
				m, dmax = math.Max(m, s[j]), math.Max(dmax, d[j])
			}
			p, eps, r, unc := make([]float64, L), make([]float64, L), make([]float64, L), make([]float64, L)
			var l, el float64
			for j := range s {
				p[j] = math.Exp(s[j] - m)
				eps[j] = 2 * (d[j] + dmax + u*math.Abs(s[j]-m) + 8*u)
				l += p[j]
				el += eps[j] * p[j]
				r[j] = p[j]
				if probBF16 {
					r[j] = float64(gpu.RoundBF16(float32(p[j])))
					rlo := float64(gpu.RoundBF16(float32(p[j] * (1 - eps[j]))))
					rhi := float64(gpu.RoundBF16(float32(p[j] * (1 + eps[j]))))
					unc[j] = rhi - rlo
				}
			}
			gl := gamma(L)
			for e := 0; e < c.hd; e++ {
				var num, a, rv float64
				for j := range s {
					vj := float64(vv[(first+j)*kc+kh*c.hd+e])
					num += r[j] * vj
					a += unc[j] * math.Abs(vj)
					if !probBF16 {
						a += eps[j] * r[j] * math.Abs(vj)
					}
					rv += r[j] * math.Abs(vj)
				}
				out[e] = num / l
				ob[e] = (a+(gl+2*u)*rv)/l + math.Abs(out[e])*(el/l+gl+2*u)
			}
		}
	}
	return want, bound
}
