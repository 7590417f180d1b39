package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// checkMatMul checks dst = x·wᵀ (+ bias) for weights F32, BF16 and F16 over
// every (M, K, N) of the grid below, the bias cycling through none, F32 and
// BF16 and the x/dst views through contiguous and strided; then strided F32
// weight views (an activation as the right operand); then batch invariance.
//
// Bound: an output is a dot product of K terms plus the bias, a sum of K+1
// terms: γ_{K+1}·(Σ_k|x_k·w_k| + |b|), for any summation order, with or
// without fused multiply-adds.
func checkMatMul(h *harness) {
	Ms := []int{1, 2, 3, 5, 9, 17, 40} // 9: a GPU's 16-row tile kernel; 17 and 40: its 64-row one
	Ks := []int{1, 7, 24, 300, 1030}
	Ns := []int{1, 5, 33}
	biases := []gpu.DType{0, gpu.F32, gpu.BF16}
	i := 0
	for _, wdt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		for _, M := range Ms {
			for _, K := range Ks {
				for _, N := range Ns {
					matmulCase(h, wdt, false, false, M, K, N, biases[i%3], i%2 == 1, i%4 == 2)
					i++
				}
			}
		}
	}
	// Many rows against many weight rows (a GPU's FMA products may take
	// a 64 × 64 tile kernel there: a codec's convolutions).
	for _, wdt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		for _, c := range []struct{ M, K, N int }{{70, 300, 70}, {130, 1030, 33}, {64, 24, 65}} {
			matmulCase(h, wdt, false, false, c.M, c.K, c.N, biases[i%3], i%2 == 1, i%4 == 2)
			i++
		}
	}
	for _, c := range []struct{ M, K, N int }{{1, 7, 5}, {5, 300, 33}, {17, 1030, 5}, {3, 24, 1}, {9, 1, 33}, {100, 260, 40}} {
		matmulCase(h, gpu.F32, true, false, c.M, c.K, c.N, biases[i%3], i%2 == 0, true)
		i++
	}
	// x of exact bf16 values (what bf16 networks multiply; a GPU may stage
	// such tiles differently), past the few-row kernels and over several
	// row tiles.
	// (12 × [8500, 40]: 9–16 rows against weights too wide for the few-row
	// kernels' tiles on a 132-multiprocessor GPU.)
	// (130 × [1100, 300]: 54 tiles of 64 × 64, fewer than a 132-
	// multiprocessor GPU's multiprocessors: a backend may split each
	// tile's sum over blocks.)
	for _, c := range []struct{ M, K, N int }{{40, 1030, 33}, {70, 300, 70}, {130, 24, 5}, {64, 2100, 65}, {12, 40, 8500}, {130, 300, 1100}} {
		matmulCase(h, gpu.BF16, false, true, c.M, c.K, c.N, biases[i%3], i%2 == 0, false)
		i++
	}
	// Products large enough that a GPU backend's shape rules pick its
	// other kernels (for a device of up to 135 multiprocessors): 64 × 64
	// tiles for many rows against many weight rows, the tensor cores' tile
	// kernels for a few rows against more weight rows than their few-row
	// kernels take, and one- and few-row products over weights wide and
	// long enough for the variants that keep more rows or bytes in flight
	// (K a multiple of 8: their vector loads need aligned rows). K = 300
	// on the tiles reaches past term 256 of each sum.
	for _, c := range []struct {
		wdt     gpu.DType
		M, K, N int
	}{
		{gpu.F32, 130, 300, 2820}, {gpu.BF16, 130, 300, 2820}, {gpu.F16, 130, 300, 2820}, {gpu.BF16, 40, 300, 2100},
		{gpu.BF16, 5, 24, 16390}, {gpu.BF16, 3, 304, 1500}, {gpu.BF16, 1, 2056, 33}, {gpu.BF16, 1, 304, 2110}, {gpu.BF16, 1, 2056, 2110},
		{gpu.BF16, 1, 24, 4220}, {gpu.BF16, 1, 2056, 4220}, {gpu.BF16, 4, 2056, 4220}, {gpu.BF16, 130, 300, 1100},
	} {
		matmulCase(h, c.wdt, false, false, c.M, c.K, c.N, biases[i%3], false, false) // aligned rows, as those kernels want
		i++
	}
	checkBatchInvariance(h)
}

// matmulCase checks one product; wview makes w a strided F32 activation
// (written with Write) instead of a loaded weight, wstrided a loaded
// weight a strided view.
func matmulCase(h *harness, wdt gpu.DType, wview, xbf16 bool, M, K, N int, bdt gpu.DType, strided, wstrided bool) {
	xv := h.values(M*K, 1)
	xtag := ""
	if xbf16 {
		xv, xtag = h.bf16Values(M*K, 1), "/x=bf16"
	}
	x := h.input(M, K, strided, xv)
	var w operand
	if wview {
		w = h.input(N, K, true, h.values(N*K, 1))
	} else {
		w = h.weight(wdt, N, K, wstrided, 1)
	}
	var b operand
	bt := gpu.Tensor{}
	if bdt != 0 {
		b = h.vector(bdt, N, 1)
		bt = b.view
	}
	dst := h.f32(M, N, strided)
	want, bound := matmulReplay(x.vals, w.vals, b.vals, M, K, N)
	if h.opts.TensorCoreMatMul && wdt == gpu.BF16 && !wview {
		want, bound = matmulReplayTC(x.vals, w.vals, b.vals, M, K, N)
	}
	h.q.MatMul(dst.view, x.view, w.view, bt)
	wname, wtag := dtName(wdt), ""
	if wview {
		wname = "f32-view"
	} else if w.view.Stride != K {
		wtag = "/w-strided"
	}
	bias := "none"
	if bdt != 0 {
		bias = dtName(bdt)
	}
	h.verify(fmt.Sprintf("w=%s/M=%d/K=%d/N=%d/bias=%s%s%s%s", wname, M, K, N, bias, wtag, xtag, tag(strided)), dst, want, bound, x, w, b)
}

// matmulReplay returns x·wᵀ + b in float64 and the bound of every element.
func matmulReplay(x, w, b []float32, M, K, N int) (want, bound []float64) {
	want, bound = make([]float64, M*N), make([]float64, M*N)
	g := gamma(K + 1)
	for m := 0; m < M; m++ {
		for n := 0; n < N; n++ {
			var s, sa float64
			for k := 0; k < K; k++ {
				p := float64(x[m*K+k]) * float64(w[n*K+k])
				s += p
				sa += math.Abs(p)
			}
			if b != nil {
				s += float64(b[n])
				sa += math.Abs(float64(b[n]))
			}
			want[m*N+n], bound[m*N+n] = s, g*sa
		}
	}
	return want, bound
}

// matmulReplayTC is matmulReplay with Options.TensorCoreMatMul's bound.
func matmulReplayTC(x, w, b []float32, M, K, N int) (want, bound []float64) {
	want, sa := matmulReplay(x, w, b, M, K, N)
	n := float64(3*K + 17)
	g := n * 2 * u / (1 - n*2*u)
	for i := range sa {
		sa[i] = sa[i] / gamma(K+1) * (g + u)
	}
	return want, sa
}

// checkBatchInvariance records the check "batch-invariance": for every
// weight dtype and two widths, each row of a 17-row x is computed alone
// (M = 1, in its own buffer and as a row view of the batch) and inside
// batches of 3, 8 and 17 rows; every computation of a row must give the
// same floats bit for bit (gpu.Queue.MatMul's contract).
func checkBatchInvariance(h *harness) {
	const rows, N = 17, 33
	var fails []string
	var worst float64
	configs := 0
	for _, wdt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		for _, K := range []int{300, 1030} {
			configs++
			xv := h.values(rows*K, 1)
			xb := h.input(rows, K, true, xv)
			w := h.weight(wdt, N, K, false, 1)
			b := h.vector(gpu.F32, N, 1)
			cfg := fmt.Sprintf("w=%s/K=%d/N=%d", dtName(wdt), K, N)
			// Each row alone, in its own buffer and as a row view.
			alone := make([][]float32, rows)
			for r := 0; r < rows; r++ {
				x1 := h.input(1, K, false, xv[r*K:(r+1)*K])
				d1 := h.f32(1, N, false)
				h.q.MatMul(d1.view, x1.view, w.view, b.view)
				dv := h.f32(1, N, false)
				h.q.MatMul(dv.view, xb.view.Row(r), w.view, b.view)
				a, err1 := h.readView(d1)
				v, err2 := h.readView(dv)
				if err1 != nil || err2 != nil {
					fails = append(fails, fmt.Sprintf("%s: read: %v %v", cfg, err1, err2))
					continue
				}
				alone[r] = a
				if i := FirstDiff(a, v); i >= 0 {
					fails = append(fails, fmt.Sprintf("%s row %d: alone %.9g, as a row view %.9g (column %d)", cfg, r, a[i], v[i], i))
					worst = max(worst, math.Abs(float64(a[i])-float64(v[i])))
				}
			}
			for _, M := range []int{3, 8, 17} {
				d := h.f32(M, N, true)
				h.q.MatMul(d.view, xb.view.Slice(0, M), w.view, b.view)
				got, err := h.readView(d)
				if err != nil {
					fails = append(fails, fmt.Sprintf("%s M=%d: %v", cfg, M, err))
					continue
				}
				for r := 0; r < M; r++ {
					if alone[r] == nil {
						continue
					}
					if i := FirstDiff(alone[r], got[r*N:(r+1)*N]); i >= 0 {
						g := got[r*N+i]
						fails = append(fails, fmt.Sprintf("%s M=%d row %d column %d: %.9g, alone %.9g", cfg, M, r, i, g, alone[r][i]))
						worst = max(worst, math.Abs(float64(g)-float64(alone[r][i])))
					}
				}
			}
		}
	}
	detail := fmt.Sprintf("%d configurations, rows alone vs M=3, 8, 17", configs)
	if len(fails) > 0 {
		detail = fmt.Sprintf("%d rows differ; %s", len(fails), fails[0])
		if len(fails) > 1 {
			detail += "; " + fails[1]
		}
	}
	h.record("batch-invariance", len(fails) == 0, worst, 0, detail)
}

// readView returns an F32 operand's view, row-major.
func (h *harness) readView(o operand) ([]float32, error) {
	got := make([]float32, o.view.Len())
	if err := h.q.Read(got, o.view); err != nil {
		return nil, err
	}
	return got, nil
}

// FirstDiff returns the first index where a and b differ in their bits,
// or −1 (a length mismatch is a difference at the shorter length): the
// check of every "bit for bit" test.
func FirstDiff(a, b []float32) int {
	for i := range min(len(a), len(b)) {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// checkMatMulPrompt checks gpu.MatMulPrompt (a prompt's rows: a backend
// may hand them to a vendor GEMM whose order depends on the shape) on x of
// exact bf16 values, the op's precondition, against the float64 replay
// with the tensor cores' bound (K + 1 terms and then some: any order of
// fp32 additions, truncating or not, is within it). The rows run from
// below a GPU's threshold for the vendor GEMM (the op is MatMul there) to
// a few hundred, with K and N not multiples of the GEMM's tiles, aligned
// and unaligned rows (the CUDA backend hands only rows aligned to 16
// bytes to cuBLAS), strided views and both bias dtypes;
// each product runs again into the same view and into a view of the same
// stride 16 bytes further into another buffer, and must give the same bits
// (a prompt replayed gives the same cache, wherever the arena put it).
func checkMatMulPrompt(h *harness) {
	biases := []gpu.DType{0, gpu.F32, gpu.BF16}
	for i, c := range []struct {
		M, K, N           int
		strided, wstrided bool
	}{
		// Rows whose every operand is 16-byte aligned (K a multiple of 8,
		// N of 4, as in the released models): a GPU's vendor GEMM takes
		// them from 32 rows on, whatever M, K and N are beyond that.
		{5, 304, 36, false, false}, {31, 24, 72, false, false}, {32, 1032, 36, false, false},
		{100, 2048, 40, false, false}, {130, 520, 1100, false, false}, {64, 8, 68, false, false},
		{300, 1032, 264, false, false}, {257, 64, 20, false, false}, {33, 200, 4, false, false},
		// Unaligned rows (ragged K, N, strided views): MatMul on a GPU.
		{40, 300, 70, true, true}, {64, 7, 65, false, false}, {130, 1030, 33, true, false},
	} {
		M, K, N := c.M, c.K, c.N
		x := h.input(M, K, c.strided, h.bf16Values(M*K, 1))
		w := h.weight(gpu.BF16, N, K, c.wstrided, 1)
		var b operand
		bt := gpu.Tensor{}
		if bdt := biases[i%3]; bdt != 0 {
			b = h.vector(bdt, N, 1)
			bt = b.view
		}
		want, bound := matmulReplayTC(x.vals, w.vals, b.vals, M, K, N)
		dst := h.f32(M, N, c.strided)
		gpu.MatMulPrompt(h.q, dst.view, x.view, w.view, bt)
		name := fmt.Sprintf("M=%d/K=%d/N=%d/bias=%v%s", M, K, N, i%3, tag(c.strided))
		if c.wstrided {
			name += "/w-strided"
		}
		first, err := h.readView(dst)
		if !h.verify(name, dst, want, bound, x, w, b) || err != nil {
			continue
		}
		// Again into the same view, and into another buffer whose view
		// has the same stride, 16 bytes further from the buffer's start
		// (a backend may pick its kernel by the operands' alignment, but
		// not by where they lie beyond it).
		detail := "the same bits twice, and in another buffer"
		j, err := -1, error(nil)
		for k, again := range []operand{dst, h.f32Shifted(dst, 4)} {
			gpu.MatMulPrompt(h.q, again.view, x.view, w.view, bt)
			var got []float32
			if got, err = h.readView(again); err != nil {
				detail = err.Error()
				break
			}
			if j = FirstDiff(first, got); j >= 0 {
				detail = fmt.Sprintf("run %d, element %d: %.9g then %.9g", k+2, j, first[j], got[j])
				break
			}
		}
		h.record(name+"/repeat", err == nil && j < 0, 0, 0, detail)
	}
}

// f32Shifted allocates a poisoned F32 view of o's shape and stride in a
// buffer of its own, shift elements further from the buffer's start than
// o's view is from its buffer's.
func (h *harness) f32Shifted(o operand, shift int) operand {
	v := o.view
	off := v.Off - o.whole.Off + shift
	wr := (off+v.Stride*(v.Rows-1)+v.Cols+v.Stride-1)/v.Stride + 1
	whole := h.dev.Alloc(gpu.F32, wr, v.Stride)
	h.owned = append(h.owned, whole)
	out := operand{whole: whole, dt: gpu.F32}
	out.view = gpu.Tensor{Buf: whole.Buf, Off: whole.Off + off, Rows: v.Rows, Cols: v.Cols, Stride: v.Stride}
	out.host = make([]float32, wr*v.Stride)
	for i := range out.host {
		out.host[i] = poison
	}
	h.q.Write(whole, out.host)
	return out
}
