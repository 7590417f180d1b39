package gpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// The ops below each stand for one op per sequence (or per row) of a
// batch: continuous batching steps hundreds of conversations at once, and
// an op issued per conversation costs a GPU a launch (and a replayed graph
// a node update) per conversation. A backend that implements the matching
// interface runs each as one op; elsewhere the functions run the sequence
// of ops they stand for. Either way the floats are the same: a batched op
// computes each sequence exactly as its op alone would.

// RowCopier is a Queue that copies many rows between two tensors in one op.
type RowCopier interface {
	// CopyRows is CopyRows's sequence of row copies; see there.
	CopyRows(dst, src Tensor, dstRows, srcRows []int32)
}

// CopyRows sets row dstRows[i] of dst to row srcRows[i] of src for every i:
// the same element type and column count, dst and src views whose extents
// do not overlap (no read can see a write), and no dst row named twice.
func CopyRows(q Queue, dst, src Tensor, dstRows, srcRows []int32) {
	if err := checkCopyRows(dst, src, dstRows, srcRows); err != nil {
		panic(err.Error())
	}
	if c, ok := q.(RowCopier); ok {
		c.CopyRows(dst, src, dstRows, srcRows)
		return
	}
	CopyRowsSeq(q, dst, src, dstRows, srcRows)
}

// CopyRowsSeq is CopyRows as plain copies, one per run of rows that are
// consecutive in both tensors.
func CopyRowsSeq(q Queue, dst, src Tensor, dstRows, srcRows []int32) {
	for i := 0; i < len(dstRows); {
		n := 1
		for i+n < len(dstRows) && dstRows[i+n] == dstRows[i]+int32(n) && srcRows[i+n] == srcRows[i]+int32(n) {
			n++
		}
		d, s := int(dstRows[i]), int(srcRows[i])
		q.Copy(dst.Slice(d, d+n), src.Slice(s, s+n))
		i += n
	}
}

func checkCopyRows(dst, src Tensor, dstRows, srcRows []int32) error {
	if len(dstRows) != len(srcRows) || dst.Cols != src.Cols || dst.DType() != src.DType() || (len(dstRows) > 0 && overlap(dst, src)) {
		return fmt.Errorf("gpu: copy %d rows of %v to %d rows of %v", len(srcRows), src, len(dstRows), dst)
	}
	seen := make(map[int32]struct{}, len(dstRows))
	for i, d := range dstRows {
		s := srcRows[i]
		if d < 0 || int(d) >= dst.Rows || s < 0 || int(s) >= src.Rows {
			return fmt.Errorf("gpu: copy row %d of %v to row %d of %v", s, src, d, dst)
		}
		if _, dup := seen[d]; dup {
			return fmt.Errorf("gpu: copy rows: row %d of %v written twice", d, dst)
		}
		seen[d] = struct{}{}
	}
	return nil
}

// AttnSeq is one sequence of a batched attention: Rows consecutive rows of
// q (and of dst) in batch order, the first of them at position QPos0, over
// keys K and V — a sequence's own contiguous keys, or pools paged through
// Blocks with Keys keys, as in AttnParams.
type AttnSeq struct {
	Rows   int
	QPos0  int
	K, V   Tensor
	Blocks Tensor
	Keys   int
}

// SeqAttender is a Queue that runs the attention of many sequences in one
// op.
type SeqAttender interface {
	// AttentionSeqs is AttentionSeqs's sequence of attentions; see there.
	AttentionSeqs(dst, q Tensor, p AttnParams, seqs []AttnSeq)
}

// AttentionSeqs runs Attention for every sequence of seqs on its rows of
// dst and q, with p's heads, scale, mask and rounding and the sequence's
// own QPos0, K, V, Blocks and Keys (p's QPos0, Blocks, BlockRows and Keys
// are ignored; BlockRows is p's for every paged sequence). Sequences of
// no rows are skipped.
func AttentionSeqs(q Queue, dst, qt Tensor, p AttnParams, seqs []AttnSeq) {
	rows := 0
	for _, s := range seqs {
		if s.Rows < 0 {
			panic(fmt.Sprintf("gpu: attention sequence of %d rows", s.Rows))
		}
		rows += s.Rows
	}
	if rows != qt.Rows || dst.Rows != qt.Rows {
		panic(fmt.Sprintf("gpu: attention of %d sequence rows over q %v into %v", rows, qt, dst))
	}
	if a, ok := q.(SeqAttender); ok {
		a.AttentionSeqs(dst, qt, p, seqs)
		return
	}
	AttentionSeqsSeq(q, dst, qt, p, seqs)
}

// AttentionSeqsSeq is AttentionSeqs as one Attention per sequence.
func AttentionSeqsSeq(q Queue, dst, qt Tensor, p AttnParams, seqs []AttnSeq) {
	r0 := 0
	for _, s := range seqs {
		if s.Rows == 0 {
			continue
		}
		sp := p
		sp.QPos0, sp.Blocks, sp.Keys = s.QPos0, s.Blocks, s.Keys
		q.Attention(dst.Slice(r0, r0+s.Rows), qt.Slice(r0, r0+s.Rows), s.K, s.V, sp)
		r0 += s.Rows
	}
}

// SeqConvolver is a Queue that runs the short convolution of many
// sequences, each with its own state, in one op.
type SeqConvolver interface {
	// ShortConvSeqs is ShortConvSeqs's sequence of convolutions; see there.
	ShortConvSeqs(dst, x, w Tensor, states []Tensor, rows []int)
}

// ShortConvSeqs runs ShortConv(dst rows, x rows, w, states[i]) for every
// sequence i, whose rows[i] rows follow the previous sequences' rows in x
// and dst. Sequences of no rows are skipped (their state is untouched).
func ShortConvSeqs(q Queue, dst, x, w Tensor, states []Tensor, rows []int) {
	total := 0
	for _, r := range rows {
		if r < 0 {
			panic(fmt.Sprintf("gpu: short conv sequence of %d rows", r))
		}
		total += r
	}
	if len(states) != len(rows) || total != x.Rows || dst.Rows != x.Rows {
		panic(fmt.Sprintf("gpu: short conv of %d sequences (%d rows) over %v into %v", len(states), total, x, dst))
	}
	if c, ok := q.(SeqConvolver); ok {
		c.ShortConvSeqs(dst, x, w, states, rows)
		return
	}
	ShortConvSeqsSeq(q, dst, x, w, states, rows)
}

// ShortConvSeqsSeq is ShortConvSeqs as one ShortConv per sequence.
func ShortConvSeqsSeq(q Queue, dst, x, w Tensor, states []Tensor, rows []int) {
	r0 := 0
	for i, n := range rows {
		if n == 0 {
			continue
		}
		q.ShortConv(dst.Slice(r0, r0+n), x.Slice(r0, r0+n), w, states[i])
		r0 += n
	}
}

// GatedConvolver is a Queue that runs LFM2's gated short convolution —
// the gate's product, then ShortConvSeqs — as one op, with exactly the
// floats of ShortConvSeqsGatedSeq, or does nothing and reports false where
// it cannot take the shapes.
type GatedConvolver interface {
	ShortConvSeqsGated(dst, b, x, w Tensor, states []Tensor, rows []int, round bool) bool
}

// ShortConvSeqsGated is LFM2's conv operator between its projections:
// bx = b ⊙ x (rounded to bfloat16 when round), then ShortConvSeqs(dst, bx,
// w, states, rows) — the states take the gated rows — as one op where q
// can (GatedConvolver). bx is scratch of x's shape for the sequence (its
// contents afterwards are unspecified); it must not alias dst, b or x.
func ShortConvSeqsGated(q Queue, dst, bx, b, x, w Tensor, states []Tensor, rows []int, round bool) {
	if b.Rows != x.Rows || b.Cols != x.Cols || bx.Rows != x.Rows || bx.Cols != x.Cols {
		panic(fmt.Sprintf("gpu: gated short conv of %v ⊙ %v (scratch %v)", b, x, bx))
	}
	if g, ok := q.(GatedConvolver); ok && g.ShortConvSeqsGated(dst, b, x, w, states, rows, round) {
		return
	}
	ShortConvSeqsGatedSeq(q, dst, bx, b, x, w, states, rows, round)
}

// ShortConvSeqsGatedSeq is ShortConvSeqsGated as its sequence of ops.
func ShortConvSeqsGatedSeq(q Queue, dst, bx, b, x, w Tensor, states []Tensor, rows []int, round bool) {
	q.Mul(bx, b, x)
	if round {
		q.RoundBF16(bx)
	}
	ShortConvSeqs(q, dst, bx, w, states, rows)
}

// Copier is a Queue that runs many independent copies in one op.
type Copier interface {
	// CopyMany is CopyMany's sequence of copies; see there.
	CopyMany(pairs []CopyPair)
}

// CopyPair is one copy of CopyMany: Dst = Src (the same shape and element
// type).
type CopyPair struct{ Dst, Src Tensor }

// CopyMany runs Copy(p.Dst, p.Src) for every pair, as one op where q can
// (a stream's state moved in and out of a batch, one copy per stream). No
// Dst's extent may overlap another pair's Src or Dst or its own Src (Srcs
// may overlap each other): a copy that depends on another's result belongs
// in a later CopyMany.
func CopyMany(q Queue, pairs []CopyPair) {
	for _, p := range pairs {
		if p.Dst.Rows != p.Src.Rows || p.Dst.Cols != p.Src.Cols || p.Dst.DType() != p.Src.DType() {
			panic(fmt.Sprintf("gpu: copy %v to %v", p.Src, p.Dst))
		}
	}
	if err := checkDisjoint(pairs); err != nil {
		panic(err.Error())
	}
	if c, ok := q.(Copier); ok {
		c.CopyMany(pairs)
		return
	}
	for _, p := range pairs {
		q.Copy(p.Dst, p.Src)
	}
}

// extent returns the elements [lo, hi) of t's buffer that its view spans.
func extent(t Tensor) (lo, hi int) {
	if t.Rows == 0 || t.Cols == 0 {
		return t.Off, t.Off
	}
	return t.Off, t.Off + (t.Rows-1)*t.Stride + t.Cols
}

// overlap says a and b are non-empty views of one buffer whose extents
// overlap.
func overlap(a, b Tensor) bool {
	if a.Buf != b.Buf {
		return false
	}
	alo, ahi := extent(a)
	blo, bhi := extent(b)
	return alo < ahi && blo < bhi && alo < bhi && blo < ahi
}

// checkDisjoint checks CopyMany's rule: no Dst extent overlaps any other
// view's (a sweep over each buffer's extents in order of their start).
func checkDisjoint(pairs []CopyPair) error {
	type span struct {
		lo, hi int
		dst    bool
		t      Tensor
	}
	byBuf := map[Buffer][]span{}
	for _, p := range pairs {
		for _, v := range []struct {
			t   Tensor
			dst bool
		}{{p.Dst, true}, {p.Src, false}} {
			if lo, hi := extent(v.t); lo < hi {
				byBuf[v.t.Buf] = append(byBuf[v.t.Buf], span{lo, hi, v.dst, v.t})
			}
		}
	}
	for _, spans := range byBuf {
		slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
		maxHi, maxDst := math.MinInt, math.MinInt
		var last, lastDst Tensor
		for _, s := range spans {
			if s.dst && s.lo < maxHi {
				return fmt.Errorf("gpu: copy many: destination %v overlaps %v", s.t, last)
			}
			if !s.dst && s.lo < maxDst {
				return fmt.Errorf("gpu: copy many: source %v overlaps destination %v", s.t, lastDst)
			}
			if s.hi > maxHi {
				maxHi, last = s.hi, s.t
			}
			if s.dst && s.hi > maxDst {
				maxDst, lastDst = s.hi, s.t
			}
		}
	}
	return nil
}
