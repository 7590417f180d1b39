package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The batched ops of gpu/seqs.go, each checked against the replay of the
// ops it stands for: every sequence of a batch with its own keys, table,
// position and state, so that a kernel that reads another sequence's (or
// the first one's) fails.

// attnSeqsCases are batches of sequences that share heads, mask and head
// size: decode rows beside prefill chunks, paged beside contiguous keys, a
// sequence of no rows, positions and key counts all different.
var attnSeqsCases = []struct {
	name string
	seqs []attnCase
}{
	{"decode+prefill/paged+contiguous/gqa", []attnCase{
		{heads: 4, kvheads: 2, hd: 64, nq: 1, nk: 25, qpos0: 24, causal: true, paged: 4},
		{heads: 4, kvheads: 2, hd: 64, nq: 1, nk: 9, qpos0: 8, causal: true, strided: true},
		{heads: 4, kvheads: 2, hd: 64, nq: 0, nk: 5, qpos0: 5, causal: true, paged: 4},
		{heads: 4, kvheads: 2, hd: 64, nq: 3, nk: 14, qpos0: 11, causal: true, paged: 4},
		{heads: 4, kvheads: 2, hd: 64, nq: 1, nk: 302, qpos0: 301, causal: true, paged: 4},
	}},
	{"decode/window=7/paged", []attnCase{
		{heads: 2, kvheads: 1, hd: 6, nq: 1, nk: 34, qpos0: 33, window: 7, causal: true, paged: 3},
		{heads: 2, kvheads: 1, hd: 6, nq: 1, nk: 4, qpos0: 3, window: 7, causal: true, paged: 3},
		{heads: 2, kvheads: 1, hd: 6, nq: 2, nk: 20, qpos0: 18, window: 7, causal: true, paged: 3, strided: true},
	}},
	// A batch whose longest sequence has more keys than a GPU block keeps
	// scores for in shared memory (4,096 on CUDA).
	{"decode/paged/beyond-shared", []attnCase{
		{heads: 2, kvheads: 1, hd: 6, nq: 1, nk: 4201, qpos0: 4200, causal: true, paged: 64},
		{heads: 2, kvheads: 1, hd: 6, nq: 1, nk: 10, qpos0: 9, causal: true, paged: 64},
	}},
	{"noncausal/contiguous", []attnCase{
		{heads: 4, kvheads: 2, hd: 2, nq: 5, nk: 11},
		{heads: 4, kvheads: 2, hd: 2, nq: 2, nk: 3, strided: true},
		{heads: 4, kvheads: 2, hd: 2, nq: 1, nk: 40},
	}},
}

func checkAttentionSeqs(h *harness) {
	for _, b := range attnSeqsCases {
		for _, pb := range []bool{false, true} {
			attentionSeqsCase(h, b.name, b.seqs, pb)
		}
	}
}

// attentionSeqsCase runs one batch through gpu.AttentionSeqs and checks
// every sequence's rows against attentionReplay of that sequence alone.
func attentionSeqsCase(h *harness, name string, cs []attnCase, probBF16 bool) {
	c0 := cs[0]
	qc, kc := c0.heads*c0.hd, c0.kvheads*c0.hd
	rows := 0
	for _, c := range cs {
		rows += c.nq
	}
	qv := h.values(rows*qc, 1)
	scale := float32(1 / math.Sqrt(float64(c0.hd)))
	p := gpu.AttnParams{Heads: c0.heads, KVHeads: c0.kvheads, HeadDim: c0.hd, Scale: scale, Causal: c0.causal,
		Window: c0.window, ProbBF16: probBF16}
	seqs := make([]gpu.AttnSeq, len(cs))
	want, bound := make([]float64, 0, rows*qc), make([]float64, 0, rows*qc)
	srcs := []operand{}
	r0 := 0
	for si, c := range cs {
		kv, vv := h.values(c.nk*kc, 1), h.values(c.nk*kc, 1)
		s := gpu.AttnSeq{Rows: c.nq, QPos0: c.qpos0}
		k, v, pg := h.kvOperands(c, kv, vv, kc)
		if c.paged > 0 {
			s.Blocks, p.BlockRows, s.Keys = pg.table, pg.rows, pg.keys
		}
		s.K, s.V = k.view, v.view
		seqs[si] = s
		srcs = append(srcs, k, v)
		w, b := attentionReplay(c, qv[r0*qc:(r0+c.nq)*qc], kv, vv, scale, probBF16)
		want, bound = append(want, w...), append(bound, b...)
		r0 += c.nq
	}
	q := h.input(rows, qc, true, qv)
	dst := h.f32(rows, qc, true)
	gpu.AttentionSeqs(h.q, dst.view, q.view, p, seqs)
	prec := "/prob=f32"
	if probBF16 {
		prec = "/prob=bf16"
	}
	h.verify(fmt.Sprintf("%s/seqs=%d/rows=%d/heads=%d/kv=%d/hd=%d%s", name, len(cs), rows, c0.heads, c0.kvheads, c0.hd, prec),
		dst, want, bound, append(srcs, q)...)
}

// pagedPool lays vals (keys of kc columns) out in the pool rows that
// pageTable's poolKey names, poison elsewhere.
func (h *harness) pagedPool(poolKey []int32, vals []float32, kc int, strided bool) operand {
	pool := make([]float32, len(poolKey)*kc)
	for r, j := range poolKey {
		for e := 0; e < kc; e++ {
			pool[r*kc+e] = poison
			if j >= 0 {
				pool[r*kc+e] = vals[int(j)*kc+e]
			}
		}
	}
	return h.input(len(poolKey), kc, strided, pool)
}

// checkShortConvSeqs runs several batched calls in a row, each sequence on
// its own state, and checks every output within γ_L·Σ|w·x′| and every
// state exactly after every call (a sequence of no rows keeps its state).
func checkShortConvSeqs(h *harness) {
	for _, c := range []struct {
		L, C    int
		wdt     gpu.DType
		calls   [][]int // rows of each sequence, per call
		strided bool
	}{
		{3, 33, gpu.F32, [][]int{{5, 1, 3}, {1, 1, 1}, {1, 0, 2}}, true},
		{4, 130, gpu.BF16, [][]int{{1, 1, 1, 1}, {2, 1, 0, 1}, {1, 1, 1, 1}}, false},
		{4, 5, gpu.BF16, [][]int{{1}, {3}}, true},
		{3, 33, gpu.F32, [][]int{{37, 1, 18}, {1, 1, 1}}, false}, // chunks of 16 rows on CUDA
	} {
		name := fmt.Sprintf("L=%d/C=%d/w=%s/seqs=%d%s", c.L, c.C, dtName(c.wdt), len(c.calls[0]), tag(c.strided))
		shortConvCalls(h, name, c.L, c.C, c.wdt, c.calls, c.strided, false, false)
	}
}

// checkShortConvGated: gpu.ShortConvSeqsGated as checkShortConvSeqs
// checks the convolution, its input the gate's product b ⊙ x — a float32
// product, rounded to bfloat16 when round, replayed exactly — and the
// states holding the gated rows; a batch of sequences over two calls
// (chunks of rows on CUDA in the first), a strided batch, and the gate
// unrounded.
func checkShortConvGated(h *harness) {
	for _, c := range []struct {
		L, C    int
		calls   [][]int
		strided bool
		round   bool
	}{
		{3, 130, [][]int{{37, 1, 4}, {1, 1, 1}}, false, true},
		{4, 33, [][]int{{1, 2}, {3, 0}}, true, false},
	} {
		name := fmt.Sprintf("L=%d/C=%d/seqs=%d/round=%v%s", c.L, c.C, len(c.calls[0]), c.round, tag(c.strided))
		shortConvCalls(h, name, c.L, c.C, gpu.BF16, c.calls, c.strided, true, c.round)
	}
}

// shortConvCalls runs the batched convolution of one weight over calls in
// a row (calls[i]: each sequence's rows), each sequence on its own state;
// gated, each call's input is b ⊙ x (ShortConvSeqsGated, rounded when
// round). It checks every output against shortConvReplay of the input as
// the op forms it, and every state exactly after every call.
func shortConvCalls(h *harness, name string, L, C int, wdt gpu.DType, calls [][]int, strided, gated, round bool) {
	w := h.weight(wdt, C, L, false, 1)
	nseq := len(calls[0])
	st := make([][]float32, nseq)
	states := make([]operand, nseq)
	for i := range st {
		st[i] = h.values((L-1)*C, 1)
		states[i] = h.input(L-1, C, strided, append([]float32(nil), st[i]...))
	}
	views := make([]gpu.Tensor, nseq)
	for i, s := range states {
		views[i] = s.view
	}
	for call, rows := range calls {
		T := 0
		for _, r := range rows {
			T += r
		}
		var b operand
		var bv []float32
		if gated {
			bv = h.values(T*C, 1)
			b = h.input(T, C, strided, bv)
		}
		xv := h.values(T*C, 1)
		x := h.input(T, C, strided, xv)
		in, srcs := xv, []operand{x}
		if gated {
			in, srcs = make([]float32, T*C), append(srcs, b)
			for i := range in {
				in[i] = bv[i] * xv[i]
				if round {
					in[i] = gpu.RoundBF16(in[i])
				}
			}
		}
		dst := h.f32(T, C, strided)
		want, bound := make([]float64, T*C), make([]float64, T*C)
		r0 := 0
		for si, n := range rows {
			xp := append(append([]float32(nil), st[si]...), in[r0*C:(r0+n)*C]...)
			shortConvReplay(want[r0*C:], bound[r0*C:], w.vals, xp, n, C, L)
			st[si] = append([]float32(nil), xp[n*C:]...)
			r0 += n
		}
		if gated {
			bx := h.f32(T, C, false)
			gpu.ShortConvSeqsGated(h.q, dst.view, bx.view, b.view, x.view, w.view, views, rows, round)
		} else {
			gpu.ShortConvSeqs(h.q, dst.view, x.view, w.view, views, rows)
		}
		cs := fmt.Sprintf("%s/call%d/rows=%v", name, call+1, rows)
		h.verify(cs, dst, want, bound, srcs...)
		for si, s := range states {
			got, err := h.read(s)
			if err != nil {
				h.fail(cs+"/state", "%v", err)
				continue
			}
			d := compare(s, got, widen(st[si]), nil, true)
			h.record(fmt.Sprintf("%s/state%d", cs, si), d.ok(), d.err, 0, d.String())
		}
	}
}

// checkCopyRows scatters and gathers rows (shuffled, with runs of
// consecutive rows and single ones) and checks the destination exactly:
// the named rows hold their sources, every other row its old contents.
func checkCopyRows(h *harness) {
	for _, c := range []struct {
		dst, src, cols, n int
		strided           bool
	}{
		{40, 9, 7, 9, true},      // a scatter of all source rows
		{6, 50, 300, 6, false},   // a gather into every destination row
		{64, 64, 2100, 17, true}, // wide rows, some of each
	} {
		dv := h.values(c.dst*c.cols, 1)
		sv := h.values(c.src*c.cols, 1)
		dst := h.input(c.dst, c.cols, c.strided, append([]float32(nil), dv...))
		src := h.input(c.src, c.cols, c.strided, sv)
		// n−3 shuffled rows with a run of three rows consecutive in both
		// tensors (the last three of each) in their midst.
		dperm, sperm := h.rng.Perm(c.dst - 3)[:c.n-3], h.rng.Perm(c.src - 3)[:c.n-3]
		mid := (c.n - 3) / 2
		run := func(n int) []int { return []int{n - 3, n - 2, n - 1} }
		dperm = append(append(append([]int(nil), dperm[:mid]...), run(c.dst)...), dperm[mid:]...)
		sperm = append(append(append([]int(nil), sperm[:mid]...), run(c.src)...), sperm[mid:]...)
		dr, sr := make([]int32, c.n), make([]int32, c.n)
		want := widen(dv)
		for i := range dr {
			dr[i], sr[i] = int32(dperm[i]), int32(sperm[i])
			for e := 0; e < c.cols; e++ {
				want[dperm[i]*c.cols+e] = float64(sv[sperm[i]*c.cols+e])
			}
		}
		gpu.CopyRows(h.q, dst.view, src.view, dr, sr)
		got, err := h.read(dst)
		cs := fmt.Sprintf("dst=%d/src=%d/cols=%d/n=%d%s", c.dst, c.src, c.cols, c.n, tag(c.strided))
		if err != nil {
			h.fail(cs, "%v", err)
			continue
		}
		d := compare(dst, got, want, nil, true)
		pass := d.ok()
		detail := d.String()
		if msg := h.unchanged(src); msg != "" {
			pass, detail = false, detail+"; "+msg
		}
		h.record(cs, pass, d.err, 0, detail)
	}
	copyRowsBF16(h)
}

// checkBF16View compares a bf16 view with want bit for bit, reading it back
// by gathering each of its rows into float32 with Embed (exact in its
// one-id form). The padding of a bf16 view is not read back (the F32 cases
// check that the copies keep to the view).
func checkBF16View(h *harness, cs string, dst operand, want []float32) {
	out := h.f32(dst.view.Rows, dst.view.Cols, false)
	ids := make([]int32, dst.view.Rows)
	for r := range ids {
		ids[r] = int32(r)
	}
	h.q.Embed(out.view, dst.view, ids)
	got, err := h.read(out)
	if err != nil {
		h.fail(cs, "%v", err)
		return
	}
	d := compare(out, got, widen(want), nil, false)
	h.record(cs, d.ok(), d.err, 0, d.String())
}

// copyRowsBF16 scatters rows of bf16 tensors (a backend may move 2-byte
// elements with kernels of their own): the copied rows hold the source's,
// the others their own.
func copyRowsBF16(h *harness) {
	for _, c := range []struct{ dst, src, cols, n int }{{12, 5, 9, 5}, {7, 40, 1030, 7}} {
		dst := h.weight(gpu.BF16, c.dst, c.cols, true, 1)
		src := h.weight(gpu.BF16, c.src, c.cols, c.cols < 100, 1)
		want := append([]float32(nil), dst.vals...)
		dperm, sperm := h.rng.Perm(c.dst)[:c.n], h.rng.Perm(c.src)[:c.n]
		dr, sr := make([]int32, c.n), make([]int32, c.n)
		for i := range dr {
			dr[i], sr[i] = int32(dperm[i]), int32(sperm[i])
			copy(want[dperm[i]*c.cols:(dperm[i]+1)*c.cols], src.vals[sperm[i]*c.cols:(sperm[i]+1)*c.cols])
		}
		gpu.CopyRows(h.q, dst.view, src.view, dr, sr)
		checkBF16View(h, fmt.Sprintf("bf16/dst=%d/src=%d/cols=%d/n=%d", c.dst, c.src, c.cols, c.n), dst, want)
	}
}

// copyManyBF16 copies bf16 views of several shapes in one op, each into
// rows 1 … of a destination one row taller.
func copyManyBF16(h *harness) {
	shapes := [][2]int{{3, 7}, {1, 300}, {5, 1}, {2, 2100}}
	pairs := make([]gpu.CopyPair, len(shapes))
	dsts := make([]operand, len(shapes))
	wants := make([][]float32, len(shapes))
	for i, sh := range shapes {
		rows, cols := sh[0], sh[1]
		dsts[i] = h.weight(gpu.BF16, rows+1, cols, i%2 == 0, 1)
		src := h.weight(gpu.BF16, rows, cols, i%2 == 1, 1)
		pairs[i] = gpu.CopyPair{Dst: dsts[i].view.Slice(1, rows+1), Src: src.view}
		wants[i] = append(append([]float32(nil), dsts[i].vals[:cols]...), src.vals...)
	}
	gpu.CopyMany(h.q, pairs)
	for i := range pairs {
		checkBF16View(h, fmt.Sprintf("bf16/pair%d/%dx%d", i, shapes[i][0], shapes[i][1]), dsts[i], wants[i])
	}
}

// checkCopyMany copies views of several shapes (strided, one row, one
// column, wide) between several buffers in one op and checks every
// destination exactly, its padding and every other row untouched.
func checkCopyMany(h *harness) {
	for _, c := range []struct {
		name   string
		shapes [][2]int
	}{
		{"mixed", [][2]int{{3, 7}, {1, 300}, {5, 1}, {2, 2100}, {4, 33}}},
		{"same-shape", [][2]int{{6, 16}, {6, 16}, {6, 16}}},
	} {
		pairs := make([]gpu.CopyPair, len(c.shapes))
		dsts, srcs := make([]operand, len(c.shapes)), make([]operand, len(c.shapes))
		wants := make([][]float64, len(c.shapes))
		for i, sh := range c.shapes {
			rows, cols := sh[0], sh[1]
			strided := i%2 == 0
			// The copy lands in rows 1 … rows of a destination one row
			// taller, whose first row must keep its values.
			dv := h.values((rows+1)*cols, 1)
			sv := h.values(rows*cols, 1)
			dsts[i] = h.input(rows+1, cols, strided, append([]float32(nil), dv...))
			srcs[i] = h.input(rows, cols, !strided, sv)
			pairs[i] = gpu.CopyPair{Dst: dsts[i].view.Slice(1, rows+1), Src: srcs[i].view}
			wants[i] = widen(append(dv[:cols:cols], sv...))
		}
		gpu.CopyMany(h.q, pairs)
		for i := range pairs {
			cs := fmt.Sprintf("%s/pair%d/%dx%d", c.name, i, c.shapes[i][0], c.shapes[i][1])
			got, err := h.read(dsts[i])
			if err != nil {
				h.fail(cs, "%v", err)
				continue
			}
			d := compare(dsts[i], got, wants[i], nil, true)
			pass, detail := d.ok(), d.String()
			if msg := h.unchanged(srcs[i]); msg != "" {
				pass, detail = false, detail+"; "+msg
			}
			h.record(cs, pass, d.err, 0, detail)
		}
	}
	copyManyBF16(h)
}
