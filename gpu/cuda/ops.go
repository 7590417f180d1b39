package cuda

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// matmulRows picks the rows of x one warp tile covers: the summation order
// does not depend on it (kernels.cu), only the weight re-reads do.
func matmulRows(m int) int {
	switch {
	case m <= 1:
		return 1
	case m <= 2:
		return 2
	case m <= 4:
		return 4
	}
	return 8
}

// matmulKernels names the FMA kernel of each (row tile, weight type): a
// table, not a formatted string, since MatMul runs hundreds of times a step.
var matmulKernels = map[gpu.DType][9]string{
	gpu.F32:  {1: "matmul_r1_f32", 2: "matmul_r2_f32", 4: "matmul_r4_f32", 8: "matmul_r8_f32"},
	gpu.BF16: {1: "matmul_r1_bf16", 2: "matmul_r2_bf16", 4: "matmul_r4_bf16", 8: "matmul_r8_bf16"},
	gpu.F16:  {1: "matmul_r1_f16", 2: "matmul_r2_f16", 4: "matmul_r4_f16", 8: "matmul_r8_f16"},
}

// matmulTiledKernels names the FMA kernel on 64 × 64 tiles by weight type.
var matmulTiledKernels = map[gpu.DType]string{gpu.F32: "matmul_t64_f32", gpu.BF16: "matmul_t64_bf16", gpu.F16: "matmul_t64_f16"}

// The FMA products take the 64 × 64 tile kernel (matmul_t64_*, the same
// bits as the 8 × 4 warp tiles) when there are enough tiles to fill the
// multiprocessors: a codec's convolutions (tens of thousands of rows, K of
// 32–1536) on a warp tile leave most lanes idle and pay a 32-lane
// reduction for each output; on the H200 the tile kernel ran them 1.7–3.4×
// faster (BenchmarkMatMulFMATiles, 256–3840 tiles). A tile walks K alone,
// one 8-column chunk at a time, so a product of few tiles is bound by each
// chunk's load latency: 64 × 512 outputs of 512 terms (8 tiles) took 61 µs
// there against the warp tiles' 24 µs.
const (
	matmulTiledMinRows = 64
	matmulTiledMinCols = 32
)

// useFMATiles reports whether an FMA product of M rows and N weight rows
// runs on the 64 × 64 tile kernel: at least one tile per two
// multiprocessors (or Options.FMATiles). A tile a multiprocessor was the
// rule until the H200's 256-session load (2026-12-03): Mimi's transformer
// products of 256 rows ([1536, 512] and [2048, 512]: 96 and 128 tiles)
// then took the warp tiles, and with them on the tile kernel (a threshold
// of 64 or 16 tiles) the engine made 277–279 s of speech a second against
// 260–263, first audio p50 211–215 ms against 230–245.
func (q *Queue) useFMATiles(M, N int) bool {
	if q.fmaTiles != 0 {
		return q.fmaTiles > 0
	}
	least := (q.d.sms + 1) / 2
	if q.d.fmaTiles > 0 {
		least = q.d.fmaTiles
	}
	tiles := ((M + 63) / 64) * ((N + 63) / 64)
	return M >= matmulTiledMinRows && N >= matmulTiledMinCols && tiles >= least
}

// matmulKernel names the kernel for a row tile and weight type.
func matmulKernel(r int, dt gpu.DType) string {
	k, ok := matmulKernels[dt]
	if !ok {
		panic(fmt.Sprintf("cuda: matmul weight %v", dt))
	}
	return k[r]
}

// matmulGrid returns the launch grid for M×N outputs with R rows a tile (4
// weight rows a warp, 4 warps a block).
func matmulGrid(m, n, r int) [3]uint32 {
	tiles := (n + 3) / 4
	return [3]uint32{uint32((tiles + 3) / 4), uint32((m + r - 1) / r), 1}
}

// mmaBigMinRows is the fewest rows of x that take mma_bf16_big (64 × 64
// output tiles, operands staged in shared memory) rather than mma_tile's
// kernels (16 weight rows × 8–32 rows of x a block): on the H200, on exact
// bf16 rows against [8192, 2048] weights (BenchmarkMatMulTiles, commit
// 1cf6c5d), the two ran even at 16 rows and the big one was faster from 32
// (26.9 against 21.5 TFLOP/s; 61.7 against 31.2 at 64 rows, 109 against
// 39.9 at 256, 154 against 43.3 at 1024).
const mmaBigMinRows = 17

// mmaLaunch picks the tensor-core kernel for M rows (8 or 16 rows of x a
// block of 16 weight rows, or 64 × 64 tiles from mmaBigMinRows rows — split
// over blocks where they are few, mmaBigSplit: the order of the sums does
// not depend on it) and its grid; force, when set, names the kernel (tests
// and benchmarks; mma_bf16_m32, mma_tile's 32-row blocks, is the tile
// order the other kernels are held to bit for bit). Until the split,
// products of fewer tiles than a quarter of the multiprocessors took
// mma_tile's blocks; on the H200 (BenchmarkEncoderShapes, 2026-12-02, µs
// for 16 products of exact bf16 rows) the split tiles beat them: 256 ×
// [512, 2048] 329 against 432, 62 × [512, 512] 128 against 181.
func mmaLaunch(m, n, sms int, force string) (string, [3]uint32) {
	rows, name := 32, "mma_bf16_m32"
	force, _, _ = strings.Cut(force, "/") // "mma_bf16_big/S": the split too (mmaBigSplit)
	switch {
	case force == "mma_bf16_big" || force == "" && m >= mmaBigMinRows:
		return "mma_bf16_big", [3]uint32{uint32((n + 63) / 64), uint32((m + 63) / 64), 1}
	case force != "":
		rows, name = map[string]int{"mma_bf16_m8": 8, "mma_bf16_m16": 16, "mma_bf16_m32": 32}[force], force
	case m <= 8:
		rows, name = 8, "mma_bf16_m8"
	case m <= 16:
		rows, name = 16, "mma_bf16_m16"
	}
	return name, [3]uint32{uint32((n + 15) / 16), uint32((m + rows - 1) / rows), 1}
}

// mmaSplitMaxBytes bounds a split product's class sums (mmaBigSplit):
// 16 planes of M × N floats, 32 MiB at 256 rows × 2048 outputs.
const mmaSplitMaxBytes = 32 << 20

// mmaBigSplit returns over how many blocks mma_bf16_big's 16 superblock
// classes are split a 64 × 64 tile (mma_bf16_bigp, then mma_fold_f32 adds
// the class sums in class order: the same bits), 1 for one block a tile:
// where the tiles of M × N outputs are fewer than the sms multiprocessors
// (a 100-row prefill's or a 256-session step's [2048, ·] products: 64 and
// 128 tiles, each walking K alone), the split doubles until the blocks
// number three times the multiprocessors, up to the classes that have
// superblocks and mmaSplitMaxBytes of sums. force "mma_bf16_big/S" sets S
// (tests and benchmarks). On the H200 (BenchmarkEncoderShapes, 2026-12-02,
// µs for 16 products of exact bf16 rows, unsplit / the pick / the best):
// 100 × [2048, 2048] 634 / 380 (S 8); 100 × [2048, 8192] 2143 / 1083 (8);
// 130 × [2048, 2048] 732 / 477 (8); 256 × [2048, 8192] 2733 / 1656 (4) /
// 1635 (8); 256 × [2048, 2048] 784 / 633 (4); 256 × [512, 2048] 772 / 329
// (16). Where the tiles fill the device the split costs more than it
// gives (100 × [8192, 2048], 256 tiles: 883 unsplit, 1026 at S 2): every
// class's sums are written and read back.
func mmaBigSplit(m, n, k, sms int, force string) int {
	ncls := min(16, (k+63)/64)
	if _, f, ok := strings.Cut(force, "/"); ok {
		s, err := strconv.Atoi(f)
		if err != nil || s < 1 {
			panic(fmt.Sprintf("cuda: tile kernel %q", force))
		}
		return min(s, ncls)
	}
	tiles := ((n + 63) / 64) * ((m + 63) / 64)
	s := 1
	if tiles >= sms || 4*ncls*m*n > mmaSplitMaxBytes {
		return s
	}
	for 2*s <= ncls && tiles*s < 3*sms {
		s *= 2
	}
	return s
}

// MatMul implements gpu.Queue. BF16 weights run on the tensor cores (the
// default, Options.MatMul "mma"), in one K-only order: up to mmvMaxRows
// rows of x against up to mmvMaxN weight rows on the few-row kernels
// (mmv_bf16, x split in registers), the rest on the tile kernels after
// split_bf16 — the same bits. Other weights, and BF16 ones with MatMul
// "fma" or on a gpu.FP32Products queue, run on the FMA kernels, whose
// order (another, also K-only) the one-row (gemv_bf16) and few-row
// (gemvr_bf16) kernels keep with more weight bytes in flight. Either way a
// row alone equals the same row in any batch.
func (q *Queue) MatMul(dst, x, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	if w.Cols != K || dst.Rows != M || dst.Cols != N || (!bias.IsNil() && bias.Len() < N) {
		panic(fmt.Sprintf("cuda: matmul %v · %vᵀ -> %v (bias %v)", x, w, dst, bias))
	}
	wantF32("matmul", dst, x)
	if M == 0 || N == 0 {
		return
	}
	if K == 0 {
		if bias.IsNil() {
			q.Fill(dst, 0)
		} else {
			q.Fill(dst, 0)
			q.AddRow(dst, dst, bias)
		}
		return
	}
	gemvOK := w.DType() == gpu.BF16 && !q.tensorCores() && !q.tileForce && q.ptr(x)%16 == 0 && q.ptr(w)%16 == 0 && w.Stride%8 == 0
	if M == 1 && gemvOK {
		name, rows := gemvVariant(N, K)
		if q.gemvForce != "" { // tests: every variant against the tile kernels
			name, rows = q.gemvForce, q.gemvForceRows
		}
		q.launchEpi(epiProduct, dst, name, [3]uint32{uint32((N + rows - 1) / rows), 1, 1}, blk128, 0,
			q.t(dst), q.t(x), q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(N), i(K))
		return
	}
	if M >= 2 && M <= gemvrMaxRows && gemvOK && x.Stride%4 == 0 {
		v := gemvrVariant(M)
		if q.gemvrForce != "" {
			v = gemvrByName(q.gemvrForce)
		}
		q.launchEpi(epiProduct, dst, v.name, [3]uint32{uint32((M + v.r - 1) / v.r), uint32((N + 4*v.c - 1) / (4 * v.c)), 1}, blk128, 0,
			q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(M), i(N), i(K))
		return
	}
	mid, midOK := mmvMidVariant(M, N, K, q.d.sms)
	midOK = midOK && q.tileKernel == ""
	if w.DType() == gpu.BF16 && q.tensorCores() && !q.tileForce && (q.mmvForce != "" || M <= mmvMaxRows && N <= mmvMaxN || midOK) {
		v := mmvVariant(N)
		if midOK {
			v = mid
		}
		if q.mmvForce != "" {
			v = mmvByName(q.mmvForce)
		}
		name, wp := v.name, q.t(w)
		if tw, ok := q.tiled(w); ok {
			name, wp = mmvTiledName(name), p(tw)
		}
		q.launchEpi(epiProduct, dst, name, v.grid(M, N), v.block(), 0,
			q.t(dst), ld(dst), q.t(x), ld(x), wp, ld(w), q.t(bias), p(dtCode(bias.DType())), i(M), i(N), i(K))
		return
	}
	if w.DType() == gpu.BF16 && q.tensorCores() {
		xs, fl, Kp := q.splitRows(x)
		name, g := mmaLaunch(M, N, q.d.sms, q.tileKernel)
		if s := mmaBigSplit(M, N, K, q.d.sms, q.tileKernel); name == "mma_bf16_big" && s > 1 {
			ncls := min(16, (K+63)/64)
			if q.parts == nil || q.parts.n < ncls*M*N {
				q.grow(&q.parts, gpu.F32, ncls*M*N)
			}
			parts := gpu.Tensor{Buf: q.parts, Rows: 1, Cols: ncls * M * N, Stride: ncls * M * N}
			g[2] = uint32(s)
			q.launch("mma_bf16_bigp", g, blk128, 0, q.t(parts), q.t(xs), q.t(fl), i(Kp), q.t(w), ld(w), i(M), i(N), i(K))
			q.launchEpi(epiProduct, dst, "mma_fold_f32", q.grid1(M*N), blk256, 0,
				q.t(dst), ld(dst), q.t(parts), i(ncls), q.t(bias), p(dtCode(bias.DType())), i(M), i(N))
			return
		}
		q.launchEpi(epiProduct, dst, name, g, blk128, 0,
			q.t(dst), ld(dst), q.t(xs), q.t(fl), i(Kp), q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(M), i(N), i(K))
		return
	}
	if q.useFMATiles(M, N) {
		name, ok := matmulTiledKernels[w.DType()]
		if !ok {
			panic(fmt.Sprintf("cuda: matmul weight %v", w.DType()))
		}
		q.launchEpi(epiProduct, dst, name, [3]uint32{uint32((N + 63) / 64), uint32((M + 63) / 64), 1}, blk256, 0,
			q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(M), i(N), i(K))
		return
	}
	r := matmulRows(M)
	q.launchEpi(epiProduct, dst, matmulKernel(r, w.DType()), matmulGrid(M, N, r), blk128, 0,
		q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), ld(w), q.t(bias), p(dtCode(bias.DType())), i(M), i(N), i(K))
}

// splitRows splits x's rows into their three bf16 parts (split_bf16) in
// the queue's scratch: xs holds the hi rows, then the mid, then the lo,
// each Kp (K rounded up to 64) wide, and fl each row's flags.
func (q *Queue) splitRows(x gpu.Tensor) (xs, fl gpu.Tensor, Kp int) {
	M, K := x.Rows, x.Cols
	Kp = (K + 63) &^ 63
	if q.split == nil || q.split.n < 3*M*Kp {
		q.grow(&q.split, gpu.BF16, 3*M*Kp)
	}
	if q.flags == nil || q.flags.n < M {
		q.grow(&q.flags, gpu.I32, M)
	}
	xs = gpu.Tensor{Buf: q.split, Rows: 1, Cols: 3 * M * Kp, Stride: 3 * M * Kp}
	fl = gpu.Tensor{Buf: q.flags, Rows: 1, Cols: M, Stride: M}
	q.launch("split_bf16", [3]uint32{uint32(M), 1, 1}, blk128, 0, q.t(xs), q.t(fl), q.t(x), ld(x), i(M), i(K), i(Kp))
	return xs, fl, Kp
}

// gemvVariants are the one-row kernels by rows per warp (C) and chunks
// in flight (U); all sum in one order (kernels.cu: GEMV).
var gemvVariants = []struct {
	name string
	c, u int
}{
	{"gemv_bf16_c1u4", 1, 4}, {"gemv_bf16_c1u8", 1, 8}, {"gemv_bf16_c2u4", 2, 4},
	{"gemv_bf16_c2u8", 2, 8}, {"gemv_bf16", 4, 4}, {"gemv_bf16_c4u8", 4, 8},
}

// gemvVariant returns the one-row kernel for N outputs of K terms and the
// outputs one block of four warps covers: as many rows per warp as keep
// at least two blocks per multiprocessor of an H200 (264), else one;
// eight chunks in flight where K has them (K ≥ 2048), else four.
func gemvVariant(N, K int) (name string, rowsPerBlock int) {
	c := 1
	for _, cc := range []int{4, 2} {
		if (N+4*cc-1)/(4*cc) >= 264 {
			c = cc
			break
		}
	}
	u := 4
	if K >= 2048 {
		u = 8
	}
	for _, v := range gemvVariants {
		if v.c == c && v.u == u {
			return v.name, 4 * c
		}
	}
	panic("cuda: no gemv variant")
}

// gemvrKernel is a few-row kernel: rows of x a tile (r), weight rows a
// warp (c), chunks in flight (u).
type gemvrKernel struct {
	name    string
	r, c, u int
}

// gemvrVariants are the few-row kernels; all sum in the one-row kernel's
// order (kernels.cu: GEMVR), so which one runs never changes a bit.
var gemvrVariants = []gemvrKernel{
	{"gemvr_bf16_r2c4u4", 2, 4, 4}, {"gemvr_bf16_r2c2u8", 2, 2, 8}, {"gemvr_bf16_r3c4u4", 3, 4, 4},
	{"gemvr_bf16_r4c4u4", 4, 4, 4}, {"gemvr_bf16_r4c4u2", 4, 4, 2}, {"gemvr_bf16_r4c8u2", 4, 8, 2},
	{"gemvr_bf16_r4c8u1", 4, 8, 1}, {"gemvr_bf16_r8c4u2", 8, 4, 2},
}

// gemvrMaxRows is the most rows of x the few-row kernels take (at 32 they
// run 1.8× the tile kernels' rate on an H200); beyond, the tile kernels
// (whose order is the same) take them — not yet measured against these.
const gemvrMaxRows = 32

// gemvrVariant returns the few-row kernel for M rows of x (2 ≤ M ≤
// gemvrMaxRows), the fastest measured on an H200 (BenchmarkGemvRows over
// the 256 MiB text head, docs/performance.md): a tile of two rows for two,
// of three for three, of four beyond (the tiles of one weight slice side
// by side, so it is read from memory once and from L2 after). Every
// variant gives the same bits (TestGemvrVariantsBitIdentical).
func gemvrVariant(M int) gemvrKernel {
	switch M {
	case 2:
		return gemvrByName("gemvr_bf16_r2c4u4")
	case 3:
		return gemvrByName("gemvr_bf16_r3c4u4")
	}
	return gemvrByName("gemvr_bf16_r4c4u2")
}

func gemvrByName(name string) gemvrKernel {
	for _, v := range gemvrVariants {
		if v.name == name {
			return v
		}
	}
	panic("cuda: no gemvr variant " + name)
}

func checkConv(op string, x, w, bias gpu.Tensor, cin, cout, groups, k int) {
	if groups < 1 || cin%groups != 0 || cout%groups != 0 || k < 1 || !w.Contiguous() || dtCode(w.DType()) == 0 ||
		(!bias.IsNil() && (bias.Len() < cout || dtCode(bias.DType()) == 0)) {
		panic(fmt.Sprintf("cuda: %s x %v w %v bias %v (cin %d cout %d groups %d k %d)", op, x, w, bias, cin, cout, groups, k))
	}
}

// Conv1D implements gpu.Queue.
func (q *Queue) Conv1D(dst, x, w, bias gpu.Tensor, cp gpu.ConvParams) {
	Cin, Cout := x.Cols, dst.Cols
	checkConv("conv1d", x, w, bias, Cin, Cout, cp.Groups, cp.K)
	if w.Rows != Cout || w.Cols != Cin/cp.Groups*cp.K || cp.Stride < 1 || cp.Dilation < 1 {
		panic(fmt.Sprintf("cuda: conv1d x %v w %v dst %v %+v", x, w, dst, cp))
	}
	wantF32("conv1d", dst, x)
	q.launchOut(dst, "conv1d_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), p(dtCode(w.DType())),
		q.t(bias), p(dtCode(bias.DType())), i(x.Rows), i(Cin), i(dst.Rows), i(Cout), i(cp.K), i(cp.Stride), i(cp.Dilation),
		i(cp.PadLeft), i(cp.Groups))
}

// ConvTranspose1D implements gpu.Queue.
func (q *Queue) ConvTranspose1D(dst, x, w, bias gpu.Tensor, cp gpu.ConvParams) {
	Cin, Cout := x.Cols, dst.Cols
	checkConv("convtranspose1d", x, w, bias, Cin, Cout, cp.Groups, cp.K)
	if w.Rows != Cin || w.Cols != Cout/cp.Groups*cp.K || cp.Stride < 1 || cp.PadLeft < 0 {
		panic(fmt.Sprintf("cuda: convtranspose1d x %v w %v dst %v %+v", x, w, dst, cp))
	}
	wantF32("convtranspose1d", dst, x)
	q.launchOut(dst, "convtr1d_f32", q.grid1(dst.Len()), blk256, 0, q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), p(dtCode(w.DType())),
		q.t(bias), p(dtCode(bias.DType())), i(x.Rows), i(Cin), i(dst.Rows), i(Cout), i(cp.K), i(cp.Stride), i(cp.PadLeft),
		i(cp.Groups))
}

// Conv2D implements gpu.Queue.
func (q *Queue) Conv2D(dst, x, w, bias gpu.Tensor, cp gpu.Conv2DParams) {
	if cp.W < 1 || cp.Cin < 1 || x.Cols != cp.Cin*cp.W || cp.Wout < 1 || dst.Cols%cp.Wout != 0 || cp.StrideH < 1 || cp.StrideW < 1 {
		panic(fmt.Sprintf("cuda: conv2d x %v dst %v %+v", x, dst, cp))
	}
	Cout := dst.Cols / cp.Wout
	checkConv("conv2d", x, w, bias, cp.Cin, Cout, cp.Groups, cp.KH*cp.KW)
	if w.Rows != Cout || w.Cols != cp.Cin/cp.Groups*cp.KH*cp.KW {
		panic(fmt.Sprintf("cuda: conv2d x %v w %v dst %v %+v", x, w, dst, cp))
	}
	wantF32("conv2d", dst, x)
	args := []arg{q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), p(dtCode(w.DType())),
		q.t(bias), p(dtCode(bias.DType())), i(x.Rows), i(cp.Cin), i(cp.W), i(dst.Rows), i(Cout), i(cp.Wout), i(cp.KH), i(cp.KW),
		i(cp.StrideH), i(cp.StrideW), i(cp.PadH), i(cp.PadW), i(cp.Groups)}
	if pointwise(cp, x.Rows, dst.Rows) && !q.conv2dDirect && !q.conv2dRows {
		q.launchOut(dst, "conv2d_pw_f32", [3]uint32{uint32((Cout + 63) / 64), uint32(dst.Rows), uint32((cp.W + 31) / 32)}, blk256, 0,
			q.t(dst), ld(dst), q.t(x), ld(x), q.t(w), p(dtCode(w.DType())), q.t(bias), p(dtCode(bias.DType())),
			i(cp.Cin), i(cp.W), i(Cout))
		return
	}
	if ob, shm, ok := conv2dRowsPlan(cp, Cout); ok && !q.conv2dDirect {
		q.launchOut(dst, "conv2d_rows_f32", [3]uint32{uint32((Cout + ob - 1) / ob), uint32(dst.Rows), 1}, blk256, shm,
			append(args, i(ob))...)
		return
	}
	q.launchOut(dst, "conv2d_f32", q.grid1(dst.Len()), blk256, 0, args...)
}

// pointwise reports whether cp is a dense 1 × 1 convolution that keeps the
// rows and positions (conv2d_pw_f32's case).
func pointwise(cp gpu.Conv2DParams, rows, outRows int) bool {
	return cp.KH == 1 && cp.KW == 1 && cp.StrideH == 1 && cp.StrideW == 1 && cp.PadH == 0 && cp.PadW == 0 &&
		cp.Groups == 1 && cp.Wout == cp.W && rows == outRows
}

// conv2dRowsMaxShm bounds conv2d_rows_f32's dynamic shared memory (a
// block may use 48 KiB without opting in).
const conv2dRowsMaxShm = 46 << 10

// conv2dRowsPlan returns conv2d_rows_f32's output channels a block (about
// 256 outputs, one a thread) and its shared memory for cp with Cout output
// channels, or false where a block's input rows and weights do not fit
// (conv2d_f32 then runs it).
func conv2dRowsPlan(cp gpu.Conv2DParams, Cout int) (ob, shm int, ok bool) {
	cg, og := cp.Cin/cp.Groups, Cout/cp.Groups
	ob = min(max(256/cp.Wout, 1), Cout)
	for {
		// ob outputs from any offset span at most ⌈ob/og⌉ + 1 groups.
		nch := min(cp.Cin, ((ob+og-1)/og+1)*cg)
		shm = 4 * (cp.KH*nch*cp.W + ob*cg*cp.KH*cp.KW)
		if shm <= conv2dRowsMaxShm {
			return ob, shm, true
		}
		if ob == 1 {
			return 0, 0, false
		}
		ob /= 2
	}
}

// mmvKernel is a few-row tensor-core kernel: warps a block (w: 4 or 16,
// each holding 16/w of the 16 superblock classes), 16-row weight tiles a
// warp (nt), 8-row tiles of x a warp (mt).
type mmvKernel struct {
	name      string
	w, nt, mt int
}

// grid is the launch grid for M rows of x against N weight rows.
func (v mmvKernel) grid(m, n int) [3]uint32 {
	return [3]uint32{uint32((n + 16*v.nt - 1) / (16 * v.nt)), uint32((m + 8*v.mt - 1) / (8 * v.mt)), 1}
}

// block is the launch's block: 32 threads a warp.
func (v mmvKernel) block() [2]uint32 { return [2]uint32{uint32(32 * v.w), 1} }

// mmvVariants are the few-row tensor-core kernels (kernels.cu: MMV); all
// give mma_tile's bits.
var mmvVariants = []mmvKernel{
	{"mmv_bf16_w4n1m1", 4, 1, 1}, {"mmv_bf16_w16n1m1", 16, 1, 1}, {"mmv_bf16_w16n2m1", 16, 2, 1},
	{"mmv_bf16_w16n4m1", 16, 4, 1}, {"mmv_bf16_w16n1m2", 16, 1, 2},
}

// mmvMaxRows is the most rows of x the few-row tensor-core kernels take,
// and mmvMaxN the most weight rows: beyond either the tile kernels (after
// split_bf16) stream faster (BenchmarkGemvRows on the H200, commit d1fe22c:
// the [65536, 2048] head at 3.38 TB/s against 3.15 for one row, 2.41
// against 1.48 at 16 rows).
const (
	mmvMaxRows = 8
	mmvMaxN    = 16384
)

// mmvVariant returns the few-row tensor-core kernel for N ≤ mmvMaxN
// weight rows (and at most mmvMaxRows rows of x: one 8-row tile), the
// fastest measured on the H200 (BenchmarkProductShapes, commit d1fe22c):
// 16 warps a block, one 16-row weight tile a warp up to 2048 weight rows
// ([2048, 8192], [2048, 2048], [1024, 1024]), four beyond ([8192, 2048]:
// 1.67 TB/s against 1.26).
func mmvVariant(N int) mmvKernel {
	if N <= 2048 {
		return mmvVariants[1] // mmv_bf16_w16n1m1
	}
	return mmvVariants[3] // mmv_bf16_w16n4m1
}

// mmvMidMaxRows is the most rows of x the few-row kernels take past
// mmvMaxRows (mmvMidVariant).
const mmvMidMaxRows = 128

// mmvMidVariant returns the few-row kernel for mmvMaxRows < M ≤
// mmvMidMaxRows rows against an [N, K] weight where the 64 × 64 tile
// kernel would give tiles to fewer than a quarter of the device's
// multiprocessors (a clip's encoder products; until the tiles could be
// split, mmaBigSplit, below half of them: a prompt's [2048, ·] products,
// which the split tiles now take: 100 × [2048, 2048] 380 µs against 537
// for w4n1m1, 100 × [2048, 8192] 1083 against 1570 for w16n1m2), or false:
// the few-row kernels read the weights once per 16 rows of x, which the
// tile kernel's wide products did not repay where measured (100 ×
// [8192, 2048], below), so nearer a full wave the tiles keep them. The
// few-row kernels split x in registers (no split_bf16 launch) and give
// every block a weight tile, where the tile kernels' few blocks each walk
// all of K. BenchmarkEncoderShapes on the H200 (2026-12-02, µs for 16
// products, rows of exact bf16): 62 × [512, 512] 55 (w4n1m1) against 162
// for the default then (mma_bf16_m32); 62 × [2048, 512] 124 against 179;
// 62 × [512, 2048] 101 (w16n1m2) against 356; 62 × [1024, 512] 67 against
// 162; 100 × [2048, 2048] 530 (w4n1m1) against 621; 100 × [2048, 8192]
// 1548 (w16n1m2) against 2146; 100 × [8192, 2048] stays on mma_bf16_big
// (868, against 1879 for the best few-row kernel). The bits are the same
// on every kernel (TestMmvVariantsBitIdentical).
func mmvMidVariant(M, N, K, sms int) (mmvKernel, bool) {
	if M <= mmvMaxRows || M > mmvMidMaxRows || N > mmvMaxN || 4*((N+63)/64)*((M+63)/64) >= sms {
		return mmvKernel{}, false
	}
	if K <= 1024 || K <= 2048 && N > 1024 {
		return mmvByName("mmv_bf16_w4n1m1"), true
	}
	return mmvByName("mmv_bf16_w16n1m2"), true
}

// mmvTiledName names the MMVT twin of MMV kernel name: the same kernel
// on weights in the tiled layout (tiled.go).
func mmvTiledName(name string) string { return "mmvt" + strings.TrimPrefix(name, "mmv") }

// mmvNormVariants are the one-row tensor-core kernels with the row norm
// fused before the product (kernels.cu: MMV_NORM; gpu.NormFuser).
var mmvNormVariants = []mmvKernel{{"mmvn_bf16_w4", 4, 1, 1}, {"mmvn_bf16_w16", 16, 1, 1}}

// mmvNormDefault is the fused kernel NormMatMul takes on the tensor cores.
var mmvNormDefault = mmvNormVariants[1]

// mmvNormMaxK bounds the row MMV_NORM keeps in shared memory beside the
// class sums (16·32·4 floats), within 48 KiB.
const mmvNormMaxK = 8192

// mmvByName finds a few-row tensor-core kernel (tests and benchmarks
// force one by name).
func mmvByName(name string) mmvKernel {
	for _, vs := range [][]mmvKernel{mmvVariants, mmvNormVariants} {
		for _, v := range vs {
			if v.name == name {
				return v
			}
		}
	}
	panic("cuda: no mmv variant " + name)
}
