package cpu

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Queue is the CPU backend's gpu.Queue. Ops run eagerly: when a method
// returns, its result is in memory. A Queue must be used by one goroutine at
// a time (a stage owns its queue).
type Queue struct {
	dev  *Device
	name string
	asm  bool
	work []*work // per-chunk scratch of the parallel ops, grown on demand
}

var _ gpu.Queue = (*Queue)(nil)

// Name implements gpu.Queue.
func (q *Queue) Name() string { return q.name }

// Sync implements gpu.Queue. CPU ops finish before they return.
func (q *Queue) Sync() error { return nil }

func sameShape(op string, a, b gpu.Tensor) {
	if a.Rows != b.Rows || a.Cols != b.Cols {
		panic(fmt.Sprintf("cpu: %s: shapes %v and %v differ", op, a, b))
	}
}

// rows calls fn(r, row) for every row of t in parallel (F32).
func (q *Queue) eachRow(t gpu.Tensor, fn func(r int, row []float32)) {
	if t.Rows == 0 || t.Cols == 0 {
		return
	}
	s := f32s(t)
	grain := max(1, 16384/max(t.Cols, 1))
	q.dev.pool.For(t.Rows, grain, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			fn(r, s[r*t.Stride:r*t.Stride+t.Cols])
		}
	})
}

func row(t gpu.Tensor, s []float32, r int) []float32 {
	return s[r*t.Stride : r*t.Stride+t.Cols]
}

// Write implements gpu.Queue.
func (q *Queue) Write(dst gpu.Tensor, src []float32) {
	if len(src) != dst.Len() {
		panic(fmt.Sprintf("cpu: write %d values to %v", len(src), dst))
	}
	d := f32s(dst)
	for r := 0; r < dst.Rows; r++ {
		copy(row(dst, d, r), src[r*dst.Cols:])
	}
}

// WriteInt implements gpu.Queue.
func (q *Queue) WriteInt(dst gpu.Tensor, src []int32) {
	if len(src) != dst.Len() {
		panic(fmt.Sprintf("cpu: write %d ints to %v", len(src), dst))
	}
	d := i32s(dst)
	for r := 0; r < dst.Rows; r++ {
		copy(d[r*dst.Stride:r*dst.Stride+dst.Cols], src[r*dst.Cols:])
	}
}

// Read implements gpu.Queue.
func (q *Queue) Read(dst []float32, src gpu.Tensor) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("cpu: read %v into %d values", src, len(dst))
	}
	s := f32s(src)
	for r := 0; r < src.Rows; r++ {
		copy(dst[r*src.Cols:(r+1)*src.Cols], row(src, s, r))
	}
	return nil
}

// Copy implements gpu.Queue.
func (q *Queue) Copy(dst, src gpu.Tensor) {
	sameShape("copy", dst, src)
	if dst.DType() != src.DType() {
		panic(fmt.Sprintf("cpu: copy %v to %v", src, dst))
	}
	db, sb := buf(dst), buf(src)
	for r := 0; r < dst.Rows; r++ {
		do, so := dst.Off+r*dst.Stride, src.Off+r*src.Stride
		switch db.dt {
		case gpu.F32:
			copy(db.f32[do:do+dst.Cols], sb.f32[so:so+src.Cols])
		case gpu.BF16, gpu.F16:
			copy(db.u16[do:do+dst.Cols], sb.u16[so:so+src.Cols])
		case gpu.I32:
			copy(db.i32[do:do+dst.Cols], sb.i32[so:so+src.Cols])
		}
	}
}

// Fill implements gpu.Queue.
func (q *Queue) Fill(dst gpu.Tensor, v float32) {
	d := f32s(dst)
	for r := 0; r < dst.Rows; r++ {
		x := row(dst, d, r)
		for i := range x {
			x[i] = v
		}
	}
}

func (q *Queue) binary(op string, dst, a, b gpu.Tensor, f func(d, x, y []float32)) {
	sameShape(op, dst, a)
	sameShape(op, dst, b)
	as, bs := f32s(a), f32s(b)
	q.eachRow(dst, func(r int, d []float32) { f(d, row(a, as, r), row(b, bs, r)) })
}

// Add implements gpu.Queue.
func (q *Queue) Add(dst, a, b gpu.Tensor) {
	q.binary("add", dst, a, b, func(d, x, y []float32) {
		for i := range d {
			d[i] = x[i] + y[i]
		}
	})
}

// Mul implements gpu.Queue.
func (q *Queue) Mul(dst, a, b gpu.Tensor) {
	q.binary("mul", dst, a, b, func(d, x, y []float32) {
		for i := range d {
			d[i] = x[i] * y[i]
		}
	})
}

// vector returns a [1, n] tensor of any float dtype as float32 values.
func vector(v gpu.Tensor, n int) []float32 {
	if v.Rows != 1 || v.Cols != n {
		panic(fmt.Sprintf("cpu: want a [1,%d] vector, got %v", n, v))
	}
	b := buf(v)
	switch b.dt {
	case gpu.F32:
		return b.f32[v.Off : v.Off+n]
	case gpu.BF16:
		out := make([]float32, n)
		for i, h := range b.u16[v.Off : v.Off+n] {
			out[i] = gpu.BF16ToF32(h)
		}
		return out
	case gpu.F16:
		out := make([]float32, n)
		for i, h := range b.u16[v.Off : v.Off+n] {
			out[i] = gpu.F16ToF32(h)
		}
		return out
	}
	panic(fmt.Sprintf("cpu: vector of %v", v))
}

// AddRow implements gpu.Queue.
func (q *Queue) AddRow(dst, a, v gpu.Tensor) {
	sameShape("addrow", dst, a)
	vs := vector(v, dst.Cols)
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		for i := range d {
			d[i] = x[i] + vs[i]
		}
	})
}

// MulRow implements gpu.Queue.
func (q *Queue) MulRow(dst, a, v gpu.Tensor) {
	sameShape("mulrow", dst, a)
	vs := vector(v, dst.Cols)
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		for i := range d {
			d[i] = x[i] * vs[i]
		}
	})
}

// Scale implements gpu.Queue.
func (q *Queue) Scale(dst, a gpu.Tensor, s float32) {
	sameShape("scale", dst, a)
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		for i := range d {
			d[i] = x[i] * s
		}
	})
}

// RoundBF16 implements gpu.Queue.
func (q *Queue) RoundBF16(dst gpu.Tensor) {
	q.eachRow(dst, func(_ int, d []float32) {
		for i, v := range d {
			d[i] = gpu.RoundBF16(v)
		}
	})
}

// Act implements gpu.Queue.
func (q *Queue) Act(dst, a gpu.Tensor, f gpu.Activation) {
	sameShape("act", dst, a)
	var fn func(float32) float32
	switch f {
	case gpu.SiLU:
		fn = func(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }
	case gpu.GELU:
		fn = func(x float32) float32 { return float32(0.5 * float64(x) * (1 + math.Erf(float64(x)/math.Sqrt2))) }
	case gpu.ReLU:
		fn = func(x float32) float32 { return max(x, 0) }
	case gpu.ELU:
		fn = func(x float32) float32 {
			if x > 0 {
				return x
			}
			return float32(math.Expm1(float64(x)))
		}
	case gpu.Sigmoid:
		fn = func(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }
	default:
		panic(fmt.Sprintf("cpu: activation %v", f))
	}
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		for i := range d {
			d[i] = fn(x[i])
		}
	})
}

// GLU implements gpu.Queue.
func (q *Queue) GLU(dst, a gpu.Tensor) {
	if a.Rows != dst.Rows || a.Cols != 2*dst.Cols {
		panic(fmt.Sprintf("cpu: glu %v -> %v", a, dst))
	}
	as := f32s(a)
	n := dst.Cols
	q.eachRow(dst, func(r int, d []float32) {
		x := as[r*a.Stride : r*a.Stride+a.Cols]
		for i := range d {
			d[i] = x[i] / (1 + float32(math.Exp(float64(-x[n+i]))))
		}
	})
}

// RMSNorm implements gpu.Queue.
func (q *Queue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	sameShape("rmsnorm", dst, a)
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		var ss float32
		for _, v := range x {
			ss += v * v
		}
		inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
		for i, v := range x {
			d[i] = v * inv
		}
	})
}

// LayerNorm implements gpu.Queue.
func (q *Queue) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	sameShape("layernorm", dst, a)
	ws := vector(w, dst.Cols)
	var bs []float32
	if !b.IsNil() {
		bs = vector(b, dst.Cols)
	}
	as := f32s(a)
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		var mean float32
		for _, v := range x {
			mean += v
		}
		mean /= float32(len(x))
		var vr float32
		for _, v := range x {
			vr += (v - mean) * (v - mean)
		}
		inv := float32(1 / math.Sqrt(float64(vr/float32(len(x))+eps)))
		for i, v := range x {
			y := (v - mean) * inv * ws[i]
			if bs != nil {
				y += bs[i]
			}
			d[i] = y
		}
	})
}

// Softmax implements gpu.Queue.
func (q *Queue) Softmax(dst gpu.Tensor) {
	q.eachRow(dst, func(_ int, d []float32) { softmax(d) })
}

func softmax(d []float32) {
	m := float32(math.Inf(-1))
	for _, v := range d {
		m = max(m, v)
	}
	var sum float32
	for i, v := range d {
		e := float32(math.Exp(float64(v - m)))
		d[i] = e
		sum += e
	}
	for i := range d {
		d[i] /= sum
	}
}

// RoPE implements gpu.Queue.
func (q *Queue) RoPE(dst gpu.Tensor, p gpu.RoPEParams) {
	hd := p.HeadDim
	if hd <= 0 || hd%2 != 0 || dst.Cols%hd != 0 || len(p.InvFreq) != hd/2 || len(p.Pos) != dst.Rows {
		panic(fmt.Sprintf("cpu: rope %v head %d invfreq %d pos %d", dst, hd, len(p.InvFreq), len(p.Pos)))
	}
	half := hd / 2
	rnd := func(v float32) float32 { return v }
	if p.BF16 {
		rnd = gpu.RoundBF16
	}
	q.eachRow(dst, func(r int, d []float32) {
		pos := float32(p.Pos[r])
		for j := 0; j < half; j++ {
			ang := pos * p.InvFreq[j] // fp32 product, as the references compute it
			c := rnd(float32(math.Cos(float64(ang))))
			s := rnd(float32(math.Sin(float64(ang))))
			for h := 0; h < dst.Cols; h += hd {
				var i0, i1 int
				if p.Style == gpu.Interleaved {
					i0, i1 = h+2*j, h+2*j+1
				} else {
					i0, i1 = h+j, h+j+half
				}
				x0, x1 := d[i0], d[i1]
				d[i0] = rnd(rnd(x0*c) - rnd(x1*s))
				d[i1] = rnd(rnd(x1*c) + rnd(x0*s))
			}
		}
	})
}

// ShortConv implements gpu.Queue.
func (q *Queue) ShortConv(dst, x, w, state gpu.Tensor) {
	sameShape("shortconv", dst, x)
	C := x.Cols
	L := w.Cols
	if w.Rows != C || state.Rows != L-1 || state.Cols != C {
		panic(fmt.Sprintf("cpu: shortconv x %v w %v state %v", x, w, state))
	}
	ws := weightF32(w)
	xs, ss, ds := f32s(x), f32s(state), f32s(dst)
	T := x.Rows
	at := func(t, c int) float32 { // row t of [state; x]
		if t < L-1 {
			return ss[t*state.Stride+c]
		}
		return xs[(t-L+1)*x.Stride+c]
	}
	q.dev.pool.For(C, 64, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			wc := ws[c*L : (c+1)*L]
			for t := 0; t < T; t++ {
				var acc float32
				for j := 0; j < L; j++ {
					acc += wc[j] * at(t+j, c)
				}
				ds[t*dst.Stride+c] = acc
			}
			// New state: the last L−1 rows of [state; x].
			tail := make([]float32, L-1)
			for j := range tail {
				tail[j] = at(T+j, c)
			}
			for j, v := range tail {
				ss[j*state.Stride+c] = v
			}
		}
	})
}

// weightF32 returns a contiguous weight tensor's values as float32 (a
// conversion for BF16/F16, the slice itself for F32).
func weightF32(w gpu.Tensor) []float32 {
	b := buf(w)
	if !w.Contiguous() {
		panic(fmt.Sprintf("cpu: weight %v is not contiguous", w))
	}
	n := w.Len()
	switch b.dt {
	case gpu.F32:
		return b.f32[w.Off : w.Off+n]
	case gpu.BF16, gpu.F16:
		out := make([]float32, n)
		conv := gpu.BF16ToF32
		if b.dt == gpu.F16 {
			conv = gpu.F16ToF32
		}
		for i, h := range b.u16[w.Off : w.Off+n] {
			out[i] = conv(h)
		}
		return out
	}
	panic(fmt.Sprintf("cpu: weight of %v", w))
}

// Embed implements gpu.Queue.
func (q *Queue) Embed(dst, table gpu.Tensor, ids []int32) {
	if dst.Rows == 0 {
		return
	}
	if len(ids)%dst.Rows != 0 || table.Cols != dst.Cols {
		panic(fmt.Sprintf("cpu: embed %d ids from %v into %v", len(ids), table, dst))
	}
	n := len(ids) / dst.Rows
	for _, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("cpu: embed id %d outside table of %d rows", id, table.Rows))
		}
	}
	tb := buf(table)
	q.eachRow(dst, func(r int, d []float32) {
		for c := range d {
			d[c] = 0
		}
		for _, id := range ids[r*n : (r+1)*n] {
			o := table.Off + int(id)*table.Stride
			switch tb.dt {
			case gpu.F32:
				for c, v := range tb.f32[o : o+table.Cols] {
					d[c] += v
				}
			case gpu.BF16:
				for c, h := range tb.u16[o : o+table.Cols] {
					d[c] += gpu.BF16ToF32(h)
				}
			case gpu.F16:
				for c, h := range tb.u16[o : o+table.Cols] {
					d[c] += gpu.F16ToF32(h)
				}
			default:
				panic(fmt.Sprintf("cpu: embed from %v", table))
			}
		}
	})
}
