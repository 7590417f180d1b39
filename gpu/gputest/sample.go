package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// sampleCase is one Sample launch: B rows of V logits under one
// configuration (each row draws its own U and history).
type sampleCase struct {
	name       string
	B, V       int
	row        gpu.SampleRow // U and History are drawn per row
	histLen    int           // history ids per row (with repeats and ids out of range)
	scale      float32       // logits scale
	ties, nans bool          // plant tied maxima / a NaN row
	tieStride  int           // > 0: plant tied maxima tieStride apart (one GPU thread's entries)
	negInf     bool          // a row of −∞ but one entry
	suppress   bool          // suppress the row's argmax, the last id and an id out of range
	strided    bool
}

// checkSample compares Queue.Sample with gpu.SampleHost, which it must
// equal exactly (the spec's ops are IEEE float64 in a stated order, exp
// included). Half the rows put U exactly on a boundary of the host's
// cumulative distribution (found by bisection on U) or one ulp below it:
// a pick there flips when a partial sum differs by one ulp, so the check
// sees the bits, not only the picks.
func checkSample(h *harness) {
	for _, c := range []sampleCase{
		{name: "greedy", B: 5, V: 2049, row: gpu.SampleRow{}, scale: 4, ties: true, nans: true, strided: true},
		{name: "greedy-penalty", B: 4, V: 300, row: gpu.SampleRow{Penalty: 1.3}, histLen: 40, scale: 4, ties: true},
		{name: "temperature", B: 6, V: 37, row: gpu.SampleRow{Temperature: 0.7}, scale: 3, negInf: true},
		{name: "audio-topk4", B: 64, V: 2049, row: gpu.SampleRow{Temperature: 1, TopK: 4}, scale: 2, strided: true},
		{name: "topk-ties", B: 16, V: 50, row: gpu.SampleRow{Temperature: 1.5, TopK: 3}, scale: 1, ties: true},
		{name: "topk-topp", B: 16, V: 300, row: gpu.SampleRow{Temperature: 0.9, TopK: 40, TopP: 0.8}, scale: 4},
		{name: "topp", B: 16, V: 1000, row: gpu.SampleRow{Temperature: 1.2, TopP: 0.6}, scale: 5},
		{name: "penalty-topk", B: 32, V: 2049, row: gpu.SampleRow{Temperature: 1, TopK: 8, Penalty: 1.5}, histLen: 64, scale: 3},
		{name: "penalty-full", B: 32, V: 129, row: gpu.SampleRow{Temperature: 1, Penalty: 2}, histLen: 30, scale: 2},
		{name: "one-entry", B: 3, V: 1, row: gpu.SampleRow{Temperature: 1, TopK: 4}, scale: 1},
		{name: "suppress-greedy", B: 4, V: 2049, row: gpu.SampleRow{}, scale: 2, ties: true, suppress: true},
		{name: "suppress-topk4", B: 32, V: 2049, row: gpu.SampleRow{Temperature: 1, TopK: 4}, scale: 2, suppress: true},
		// The text head greedy, ragged, with maxima tied 512 apart (the
		// entries one thread of a 512-thread block compares in turn).
		{name: "text-greedy", B: 3, V: 65549, row: gpu.SampleRow{}, scale: 2, tieStride: 512, nans: true, strided: true},
		{name: "text-greedy-suppress", B: 2, V: 65536, row: gpu.SampleRow{}, scale: 2, ties: true, suppress: true},
		{name: "text-topk50", B: 4, V: 65536, row: gpu.SampleRow{Temperature: 0.8, TopK: 50, TopP: 0.95}, scale: 2},
		// Vocabularies on either side of where a backend may keep a row's
		// scratch on chip (cuda: up to 3,343 entries in shared memory),
		// ragged against a 512-thread block.
		{name: "wide-topk4", B: 8, V: 3343, row: gpu.SampleRow{Temperature: 1, TopK: 4, Penalty: 1.2}, histLen: 16, scale: 2, suppress: true},
		{name: "wider-topk4", B: 8, V: 6007, row: gpu.SampleRow{Temperature: 1, TopK: 4, Penalty: 1.2}, histLen: 16, scale: 2, suppress: true, strided: true},
		{name: "wider-topp", B: 4, V: 6007, row: gpu.SampleRow{Temperature: 0.9, TopP: 0.7}, scale: 3},
	} {
		h.sampleCase(c)
	}
}

func (h *harness) sampleCase(c sampleCase) {
	logits := make([]float32, c.B*c.V)
	for i := range logits {
		// Gaussian, bf16-valued as the models' logits (bf16 makes ties).
		logits[i] = gpu.RoundBF16(float32(h.rng.NormFloat64()) * c.scale)
	}
	rows := make([]gpu.SampleRow, c.B)
	for r := range rows {
		row := logits[r*c.V : (r+1)*c.V]
		if c.ties && c.V > 3 { // the maximum twice: the first index must win
			i, j := h.rng.IntN(c.V/2), c.V/2+h.rng.IntN(c.V/2)
			row[i], row[j] = 4*c.scale, 4*c.scale
		}
		if c.tieStride > 0 && c.V > c.tieStride {
			i := h.rng.IntN(c.V - c.tieStride)
			row[i], row[i+c.tieStride] = 4*c.scale, 4*c.scale
		}
		if c.nans && r == 1 && c.V > 2 {
			row[0], row[2] = float32(math.NaN()), float32(math.NaN())
		}
		if c.negInf && r == 0 {
			for i := range row {
				row[i] = float32(math.Inf(-1))
			}
			row[c.V-1] = 0
		}
		rows[r] = c.row
		if c.histLen > 0 {
			hist := make([]int32, c.histLen)
			for i := range hist {
				hist[i] = int32(h.rng.IntN(c.V+2) - 1) // −1 and V are out of range
			}
			hist[0], hist[1] = int32(gpu.SampleHost(row, gpu.SampleRow{}, new(gpu.SampleScratch))), hist[0] // the argmax, twice
			rows[r].History = hist
		}
		if c.suppress {
			best := int32(gpu.SampleHost(row, gpu.SampleRow{}, new(gpu.SampleScratch)))
			rows[r].Suppress = []int32{best, int32(c.V - 1), int32(c.V + 5)}
		}
		if !rows[r].Greedy() {
			rows[r].U = h.rng.Float64()
			switch r % 4 {
			case 1: // on a boundary: a partial sum one ulp larger flips it
				rows[r].U = sampleBoundary(row, rows[r], rows[r].U)
			case 3: // one ulp below one: a partial sum one ulp smaller flips it
				if b := sampleBoundary(row, rows[r], rows[r].U); b != rows[r].U {
					rows[r].U = math.Nextafter(b, 0)
				}
			}
		}
	}
	src := h.input(c.B, c.V, c.strided, logits)
	cols, col := 1, 0
	if c.strided {
		cols, col = 3, 1
	}
	ids := h.dev.Alloc(gpu.I32, c.B, cols)
	h.owned = append(h.owned, ids)
	poison := make([]int32, c.B*cols)
	for i := range poison {
		poison[i] = -7
	}
	h.q.WriteInt(ids, poison)
	h.q.Sample(ids.ColSlice(col, col+1), src.view, rows)
	got := make([]int32, c.B*cols)
	cs := fmt.Sprintf("%s/%dx%d%s", c.name, c.B, c.V, tag(c.strided))
	if err := h.q.ReadInt(got, ids); err != nil {
		h.fail(cs, "ReadInt: %v", err)
		return
	}
	var s gpu.SampleScratch
	bad, detail := 0, ""
	for r := 0; r < c.B; r++ {
		want := int32(gpu.SampleHost(logits[r*c.V:(r+1)*c.V], rows[r], &s))
		for k := 0; k < cols; k++ {
			w := int32(-7)
			if k == col {
				w = want
			}
			if g := got[r*cols+k]; g != w {
				if bad == 0 {
					detail = fmt.Sprintf("row %d col %d: got %d want %d (U %v)", r, k, g, w, rows[r].U)
				}
				bad++
			}
		}
	}
	if bad > 0 {
		detail = fmt.Sprintf("%d/%d picks differ; first %s", bad, c.B, detail)
	}
	h.record(cs, bad == 0, float64(bad), 0, detail)
}

// sampleBoundary returns the smallest U in (0, 1) at which row's pick
// differs from its pick at u0's side below, i.e. a cumulative sum of the
// host's distribution exactly; u0 when the pick never changes.
func sampleBoundary(logits []float32, row gpu.SampleRow, u0 float64) float64 {
	var s gpu.SampleScratch
	pick := func(u float64) int { row.U = u; return gpu.SampleHost(logits, row, &s) }
	lo, hi := 0.0, math.Nextafter(1, 0)
	plo := pick(lo)
	if pick(hi) == plo {
		return u0
	}
	// Bisect on the bits: for non-negative doubles the order of the bits
	// is the order of the values.
	a, b := math.Float64bits(lo), math.Float64bits(hi)
	for b-a > 1 {
		m := a + (b-a)/2
		if pick(math.Float64frombits(m)) == plo {
			a = m
		} else {
			b = m
		}
	}
	return math.Float64frombits(b)
}

// checkEmbedIDs checks EmbedIDs (ids in device memory, a strided view)
// like Embed, and ReadInt of a strided view.
func checkEmbedIDs(h *harness) {
	for _, c := range []struct {
		dt                gpu.DType
		n, rows, trows, w int
	}{{gpu.F32, 1, 4, 11, 7}, {gpu.BF16, 3, 5, 13, 33}, {gpu.BF16, 1, 9, 2049, 16}, {gpu.F16, 2, 2, 6, 64}} {
		table := h.weight(c.dt, c.trows, c.w, true, 1)
		host := make([]int32, c.rows*c.n)
		for i := range host {
			host[i] = int32(h.rng.IntN(c.trows))
		}
		if c.n > 1 && host[0] == host[1] {
			host[1] = (host[0] + 1) % int32(c.trows)
		}
		// The ids live in columns 1..n of a [rows, n+2] tensor.
		all := make([]int32, c.rows*(c.n+2))
		for r := 0; r < c.rows; r++ {
			all[r*(c.n+2)] = -5
			copy(all[r*(c.n+2)+1:], host[r*c.n:(r+1)*c.n])
			all[r*(c.n+2)+c.n+1] = int32(c.trows) + 3
		}
		ids := h.dev.Alloc(gpu.I32, c.rows, c.n+2)
		h.owned = append(h.owned, ids)
		h.q.WriteInt(ids, all)
		view := ids.ColSlice(1, c.n+1)
		dst := h.f32(c.rows, c.w, true)
		want, bound := make([]float64, c.rows*c.w), make([]float64, c.rows*c.w)
		for r := 0; r < c.rows; r++ {
			for k := 0; k < c.w; k++ {
				var s, sa float64
				for _, id := range host[r*c.n : (r+1)*c.n] {
					v := float64(table.vals[int(id)*c.w+k])
					s, sa = s+v, sa+math.Abs(v)
				}
				want[r*c.w+k], bound[r*c.w+k] = s, gamma(c.n)*sa
			}
		}
		var b []float64
		if c.n > 1 {
			b = bound
		}
		h.q.EmbedIDs(dst.view, table.view, view)
		h.verify(fmt.Sprintf("table=%s/n=%d/rows=%d/%dx%d", dtName(c.dt), c.n, c.rows, c.trows, c.w), dst, want, b)
		got := make([]int32, c.rows*c.n)
		cs := fmt.Sprintf("readint-strided/%dx%d", c.rows, c.n)
		if err := h.q.ReadInt(got, view); err != nil {
			h.fail(cs, "ReadInt: %v", err)
			continue
		}
		bad := 0
		for i := range got {
			if got[i] != host[i] {
				bad++
			}
		}
		h.record(cs, bad == 0, float64(bad), 0, fmt.Sprintf("%d/%d ids differ", bad, len(got)))
	}
}
