package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

func checkConv(op string, dst, x, w gpu.Tensor, p gpu.ConvParams, cin, cout int) {
	if p.K < 1 || p.Stride < 1 || p.Dilation < 1 || p.Groups < 1 || cin%p.Groups != 0 || cout%p.Groups != 0 || p.PadLeft < 0 {
		panic(fmt.Sprintf("cpu: %s params %+v for %d->%d channels", op, p, cin, cout))
	}
	if dst.Buf == x.Buf {
		panic(fmt.Sprintf("cpu: %s dst aliases x", op))
	}
}

// Conv1D implements gpu.Queue.
func (q *Queue) Conv1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	cin, cout := x.Cols, dst.Cols
	checkConv("conv1d", dst, x, w, p, cin, cout)
	cg := cin / p.Groups // input channels per group
	og := cout / p.Groups
	if w.Rows != cout || w.Cols != cg*p.K {
		panic(fmt.Sprintf("cpu: conv1d weight %v for %d->%d k %d groups %d", w, cin, cout, p.K, p.Groups))
	}
	ws := weightF32(w)
	var bs []float32
	if !bias.IsNil() {
		bs = vector(bias, cout)
	}
	xs, ds := f32s(x), f32s(dst)
	Tin := x.Rows
	q.dev.pool.For(dst.Rows, 1, func(lo, hi int) {
		col := make([]float32, cg*p.K)
		for t := lo; t < hi; t++ {
			out := ds[t*dst.Stride : t*dst.Stride+cout]
			for g := 0; g < p.Groups; g++ {
				for k := 0; k < p.K; k++ {
					src := t*p.Stride + k*p.Dilation - p.PadLeft
					for c := 0; c < cg; c++ {
						var v float32
						if src >= 0 && src < Tin {
							v = xs[src*x.Stride+g*cg+c]
						}
						col[c*p.K+k] = v
					}
				}
				for o := g * og; o < (g+1)*og; o++ {
					s := dot(ws[o*cg*p.K:(o+1)*cg*p.K], col)
					if bs != nil {
						s += bs[o]
					}
					out[o] = s
				}
			}
		}
	})
}

// ConvTranspose1D implements gpu.Queue.
func (q *Queue) ConvTranspose1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	cin, cout := x.Cols, dst.Cols
	checkConv("convtranspose1d", dst, x, w, p, cin, cout)
	cg := cin / p.Groups
	og := cout / p.Groups
	if w.Rows != cin || w.Cols != og*p.K {
		panic(fmt.Sprintf("cpu: convtranspose1d weight %v for %d->%d k %d groups %d", w, cin, cout, p.K, p.Groups))
	}
	ws := weightF32(w)
	var bs []float32
	if !bias.IsNil() {
		bs = vector(bias, cout)
	}
	xs, ds := f32s(x), f32s(dst)
	Tin := x.Rows
	q.dev.pool.For(dst.Rows, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			u := r + p.PadLeft // row of the full output
			out := ds[r*dst.Stride : r*dst.Stride+cout]
			for o := range out {
				if bs != nil {
					out[o] = bs[o]
				} else {
					out[o] = 0
				}
			}
			for k := 0; k < p.K; k++ {
				if (u-k)%p.Stride != 0 || u-k < 0 {
					continue
				}
				t := (u - k) / p.Stride
				if t >= Tin {
					continue
				}
				xr := xs[t*x.Stride : t*x.Stride+cin]
				for o := 0; o < cout; o++ {
					g := o / og
					oi := o % og
					var s float32
					for c := 0; c < cg; c++ {
						s += xr[g*cg+c] * ws[(g*cg+c)*og*p.K+oi*p.K+k]
					}
					out[o] += s
				}
			}
		}
	})
}

// Conv2D implements gpu.Queue.
func (q *Queue) Conv2D(dst, x, w, bias gpu.Tensor, p gpu.Conv2DParams) {
	if p.Cin < 1 || p.W < 1 || p.KH < 1 || p.KW < 1 || p.StrideH < 1 || p.StrideW < 1 || p.Groups < 1 ||
		p.Cin%p.Groups != 0 || x.Cols != p.Cin*p.W || p.Wout < 1 || dst.Cols%p.Wout != 0 {
		panic(fmt.Sprintf("cpu: conv2d x %v dst %v params %+v", x, dst, p))
	}
	if dst.Buf == x.Buf {
		panic("cpu: conv2d dst aliases x")
	}
	cout := dst.Cols / p.Wout
	cg, og := p.Cin/p.Groups, cout/p.Groups
	if cout%p.Groups != 0 || w.Rows != cout || w.Cols != cg*p.KH*p.KW {
		panic(fmt.Sprintf("cpu: conv2d weight %v for %d->%d channels k %dx%d groups %d", w, p.Cin, cout, p.KH, p.KW, p.Groups))
	}
	ws := weightF32(w)
	var bs []float32
	if !bias.IsNil() {
		bs = vector(bias, cout)
	}
	xs, ds := f32s(x), f32s(dst)
	H := x.Rows
	kk := p.KH * p.KW
	q.dev.pool.For(dst.Rows, 1, func(lo, hi int) {
		col := make([]float32, cg*kk)
		for oh := lo; oh < hi; oh++ {
			out := ds[oh*dst.Stride : oh*dst.Stride+dst.Cols]
			for ow := 0; ow < p.Wout; ow++ {
				for g := 0; g < p.Groups; g++ {
					for c := 0; c < cg; c++ {
						for i := 0; i < p.KH; i++ {
							h := oh*p.StrideH + i - p.PadH
							for j := 0; j < p.KW; j++ {
								wi := ow*p.StrideW + j - p.PadW
								var v float32
								if h >= 0 && h < H && wi >= 0 && wi < p.W {
									v = xs[h*x.Stride+(g*cg+c)*p.W+wi]
								}
								col[c*kk+i*p.KW+j] = v
							}
						}
					}
					for o := g * og; o < (g+1)*og; o++ {
						s := dot(ws[o*cg*kk:(o+1)*cg*kk], col)
						if bs != nil {
							s += bs[o]
						}
						out[o*p.Wout+ow] = s
					}
				}
			}
		}
	})
}

func dot(a, b []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
