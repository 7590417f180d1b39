package gputest

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Convolutions. Every output is a sum of its taps' products and the bias:
// the bound is γ_{n+1}·(Σ|w·x| + |b|) for its n taps inside the input
// (taps outside read zero and add nothing), whatever the summation order.

// convBias makes an optional bias of dt (0: none).
func (h *harness) convBias(dt gpu.DType, n int) (operand, gpu.Tensor, string) {
	if dt == 0 {
		return operand{}, gpu.Tensor{}, "nobias"
	}
	b := h.vector(dt, n, 1)
	return b, b.view, "b=" + dtName(dt)
}

// tapSum is one output's float64 replay: the sum of its tap products and
// the sum of their magnitudes, over its n taps inside the input.
type tapSum struct {
	s, abs float64
	n      int
}

func (a *tapSum) add(pr float64) {
	a.s += pr
	a.abs += math.Abs(pr)
	a.n++
}

// result adds output channel o's bias (none where convBias made none) and
// returns the exact output and its bound γ_{n+1}·(Σ|w·x| + |b|).
func (a tapSum) result(b operand, o int) (want, bound float64) {
	if b.vals != nil {
		a.s += float64(b.vals[o])
		a.abs += math.Abs(float64(b.vals[o]))
	}
	return a.s, gamma(a.n+1) * a.abs
}

func groupName(groups, cin int) string {
	if groups == cin && groups > 1 {
		return "depthwise"
	}
	return fmt.Sprintf("g=%d", groups)
}

func checkConv1D(h *harness) {
	type c1 struct {
		tin, cin, cout, k, stride, dil, pad, groups, tout int
		wdt, bdt                                          gpu.DType
		strided                                           bool
	}
	for _, c := range []c1{
		{9, 5, 7, 3, 1, 1, 2, 1, 9, gpu.F32, gpu.F32, true},       // causal, im2col
		{10, 4, 6, 3, 2, 1, 1, 1, 6, gpu.BF16, gpu.BF16, false},   // stride 2, last row past the end
		{8, 3, 5, 3, 1, 2, 4, 1, 8, gpu.F32, 0, true},             // dilation 2
		{11, 6, 6, 5, 2, 2, 3, 6, 6, gpu.F32, gpu.F32, true},      // depthwise, stride and dilation 2
		{7, 33, 33, 4, 1, 1, 3, 33, 7, gpu.BF16, gpu.BF16, false}, // depthwise causal (LFM2-style)
		{70, 6, 4, 3, 1, 1, 1, 2, 70, gpu.F16, gpu.F32, true},     // groups 2, many rows
		{4, 9, 5, 1, 1, 1, 0, 1, 4, gpu.F32, gpu.BF16, false},     // pointwise
		{80, 16, 12, 7, 1, 1, 3, 1, 80, gpu.BF16, gpu.F32, true},  // many rows, wide taps
		{6, 2, 3, 3, 1, 1, 2, 1, 6, gpu.F32, gpu.F32, false},      // few taps per output
		{1, 4, 3, 3, 2, 1, 1, 1, 1, gpu.F32, gpu.F32, true},       // one row
	} {
		cg := c.cin / c.groups
		og := c.cout / c.groups
		xv := h.values(c.tin*c.cin, 1)
		x := h.input(c.tin, c.cin, c.strided, xv)
		w := h.weight(c.wdt, c.cout, cg*c.k, false, 1)
		b, bt, bname := h.convBias(c.bdt, c.cout)
		dst := h.f32(c.tout, c.cout, c.strided)
		want, bound := make([]float64, c.tout*c.cout), make([]float64, c.tout*c.cout)
		for t := 0; t < c.tout; t++ {
			for o := 0; o < c.cout; o++ {
				g := o / og
				var a tapSum
				for ci := 0; ci < cg; ci++ {
					for kk := 0; kk < c.k; kk++ {
						ti := t*c.stride + kk*c.dil - c.pad
						if ti < 0 || ti >= c.tin {
							continue
						}
						a.add(float64(w.vals[o*cg*c.k+ci*c.k+kk]) * float64(xv[ti*c.cin+g*cg+ci]))
					}
				}
				want[t*c.cout+o], bound[t*c.cout+o] = a.result(b, o)
			}
		}
		h.q.Conv1D(dst.view, x.view, w.view, bt, gpu.ConvParams{K: c.k, Stride: c.stride, Dilation: c.dil, Groups: c.groups, PadLeft: c.pad})
		h.verify(fmt.Sprintf("k=%d/s=%d/d=%d/pad=%d/%s/%dx%d->%dx%d/w=%s/%s%s", c.k, c.stride, c.dil, c.pad,
			groupName(c.groups, c.cin), c.tin, c.cin, c.tout, c.cout, dtName(c.wdt), bname, tag(c.strided)),
			dst, want, bound, x, b)
	}
}

func checkConvTranspose1D(h *harness) {
	type ct struct {
		tin, cin, cout, k, stride, pad, groups, rows int // rows < 0: full − pad + rows
		wdt, bdt                                     gpu.DType
		strided                                      bool
	}
	for _, c := range []ct{
		{6, 5, 3, 4, 2, 1, 1, -1, gpu.F32, gpu.F32, true},     // PyTorch padding 1: full − 2
		{6, 7, 7, 4, 2, 1, 7, 0, gpu.BF16, gpu.BF16, false},   // depthwise, to the end
		{40, 8, 6, 3, 2, 0, 1, 0, gpu.F32, 0, true},           // many rows
		{5, 4, 6, 5, 3, 2, 2, -2, gpu.F16, gpu.F32, true},     // groups 2, stride 3
		{9, 12, 12, 4, 2, 2, 12, -2, gpu.F32, gpu.BF16, true}, // depthwise, padded
		{1, 3, 2, 4, 2, 1, 1, 0, gpu.BF16, gpu.F32, false},    // one input row
		{70, 4, 5, 2, 2, 0, 1, 0, gpu.F32, gpu.F32, false},    // K = stride, many rows
	} {
		cg := c.cin / c.groups
		og := c.cout / c.groups
		full := (c.tin-1)*c.stride + c.k
		R := full - c.pad + c.rows
		xv := h.values(c.tin*c.cin, 1)
		x := h.input(c.tin, c.cin, c.strided, xv)
		w := h.weight(c.wdt, c.cin, og*c.k, false, 1)
		b, bt, bname := h.convBias(c.bdt, c.cout)
		dst := h.f32(R, c.cout, c.strided)
		want, bound := make([]float64, R*c.cout), make([]float64, R*c.cout)
		for r := 0; r < R; r++ {
			uu := r + c.pad
			for o := 0; o < c.cout; o++ {
				g, oo := o/og, o%og
				var a tapSum
				for kk := 0; kk < c.k; kk++ {
					if uu-kk < 0 || (uu-kk)%c.stride != 0 || (uu-kk)/c.stride >= c.tin {
						continue
					}
					t := (uu - kk) / c.stride
					for ci := 0; ci < cg; ci++ {
						in := g*cg + ci
						a.add(float64(xv[t*c.cin+in]) * float64(w.vals[in*og*c.k+oo*c.k+kk]))
					}
				}
				want[r*c.cout+o], bound[r*c.cout+o] = a.result(b, o)
			}
		}
		h.q.ConvTranspose1D(dst.view, x.view, w.view, bt, gpu.ConvParams{K: c.k, Stride: c.stride, Dilation: 1, Groups: c.groups, PadLeft: c.pad})
		h.verify(fmt.Sprintf("k=%d/s=%d/pad=%d/%s/%dx%d->%dx%d/w=%s/%s%s", c.k, c.stride, c.pad,
			groupName(c.groups, c.cin), c.tin, c.cin, R, c.cout, dtName(c.wdt), bname, tag(c.strided)),
			dst, want, bound, x, b)
	}
}

func checkConv2D(h *harness) {
	type c2 struct {
		H, W, cin, cout, kh, kw, sh, sw, ph, pw, groups int
		wdt, bdt                                        gpu.DType
		strided                                         bool
	}
	for _, c := range []c2{
		{9, 7, 3, 4, 3, 3, 2, 2, 1, 1, 1, gpu.F32, gpu.F32, true},
		{8, 10, 5, 5, 3, 3, 2, 2, 1, 1, 5, gpu.F32, gpu.BF16, true},  // depthwise
		{5, 6, 2, 3, 3, 3, 1, 1, 1, 1, 1, gpu.BF16, gpu.BF16, false}, // stride 1
		{7, 9, 4, 6, 3, 3, 2, 2, 1, 1, 2, gpu.F16, 0, true},          // groups 2
		{6, 11, 1, 4, 2, 3, 1, 2, 0, 1, 1, gpu.F32, gpu.F32, false},  // KH ≠ KW, strides differ
		{3, 5, 7, 7, 3, 3, 2, 2, 1, 1, 7, gpu.BF16, gpu.F32, false},  // depthwise, one output row pair
		// The conformer's kinds at more channels than a CUDA block's tile
		// (conv2d_rows_f32: 256 outputs a block): a pointwise 1 × 1, a
		// depthwise, a stem with one input channel; then rows too wide for
		// its shared memory (conv2d_f32).
		{4, 12, 40, 48, 1, 1, 1, 1, 0, 0, 1, gpu.BF16, gpu.BF16, true},
		{3, 37, 70, 67, 1, 1, 1, 1, 0, 0, 1, gpu.F32, gpu.F32, true}, // ragged 64 × 32 tiles and channel steps
		{7, 16, 36, 36, 3, 3, 2, 2, 1, 1, 36, gpu.BF16, gpu.BF16, false},
		{9, 40, 1, 24, 3, 3, 2, 2, 1, 1, 1, gpu.BF16, gpu.BF16, false},
		{3, 4100, 1, 2, 3, 3, 2, 2, 1, 1, 1, gpu.F32, gpu.F32, false},
	} {
		cg := c.cin / c.groups
		og := c.cout / c.groups
		ho := (c.H+2*c.ph-c.kh)/c.sh + 1
		wo := (c.W+2*c.pw-c.kw)/c.sw + 1
		kk := cg * c.kh * c.kw
		xv := h.values(c.H*c.cin*c.W, 1)
		x := h.input(c.H, c.cin*c.W, c.strided, xv)
		w := h.weight(c.wdt, c.cout, kk, false, 1)
		b, bt, bname := h.convBias(c.bdt, c.cout)
		dst := h.f32(ho, c.cout*wo, c.strided)
		want, bound := make([]float64, ho*c.cout*wo), make([]float64, ho*c.cout*wo)
		for oh := 0; oh < ho; oh++ {
			for o := 0; o < c.cout; o++ {
				g := o / og
				for ow := 0; ow < wo; ow++ {
					var a tapSum
					for ci := 0; ci < cg; ci++ {
						in := g*cg + ci
						for i := 0; i < c.kh; i++ {
							hi := oh*c.sh + i - c.ph
							if hi < 0 || hi >= c.H {
								continue
							}
							for j := 0; j < c.kw; j++ {
								wi := ow*c.sw + j - c.pw
								if wi < 0 || wi >= c.W {
									continue
								}
								a.add(float64(w.vals[o*kk+(ci*c.kh+i)*c.kw+j]) * float64(xv[hi*c.cin*c.W+in*c.W+wi]))
							}
						}
					}
					idx := oh*c.cout*wo + o*wo + ow
					want[idx], bound[idx] = a.result(b, o)
				}
			}
		}
		h.q.Conv2D(dst.view, x.view, w.view, bt, gpu.Conv2DParams{Cin: c.cin, W: c.W, Wout: wo, KH: c.kh, KW: c.kw,
			StrideH: c.sh, StrideW: c.sw, PadH: c.ph, PadW: c.pw, Groups: c.groups})
		h.verify(fmt.Sprintf("%dx%d/s=%dx%d/p=%dx%d/%s/%dx%dx%d->%dx%dx%d/w=%s/%s%s", c.kh, c.kw, c.sh, c.sw, c.ph, c.pw,
			groupName(c.groups, c.cin), c.H, c.cin, c.W, ho, c.cout, wo, dtName(c.wdt), bname, tag(c.strided)),
			dst, want, bound, x, b)
	}
}
