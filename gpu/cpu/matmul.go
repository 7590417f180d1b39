package cpu

import (
	"fmt"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The summation order of a matrix product, shared by every path (GEMV and
// GEMM, assembly and Go, any tile and any worker split), so that an output
// element depends only on its own row of x and column of w:
//
//  1. Eight lane sums over the first K8 = K &^ 7 terms: lane l accumulates
//     x[k]·w[k] for k ≡ l (mod 8) in increasing k, starting from zero.
//  2. Their reduction s = ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)).
//  3. The tail: s += x[k]·w[k] for k = K8 … K−1, the product rounded first.
//  4. The bias: s += b[n].
//
// The assembly kernels fuse step 1's multiply and add (FMA, one rounding);
// the Go kernels round the product and then the sum. A process uses one
// kernel set, so within it results are reproducible bit for bit. K is never
// split across workers; the assembly GEMM may cut K into blocks, carrying the
// raw 8-lane accumulators between them, which changes nothing.

// streamRows is the most rows of x a product takes in one pass (the decode
// step of a batch of sessions): each participant streams its weight rows
// once, from DRAM, with every row of x against them, and K is not blocked,
// so a batch costs about what one row does while the product is
// bandwidth-bound. More rows take the blocked GEMM (at 16 rows the one pass
// was still the faster; at 32 they were even). Either way a row's outputs
// are the same floats (the summation order above).
const streamRows = 16

// chunksPerWorker is how many column chunks per worker a one-pass product
// is cut into at least (OMNIPIPE_CPU_CHUNKS; a tuning knob).
var chunksPerWorker = envInt("OMNIPIPE_CPU_CHUNKS", 2)

// Blocking of the assembly GEMM (more than streamRows rows). The x
// micro-panel of a tile (4 rows × kcBlock floats, 8 KB) stays in L1 while
// the tile walks a column block; the w block (ncBlock rows × kcBlock, 96 KB
// in bf16) stays in L2 while the tiles walk the row block; the spilled
// accumulators of a row block × column block (mcBlock/4 · ncBlock/3 · 384
// bytes = 384 KB) live in L2 as well. A prompt of up to mcBlock rows streams each weight once.
const (
	kcBlock = 512 // multiple of 8
	mcBlock = 128 // multiple of 4
	ncBlock = 96  // multiple of 12 (whole 3- and 4-column tiles)
)

// work is the scratch of one parallel chunk of an op. A Queue keeps one per
// worker and reuses them, so ops do not allocate.
type work struct {
	args tileArgs
	acc  []float32 // spilled dot accumulators
	row  []float32 // a widened weight row (Go kernels); LayerNorm's bias
	col  []float32 // im2col rows, patches, z rows, attention scores
	vec  []float32 // a per-op vector (widened bias, norm weight)
	wts  []float32 // an op's weight converted to F32 (convolutions)
}

// workspace returns n chunk scratches.
// argsFor sets wk's tile-kernel row strides for x, weight and output rows
// of xs, ws and ds elements (F32 x and outputs, weights of wt) and returns
// the arguments with wt's kernel-table index.
func (wk *work) argsFor(xs, ws, ds int, wt gpu.DType) (*tileArgs, int) {
	a := &wk.args
	a.xs = uintptr(xs) * 4
	a.ws = uintptr(ws) * uintptr(wt.Size())
	a.os = uintptr(ds) * 4
	return a, dtIndex(wt)
}

func (q *Queue) workspace(n int) []*work {
	for len(q.work) < n {
		q.work = append(q.work, new(work))
	}
	return q.work[:n]
}

// grow returns s resliced to n elements, reallocated when too small.
func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n, n+n/4)
	}
	return s[:n]
}

// mm is one matrix product dst[M,N] = x[M,K]·w[N,K]ᵀ (+ bias) over host
// memory. Row r of x starts at x[r·xs], row n of w at w[n·ws], row r of dst
// at dst[r·ds].
type mm struct {
	x       []float32
	xs      int
	wt      gpu.DType
	w32     []float32 // F32 weights
	w16     []uint16  // BF16 or F16 weights
	ws      int
	dst     []float32
	ds      int
	bias    []float32 // nil: none
	M, N, K int
}

// MatMul implements gpu.Queue.
func (q *Queue) MatMul(dst, x, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	if w.Cols != K || dst.Rows != M || dst.Cols != N {
		panic(fmt.Sprintf("cpu: matmul x %v w %v dst %v", x, w, dst))
	}
	if dst.Buf == x.Buf || dst.Buf == w.Buf {
		panic("cpu: matmul dst aliases an operand")
	}
	if M == 0 || N == 0 {
		return
	}
	g := mm{x: f32s(x), xs: x.Stride, dst: f32s(dst), ds: dst.Stride, M: M, N: N, K: K}
	g.setWeight(w)
	ws := q.workspace(1)
	if !bias.IsNil() {
		g.bias = vectorInto(&ws[0].vec, bias, N)
	}
	q.gemm(&g)
}

// setWeight points g at w's elements.
func (g *mm) setWeight(w gpu.Tensor) {
	b := buf(w)
	g.wt, g.ws = b.dt, w.Stride
	if w.Rows == 0 || w.Cols == 0 {
		return
	}
	end := w.Off + (w.Rows-1)*w.Stride + w.Cols
	switch b.dt {
	case gpu.F32:
		g.w32 = b.f32[w.Off:end:end]
	case gpu.BF16, gpu.F16:
		g.w16 = b.u16[w.Off:end:end]
	default:
		panic(fmt.Sprintf("cpu: matmul weight %v", w))
	}
}

// gemm runs g on the worker pool. The outputs are cut into column chunks
// (each participant streams its own weight rows: the GEMV of a decode step,
// and products whose weight outweighs x) or into row chunks (tall products
// such as a convolution over thousands of rows); participants take chunks
// as they become free. The cut never changes a result.
func (q *Queue) gemm(g *mm) {
	p := q.dev.pool
	ws := q.workspace(p.workers)
	asm := q.asm
	byCols := g.M <= streamRows || g.N*g.wt.Size() >= g.M*4
	switch {
	case p.workers == 1 || g.M*g.N*max(g.K, 8) < 1<<16:
		g.run(ws[0], 0, g.M, 0, g.N, asm)
	case byCols && g.N >= 24:
		// Chunks of about 192 KB of weights for the one-pass product,
		// whole column blocks for the GEMM; a multiple of 12 columns
		// (whole tiles).
		grain := ncBlock
		if g.M <= streamRows {
			grain = streamGrain(g.N, g.K*g.wt.Size(), p.workers)
		} else {
			grain = min(grain, streamGrain(g.N, 0, p.workers))
		}
		p.ForW(g.N, grain, func(w, lo, hi int) { g.run(ws[w], 0, g.M, lo, hi, asm) })
	case g.M >= 8:
		grain := min(mcBlock, max(4, (g.M+2*p.workers-1)/(2*p.workers)/4*4))
		p.ForW(g.M, grain, func(w, lo, hi int) { g.run(ws[w], lo, hi, 0, g.N, asm) })
	default:
		g.run(ws[0], 0, g.M, 0, g.N, asm)
	}
}

// streamGrain is the column chunk of a one-pass product of N weight rows
// of rowBytes each: about 192 KB of weights, a multiple of 12 columns (whole
// tiles), and at least chunksPerWorker chunks a worker. rowBytes 0 leaves
// only the last two rules.
func streamGrain(N, rowBytes, workers int) int {
	fair := max(12, (N+chunksPerWorker*workers-1)/(chunksPerWorker*workers)/12*12)
	if rowBytes <= 0 {
		return fair
	}
	return min(max(12, (192<<10)/rowBytes/12*12), fair)
}

// run computes the outputs [m0,m1) × [n0,n1) on the calling goroutine.
func (g *mm) run(wk *work, m0, m1, n0, n1 int, asm bool) {
	if m0 >= m1 || n0 >= n1 {
		return
	}
	if asm {
		g.runAsm(wk, m0, m1, n0, n1)
	} else {
		g.runGo(wk, m0, m1, n0, n1)
	}
	g.finish(m0, m1, n0, n1)
}

// runAsm computes steps 1 and 2 of the summation order with the tile
// kernels: up to streamRows rows in one pass (runStream), more with the
// blocked GEMM: 4×3 tiles, K cut into kcBlock blocks.
func (g *mm) runAsm(wk *work, m0, m1, n0, n1 int) {
	K8 := g.K &^ 7
	if K8 == 0 {
		return
	}
	rows := m1 - m0
	if rows <= streamRows {
		g.runStream(wk, m0, m1, n0, n1)
		return
	}
	mr, nr := 4, 3
	kc, mc, nc := kcBlock, mcBlock, ncBlock
	if kc >= K8 {
		kc = K8
	} else {
		// Tiles of a block × 96 floats (the largest tile's accumulators).
		wk.acc = grow(wk.acc, ((min(mc, rows)+mr-1)/mr)*((min(nc, n1-n0)+nr-1)/nr)*96)
	}
	a, di := wk.argsFor(g.xs, g.ws, g.ds, g.wt)
	for nb := n0; nb < n1; nb += nc {
		nbe := min(nb+nc, n1)
		for mb := m0; mb < m1; mb += mc {
			mbe := min(mb+mc, m1)
			for kb := 0; kb < K8; kb += kc {
				kbe := min(kb+kc, K8)
				a.k = uintptr(kbe-kb) / 8
				a.mode = 0
				if kb > 0 {
					a.mode |= modeLoad
				}
				if kbe < K8 {
					a.mode |= modeStore
				}
				slot := 0
				for m := mb; m < mbe; m += mr {
					tm := min(mr, mbe-m)
					for n := nb; n < nbe; n += nr {
						tn := min(nr, nbe-n)
						a.x = unsafe.Pointer(&g.x[m*g.xs+kb])
						if g.w32 != nil {
							a.w = unsafe.Pointer(&g.w32[n*g.ws+kb])
						} else {
							a.w = unsafe.Pointer(&g.w16[n*g.ws+kb])
						}
						if a.mode != 0 {
							a.acc = unsafe.Pointer(&wk.acc[slot*96])
						}
						a.out = unsafe.Pointer(&g.dst[m*g.ds+n])
						dotTiles[di][tm][tn](a)
						slot++
					}
				}
			}
		}
	}
	a.x, a.w, a.acc, a.out = nil, nil, nil, nil // retain no tensor
}

// runStream computes steps 1 and 2 of the summation order for a few rows
// (at most streamRows) in one pass over K: the columns are walked in tiles
// of nr weight rows (4 for one or two rows, else 3), and each tile is
// dotted with every row of x, in groups of up to 4 rows, before the next.
// The first group streams the tile from memory, prefetching the next one
// (streamTiles); the later groups find it in L1. Each weight is read from
// memory once, whatever the number of rows.
func (g *mm) runStream(wk *work, m0, m1, n0, n1 int) {
	K8 := g.K &^ 7
	rows := m1 - m0
	nr := 3
	if rows <= 2 {
		nr = 4
	}
	a, di := wk.argsFor(g.xs, g.ws, g.ds, g.wt)
	a.k = uintptr(K8) / 8
	a.mode = 0
	for n := n0; n < n1; n += nr {
		tn := min(nr, n1-n)
		if g.w32 != nil {
			a.w = unsafe.Pointer(&g.w32[n*g.ws])
		} else {
			a.w = unsafe.Pointer(&g.w16[n*g.ws])
		}
		tiles := &streamTiles[di]
		for m := m0; m < m1; m += 4 {
			tm := min(4, m1-m)
			a.x = unsafe.Pointer(&g.x[m*g.xs])
			a.out = unsafe.Pointer(&g.dst[m*g.ds+n])
			tiles[tm][tn](a)
			tiles = &dotTiles[di]
		}
	}
	a.x, a.w, a.out = nil, nil, nil // retain no tensor
}

// runGo computes steps 1 and 2 of the summation order in Go: each weight
// row is widened once and dotted with every row of x.
func (g *mm) runGo(wk *work, m0, m1, n0, n1 int) {
	K8 := g.K &^ 7
	if K8 == 0 {
		return
	}
	wk.row = grow(wk.row, K8)
	wr := wk.row
	for n := n0; n < n1; n++ {
		o := n * g.ws
		switch g.wt {
		case gpu.F32:
			wr = g.w32[o : o+K8]
		case gpu.BF16:
			widenBF16(wr, g.w16[o:o+K8])
		case gpu.F16:
			widenF16(wr, g.w16[o:o+K8])
		}
		for m := m0; m < m1; m++ {
			g.dst[m*g.ds+n] = dot8(g.x[m*g.xs:m*g.xs+K8], wr)
		}
	}
}

// finish applies steps 3 and 4 of the summation order (tail and bias).
func (g *mm) finish(m0, m1, n0, n1 int) {
	K8 := g.K &^ 7
	tail := g.K - K8
	if tail == 0 && g.bias == nil && K8 > 0 {
		return
	}
	var wt [8]float32 // the tail of one weight row
	for n := n0; n < n1; n++ {
		o := n*g.ws + K8
		switch {
		case tail == 0: // K = 0: x and w hold no elements
		case g.wt == gpu.F32:
			copy(wt[:tail], g.w32[o:o+tail])
		case g.wt == gpu.BF16:
			widenBF16(wt[:tail], g.w16[o:o+tail])
		case g.wt == gpu.F16:
			widenF16(wt[:tail], g.w16[o:o+tail])
		}
		var b float32
		if g.bias != nil {
			b = g.bias[n]
		}
		for m := m0; m < m1; m++ {
			i := m*g.ds + n
			var s float32
			if K8 > 0 {
				s = g.dst[i]
			}
			if tail > 0 {
				for k, xv := range g.x[m*g.xs+K8 : m*g.xs+g.K] {
					s += float32(xv * wt[k])
				}
			}
			if g.bias != nil {
				s += b
			}
			g.dst[i] = s
		}
	}
}

// weight returns weight element i as float32.
func (g *mm) weight(i int) float32 {
	switch g.wt {
	case gpu.BF16:
		return gpu.BF16ToF32(g.w16[i])
	case gpu.F16:
		return gpu.F16ToF32(g.w16[i])
	}
	return g.w32[i]
}

// dot8 returns steps 1 and 2 of the summation order for len(x) = len(w), a
// multiple of 8, with each product rounded before it is added (the explicit
// conversions forbid the compiler from fusing them, on every architecture).
func dot8(x, w []float32) float32 {
	var a0, a1, a2, a3, a4, a5, a6, a7 float32
	w = w[:len(x)]
	for i := 0; i+8 <= len(x); i += 8 {
		xs, ws := x[i:i+8:i+8], w[i:i+8:i+8]
		a0 += float32(xs[0] * ws[0])
		a1 += float32(xs[1] * ws[1])
		a2 += float32(xs[2] * ws[2])
		a3 += float32(xs[3] * ws[3])
		a4 += float32(xs[4] * ws[4])
		a5 += float32(xs[5] * ws[5])
		a6 += float32(xs[6] * ws[6])
		a7 += float32(xs[7] * ws[7])
	}
	return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
}

func widenBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = gpu.BF16ToF32(h)
	}
}

func widenF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = gpu.F16ToF32(h)
	}
}

// vectorInto returns a [1, n] tensor of any float dtype as float32 values:
// the tensor's own slice for F32, else a conversion into *scratch (grown as
// needed).
func vectorInto(scratch *[]float32, v gpu.Tensor, n int) []float32 {
	if v.Rows != 1 || v.Cols != n {
		panic(fmt.Sprintf("cpu: want a [1,%d] vector, got %v", n, v))
	}
	return floatsInto(scratch, v, n)
}

// floatsInto returns the n elements of t's buffer from t.Off as float32:
// the buffer's own slice for F32, else a conversion into *scratch (grown as
// needed).
func floatsInto(scratch *[]float32, t gpu.Tensor, n int) []float32 {
	b := buf(t)
	switch b.dt {
	case gpu.F32:
		return b.f32[t.Off : t.Off+n]
	case gpu.BF16:
		*scratch = grow(*scratch, n)
		widenBF16(*scratch, b.u16[t.Off:t.Off+n])
		return *scratch
	case gpu.F16:
		*scratch = grow(*scratch, n)
		widenF16(*scratch, b.u16[t.Off:t.Off+n])
		return *scratch
	}
	panic(fmt.Sprintf("cpu: float values of %v", t))
}
