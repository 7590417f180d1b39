package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// EmbedIDs implements gpu.Queue: embed_f32 reading its ids from device
// memory (an out-of-range id yields a NaN row: a kernel cannot panic).
func (q *Queue) EmbedIDs(dst, table, ids gpu.Tensor) {
	if ids.DType() != gpu.I32 || ids.Rows != dst.Rows || ids.Cols < 1 || table.Cols != dst.Cols || dtCode(table.DType()) == 0 {
		panic(fmt.Sprintf("cuda: embed ids %v from %v into %v", ids, table, dst))
	}
	if dst.Rows == 0 {
		return
	}
	wantF32("embed", dst)
	q.launchOut(dst, "embed_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(table), p(dtCode(table.DType())), ld(table),
		q.t(ids), ld(ids), i(ids.Cols), i(table.Rows), i(dst.Rows), i(dst.Cols))
}

// sampleArgBytes is the size of kernels.cu's struct sample_arg.
const sampleArgBytes = 56

// sampleThreads is sample_f32's block size (its __launch_bounds__).
const sampleThreads = 512

// maxSampleVocab bounds V by the penalty bitmap's dynamic shared memory
// and the suppressed ids' (2·V bits within 40 KiB, beside the kernel's
// static shared memory).
const maxSampleVocab = 40 << 10 * 8 / 2

// packSampleArgs returns the rows' sample_arg records and their
// concatenated histories and suppressed ids.
func packSampleArgs(rows []gpu.SampleRow) (args []byte, hist []int32) {
	args = make([]byte, sampleArgBytes*len(rows))
	for r, row := range rows {
		b := args[r*sampleArgBytes:]
		binary.LittleEndian.PutUint64(b[0:], math.Float64bits(row.Temperature))
		binary.LittleEndian.PutUint64(b[8:], math.Float64bits(row.TopP))
		binary.LittleEndian.PutUint64(b[16:], math.Float64bits(row.Penalty))
		binary.LittleEndian.PutUint64(b[24:], math.Float64bits(row.U))
		topK := min(max(row.TopK, -1), math.MaxInt32)
		binary.LittleEndian.PutUint32(b[32:], uint32(int32(topK)))
		binary.LittleEndian.PutUint32(b[36:], uint32(len(hist)))
		h := row.History
		if !row.Penalizes() {
			h = nil // the kernel reads no history then
		}
		binary.LittleEndian.PutUint32(b[40:], uint32(len(h)))
		hist = append(hist, h...)
		binary.LittleEndian.PutUint32(b[44:], uint32(len(hist)))
		binary.LittleEndian.PutUint32(b[48:], uint32(len(row.Suppress)))
		hist = append(hist, row.Suppress...)
	}
	return args, hist
}

// sampleSharedBytes bounds sample_f32's dynamic shared memory when it
// keeps a row's ew (8V bytes) and cand (4V) there beside the two bitmaps:
// 40 KiB leaves the kernel's static shared memory (about 3.6 KiB) under
// the 48 KiB a launch gets without opting in. It holds V up to 3,343,
// the audio vocabulary (2,049) among them; the text vocabulary (65,536)
// takes the global scratch.
const sampleSharedBytes = 40 << 10

// sampleShared returns sample_f32's dynamic shared memory for V entries
// and whether ew and cand live there (the kernel's sh argument): the
// penalty's and the suppressed ids' bitmaps (V bits each, in 32-bit
// words), then ew and cand where all of it fits in sampleSharedBytes.
func sampleShared(V int) (shm int, inShared bool) {
	bitmaps := 2 * ((V + 31) / 32) * 4
	if all := bitmaps + 12*V; all <= sampleSharedBytes {
		return all, true
	}
	return bitmaps, false
}

// sampleScratch returns the byte offsets of sample_f32's per-row scratch
// arrays in one buffer for B rows of V entries, and the buffer's size:
// ew (8V), skey (8P), cand (4V), sidx (4P), P the power of two ≥ V.
func sampleScratch(B, V int) (ew, skey, cand, sidx, total, P int) {
	P = 1
	for P < V {
		P <<= 1
	}
	ew = 0
	skey = ew + 8*B*V
	cand = skey + 8*B*P
	sidx = cand + 4*B*V
	total = sidx + 4*B*P
	return
}

// Sample implements gpu.Queue: one sample_f32 block per row.
func (q *Queue) Sample(ids, logits gpu.Tensor, rows []gpu.SampleRow) {
	B, V := logits.Rows, logits.Cols
	if ids.DType() != gpu.I32 || ids.Rows != B || ids.Cols != 1 || len(rows) != B || V == 0 {
		panic(fmt.Sprintf("cuda: sample %v (%d rows) into %v", logits, len(rows), ids))
	}
	if V > maxSampleVocab {
		panic(fmt.Sprintf("cuda: sample from %d entries (at most %d)", V, maxSampleVocab))
	}
	wantF32("sample", logits)
	if B == 0 {
		return
	}
	args, hist := packSampleArgs(rows)
	ao := q.put(args)
	ho := q.put(bytesOf(append(hist, 0)))
	ew, skey, cand, sidx, total, P := sampleScratch(B, V)
	if q.sampleBuf == nil || q.sampleBuf.n*4 < total {
		q.grow(&q.sampleBuf, gpu.F32, (total+3)/4)
	}
	base := q.ptr(gpu.Tensor{Buf: q.sampleBuf, Rows: 1, Cols: 1, Stride: 1})
	shm, inShared := sampleShared(V)
	q.launch("sample_f32", [3]uint32{uint32(B), 1, 1}, [2]uint32{sampleThreads, 1}, shm,
		q.t(ids), ld(ids), q.t(logits), ld(logits), i(V), upload(ao), upload(ho),
		p(base+int64(ew)), p(base+int64(cand)), p(base+int64(skey)), p(base+int64(sidx)), i(P), b2i(inShared))
}
