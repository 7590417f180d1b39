package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The batched ops of gpu.RowCopier, gpu.SeqAttender and gpu.SeqConvolver:
// one launch for every sequence of a batch, each sequence's pointers and
// positions in the launch's uploaded bytes. A replayed graph then changes
// data, not kernel arguments, as the sessions advance (no node updates),
// and a step of 256 sessions is one launch where it was 256.

// attnRowBytes and convSeqBytes are the sizes of kernels.cu's struct
// attn_seq and struct conv_seq.
const (
	attnRowBytes = 48
	convSeqBytes = 24
)

// CopyRows implements gpu.RowCopier: one copy_rows launch, a block per row
// pair (the arguments were checked by gpu.CopyRows).
func (q *Queue) CopyRows(dst, src gpu.Tensor, dstRows, srcRows []int32) {
	n := len(dstRows)
	if n == 0 || dst.Cols == 0 {
		return
	}
	name := "copy_rows_u32"
	switch dst.DType().Size() {
	case 4:
	case 2:
		name = "copy_rows_u16"
	default:
		panic(fmt.Sprintf("cuda: copy rows of %v", dst))
	}
	pairs := make([]int32, 2*n)
	for i := range dstRows {
		pairs[2*i], pairs[2*i+1] = dstRows[i], srcRows[i]
	}
	off := q.put(bytesOf(pairs))
	q.launch(name, copyRowsGrid(n, dst.Cols), blk256, 0, q.t(dst), ld(dst), q.t(src), ld(src), upload(off), i(dst.Cols))
}

// copyRowsGrid is copy_rows's grid: a block row per row pair, enough
// 256-thread blocks across for the columns (at most 8; they loop).
func copyRowsGrid(rows, cols int) [3]uint32 {
	return [3]uint32{uint32(rows), uint32(min(8, (cols+255)/256)), 1}
}

// AttentionSeqs implements gpu.SeqAttender: one attention_seqs_f32 launch
// whose row r reads its sequence's keys, values, table, position and key
// count from the uploaded attn_seq r — the arithmetic of attention_f32.
// Batches whose scores would not fit the scratch run as one Attention per
// sequence (each chunks its rows).
func (q *Queue) AttentionSeqs(dst, qt gpu.Tensor, ap gpu.AttnParams, seqs []gpu.AttnSeq) {
	hd := ap.HeadDim
	if hd < 1 || ap.KVHeads < 1 || ap.Heads%ap.KVHeads != 0 || qt.Cols != ap.Heads*hd || dst.Cols != qt.Cols ||
		dst.Rows != qt.Rows || ap.Window < 0 {
		panic(fmt.Sprintf("cuda: attention of sequences q %v dst %v heads %d/%d dim %d", qt, dst, ap.Heads, ap.KVHeads, hd))
	}
	wantF32("attention", dst, qt)
	maxL, paged := 1, false
	keys := make([]int, len(seqs))
	for si, s := range seqs {
		nkeys, err := attnSeqKeys(s, ap)
		if err != nil {
			panic(err.Error())
		}
		wantF32("attention", s.K, s.V)
		keys[si], maxL = nkeys, max(maxL, nkeys)
		paged = paged || !s.Blocks.IsNil()
	}
	if qt.Rows == 0 {
		return
	}
	need := qt.Rows * ap.Heads * maxL
	if need > maxScores {
		gpu.AttentionSeqsSeq(q, dst, qt, ap, seqs)
		return
	}
	buf := make([]byte, attnRowBytes*qt.Rows)
	r := 0
	le := binary.LittleEndian
	for si, s := range seqs {
		nkeys := keys[si]
		k, v, tab := q.ptr(s.K), q.ptr(s.V), q.ptr(s.Blocks)
		for j := 0; j < s.Rows; j++ {
			b := buf[r*attnRowBytes:]
			le.PutUint64(b[0:], uint64(k))
			le.PutUint64(b[8:], uint64(v))
			le.PutUint64(b[16:], uint64(tab))
			le.PutUint64(b[24:], uint64(s.K.Stride))
			le.PutUint64(b[32:], uint64(s.V.Stride))
			le.PutUint32(b[40:], uint32(int32(s.QPos0+j)))
			le.PutUint32(b[44:], uint32(int32(nkeys)))
			r++
		}
	}
	off := q.put(buf)
	if q.scores == nil || q.scores.n < need {
		q.grow(&q.scores, gpu.F32, need)
	}
	sc := gpu.Tensor{Buf: q.scores, Rows: 1, Cols: need, Stride: need}
	brows := 1
	if paged {
		brows = ap.BlockRows
	}
	shm, shs := attnShm(hd, maxL)
	q.launchOut(dst, "attention_seqs_f32", [3]uint32{uint32(qt.Rows), uint32(ap.Heads), 1}, blk128, shm,
		q.t(dst), ld(dst), q.t(qt), ld(qt), upload(off), q.t(sc), i(maxL),
		i(ap.Heads), i(ap.KVHeads), i(hd), f(ap.Scale), b2i(ap.Causal), i(ap.Window), b2i(ap.ProbBF16), i(brows), b2i(shs))
}

// attnSeqKeys checks one sequence of AttentionSeqs as Attention checks its
// operands and returns its key count.
func attnSeqKeys(s gpu.AttnSeq, ap gpu.AttnParams) (int, error) {
	k, v := s.K, s.V
	if k.Cols != ap.KVHeads*ap.HeadDim || v.Cols != k.Cols || v.Rows != k.Rows || s.QPos0 < 0 || s.QPos0 > math.MaxInt32 {
		return 0, fmt.Errorf("cuda: attention sequence at %d over k %v v %v, heads %d/%d dim %d", s.QPos0, k, v, ap.Heads, ap.KVHeads, ap.HeadDim)
	}
	if s.Blocks.IsNil() {
		return k.Rows, nil
	}
	b := s.Blocks
	if ap.BlockRows < 1 || s.Keys < 0 || b.DType() != gpu.I32 || b.Rows != 1 || b.Cols*ap.BlockRows < s.Keys || k.Rows%ap.BlockRows != 0 {
		return 0, fmt.Errorf("cuda: paged attention sequence of %d keys in blocks of %d rows, table %v, pool %v", s.Keys, ap.BlockRows, b, k)
	}
	return s.Keys, nil
}

// ShortConvSeqs implements gpu.SeqConvolver: one shortconv_seqs_f32
// launch, a grid row per sequence with rows (the arithmetic of
// shortconv_f32, each sequence with its own state).
func (q *Queue) ShortConvSeqs(dst, x, w gpu.Tensor, states []gpu.Tensor, rows []int) {
	q.shortConvSeqs(dst, x, w, states, rows, gpu.Tensor{}, false)
}

// ShortConvSeqsGated implements gpu.GatedConvolver: one launch of
// shortconv_seqs_gated_f32, which forms each input value as b ⊙ x (and its
// rounding) where shortconv_seqs_f32 reads it — the floats of the Mul, the
// RoundBF16 and the convolution (TestShortConvGatedEqualsSeq). dst may not
// be b or x (the rows are cut into chunks); there it reports false.
func (q *Queue) ShortConvSeqsGated(dst, b, x, w gpu.Tensor, states []gpu.Tensor, rows []int, round bool) bool {
	if q.unfused || dst.Buf == x.Buf || dst.Buf == b.Buf {
		return false
	}
	sameShape("shortconv", b, x)
	wantF32("shortconv", b)
	q.shortConvSeqs(dst, x, w, states, rows, b, round)
	return true
}

// shortConvSeqs launches shortconv_seqs_f32, or with gate b (not nil)
// shortconv_seqs_gated_f32.
func (q *Queue) shortConvSeqs(dst, x, w gpu.Tensor, states []gpu.Tensor, rows []int, b gpu.Tensor, round bool) {
	sameShape("shortconv", dst, x)
	C, L := x.Cols, w.Cols
	if w.Rows != C || !w.Contiguous() || L < 1 || L > maxShortConv {
		panic(fmt.Sprintf("cuda: shortconv x %v w %v", x, w))
	}
	wantF32("shortconv", dst, x)
	buf := make([]byte, 0, convSeqBytes*len(states))
	r0, n, most := 0, 0, 0
	for si, st := range states {
		if st.Rows != L-1 || st.Cols != C {
			panic(fmt.Sprintf("cuda: shortconv x %v w %v state %v", x, w, st))
		}
		wantF32("shortconv", st)
		if rows[si] > 0 {
			var b [convSeqBytes]byte
			binary.LittleEndian.PutUint64(b[0:], uint64(q.ptr(st)))
			binary.LittleEndian.PutUint64(b[8:], uint64(st.Stride))
			binary.LittleEndian.PutUint32(b[16:], uint32(r0))
			binary.LittleEndian.PutUint32(b[20:], uint32(rows[si]))
			buf = append(buf, b[:]...)
			n++
			most = max(most, rows[si])
		}
		r0 += rows[si]
	}
	if n == 0 {
		return
	}
	off := q.put(buf)
	chunk, nz := shortConvChunks(dst, x, most)
	grid := [3]uint32{uint32((C + 127) / 128), uint32(n), nz}
	if !b.IsNil() {
		q.launchEpi(epiProduct, dst, "shortconv_seqs_gated_f32", grid, blk128, 0,
			q.t(dst), ld(dst), q.t(x), ld(x), q.t(b), ld(b), b2i(round), q.t(w), p(dtCode(w.DType())), upload(off), i(chunk), i(C), i(L))
		return
	}
	q.launchEpi(epiProduct, dst, "shortconv_seqs_f32", grid, blk128, 0,
		q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), p(dtCode(w.DType())), upload(off), i(chunk), i(C), i(L))
}

// copyPairBytes is the size of kernels.cu's struct copy_pair.
const copyPairBytes = 40

// CopyMany implements gpu.Copier: one copy_many launch per element size, a
// block row per pair (the pairs were checked by gpu.CopyMany).
func (q *Queue) CopyMany(pairs []gpu.CopyPair) {
	if len(pairs) == 1 { // the plain copy's grid fits one large copy better
		q.Copy(pairs[0].Dst, pairs[0].Src)
		return
	}
	for _, size := range []int{4, 2} {
		buf := make([]byte, 0, copyPairBytes*len(pairs))
		n, most := 0, 0
		for _, p := range pairs {
			if p.Dst.Len() == 0 {
				continue
			}
			switch s := p.Dst.DType().Size(); {
			case s != 2 && s != 4:
				panic(fmt.Sprintf("cuda: copy %v", p.Dst))
			case s != size:
				continue
			}
			var b [copyPairBytes]byte
			le := binary.LittleEndian
			le.PutUint64(b[0:], uint64(q.ptr(p.Dst)))
			le.PutUint64(b[8:], uint64(q.ptr(p.Src)))
			le.PutUint64(b[16:], uint64(p.Dst.Stride))
			le.PutUint64(b[24:], uint64(p.Src.Stride))
			le.PutUint32(b[32:], uint32(p.Dst.Rows))
			le.PutUint32(b[36:], uint32(p.Dst.Cols))
			buf = append(buf, b[:]...)
			n++
			most = max(most, p.Dst.Len())
		}
		if n == 0 {
			continue
		}
		name := "copy_many_u32"
		if size == 2 {
			name = "copy_many_u16"
		}
		off := q.put(buf)
		q.launch(name, copyManyGrid(n, most), blk256, 0, upload(off))
	}
}

// copyManyGrid is copy_many's grid for n pairs of at most most elements: a
// block row per pair, enough 256-thread blocks along y for the largest
// (at most 64; they loop, and a smaller pair's spare blocks exit).
func copyManyGrid(n, most int) [3]uint32 {
	return [3]uint32{uint32(n), uint32(min(64, max(1, (most+255)/256))), 1}
}
