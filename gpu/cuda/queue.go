package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/omni-pipe/omni-pipe/gpu"
)

// kernelNames lists every kernel of kernels.cu the backend launches.
var kernelNames = []string{
	"fill_f32", "copy_u32", "copy_u16", "transpose_f32",
	"binary_f32", "rowop_f32", "scale_f32", "round_bf16", "act_f32", "glu_f32",
	"rmsnorm_f32", "layernorm_f32", "softmax_f32", "rope_f32", "embed_f32", "shortconv_f32",
	"matmul_r1_f32", "matmul_r2_f32", "matmul_r4_f32", "matmul_r8_f32",
	"matmul_r1_bf16", "matmul_r2_bf16", "matmul_r4_bf16", "matmul_r8_bf16",
	"matmul_r1_f16", "matmul_r2_f16", "matmul_r4_f16", "matmul_r8_f16",
	"matmul_t64_f32", "matmul_t64_bf16", "matmul_t64_f16",
	"gemv_bf16", "gemv_bf16_c1u4", "gemv_bf16_c1u8", "gemv_bf16_c2u4", "gemv_bf16_c2u8", "gemv_bf16_c4u8",
	"gemvn_bf16_c1u4", "gemvn_bf16_c2u4", "gemvn_bf16_c4u4", "prep_heads_f32",
	"gemvr_bf16_r2c4u4", "gemvr_bf16_r2c2u8", "gemvr_bf16_r3c4u4", "gemvr_bf16_r4c4u4", "gemvr_bf16_r4c4u2",
	"gemvr_bf16_r4c8u2", "gemvr_bf16_r4c8u1", "gemvr_bf16_r8c4u2", "split_bf16", "logmel_frames_f32", "logmel_norm_f32", "sample_f32", "mma_bf16_m8", "mma_bf16_m16", "mma_bf16_m32", "mma_bf16_big", "mma_bf16_bigp", "mma_fold_f32",
	"mmv_bf16_w4n1m1", "mmv_bf16_w16n1m1", "mmv_bf16_w16n2m1", "mmv_bf16_w16n4m1", "mmv_bf16_w16n1m2",
	"mmvn_bf16_w4", "mmvn_bf16_w16",
	"mmvt_bf16_w4n1m1", "mmvt_bf16_w16n1m1", "mmvt_bf16_w16n2m1", "mmvt_bf16_w16n4m1", "mmvt_bf16_w16n1m2", "mmvnt_bf16_w16",
	"attention_f32", "attention_seqs_f32", "shortconv_seqs_f32", "shortconv_seqs_gated_f32", "copy_rows_u32", "copy_rows_u16", "copy_many_u32", "copy_many_u16", "conv1d_f32", "convtr1d_f32", "conv2d_f32", "conv2d_rows_f32", "conv2d_pw_f32", "mmvng_bf16_w16", "mmvngt_bf16_w16",
	"relpos_scores_f32", "heads_matmul_f32", "std_block_f32", "std_blockt_f32",
}

func init() { kernelNames = append(kernelNames, blockPhaseKernels()...) }

// Kernel-side codes (kernels.cu).
const (
	opAdd = 1
	opMul = 2
)

func dtCode(dt gpu.DType) int64 {
	switch dt {
	case gpu.F32:
		return 1
	case gpu.BF16:
		return 2
	case gpu.F16:
		return 3
	}
	return 0
}

// cmd is one recorded command: a kernel launch, or (free ≠ 0) a
// stream-ordered release of device memory.
type cmd struct {
	fn    uintptr
	grid  [3]uint32
	block [2]uint32
	shm   uint32
	a0    int32 // first argument slot
	na    int32 // argument count
	free  uintptr
	gemm  *gemmCmd // a cuBLAS GEMM in place of a kernel (cublas.go)
}

// batch is what a queue has recorded since its last flush.
type batch struct {
	cmds   []cmd
	slots  []uint64 // kernel arguments, 8 bytes each (little-endian)
	up     []byte   // host data the batch uploads (8-byte aligned pieces)
	relocs []int32  // slots holding an offset into up, to become a device address
}

func (b *batch) reset() {
	b.cmds, b.slots, b.up, b.relocs = b.cmds[:0], b.slots[:0], b.up[:0], b.relocs[:0]
}

// Queue is the CUDA backend's gpu.Queue: a CUDA stream. Ops are recorded
// by the calling goroutine and handed to the device's owner thread in one
// batch at Read, Sync or when the batch is large; the host waits only in
// Read and Sync.
type Queue struct {
	d      *Device
	name   string
	stream uintptr

	mu  sync.Mutex // guards rec (Free may append from another goroutine)
	rec batch
	run batch // the batch being executed (owned by the flushing goroutine)

	// st is pinned, device-mapped host memory holding the uploads of the
	// last flush that did not replay a graph (a graph has its own, so
	// that consecutive chunks in flight never wait on each other's).
	st staging
	// gen counts flushes (guarded by mu), so a launch knows whether its
	// command is still in the batch being recorded.
	gen uint64

	// readMu serialises Read and Sync, which share pin and readEv:
	// pinned memory reads land in, and the event behind them.
	readMu sync.Mutex
	pin    pinned
	readEv uintptr
	// spare holds evicted graphs' upload memory for new graphs (owner
	// thread).
	spare []staging

	scores  *buffer // attention scratch
	readBuf *buffer // contiguous staging for strided reads
	// readIntBuf is readBuf for I32 reads; sampleBuf is Sample's scratch.
	readIntBuf, sampleBuf *buffer
	// gemvForce, when set, is the one-row kernel MatMul uses (tests).
	gemvForce     string
	gemvForceRows int
	// gemvrForce, when set, is the few-row kernel MatMul uses for 2 ≤ M ≤
	// gemvrMaxRows (tests and benchmarks); tileForce sends every product
	// to the tile kernels (the reference order the variants are held to).
	gemvrForce string
	tileForce  bool
	// fmaTiles forces the FMA products onto the 64 × 64 tile kernel (1)
	// or off it (−1) whatever the shape (tests and benchmarks).
	fmaTiles int8
	// tileKernel, when set, names the tensor-core tile kernel MatMul uses
	// past the few-row kernels (tests and benchmarks).
	tileKernel string
	// mmvForce, when set, is the few-row tensor-core kernel MatMul uses
	// on the tensor cores whatever the shape (tests and benchmarks).
	mmvForce string
	// untiled keeps the few-row products on the weights' rows even where
	// a tiled copy exists (tests: tiled == rows, bit for bit).
	untiled bool
	// conv2dDirect keeps every Conv2D on conv2d_f32, the one-thread-an-
	// output kernel (tests: conv2d_rows_f32 equals it bit for bit).
	conv2dDirect bool
	// priority is the stream's priority (0, the default; lower is more
	// urgent: NewPriorityQueue).
	priority int
	// conv2dRows keeps pointwise convolutions on conv2d_rows_f32 instead
	// of conv2d_pw_f32 (tests: the two give the same bits).
	conv2dRows bool
	// fp32 keeps the queue's products on the FMA kernels whatever
	// Options.MatMul says (gpu.FP32Products).
	fp32 bool
	// unfused makes the gpu.NormFuser ops launch their op sequence
	// (tests: fused == separate, bit for bit).
	unfused bool
	stats   queueStats
	split   *buffer // x split into bf16 parts for the tensor-core products
	parts   *buffer // a split tile product's class sums (mmaBigSplit)
	// blk is std_block_f32's scratch, blkBar its grid barrier's counter
	// (block.go).
	blk, blkBar *buffer
	flags       *buffer // which parts each row of split needs
	blasWS      *buffer // the queue's cuBLAS workspace (cublas.go)
	err         error   // sticky: the first failure, returned by Read and Sync
	params      []unsafe.Pointer
	graphs      graphCache // owner thread only
	fuse        fused      // guarded by mu
}

var _ gpu.Queue = (*Queue)(nil)

// maxBatch is the number of recorded commands that triggers a flush: a
// long stage (a depthformer frame is ~700 kernels) is handed over in
// chunks, so that the GPU runs one chunk (as its own graph) while the
// host records the next, instead of waiting for the whole stage to be
// recorded.
const maxBatch = 128

// Name implements gpu.Queue.
func (q *Queue) Name() string { return q.name }

// ptr returns t's device address and marks the buffer as used by q.
func (q *Queue) ptr(t gpu.Tensor) int64 {
	if t.Buf == nil {
		return 0
	}
	b, ok := t.Buf.(*buffer)
	if !ok {
		panic(fmt.Sprintf("cuda: tensor %v is not CUDA memory", t))
	}
	if b.freed.Load() {
		panic(fmt.Sprintf("cuda: use of freed tensor %v", t))
	}
	if b.last.Load() != q {
		b.last.Store(q)
	}
	return int64(b.ptr) + int64(t.Off)*int64(b.dt.Size())
}

// arg is a kernel argument: an integer, a float32 (as its bits) or an
// upload offset to relocate.
type arg struct {
	v     uint64
	reloc bool
}

func i(v int) arg         { return arg{v: uint64(int64(v))} }
func p(v int64) arg       { return arg{v: uint64(v)} }
func f(v float32) arg     { return arg{v: uint64(math.Float32bits(v))} }
func upload(off int) arg  { return arg{v: uint64(off), reloc: true} }
func ld(t gpu.Tensor) arg { return i(t.Stride) }

func b2i(b bool) arg {
	if b {
		return i(1)
	}
	return i(0)
}
func (q *Queue) t(t gpu.Tensor) arg { return p(q.ptr(t)) }

// tiled returns the address of w's tiled copy for the few-row products
// (tiled.go), having recorded the use of w's buffer (q.ptr), or false.
func (q *Queue) tiled(w gpu.Tensor) (int64, bool) {
	if q.untiled {
		return 0, false
	}
	a, ok := tiledView(w)
	if ok {
		q.ptr(w)
	}
	return a, ok
}

// fused is the output of the last recorded launch whose kernel can apply
// the ops that follow it on its output itself (kernels.cu: OUT, rmsnorm's
// row weight, the products' epilogue): a RoundBF16, an Act, a MulRow by a
// weight vector or an Add/Mul with another tensor, of exactly that output
// and right after it, sets the kernel's arguments instead of launching.
// The bits are the same (the same float operations in the same order; +
// and × commute); a kernel and a pass over the tensor are saved.
type fused struct {
	ptr            int64
	buf            *buffer
	rows, cols, ld int
	n              int // len(rec.cmds) right after the launch; 0: nothing to fuse
	stage          int // 0: after the op; 1: after act/row weight; 2: after the elementwise op
	// Argument slots (−1 where the kernel lacks the step): the rounding at
	// each stage, the activation, the row weight and its dtype, the
	// elementwise operand, its row stride and op.
	rnd         [3]int
	act         int
	rowW, rowDT int
	e, eld, eop int
}

// epilogue says which fused steps a kernel takes after its rnd argument.
type epilogue uint8

const (
	epiRound   epilogue = iota // rnd
	epiProduct                 // rnd, act, rnd1, e, lde, eop, rnd2
	epiRowW                    // rnd, w, wdt, rnd1
)

// launchOut records a launch whose kernel takes the fused-step arguments of
// epi (appended here, all off) and writes out.
func (q *Queue) launchOut(out gpu.Tensor, name string, grid [3]uint32, block [2]uint32, shm int, args ...arg) {
	q.launchEpi(epiRound, out, name, grid, block, shm, args...)
}

func (q *Queue) launchEpi(ep epilogue, out gpu.Tensor, name string, grid [3]uint32, block [2]uint32, shm int, args ...arg) {
	base := len(args)
	switch ep {
	case epiRound:
		args = append(args, i(0))
	case epiProduct:
		args = append(args, i(0), i(0), i(0), p(0), i(0), i(0), i(0))
	case epiRowW:
		args = append(args, i(0), p(0), i(0), i(0))
	}
	q.mu.Lock()
	first, gen := len(q.rec.slots), q.gen
	q.mu.Unlock()
	if !q.launch(name, grid, block, shm, args...) {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gen != gen {
		return // the launch ended a chunk: it is no longer there to fold into
	}
	at := func(j int) int { return first + base + j }
	f := fused{ptr: q.ptr(out), buf: out.Buf.(*buffer), rows: out.Rows, cols: out.Cols, ld: out.Stride, n: len(q.rec.cmds),
		rnd: [3]int{at(0), -1, -1}, act: -1, rowW: -1, rowDT: -1, e: -1, eld: -1, eop: -1}
	switch ep {
	case epiProduct:
		f.act, f.rnd[1], f.e, f.eld, f.eop, f.rnd[2] = at(1), at(2), at(3), at(4), at(5), at(6)
	case epiRowW:
		f.rowW, f.rowDT, f.rnd[1] = at(1), at(2), at(3)
	}
	q.fuse = f
}

// fusible returns the fused record when t is exactly its output and
// nothing was recorded after it (call with q.mu held).
func (q *Queue) fusible(t gpu.Tensor) *fused {
	f := &q.fuse
	if f.n == 0 || f.n != len(q.rec.cmds) || f.rows != t.Rows || f.cols != t.Cols || f.ld != t.Stride || f.ptr != q.ptr(t) {
		return nil
	}
	return f
}

// fuseRound folds RoundBF16(t) into the launch just recorded.
func (q *Queue) fuseRound(t gpu.Tensor) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.fusible(t)
	if f == nil || f.rnd[f.stage] < 0 {
		return false
	}
	q.rec.slots[f.rnd[f.stage]] = 1
	return true
}

// fuseAct folds Act(t, t, fn) into the product just recorded.
func (q *Queue) fuseAct(dst, a gpu.Tensor, fn gpu.Activation) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.fusible(dst)
	if f == nil || f.act < 0 || f.stage != 0 || !gpu.SameView(dst, a) {
		return false
	}
	q.rec.slots[f.act] = uint64(fn)
	f.stage = 1
	return true
}

// fuseRowW folds MulRow(t, t, v) into the norm just recorded.
func (q *Queue) fuseRowW(dst, a, v gpu.Tensor) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.fusible(dst)
	if f == nil || f.rowW < 0 || f.stage != 0 || !gpu.SameView(dst, a) || v.Buf == dst.Buf {
		return false
	}
	q.rec.slots[f.rowW] = uint64(q.ptr(v))
	q.rec.slots[f.rowDT] = uint64(dtCode(v.DType()))
	f.stage = 1
	return true
}

// fuseBinary folds Add/Mul(t, t, o) or (t, o, t) into the product just
// recorded, when o is another buffer (the product must not have written
// what the epilogue reads).
func (q *Queue) fuseBinary(op int, dst, a, b gpu.Tensor) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.fusible(dst)
	if f == nil || f.e < 0 || f.stage > 1 {
		return false
	}
	o := b
	switch {
	case gpu.SameView(dst, a):
	case gpu.SameView(dst, b):
		o = a
	default:
		return false
	}
	if o.Buf == dst.Buf || o.Rows != dst.Rows || o.Cols != dst.Cols {
		return false
	}
	q.rec.slots[f.e] = uint64(q.ptr(o))
	q.rec.slots[f.eld] = uint64(o.Stride)
	q.rec.slots[f.eop] = uint64(op)
	f.stage = 2
	return true
}

// launch records a kernel launch; false when there is nothing to launch.
func (q *Queue) launch(name string, grid [3]uint32, block [2]uint32, shm int, args ...arg) bool {
	fn, ok := q.d.fns[name]
	if !ok {
		panic("cuda: no kernel " + name)
	}
	for j := range grid {
		if grid[j] == 0 {
			return false // nothing to do
		}
	}
	if c := q.d.census.Load(); c != nil {
		c.mu.Lock()
		c.n[name]++
		c.mu.Unlock()
	}
	q.mu.Lock()
	q.fuse = fused{}
	r := &q.rec
	if len(r.cmds) == 0 {
		q.stats.recStart = time.Now()
	}
	c := cmd{fn: fn, grid: grid, block: block, shm: uint32(shm), a0: int32(len(r.slots)), na: int32(len(args))}
	for _, a := range args {
		if a.reloc {
			r.relocs = append(r.relocs, int32(len(r.slots)))
		}
		r.slots = append(r.slots, a.v)
	}
	r.cmds = append(r.cmds, c)
	n := len(r.cmds)
	q.mu.Unlock()
	if n >= maxBatch {
		q.flush()
	}
	return true
}

// put appends host bytes to the batch's uploads and returns their offset.
func (q *Queue) put(b []byte) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	off := (len(q.rec.up) + 15) &^ 15
	for len(q.rec.up) < off {
		q.rec.up = append(q.rec.up, 0)
	}
	q.rec.up = append(q.rec.up, b...)
	return off
}

func bytesOf[T int32 | float32 | float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// enqueueFree queues a stream-ordered release of b behind q's recorded
// work; false when q is unusable.
func (q *Queue) enqueueFree(b *buffer) bool {
	if q.stream == 0 {
		return false
	}
	q.mu.Lock()
	q.rec.cmds = append(q.rec.cmds, cmd{free: b.ptr})
	q.mu.Unlock()
	return true
}

// flush hands the recorded batch to the owner thread, which launches it.
func (q *Queue) flush() {
	q.mu.Lock()
	q.rec, q.run = q.run, q.rec
	q.rec.reset()
	q.fuse = fused{}
	q.gen++
	q.mu.Unlock()
	r := &q.run
	if len(r.cmds) == 0 {
		return
	}
	t0 := time.Now()
	if !q.stats.recStart.IsZero() {
		q.stats.recTime += t0.Sub(q.stats.recStart)
		q.stats.recStart = time.Time{}
	}
	err := q.d.do(func() error { return q.execute(r) })
	for {
		// The upload memory the batch needs is still being read by an
		// earlier launch: wait for it off the owner thread, then retry
		// (execute did nothing yet).
		var busy *uploadsBusy
		if !errors.As(err, &busy) {
			break
		}
		q.stats.upWaits++
		if err = q.d.awaitEvent(busy.ev); err == nil {
			err = q.d.do(func() error { return q.execute(r) })
		}
	}
	q.stats.flushes++
	q.stats.cmds += len(r.cmds)
	q.stats.flushTime += time.Since(t0)
	if err != nil && q.err == nil {
		q.err = err
	}
	r.reset()
}

// execute runs on the owner thread.
func (q *Queue) execute(r *batch) error {
	c := q.d.drv
	if q.err != nil {
		// After a failure the stream's state is unknown: only releases run.
		for _, cm := range r.cmds {
			if cm.free != 0 {
				c.call("cuMemFreeAsync", c.cuMemFreeAsync, cm.free, q.stream)
			}
		}
		return nil
	}
	var e *graphEntry
	var key uint64
	useGraph := q.d.prof == nil && q.d.graphs && graphable(r)
	if useGraph {
		key, e = q.lookupGraph(r)
	}
	st := &q.st
	if e != nil {
		st = &e.st
	}
	if st.pending && len(r.up) > 0 {
		if q.d.query(st.ev) == errNotReady {
			return &uploadsBusy{ev: st.ev}
		}
	}
	if err := q.stageUploads(st, r); err != nil {
		return err
	}
	if cap(q.params) < len(r.slots) {
		q.params = make([]unsafe.Pointer, len(r.slots), 2*len(r.slots))
	}
	q.params = q.params[:len(r.slots)]
	for j := range r.slots {
		q.params[j] = unsafe.Pointer(&r.slots[j])
	}
	if q.d.prof != nil {
		if err := q.launchProfiled(r); err != nil {
			return err
		}
		return q.recordUpload(st, r)
	}
	if useGraph {
		ok, err := q.runGraph(r, key, e)
		if err != nil {
			return err
		}
		if ok {
			q.stats.graphRuns++
			return q.recordUpload(st, r)
		}
	}
	q.stats.direct++
	for _, cm := range r.cmds {
		if cm.free != 0 {
			if err := c.call("cuMemFreeAsync", c.cuMemFreeAsync, cm.free, q.stream); err != nil {
				return err
			}
			continue
		}
		if err := q.launchCmd(cm); err != nil {
			return err
		}
	}
	return q.recordUpload(st, r)
}

// uploadsBusy is execute's answer when the upload memory a batch needs is
// still being read by an earlier launch: nothing was done, and the batch
// runs once ev completes.
type uploadsBusy struct{ ev uintptr }

func (*uploadsBusy) Error() string { return "cuda: upload memory in use" }

// launchCmd launches one recorded kernel on q's stream (owner thread).
func (q *Queue) launchCmd(cm cmd) error {
	if cm.gemm != nil {
		return q.runGemm(cm.gemm)
	}
	c := q.d.drv
	var pp uintptr
	if cm.na > 0 {
		pp = uintptr(unsafe.Pointer(&q.params[cm.a0]))
	}
	if q.d.pdl.Load() {
		return q.launchPDL(cm, pp)
	}
	res, _, _ := purego.SyscallN(c.cuLaunchKernel, cm.fn,
		uintptr(cm.grid[0]), uintptr(cm.grid[1]), uintptr(cm.grid[2]),
		uintptr(cm.block[0]), uintptr(cm.block[1]), 1,
		uintptr(cm.shm), q.stream, pp, 0)
	if res != 0 {
		return c.err("cuLaunchKernel", result(res))
	}
	return nil
}

// staging is pinned, device-mapped host memory a batch's uploads are
// written to, and its device mirror they are copied to (kernels read the
// mirror, or with Options.HostUploads the host memory); ev marks when the
// device finished reading them.
type staging struct {
	host, dev uintptr
	// mirror is n bytes of device memory the uploads are copied to ahead
	// of the batch's kernels, which then read them there (devUploads), or
	// 0.
	mirror  uintptr
	n       int
	ev      uintptr
	pending bool
}

// stageUploads copies r's uploads into st (after the device finished
// reading what st held) and relocates their arguments (owner thread).
func (q *Queue) stageUploads(st *staging, r *batch) error {
	if len(r.up) == 0 {
		return nil
	}
	c := q.d.drv
	if st.host == 0 && st.ev == 0 {
		q.adoptSpare(st, len(r.up)) // a new graph takes an evicted one's upload memory
	}
	if st.pending {
		if err := c.call("cuEventSynchronize", c.cuEventSynchronize, st.ev); err != nil {
			return err
		}
		st.pending = false
	}
	if st.ev == 0 {
		if err := c.call("cuEventCreate", c.cuEventCreate, uintptr(unsafe.Pointer(&st.ev)), eventNoTime); err != nil {
			return err
		}
	}
	if len(r.up) > st.n {
		if st.host != 0 {
			c.call("cuMemFreeHost", c.cuMemFreeHost, st.host)
			st.host, st.n = 0, 0
		}
		if st.mirror != 0 {
			c.call("cuMemFreeAsync", c.cuMemFreeAsync, st.mirror, q.stream)
			st.mirror = 0
		}
		n := max(64<<10, 2*len(r.up))
		if err := c.call("cuMemHostAlloc", c.cuMemHostAlloc, uintptr(unsafe.Pointer(&st.host)), uintptr(n), hostMapped|hostPortable); err != nil {
			return err
		}
		if err := c.call("cuMemHostGetDevicePointer", c.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&st.dev)), st.host, 0); err != nil {
			return err
		}
		st.n = n
	}
	copy(unsafe.Slice(*(**byte)(unsafe.Pointer(&st.host)), len(r.up)), r.up)
	base := st.dev
	if q.d.devUploads {
		// One copy ahead of the batch's kernels (stream-ordered: after the
		// kernels of the mirror's last batch, before this one's first).
		if st.mirror == 0 {
			if err := c.call("cuMemAllocAsync", c.cuMemAllocAsync, uintptr(unsafe.Pointer(&st.mirror)), uintptr(st.n), q.stream); err != nil {
				return err
			}
		}
		if err := c.call("cuMemcpyHtoDAsync", c.cuMemcpyHtoDAsync, st.mirror, st.host, uintptr(len(r.up)), q.stream); err != nil {
			return err
		}
		base = st.mirror
	}
	for _, s := range r.relocs {
		r.slots[s] += uint64(base)
	}
	return nil
}

// recordUpload marks the point after which st may be rewritten.
func (q *Queue) recordUpload(st *staging, r *batch) error {
	if len(r.up) == 0 {
		return nil
	}
	c := q.d.drv
	if err := c.call("cuEventRecord", c.cuEventRecord, st.ev, q.stream); err != nil {
		return err
	}
	st.pending = true
	return nil
}

// free releases st once the device has finished reading it (owner
// thread).
func (st *staging) free(c *driver) {
	if st.pending {
		c.call("cuEventSynchronize", c.cuEventSynchronize, st.ev)
	}
	if st.host != 0 {
		c.call("cuMemFreeHost", c.cuMemFreeHost, st.host)
	}
	if st.mirror != 0 { // the device has finished reading it (the event above)
		c.call("cuMemFreeAsync", c.cuMemFreeAsync, st.mirror, 0)
	}
	if st.ev != 0 {
		c.call("cuEventDestroy", c.cuEventDestroy, st.ev)
	}
	*st = staging{}
}

// Sync implements gpu.Queue.
func (q *Queue) Sync() error {
	q.flush()
	if q.err != nil {
		return q.err
	}
	q.readMu.Lock()
	defer q.readMu.Unlock()
	if err := q.d.doWait(q.recordRead); err != nil {
		q.err = err
	}
	return q.err
}

// grid1 is a grid-stride launch over n elements.
func (q *Queue) grid1(n int) [3]uint32 {
	b := (n + 255) / 256
	b = min(b, q.d.sms*16)
	return [3]uint32{uint32(b), 1, 1}
}

var (
	blk256 = [2]uint32{256, 1}
	blk128 = [2]uint32{128, 1}
)

func sameShape(op string, a, b gpu.Tensor) {
	if a.Rows != b.Rows || a.Cols != b.Cols {
		panic(fmt.Sprintf("cuda: %s: shapes %v and %v differ", op, a, b))
	}
}

func wantF32(op string, ts ...gpu.Tensor) {
	for _, t := range ts {
		if t.DType() != gpu.F32 {
			panic(fmt.Sprintf("cuda: %s: want F32, got %v", op, t))
		}
	}
}

// Write implements gpu.Queue.
func (q *Queue) Write(dst gpu.Tensor, src []float32) {
	if len(src) != dst.Len() {
		panic(fmt.Sprintf("cuda: write %d values to %v", len(src), dst))
	}
	wantF32("write", dst)
	q.writeWords(dst, bytesOf(src))
}

// WriteInt implements gpu.Queue.
func (q *Queue) WriteInt(dst gpu.Tensor, src []int32) {
	if len(src) != dst.Len() {
		panic(fmt.Sprintf("cuda: write %d ints to %v", len(src), dst))
	}
	if dst.DType() != gpu.I32 {
		panic(fmt.Sprintf("cuda: write ints to %v", dst))
	}
	q.writeWords(dst, bytesOf(src))
}

func (q *Queue) writeWords(dst gpu.Tensor, b []byte) {
	if dst.Len() == 0 {
		return
	}
	off := q.put(b)
	q.launch("copy_u32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), upload(off), i(dst.Cols), i(dst.Rows), i(dst.Cols))
}

// Read implements gpu.Queue.
func (q *Queue) Read(dst []float32, src gpu.Tensor) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("cuda: read %v into %d values", src, len(dst))
	}
	if src.DType() != gpu.F32 {
		return fmt.Errorf("cuda: read of %v", src)
	}
	if len(dst) == 0 {
		return q.Sync()
	}
	return q.readWords(unsafe.Pointer(&dst[0]), src, &q.readBuf)
}

// ReadInt implements gpu.Queue.
func (q *Queue) ReadInt(dst []int32, src gpu.Tensor) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("cuda: read %v into %d ints", src, len(dst))
	}
	if src.DType() != gpu.I32 {
		return fmt.Errorf("cuda: read ints from %v", src)
	}
	if len(dst) == 0 {
		return q.Sync()
	}
	return q.readWords(unsafe.Pointer(&dst[0]), src, &q.readIntBuf)
}

// readWords copies the 4-byte elements of src to host, through the
// contiguous staging *staging when src is strided, and waits.
func (q *Queue) readWords(host unsafe.Pointer, src gpu.Tensor, staging **buffer) error {
	from := src
	if !src.Contiguous() {
		if *staging == nil || (*staging).n < src.Len() {
			q.grow(staging, src.DType(), src.Len())
		}
		from = gpu.Tensor{Buf: *staging, Rows: src.Rows, Cols: src.Cols, Stride: src.Cols}
		q.Copy(from, src)
	}
	addr := uintptr(q.ptr(from))
	q.flush()
	if q.err != nil {
		return q.err
	}
	c := q.d.drv
	n := 4 * src.Len()
	q.readMu.Lock()
	defer q.readMu.Unlock()
	t0 := time.Now()
	// The copy lands in pinned memory (an asynchronous copy to pageable
	// memory would hold the owner thread until it ends); the owner
	// polls the event behind it while this goroutine waits.
	err := q.d.doWait(func() (uintptr, error) {
		if err := q.pinRead(n); err != nil {
			return 0, err
		}
		if err := c.call("cuMemcpyDtoHAsync", c.cuMemcpyDtoHAsync, q.pin.host, addr, uintptr(n), q.stream); err != nil {
			return 0, err
		}
		return q.recordRead()
	})
	q.stats.waits++
	q.stats.waitTime += time.Since(t0)
	if err != nil {
		q.err = fmt.Errorf("cuda: read %v on %s: %w", src, q.name, err)
		return q.err
	}
	copy(unsafe.Slice((*byte)(host), n), q.pin.bytes(n))
	return nil
}

// pinned is page-locked host memory a read lands in.
type pinned struct {
	host uintptr
	n    int
}

func (p *pinned) bytes(n int) []byte { return unsafe.Slice(*(**byte)(unsafe.Pointer(&p.host)), n) }

// recordRead records q.readEv behind the work queued so far, creating it
// the first time (owner thread; q.readMu held by the waiter).
func (q *Queue) recordRead() (uintptr, error) {
	c := q.d.drv
	if q.readEv == 0 {
		if err := c.call("cuEventCreate", c.cuEventCreate, uintptr(unsafe.Pointer(&q.readEv)), eventNoTime); err != nil {
			return 0, err
		}
	}
	return q.readEv, c.call("cuEventRecord", c.cuEventRecord, q.readEv, q.stream)
}

// pinRead makes q.pin hold at least n bytes (owner thread; q.readMu held
// by the reader).
func (q *Queue) pinRead(n int) error {
	c := q.d.drv
	if n <= q.pin.n {
		return nil
	}
	if q.pin.host != 0 {
		// The last read into it has been waited for.
		c.call("cuMemFreeHost", c.cuMemFreeHost, q.pin.host)
		q.pin = pinned{}
	}
	sz := max(64<<10, n+n/4)
	if err := c.call("cuMemHostAlloc", c.cuMemHostAlloc, uintptr(unsafe.Pointer(&q.pin.host)), uintptr(sz), hostPortable); err != nil {
		return err
	}
	q.pin.n = sz
	return nil
}

// grow replaces a queue scratch buffer by one of at least n elements (the
// old one is released behind the queue's work).
func (q *Queue) grow(bp **buffer, dt gpu.DType, n int) {
	if *bp != nil {
		q.d.Free(gpu.Tensor{Buf: *bp, Rows: 1, Cols: (*bp).n, Stride: (*bp).n})
	}
	b, err := q.d.alloc(dt, max(n, 1024)*5/4, nil)
	if err != nil {
		panic(fmt.Sprintf("cuda: scratch of %d elements: %v", n, err))
	}
	*bp = b
}

// Copy implements gpu.Queue.
func (q *Queue) Copy(dst, src gpu.Tensor) {
	sameShape("copy", dst, src)
	if dst.DType() != src.DType() {
		panic(fmt.Sprintf("cuda: copy %v to %v", src, dst))
	}
	name := "copy_u32"
	if dst.DType().Size() == 2 {
		name = "copy_u16"
	}
	q.launch(name, q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(src), ld(src), i(dst.Rows), i(dst.Cols))
}

// Fill implements gpu.Queue.
func (q *Queue) Fill(dst gpu.Tensor, v float32) {
	wantF32("fill", dst)
	q.launch("fill_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), i(dst.Rows), i(dst.Cols), f(v))
}

func (q *Queue) binary(op int, name string, dst, a, b gpu.Tensor) {
	sameShape(name, dst, a)
	sameShape(name, dst, b)
	wantF32(name, dst, a, b)
	if q.fuseBinary(op, dst, a, b) {
		return
	}
	q.launchOut(dst, "binary_f32", q.grid1(dst.Len()), blk256, 0, i(op), q.t(dst), ld(dst), q.t(a), ld(a), q.t(b), ld(b), i(dst.Rows), i(dst.Cols))
}

// Add implements gpu.Queue.
func (q *Queue) Add(dst, a, b gpu.Tensor) { q.binary(opAdd, "add", dst, a, b) }

// Mul implements gpu.Queue.
func (q *Queue) Mul(dst, a, b gpu.Tensor) { q.binary(opMul, "mul", dst, a, b) }

func (q *Queue) rowop(op int, name string, dst, a, v gpu.Tensor) {
	sameShape(name, dst, a)
	wantF32(name, dst, a)
	if v.Len() < dst.Cols || dtCode(v.DType()) == 0 {
		panic(fmt.Sprintf("cuda: %s: vector %v for %v", name, v, dst))
	}
	if op == opMul && q.fuseRowW(dst, a, v) {
		return
	}
	q.launchOut(dst, "rowop_f32", q.grid1(dst.Len()), blk256, 0, i(op), q.t(dst), ld(dst), q.t(a), ld(a), q.t(v), p(dtCode(v.DType())), i(dst.Rows), i(dst.Cols))
}

// AddRow implements gpu.Queue.
func (q *Queue) AddRow(dst, a, v gpu.Tensor) { q.rowop(opAdd, "addrow", dst, a, v) }

// MulRow implements gpu.Queue.
func (q *Queue) MulRow(dst, a, v gpu.Tensor) { q.rowop(opMul, "mulrow", dst, a, v) }

// Scale implements gpu.Queue.
func (q *Queue) Scale(dst, a gpu.Tensor, s float32) {
	sameShape("scale", dst, a)
	wantF32("scale", dst, a)
	q.launchOut(dst, "scale_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(a), ld(a), f(s), i(dst.Rows), i(dst.Cols))
}

// RoundBF16 implements gpu.Queue.
func (q *Queue) RoundBF16(dst gpu.Tensor) {
	wantF32("roundbf16", dst)
	if q.fuseRound(dst) {
		return
	}
	q.launch("round_bf16", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), i(dst.Rows), i(dst.Cols))
}

// Act implements gpu.Queue.
func (q *Queue) Act(dst, a gpu.Tensor, fn gpu.Activation) {
	sameShape("act", dst, a)
	wantF32("act", dst, a)
	if fn < gpu.SiLU || fn > gpu.Sigmoid {
		panic(fmt.Sprintf("cuda: activation %v", fn))
	}
	if q.fuseAct(dst, a, fn) {
		return
	}
	q.launchOut(dst, "act_f32", q.grid1(dst.Len()), blk256, 0, i(int(fn)), q.t(dst), ld(dst), q.t(a), ld(a), i(dst.Rows), i(dst.Cols))
}

// GLU implements gpu.Queue.
func (q *Queue) GLU(dst, a gpu.Tensor) {
	if a.Rows != dst.Rows || a.Cols != 2*dst.Cols {
		panic(fmt.Sprintf("cuda: glu %v -> %v", a, dst))
	}
	wantF32("glu", dst, a)
	q.launchOut(dst, "glu_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(a), ld(a), i(dst.Rows), i(dst.Cols))
}

// RMSNorm implements gpu.Queue.
func (q *Queue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	sameShape("rmsnorm", dst, a)
	wantF32("rmsnorm", dst, a)
	q.launchEpi(epiRowW, dst, "rmsnorm_f32", [3]uint32{uint32(dst.Rows), 1, 1}, blk256, 0, q.t(dst), ld(dst), q.t(a), ld(a), i(dst.Cols), f(eps))
}

// LayerNorm implements gpu.Queue.
func (q *Queue) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	sameShape("layernorm", dst, a)
	wantF32("layernorm", dst, a)
	if w.Len() < dst.Cols || (!b.IsNil() && b.Len() < dst.Cols) {
		panic(fmt.Sprintf("cuda: layernorm %v with w %v b %v", dst, w, b))
	}
	q.launchOut(dst, "layernorm_f32", [3]uint32{uint32(dst.Rows), 1, 1}, blk256, 0, q.t(dst), ld(dst), q.t(a), ld(a),
		q.t(w), p(dtCode(w.DType())), q.t(b), p(dtCode(b.DType())), i(dst.Cols), f(eps))
}

// Softmax implements gpu.Queue.
func (q *Queue) Softmax(dst gpu.Tensor) {
	wantF32("softmax", dst)
	if dst.Cols == 0 {
		return
	}
	q.launch("softmax_f32", [3]uint32{uint32(dst.Rows), 1, 1}, blk256, 0, q.t(dst), ld(dst), i(dst.Cols))
}

// RoPE implements gpu.Queue.
func (q *Queue) RoPE(dst gpu.Tensor, rp gpu.RoPEParams) {
	hd := rp.HeadDim
	if hd <= 0 || hd%2 != 0 || dst.Cols%hd != 0 || len(rp.InvFreq) != hd/2 || len(rp.Pos) != dst.Rows {
		panic(fmt.Sprintf("cuda: rope %v head %d invfreq %d pos %d", dst, hd, len(rp.InvFreq), len(rp.Pos)))
	}
	wantF32("rope", dst)
	if dst.Rows == 0 {
		return
	}
	invf := q.constant(rp.InvFreq)
	po := q.put(bytesOf(rp.Pos))
	q.launchOut(dst, "rope_f32", q.grid1(dst.Rows*dst.Cols/2), blk256, 0, q.t(dst), ld(dst), i(dst.Rows), i(dst.Cols), i(hd),
		b2i(rp.Style == gpu.Interleaved), invf, upload(po), b2i(rp.BF16))
}

// Attention implements gpu.Queue.
func (q *Queue) Attention(dst, qt, k, v gpu.Tensor, ap gpu.AttnParams) {
	hd := ap.HeadDim
	if hd < 1 || ap.KVHeads < 1 || ap.Heads%ap.KVHeads != 0 || qt.Cols != ap.Heads*hd || dst.Cols != qt.Cols ||
		dst.Rows != qt.Rows || k.Cols != ap.KVHeads*hd || v.Cols != k.Cols || v.Rows != k.Rows || ap.Window < 0 {
		panic(fmt.Sprintf("cuda: attention q %v k %v v %v dst %v heads %d/%d dim %d", qt, k, v, dst, ap.Heads, ap.KVHeads, hd))
	}
	wantF32("attention", dst, qt, k, v)
	// Paged keys: the kernel reads key row j at pool row
	// blocks[j/BlockRows]·BlockRows + j%BlockRows. The table's entries lie
	// in device memory and are not checked here (one outside the pool reads
	// outside it); the CPU backend checks them.
	nkeys, blocks, brows := k.Rows, gpu.Tensor{}, 1
	if !ap.Blocks.IsNil() {
		b := ap.Blocks
		if ap.BlockRows < 1 || ap.Keys < 0 || b.DType() != gpu.I32 || b.Rows != 1 || b.Cols*ap.BlockRows < ap.Keys || k.Rows%ap.BlockRows != 0 {
			panic(fmt.Sprintf("cuda: paged attention of %d keys in blocks of %d rows, table %v, pool %v", ap.Keys, ap.BlockRows, b, k))
		}
		nkeys, blocks, brows = ap.Keys, b, ap.BlockRows
	}
	if qt.Rows == 0 {
		return
	}
	maxL := max(nkeys, 1)
	// The scores scratch holds rows·heads·keys floats: long prefills run in
	// chunks of rows so that it stays within maxScores (each row's result
	// does not depend on the chunk it is in).
	if rows := max(1, maxScores/(ap.Heads*maxL)); qt.Rows > rows {
		for r0 := 0; r0 < qt.Rows; r0 += rows {
			r1 := min(qt.Rows, r0+rows)
			cp := ap
			cp.QPos0 = ap.QPos0 + r0
			q.Attention(dst.Slice(r0, r1), qt.Slice(r0, r1), k, v, cp)
		}
		return
	}
	need := qt.Rows * ap.Heads * maxL
	if q.scores == nil || q.scores.n < need {
		q.grow(&q.scores, gpu.F32, need)
	}
	sc := gpu.Tensor{Buf: q.scores, Rows: 1, Cols: need, Stride: need}
	shm, shs := attnShm(hd, maxL)
	q.launchOut(dst, "attention_f32", [3]uint32{uint32(qt.Rows), uint32(ap.Heads), 1}, blk128, shm,
		q.t(dst), ld(dst), q.t(qt), ld(qt), q.t(k), ld(k), q.t(v), ld(v), q.t(sc), i(maxL),
		i(ap.Heads), i(ap.KVHeads), i(hd), f(ap.Scale), i(ap.QPos0), b2i(ap.Causal), i(ap.Window), i(nkeys), b2i(ap.ProbBF16),
		q.t(blocks), i(brows), b2i(shs))
}

// attnShmKeys is the most keys whose scores and rows attn_rows keeps in
// shared memory (8 bytes a key, 32 KiB; beyond it they go through the
// scores scratch and the block table in device memory).
const attnShmKeys = 4096

// attnShm returns the dynamic shared memory of attention_f32 and
// attention_seqs_f32 (128 threads) for heads of hd and at most maxL keys
// a row — q, the reductions, the partials and, where maxL ≤ attnShmKeys,
// the scores and the keys' rows — and whether the scores are in it. The
// keys' part is sized for a power of two from 512 keys up, not for maxL:
// a launch's shared memory is part of its graph's key (graph.go), and a
// size that grew with every decode step would make every step a new graph.
func attnShm(hd, maxL int) (bytes int, shs bool) {
	bytes = 4 * (hd + 32 + max(128, hd))
	if maxL > attnShmKeys {
		return bytes, false
	}
	keys := 512
	for keys < maxL {
		keys <<= 1
	}
	return bytes + 8*keys, true
}

// maxScores bounds the attention scratch in floats (256 MiB).
const maxScores = 1 << 26

// maxShortConv is the longest ShortConv kernel the CUDA kernel holds in
// registers.
const maxShortConv = 16

// ShortConv implements gpu.Queue.
func (q *Queue) ShortConv(dst, x, w, state gpu.Tensor) {
	sameShape("shortconv", dst, x)
	C, L := x.Cols, w.Cols
	if w.Rows != C || state.Rows != L-1 || state.Cols != C || !w.Contiguous() || L < 1 || L > maxShortConv {
		panic(fmt.Sprintf("cuda: shortconv x %v w %v state %v", x, w, state))
	}
	wantF32("shortconv", dst, x, state)
	chunk, nz := shortConvChunks(dst, x, x.Rows)
	q.launchEpi(epiProduct, dst, "shortconv_f32", [3]uint32{uint32((C + 127) / 128), 1, nz}, blk128, 0, q.t(dst), ld(dst), q.t(x), ld(x),
		q.t(w), p(dtCode(w.DType())), q.t(state), ld(state), i(x.Rows), i(chunk), i(C), i(L))
}

// shortConvChunk is the rows of a short convolution's chunk, a thread's
// window of its own (kernels.cu shortconv_rows): at least maxShortConv − 1,
// so that only the first chunk reads the carried state.
const shortConvChunk = 16

// shortConvChunks returns the chunk rows and the chunks for a short
// convolution of up to rows rows a sequence: one chunk of every row where
// dst shares x's buffer (an in-place convolution reads each row of x before
// it writes it, which only one window a thread keeps).
func shortConvChunks(dst, x gpu.Tensor, rows int) (chunk int, n uint32) {
	if rows <= shortConvChunk || dst.Buf == x.Buf {
		return max(rows, 1), 1
	}
	return shortConvChunk, uint32((rows + shortConvChunk - 1) / shortConvChunk)
}

// Embed implements gpu.Queue.
func (q *Queue) Embed(dst, table gpu.Tensor, ids []int32) {
	if dst.Rows == 0 {
		return
	}
	if len(ids)%dst.Rows != 0 || table.Cols != dst.Cols || dtCode(table.DType()) == 0 {
		panic(fmt.Sprintf("cuda: embed %d ids from %v into %v", len(ids), table, dst))
	}
	for _, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("cuda: embed id %d outside table of %d rows", id, table.Rows))
		}
	}
	wantF32("embed", dst)
	off := q.put(bytesOf(ids))
	n := len(ids) / dst.Rows
	q.launchOut(dst, "embed_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(table), p(dtCode(table.DType())), ld(table),
		upload(off), i(n), i(n), i(table.Rows), i(dst.Rows), i(dst.Cols))
}

// Transpose implements gpu.Queue.
func (q *Queue) Transpose(dst, src gpu.Tensor) {
	if dst.Rows != src.Cols || dst.Cols != src.Rows {
		panic(fmt.Sprintf("cuda: transpose %v -> %v", src, dst))
	}
	wantF32("transpose", dst, src)
	g := [3]uint32{uint32((src.Cols + 31) / 32), uint32((src.Rows + 31) / 32), 1}
	q.launch("transpose_f32", g, [2]uint32{32, 8}, 0, q.t(dst), ld(dst), q.t(src), ld(src), i(src.Rows), i(src.Cols))
}

// maxConsts bounds Device.consts; beyond it constants are uploaded with
// each launch.
const maxConsts = 256

// constant returns a kernel argument pointing at vals in device memory:
// the copy made the first time these exact values were seen (a model's
// RoPE frequencies are the same every step; reading them from the pinned
// upload area would cost a trip over the bus per launch).
// Past maxConsts (or when the copy cannot be made) the values travel with
// the batch's uploads instead.
func (q *Queue) constant(vals []float32) arg {
	d := q.d
	key := string(bytesOf(vals))
	d.constMu.Lock()
	defer d.constMu.Unlock()
	if b, ok := d.consts[key]; ok {
		return p(int64(b.ptr))
	}
	if len(d.consts) < maxConsts {
		if b, err := d.alloc(gpu.F32, len(vals), bytesOf(vals)); err == nil {
			if d.consts == nil {
				d.consts = map[string]*buffer{}
			}
			d.consts[key] = b
			return p(int64(b.ptr))
		}
	}
	return upload(q.put(bytesOf(vals)))
}

// queueStats counts what a queue's batches did (OMNIPIPE_CUDA_STATS).
type queueStats struct {
	flushes, cmds, graphRuns, direct, updates, waits int
	upWaits                                          int // batches that waited for their upload memory
	evictions                                        int // graphs dropped from a full cache
	flushTime, waitTime, recTime                     time.Duration
	recStart                                         time.Time // the batch's first command (guarded by mu)
}

// writeStats prints every queue's counts to standard error (env
// OMNIPIPE_CUDA_STATS=1): how many batches replayed a graph, how many
// kernel nodes had their arguments updated, and the host's time handing
// batches over and waiting for reads.
func (d *Device) writeStats() {
	if os.Getenv("OMNIPIPE_CUDA_STATS") == "" {
		return
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	pdl := "off"
	if d.pdl.Load() {
		pdl = "on"
	}
	fmt.Fprintf(os.Stderr, "cuda programmatic dependent launch %s\n", pdl)
	for _, q := range d.queues {
		s := q.stats
		if s.flushes == 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "cuda queue %-12s %6d batches (%5.1f cmds each): %d graph replays, %d direct, %d node updates; recording %.1f µs/batch, hand-over %.1f µs/batch, read wait %.1f µs/read, %d waits for upload memory, %d graphs evicted; stream priority %d\n",
			q.name, s.flushes, float64(s.cmds)/float64(s.flushes), s.graphRuns, s.direct, s.updates,
			float64(s.recTime)/1e3/float64(s.flushes), float64(s.flushTime)/1e3/float64(s.flushes), float64(s.waitTime)/1e3/float64(max(s.waits, 1)), s.upWaits, s.evictions, q.priority)
	}
}

// UseFP32Products implements gpu.FP32Products: this queue's products
// accumulate in IEEE fp32 with FMA (the FMA kernels' order) even where the
// device runs bf16 networks' products on the tensor cores.
func (q *Queue) UseFP32Products() { q.fp32 = true }

// tensorCores reports whether BF16-weight products run on the tensor
// cores (Options.MatMul "mma", not a gpu.FP32Products queue).
func (q *Queue) tensorCores() bool { return q.d.mmaMatMul && !q.fp32 }
