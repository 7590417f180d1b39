package cpu

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Queue is the CPU backend's gpu.Queue. Ops run eagerly: when a method
// returns, its result is in memory. A Queue must be used by one goroutine at
// a time (a stage owns its queue); it keeps per-worker scratch between ops,
// so ops do not allocate in steady state.
type Queue struct {
	dev  *Device
	name string
	asm  bool
	work []*work // per-participant scratch of the parallel ops, grown on demand
	// sample is Sample's scratch, reused across calls.
	sample gpu.SampleScratch
	// glu is NormGLU's gate products, reused across calls.
	glu []float32
}

var _ gpu.Queue = (*Queue)(nil)

// elemGrain is the number of elements of an elementwise op one participant
// takes at a time (a multiple of 8); ops smaller than two grains run on the
// calling goroutine.
const elemGrain = 16384

// Name implements gpu.Queue.
func (q *Queue) Name() string { return q.name }

// Sync implements gpu.Queue. CPU ops finish before they return.
func (q *Queue) Sync() error { return nil }

func sameShape(op string, a, b gpu.Tensor) {
	if a.Rows != b.Rows || a.Cols != b.Cols {
		panic(fmt.Sprintf("cpu: %s: shapes %v and %v differ", op, a, b))
	}
}

// contiguous reports whether every tensor's rows are adjacent, so that an
// elementwise op may treat them as one vector.
func contiguous(ts ...gpu.Tensor) bool {
	for _, t := range ts {
		if !t.Contiguous() {
			return false
		}
	}
	return true
}

// eachRow calls fn(r, row) for every row of the F32 tensor t, in parallel.
func (q *Queue) eachRow(t gpu.Tensor, fn func(r int, row []float32)) {
	if t.Rows == 0 || t.Cols == 0 {
		return
	}
	s := f32s(t)
	q.dev.pool.For(t.Rows, max(1, elemGrain/t.Cols), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			fn(r, s[r*t.Stride:r*t.Stride+t.Cols])
		}
	})
}

// span calls fn over pieces of [0, n) in parallel.
func (q *Queue) span(n int, fn func(lo, hi int)) { q.dev.pool.For(n, elemGrain, fn) }

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

// binary applies an elementwise kernel k(asm, d, x, y) to every row, or to
// the whole tensors at once when they are contiguous.
func (q *Queue) binary(op string, dst, a, b gpu.Tensor, k func(asm bool, d, x, y []float32)) {
	sameShape(op, dst, a)
	sameShape(op, dst, b)
	ds, as, bs := f32s(dst), f32s(a), f32s(b)
	asm := q.asm
	if contiguous(dst, a, b) {
		q.span(dst.Len(), func(lo, hi int) { k(asm, ds[lo:hi], as[lo:hi], bs[lo:hi]) })
		return
	}
	q.eachRow(dst, func(r int, d []float32) { k(asm, d, row(a, as, r), row(b, bs, r)) })
}

// unary applies an elementwise kernel k(asm, d, x) likewise.
func (q *Queue) unary(op string, dst, a gpu.Tensor, k func(asm bool, d, x []float32)) {
	sameShape(op, dst, a)
	ds, as := f32s(dst), f32s(a)
	asm := q.asm
	if contiguous(dst, a) {
		q.span(dst.Len(), func(lo, hi int) { k(asm, ds[lo:hi], as[lo:hi]) })
		return
	}
	q.eachRow(dst, func(r int, d []float32) { k(asm, d, row(a, as, r)) })
}

// Add implements gpu.Queue.
func (q *Queue) Add(dst, a, b gpu.Tensor) { q.binary("add", dst, a, b, vAdd) }

// Mul implements gpu.Queue.
func (q *Queue) Mul(dst, a, b gpu.Tensor) { q.binary("mul", dst, a, b, vMul) }

// rowVector returns a [1, n] operand of AddRow, MulRow or LayerNorm as
// float32, converted into participant 0's scratch when it is not F32 (vec,
// or row for a second operand).
func (q *Queue) rowVector(v gpu.Tensor, n int, second bool) []float32 {
	wk := q.workspace(1)[0]
	if second {
		return vectorInto(&wk.row, v, n)
	}
	return vectorInto(&wk.vec, v, n)
}

// AddRow implements gpu.Queue.
func (q *Queue) AddRow(dst, a, v gpu.Tensor) {
	sameShape("addrow", dst, a)
	vs := q.rowVector(v, dst.Cols, false)
	as := f32s(a)
	asm := q.asm
	q.eachRow(dst, func(r int, d []float32) { vAdd(asm, d, row(a, as, r), vs) })
}

// MulRow implements gpu.Queue.
func (q *Queue) MulRow(dst, a, v gpu.Tensor) {
	sameShape("mulrow", dst, a)
	vs := q.rowVector(v, dst.Cols, false)
	as := f32s(a)
	asm := q.asm
	q.eachRow(dst, func(r int, d []float32) { vMul(asm, d, row(a, as, r), vs) })
}

// Scale implements gpu.Queue.
func (q *Queue) Scale(dst, a gpu.Tensor, s float32) {
	q.unary("scale", dst, a, func(asm bool, d, x []float32) { vScale(asm, d, x, s) })
}

// RoundBF16 implements gpu.Queue.
func (q *Queue) RoundBF16(dst gpu.Tensor) {
	q.unary("roundbf16", dst, dst, func(asm bool, d, _ []float32) { vRound(asm, d) })
}

// Act implements gpu.Queue. SiLU, Sigmoid and ELU use exp32 (about 1 ulp);
// GELU evaluates erf in float64.
func (q *Queue) Act(dst, a gpu.Tensor, f gpu.Activation) {
	var k func(asm bool, d, x []float32)
	switch f {
	case gpu.SiLU:
		k = vSiLU
	case gpu.Sigmoid:
		k = vSigmoid
	case gpu.ELU:
		k = vELU
	case gpu.ReLU:
		k = func(_ bool, d, x []float32) {
			x = x[:len(d)]
			for i, v := range x {
				d[i] = max(v, 0)
			}
		}
	case gpu.GELU:
		k = func(_ bool, d, x []float32) {
			x = x[:len(d)]
			for i, v := range x {
				d[i] = float32(0.5 * float64(v) * (1 + math.Erf(float64(v)/math.Sqrt2)))
			}
		}
	default:
		panic(fmt.Sprintf("cpu: activation %v", f))
	}
	q.unary(f.String(), dst, a, k)
}

// GLU implements gpu.Queue.
func (q *Queue) GLU(dst, a gpu.Tensor) {
	if a.Rows != dst.Rows || a.Cols != 2*dst.Cols {
		panic(fmt.Sprintf("cpu: glu %v -> %v", a, dst))
	}
	as := f32s(a)
	n := dst.Cols
	asm := q.asm
	q.eachRow(dst, func(r int, d []float32) {
		x := as[r*a.Stride : r*a.Stride+a.Cols]
		vGLU(asm, d, x[:n], x[n:])
	})
}

// RMSNorm implements gpu.Queue: the sum of squares in the 8-lane order of
// elem.go, the inverse root in float64.
func (q *Queue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	sameShape("rmsnorm", dst, a)
	as := f32s(a)
	asm := q.asm
	q.eachRow(dst, func(r int, d []float32) { normInto(asm, d, row(a, as, r), gpu.RowNorm{Eps: eps}, nil) })
}

// normInto sets d to the RMS norm of x, rounded and weighted as n asks
// (nw: n.W as float32, nil for none) — one row of RMSNorm, then
// RoundBF16, MulRow and RoundBF16: the sum of squares in vSumSq's order,
// the inverse root in float64, the scale.
func normInto(asm bool, d, x []float32, n gpu.RowNorm, nw []float32) {
	ss := vSumSq(asm, x, 0)
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+n.Eps)))
	vScale(asm, d, x, inv)
	if n.Round {
		vRound(asm, d)
	}
	if nw != nil {
		vMul(asm, d, d, nw)
		if n.RoundW {
			vRound(asm, d)
		}
	}
}

// LayerNorm implements gpu.Queue: mean and variance in the 8-lane order of
// elem.go, the inverse root in float64, then ((x − mean)·inv)·w + b.
func (q *Queue) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	sameShape("layernorm", dst, a)
	ws := q.rowVector(w, dst.Cols, false)
	var bs []float32
	if !b.IsNil() {
		bs = q.rowVector(b, dst.Cols, true)
	}
	as := f32s(a)
	asm := q.asm
	q.eachRow(dst, func(r int, d []float32) {
		x := row(a, as, r)
		n := float32(len(x))
		mean := vSum(asm, x) / n
		vr := vSumSq(asm, x, mean) / n
		inv := float32(1 / math.Sqrt(float64(vr+eps)))
		vLNorm(asm, d, x, ws, bs, mean, inv)
	})
}

// Softmax implements gpu.Queue: exp32(x − max), summed in the 8-lane order,
// then divided by the sum.
func (q *Queue) Softmax(dst gpu.Tensor) {
	asm := q.asm
	q.eachRow(dst, func(_ int, d []float32) { softmax(asm, d) })
}

func softmax(asm bool, d []float32) {
	m := vMax(asm, d)
	vExpShift(asm, d, d, m)
	vDivs(asm, d, vSum(asm, d))
}

// RoPE implements gpu.Queue.
func (q *Queue) RoPE(dst gpu.Tensor, p gpu.RoPEParams) {
	checkRoPE("rope", dst, p)
	hd := p.HeadDim
	q.eachRow(dst, func(r int, d []float32) {
		var buf [256]float32
		cs := buf[:]
		if hd > len(buf) {
			cs = make([]float32, hd)
		}
		ropeAngles(cs, p.Pos[r], p.InvFreq, p.BF16)
		ropeRow(d, cs, hd, p.Style, p.BF16)
	})
}

// checkRoPE panics unless p rotates dst: whole heads of an even HeadDim,
// its inverse frequencies and a position for every row.
func checkRoPE(op string, dst gpu.Tensor, p gpu.RoPEParams) {
	hd := p.HeadDim
	if hd <= 0 || hd%2 != 0 || dst.Cols%hd != 0 || len(p.InvFreq) != hd/2 || len(p.Pos) != dst.Rows {
		panic(fmt.Sprintf("cpu: %s %v head %d invfreq %d pos %d", op, dst, hd, len(p.InvFreq), len(p.Pos)))
	}
}

// ropeAngles sets cs[2j] and cs[2j+1] to the cosine and sine of
// pos·invFreq[j] — the fp32 product, as the references compute it, each
// rounded to bfloat16 when bf16.
func ropeAngles(cs []float32, pos int32, invFreq []float32, bf16 bool) {
	fp := float32(pos)
	for j, f := range invFreq {
		ang := fp * f
		c, s := float32(math.Cos(float64(ang))), float32(math.Sin(float64(ang)))
		if bf16 {
			c, s = gpu.RoundBF16(c), gpu.RoundBF16(s)
		}
		cs[2*j], cs[2*j+1] = c, s
	}
}

// ropeRow rotates every head (hd columns) of row d by the angles of cs
// (ropeAngles): pairs (2j, 2j+1) or (j, j+hd/2) by style, each product and
// each sum rounded to bfloat16 when bf16, the fp32 rotation otherwise.
func ropeRow(d, cs []float32, hd int, style gpu.RoPEStyle, bf16 bool) {
	half := hd / 2
	for j := 0; j < half; j++ {
		c, s := cs[2*j], cs[2*j+1]
		for h := 0; h < len(d); h += hd {
			i0, i1 := h+j, h+j+half
			if style == gpu.Interleaved {
				i0, i1 = h+2*j, h+2*j+1
			}
			x0, x1 := d[i0], d[i1]
			if bf16 {
				d[i0] = gpu.RoundBF16(gpu.RoundBF16(x0*c) - gpu.RoundBF16(x1*s))
				d[i1] = gpu.RoundBF16(gpu.RoundBF16(x1*c) + gpu.RoundBF16(x0*s))
			} else {
				d[i0] = float32(x0*c) - float32(x1*s)
				d[i1] = float32(x1*c) + float32(x0*s)
			}
		}
	}
}

// ShortConv implements gpu.Queue.
func (q *Queue) ShortConv(dst, x, w, state gpu.Tensor) {
	sameShape("shortconv", dst, x)
	C := x.Cols
	L := w.Cols
	if w.Rows != C || state.Rows != L-1 || state.Cols != C || !w.Contiguous() {
		panic(fmt.Sprintf("cpu: shortconv x %v w %v state %v", x, w, state))
	}
	wk := q.workspace(1)[0]
	ws := weightInto(&wk.wts, w)
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
			// New state: the last L−1 rows of [state; x]. Row j reads row
			// T+j ≥ j, not yet overwritten when j ascends.
			if T > 0 {
				for j := 0; j < L-1; j++ {
					ss[j*state.Stride+c] = at(T+j, c)
				}
			}
		}
	})
}

// weightInto returns a contiguous weight tensor's values as float32: the
// slice itself for F32, else a conversion into *scratch.
func weightInto(scratch *[]float32, w gpu.Tensor) []float32 {
	if !w.Contiguous() {
		panic(fmt.Sprintf("cpu: weight %v is not contiguous", w))
	}
	return floatsInto(scratch, w, w.Len())
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
		clear(d)
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
