package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Convolutions are matrix products over gathered input rows (im2col) or,
// for transposed convolutions, matrix products followed by a gather of
// partial rows. An output row's value depends only on the input rows it
// reads, never on how many rows one call computes or how they are split:
// streamed decoding equals whole decoding. Which path computes an element
// depends on the shapes of the weight only.

// colBudget is the size in floats of a chunk's gathered rows (1 MB).
const colBudget = 1 << 18

func checkConv(op string, dst, x gpu.Tensor, p gpu.ConvParams, cin, cout int) {
	if p.K < 1 || p.Stride < 1 || p.Dilation < 1 || p.Groups < 1 || cin%p.Groups != 0 || cout%p.Groups != 0 || p.PadLeft < 0 {
		panic(fmt.Sprintf("cpu: %s params %+v for %d->%d channels", op, p, cin, cout))
	}
	if dst.Buf == x.Buf {
		panic(fmt.Sprintf("cpu: %s dst aliases x", op))
	}
}

// convBias returns the bias of a convolution as float32 (nil when absent),
// converted into participant 0's vec scratch when it is not F32.
func (q *Queue) convBias(bias gpu.Tensor, n int) []float32 {
	if bias.IsNil() {
		return nil
	}
	return vectorInto(&q.workspace(1)[0].vec, bias, n)
}

// minChunk is the fewest rows a participant computes at a time, so that
// streaming the weight once per chunk stays cheap next to the arithmetic.
// Calls with fewer than two such chunks per worker split the output
// channels instead.
const minChunk = 16

// rowChunk returns how many rows a participant computes at a time when each
// row needs perRow floats of scratch: as many as fit colBudget (at least 4),
// and few enough to give every worker two chunks, but at least minChunk.
func rowChunk(rows, perRow, workers int) int {
	c := max(4, colBudget/max(perRow, 1))
	return min(c, max(minChunk, (rows+2*workers-1)/(2*workers)))
}

// fewRows reports whether a call of rows rows is better split by output
// channels than by rows.
func (q *Queue) fewRows(rows int) bool {
	w := q.dev.pool.workers
	return w > 1 && rows < 2*w*minChunk
}

// forChunks runs fn over [0, n) in chunks of at most chunk items, in
// parallel; w is the participant number.
func (q *Queue) forChunks(n, chunk int, fn func(w, lo, hi int)) {
	q.dev.pool.ForW(n, chunk, func(w, lo, hi int) {
		for c := lo; c < hi; c += chunk {
			fn(w, c, min(c+chunk, hi))
		}
	})
}

// Conv1D implements gpu.Queue.
func (q *Queue) Conv1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	cin, cout := x.Cols, dst.Cols
	checkConv("conv1d", dst, x, p, cin, cout)
	cg := cin / p.Groups // input channels per group
	og := cout / p.Groups
	if w.Rows != cout || w.Cols != cg*p.K {
		panic(fmt.Sprintf("cpu: conv1d weight %v for %d->%d k %d groups %d", w, cin, cout, p.K, p.Groups))
	}
	T := dst.Rows
	if T == 0 || cout == 0 {
		return
	}
	bs := q.convBias(bias, cout)
	xs, ds := f32s(x), f32s(dst)
	kk := cg * p.K // one group's gathered row
	switch {
	case cg == 1 && og == 1:
		q.conv1dDepthwise(dst, x, w, bs, p)
		return
	case kk < 8:
		q.conv1dDirect(dst, x, w, bs, p)
		return
	}
	if p.K == 1 && p.Groups == 1 && inRange(T, p, x.Rows) {
		// Pointwise: every output row is the product of one input row.
		g := mm{x: xs, xs: p.Stride * x.Stride, dst: ds, ds: dst.Stride, bias: bs, M: T, N: cout, K: cin}
		g.setWeight(w)
		q.gemm(&g)
		return
	}
	// im2col: col[t, g·kk + c·K + k] = x[t·stride + k·dilation − pad, g·cg + c].
	width := p.Groups * kk
	gather := func(col []float32, t0, t1 int) {
		for t := t0; t < t1; t++ {
			r := col[(t-t0)*width : (t-t0+1)*width]
			for k := 0; k < p.K; k++ {
				src := t*p.Stride + k*p.Dilation - p.PadLeft
				if src < 0 || src >= x.Rows {
					for c := 0; c < cin; c++ {
						r[c/cg*kk+c%cg*p.K+k] = 0
					}
					continue
				}
				xr := xs[src*x.Stride : src*x.Stride+cin]
				for g := 0; g < p.Groups; g++ {
					rg := r[g*kk : (g+1)*kk]
					for c, v := range xr[g*cg : (g+1)*cg] {
						rg[c*p.K+k] = v
					}
				}
			}
		}
	}
	var g mm
	g.setWeight(w)
	g.K, g.xs, g.ds, g.bias = kk, width, dst.Stride, bs
	workers := q.dev.pool.workers
	ws := q.workspace(workers)
	if q.fewRows(T) {
		// Few rows (a streaming step): gather them all, then let the GEMM
		// split the output channels across the pool.
		ws[0].col = grow(ws[0].col, T*width)
		gather(ws[0].col, 0, T)
		for gi := 0; gi < p.Groups; gi++ {
			gg := g
			gg.x = ws[0].col[gi*kk:]
			gg.w32, gg.w16 = sliceRows(g.w32, g.w16, gi*og, g.ws)
			gg.dst = ds[gi*og:]
			gg.M, gg.N = T, og
			if bs != nil {
				gg.bias = bs[gi*og : (gi+1)*og]
			}
			q.gemm(&gg)
		}
		return
	}
	asm := q.asm
	q.forChunks(T, rowChunk(T, width, workers), func(wi, t0, t1 int) {
		wk := ws[wi]
		wk.col = grow(wk.col, (t1-t0)*width)
		gather(wk.col, t0, t1)
		for gi := 0; gi < p.Groups; gi++ {
			gg := g
			gg.x = wk.col[gi*kk:]
			gg.w32, gg.w16 = sliceRows(g.w32, g.w16, gi*og, g.ws)
			gg.dst = ds[t0*dst.Stride+gi*og:]
			gg.M, gg.N = t1-t0, og
			if bs != nil {
				gg.bias = bs[gi*og : (gi+1)*og]
			}
			gg.run(wk, 0, gg.M, 0, gg.N, asm)
		}
	})
}

// inRange reports whether the single tap of every output row of a K = 1
// convolution falls inside x.
func inRange(T int, p gpu.ConvParams, rows int) bool {
	return p.PadLeft == 0 && (T-1)*p.Stride < rows
}

// sliceRows returns the weight elements from row r on (whichever slice is
// set).
func sliceRows(w32 []float32, w16 []uint16, r, stride int) ([]float32, []uint16) {
	if w32 != nil {
		return w32[r*stride:], nil
	}
	return nil, w16[r*stride:]
}

// conv1dDirect computes a convolution with fewer than 8 taps per output
// (one input channel per group): s = 0, then s += w·x over c and k in
// increasing order (the product rounded first), then the bias.
func (q *Queue) conv1dDirect(dst, x, w gpu.Tensor, bs []float32, p gpu.ConvParams) {
	cin, cout := x.Cols, dst.Cols
	cg, og := cin/p.Groups, cout/p.Groups
	kk := cg * p.K
	ws := weightInto(&q.workspace(1)[0].wts, w) // [cout, kk]
	xs, ds := f32s(x), f32s(dst)
	q.dev.pool.For(dst.Rows, max(1, elemGrain/(cout*kk)), func(t0, t1 int) {
		for t := t0; t < t1; t++ {
			out := ds[t*dst.Stride : t*dst.Stride+cout]
			for o := range out {
				xc := (o / og) * cg
				wo := ws[o*kk : (o+1)*kk]
				var s float32
				for c := 0; c < cg; c++ {
					for k := 0; k < p.K; k++ {
						src := t*p.Stride + k*p.Dilation - p.PadLeft
						if src >= 0 && src < x.Rows {
							s += float32(wo[c*p.K+k] * xs[src*x.Stride+xc+c])
						}
					}
				}
				if bs != nil {
					s += bs[o]
				}
				out[o] = s
			}
		}
	})
}

// conv1dDepthwise computes a convolution with one channel per group, a
// vector over channels at a time: out[t] = 0, then out[t] += w[:,k] ⊙
// x[src_k] for k = 0 … K−1 (fused in assembly), then the bias.
func (q *Queue) conv1dDepthwise(dst, x, w gpu.Tensor, bs []float32, p gpu.ConvParams) {
	C, K := dst.Cols, p.K
	wk := q.workspace(1)[0]
	ws := weightInto(&wk.wts, w) // [C, K]
	wk.col = grow(wk.col, K*C)
	wt := wk.col // [K, C]
	for c := 0; c < C; c++ {
		for k := 0; k < K; k++ {
			wt[k*C+c] = ws[c*K+k]
		}
	}
	xs, ds := f32s(x), f32s(dst)
	asm := q.asm
	q.dev.pool.For(dst.Rows, max(1, elemGrain/(C*K)), func(t0, t1 int) {
		for t := t0; t < t1; t++ {
			out := ds[t*dst.Stride : t*dst.Stride+C]
			clear(out)
			for k := 0; k < K; k++ {
				src := t*p.Stride + k*p.Dilation - p.PadLeft
				if src >= 0 && src < x.Rows {
					vFmaRow(asm, out, wt[k*C:(k+1)*C], xs[src*x.Stride:src*x.Stride+C])
				}
			}
			if bs != nil {
				vAdd(asm, out, out, bs)
			}
		}
	})
}

// ConvTranspose1D implements gpu.Queue. Per group, z = x·w is a product
// with w's rows along the input channels ([cg, og·K]); output row u then
// gathers out[u, o] = b[o] + Σ z[t, o·K + k] over k = 0 … K−1 with
// t·stride + k = u, in increasing k.
func (q *Queue) ConvTranspose1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	cin, cout := x.Cols, dst.Cols
	checkConv("convtranspose1d", dst, x, p, cin, cout)
	cg := cin / p.Groups
	og := cout / p.Groups
	if w.Rows != cin || w.Cols != og*p.K {
		panic(fmt.Sprintf("cpu: convtranspose1d weight %v for %d->%d k %d groups %d", w, cin, cout, p.K, p.Groups))
	}
	R := dst.Rows
	if R == 0 || cout == 0 {
		return
	}
	bs := q.convBias(bias, cout)
	xs, ds := f32s(x), f32s(dst)
	K, S := p.K, p.Stride
	zw := cout * K // a row of z, all groups: column o·K + k
	// Input rows that output rows [r0, r1) read.
	tRange := func(r0, r1 int) (int, int) {
		u0, u1 := r0+p.PadLeft, r1+p.PadLeft
		t0 := 0
		if u0-K+1 > 0 {
			t0 = (u0 - K + 1 + S - 1) / S
		}
		return t0, min(x.Rows, (u1-1)/S+1)
	}
	var base xw
	base.setWeight(w)
	base.xs, base.ds, base.K, base.N = x.Stride, zw, cg, og*K
	// product computes z rows [t0, t1) columns [n0, n1) of every group into
	// z (row t at (t−t0)·zw).
	product := func(wk *work, z []float32, t0, t1, n0, n1 int, asm bool) {
		for gi := 0; gi < p.Groups; gi++ {
			g := base
			g.x = xs[t0*x.Stride+gi*cg:]
			g.w32, g.w16 = sliceRows(base.w32, base.w16, gi*cg, base.ws)
			g.dst = z[gi*og*K:]
			g.M = t1 - t0
			g.run(wk, 0, g.M, n0, n1, asm)
		}
	}
	gatherRows := func(z []float32, zt0, r0, r1 int) {
		for r := r0; r < r1; r++ {
			u := r + p.PadLeft
			out := ds[r*dst.Stride : r*dst.Stride+cout]
			if bs != nil {
				copy(out, bs)
			} else {
				clear(out)
			}
			for k := 0; k < K && k <= u; k++ {
				if (u-k)%S != 0 {
					continue
				}
				t := (u - k) / S
				if t >= x.Rows {
					continue
				}
				zr := z[(t-zt0)*zw:]
				for o := range out {
					out[o] += zr[o*K+k]
				}
			}
		}
	}
	if cg == 1 && og == 1 {
		q.convTransposeDepthwise(dst, x, w, bs, p)
		return
	}
	workers := q.dev.pool.workers
	ws := q.workspace(workers)
	asm := q.asm
	if q.fewRows(R) {
		// Few rows: compute their z with the columns split across the pool.
		t0, t1 := tRange(0, R)
		if t1 <= t0 {
			gatherRows(nil, 0, 0, R)
			return
		}
		ws[0].col = grow(ws[0].col, (t1-t0)*zw)
		z := ws[0].col
		n := og * K
		q.dev.pool.ForW(n, max(24, (n+2*workers-1)/(2*workers)/24*24), func(wi, n0, n1 int) {
			product(ws[wi], z, t0, t1, n0, n1, asm)
		})
		q.dev.pool.For(R, max(1, 4096/cout), func(r0, r1 int) { gatherRows(z, t0, r0, r1) })
		return
	}
	q.forChunks(R, rowChunk(R, zw/S+1, workers), func(wi, r0, r1 int) {
		t0, t1 := tRange(r0, r1)
		if t1 <= t0 {
			gatherRows(nil, 0, r0, r1)
			return
		}
		wk := ws[wi]
		wk.col = grow(wk.col, (t1-t0)*zw)
		product(wk, wk.col, t0, t1, 0, og*K, asm)
		gatherRows(wk.col, t0, r0, r1)
	})
}

// convTransposeDepthwise is ConvTranspose1D with one channel per group:
// out[u, c] = b[c] + Σ x[t, c]·w[c, k] over k = 0 … K−1 with t·stride + k =
// u, in increasing k, each product rounded first.
func (q *Queue) convTransposeDepthwise(dst, x, w gpu.Tensor, bs []float32, p gpu.ConvParams) {
	C := dst.Cols
	xs, ds := f32s(x), f32s(dst)
	var g mm
	g.setWeight(w)
	q.dev.pool.For(dst.Rows, max(1, 4096/(C*p.K)), func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			u := r + p.PadLeft
			out := ds[r*dst.Stride : r*dst.Stride+C]
			for c := range out {
				var s float32
				if bs != nil {
					s = bs[c]
				}
				for k := 0; k < p.K && k <= u; k++ {
					if (u-k)%p.Stride != 0 {
						continue
					}
					t := (u - k) / p.Stride
					if t >= x.Rows {
						continue
					}
					s += float32(xs[t*x.Stride+c] * g.weight(c*w.Stride+k))
				}
				out[c] = s
			}
		}
	})
}

// Conv2D implements gpu.Queue. Output row oh of group g is the product
// W_g [og, kk] · P_g [kk, Wout] of the group's weight with the row's patches
// (P[(c,i,j), ow] = x[oh·sh + i − ph, c·W + ow·sw + j − pw]), computed with
// the x·w kernels straight into dst's [Cout·Wout] layout: each element sums
// w·x over c, i, j in increasing order from zero (fused in assembly), then
// adds the bias, like the direct path for depthwise weights.
func (q *Queue) Conv2D(dst, x, w, bias gpu.Tensor, p gpu.Conv2DParams) {
	if p.Cin < 1 || p.W < 1 || p.KH < 1 || p.KW < 1 || p.StrideH < 1 || p.StrideW < 1 || p.Groups < 1 ||
		p.Cin%p.Groups != 0 || x.Cols != p.Cin*p.W || p.Wout < 1 || dst.Cols%p.Wout != 0 || p.PadH < 0 || p.PadW < 0 {
		panic(fmt.Sprintf("cpu: conv2d x %v dst %v params %+v", x, dst, p))
	}
	if dst.Buf == x.Buf {
		panic("cpu: conv2d dst aliases x")
	}
	cout := dst.Cols / p.Wout
	cg, og := p.Cin/p.Groups, cout/p.Groups
	kk := cg * p.KH * p.KW
	if cout%p.Groups != 0 || w.Rows != cout || w.Cols != kk {
		panic(fmt.Sprintf("cpu: conv2d weight %v for %d->%d channels k %dx%d groups %d", w, p.Cin, cout, p.KH, p.KW, p.Groups))
	}
	if dst.Rows == 0 || cout == 0 {
		return
	}
	bs := q.convBias(bias, cout)
	if og == 1 {
		q.conv2dDirect(dst, x, w, bs, p)
		return
	}
	xs, ds := f32s(x), f32s(dst)
	H := x.Rows
	wf := weightInto(&q.workspace(1)[0].wts, w) // [cout, kk] as F32: the left operand
	workers := q.dev.pool.workers
	ws := q.workspace(workers)
	asm := q.asm
	// patches gathers P_g of output row oh into col ([kk, Wout] per group,
	// groups one after another).
	patches := func(col []float32, oh int) {
		for ci := 0; ci < p.Cin; ci++ {
			for i := 0; i < p.KH; i++ {
				h := oh*p.StrideH + i - p.PadH
				for j := 0; j < p.KW; j++ {
					r := col[((ci*p.KH+i)*p.KW+j)*p.Wout:][:p.Wout]
					if h < 0 || h >= H {
						clear(r)
						continue
					}
					xr := xs[h*x.Stride+ci*p.W : h*x.Stride+(ci+1)*p.W]
					for ow := range r {
						wi := ow*p.StrideW + j - p.PadW
						if wi >= 0 && wi < p.W {
							r[ow] = xr[wi]
						} else {
							r[ow] = 0
						}
					}
				}
			}
		}
	}
	q.forChunks(dst.Rows, 1, func(wi, h0, h1 int) {
		wk := ws[wi]
		wk.col = grow(wk.col, p.Groups*kk*p.Wout)
		for oh := h0; oh < h1; oh++ {
			patches(wk.col, oh)
			for gi := 0; gi < p.Groups; gi++ {
				g := xw{
					x: wf[gi*og*kk:], xs: kk,
					wt: gpu.F32, w32: wk.col[gi*kk*p.Wout:], ws: p.Wout,
					dst: ds[oh*dst.Stride+gi*og*p.Wout:], ds: p.Wout,
					M: og, N: p.Wout, K: kk,
				}
				g.run(wk, 0, og, 0, p.Wout, asm)
			}
			if bs != nil {
				d := ds[oh*dst.Stride:]
				for o := 0; o < cout; o++ {
					out := d[o*p.Wout : (o+1)*p.Wout]
					for ow := range out {
						out[ow] += bs[o]
					}
				}
			}
		}
	})
}

// conv2dDirect computes a 2-D convolution with one output channel per
// group (depthwise): s = 0, then s += w·x over c, i, j in increasing order
// (the product rounded first), then the bias. The loops run a weight at a
// time over a row of output positions.
func (q *Queue) conv2dDirect(dst, x, w gpu.Tensor, bs []float32, p gpu.Conv2DParams) {
	cout := dst.Cols / p.Wout
	cg, og := p.Cin/p.Groups, cout/p.Groups
	kk := cg * p.KH * p.KW
	ws := weightInto(&q.workspace(1)[0].wts, w) // [cout, kk]
	xs, ds := f32s(x), f32s(dst)
	H := x.Rows
	q.dev.pool.For(dst.Rows, max(1, elemGrain/(dst.Cols*kk)), func(h0, h1 int) {
		for oh := h0; oh < h1; oh++ {
			drow := ds[oh*dst.Stride : oh*dst.Stride+dst.Cols]
			for o := 0; o < cout; o++ {
				out := drow[o*p.Wout : (o+1)*p.Wout]
				clear(out)
				gi := o / og
				for c := 0; c < cg; c++ {
					xc := (gi*cg + c) * p.W
					for i := 0; i < p.KH; i++ {
						h := oh*p.StrideH + i - p.PadH
						if h < 0 || h >= H {
							continue
						}
						xr := xs[h*x.Stride+xc : h*x.Stride+xc+p.W]
						for j := 0; j < p.KW; j++ {
							wv := ws[o*kk+(c*p.KH+i)*p.KW+j]
							// Output positions whose tap j lands inside the row.
							lo := max(0, (p.PadW-j+p.StrideW-1)/p.StrideW)
							hi := 0
							if last := p.W - 1 + p.PadW - j; last >= 0 {
								hi = min(p.Wout, last/p.StrideW+1)
							}
							for ow := lo; ow < hi; ow++ {
								out[ow] += float32(wv * xr[ow*p.StrideW+j-p.PadW])
							}
						}
					}
				}
				if bs != nil {
					for ow := range out {
						out[ow] += bs[o]
					}
				}
			}
		}
	})
}
