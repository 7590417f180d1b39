package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// kernelName describes the matmul kernels in use.
func kernelName() string { return "pure Go" }

// MatMul implements gpu.Queue.
func (q *Queue) MatMul(dst, x, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	if w.Cols != K || dst.Rows != M || dst.Cols != N {
		panic(fmt.Sprintf("cpu: matmul x %v w %v dst %v", x, w, dst))
	}
	if dst.Buf == x.Buf || dst.Buf == w.Buf {
		panic("cpu: matmul dst aliases an operand")
	}
	var bs []float32
	if !bias.IsNil() {
		bs = vector(bias, N)
	}
	if M == 0 || N == 0 {
		return
	}
	xs, ds := f32s(x), f32s(dst)
	wb := buf(w)
	q.dev.pool.For(N, max(1, 4096/max(K, 1)), func(lo, hi int) {
		wrow := make([]float32, K)
		for n := lo; n < hi; n++ {
			o := w.Off + n*w.Stride
			switch wb.dt {
			case gpu.F32:
				copy(wrow, wb.f32[o:o+K])
			case gpu.BF16:
				for i, h := range wb.u16[o : o+K] {
					wrow[i] = gpu.BF16ToF32(h)
				}
			case gpu.F16:
				for i, h := range wb.u16[o : o+K] {
					wrow[i] = gpu.F16ToF32(h)
				}
			default:
				panic(fmt.Sprintf("cpu: matmul weight %v", w))
			}
			var b float32
			if bs != nil {
				b = bs[n]
			}
			for m := 0; m < M; m++ {
				xr := xs[m*x.Stride : m*x.Stride+K]
				ds[m*dst.Stride+n] = dot(xr, wrow) + b
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
