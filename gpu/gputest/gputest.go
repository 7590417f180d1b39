// Package gputest is the kernel contract of package gpu: a
// backend-independent harness that runs every op of a device's queue on
// fresh random inputs and compares the results with a float64 host replay
// of the documented semantics (gpu/queue.go), at the kernel's own rounding
// points and within a stated error bound per op.
//
// The rules every check follows:
//
//   - Inputs are fresh random values from a PCG stream seeded by Run's seed
//     and the op's name: mostly U(−1, 1) float32 values mixed with exact
//     small integers, never all zeros.
//   - Shapes include ragged edges: sizes that are not multiples of 4, 8 or
//     32, reduction lengths that are not multiples of 256, single rows and
//     odd column counts.
//   - Operands are views: most sit inside a larger buffer (a row and
//     column offset, a row stride wider than the view). Everything outside
//     a view holds a NaN poison, so a kernel that reads outside its source
//     views poisons its result.
//   - Outputs are poisoned before each op (the whole underlying buffer), so
//     an element the op does not write fails. Afterwards the whole buffer is
//     read back: padding that lost its poison means a write outside the
//     view, and a source buffer that changed means a write into a source.
//   - Exact ops must match the float32 rounding of the float64 result bit
//     for bit; reductions must stay within Higham's γ_n·Σ|terms| (γ_n =
//     n·u/(1−n·u), u = 2⁻²⁴) plus the roundings of their final steps;
//     transcendental functions within a few ulps. Each op's file states its
//     bound and why.
//
// Run never stops at a failure: a check that panics becomes a failed Check
// carrying the panic's text, and the remaining ops still run.
package gputest

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Check is the outcome of one case of one op.
type Check struct {
	// Op names the queue op ("matmul", "rope", …).
	Op string
	// Case names the inputs: shapes, dtypes and parameters.
	Case string
	// Err is the worst element's absolute error (the element with the
	// largest error relative to its bound; for exact ops the largest error).
	Err float64
	// Bound is that element's bound (0 for exact ops).
	Bound float64
	// Pass reports whether every element was within its bound, every
	// element outside the destination view kept its poison and no source
	// changed.
	Pass bool
	// Detail describes the worst element and any other violation.
	Detail string
}

// Report is the outcome of a Run.
type Report struct {
	Checks []Check
}

// Failed returns the checks that did not pass.
func (r Report) Failed() []Check {
	var f []Check
	for _, c := range r.Checks {
		if !c.Pass {
			f = append(f, c)
		}
	}
	return f
}

// FailedOps returns the ops with at least one failed check.
func (r Report) FailedOps() map[string]bool {
	ops := make(map[string]bool)
	for _, c := range r.Checks {
		if !c.Pass {
			ops[c.Op] = true
		}
	}
	return ops
}

// Summary returns "P/N checks passed", followed by the failed ops when
// there are any.
func (r Report) Summary() string {
	n, pass := len(r.Checks), 0
	for _, c := range r.Checks {
		if c.Pass {
			pass++
		}
	}
	s := fmt.Sprintf("%d/%d checks passed", pass, n)
	if pass < n {
		var failed []string
		for _, op := range Ops {
			if r.FailedOps()[op] {
				failed = append(failed, op)
			}
		}
		s += " (failed: " + strings.Join(failed, ", ") + ")"
	}
	return s
}

// Ops lists the op names Run checks, in the order it checks them.
var Ops = []string{
	"fill", "copy", "write", "transpose", "add", "mul", "addrow", "mulrow", "scale", "roundbf16",
	"act", "glu", "rmsnorm", "layernorm", "softmax", "rope", "embed", "embedids", "shortconv", "matmul", "matmulprompt", "logmel",
	"attention", "conv1d", "convtranspose1d", "conv2d", "sample", "normmatmul", "headnormrope",
	"attentionseqs", "shortconvseqs", "copyrows", "copymany", "relposscores", "headsmatmul", "block", "normglu", "shortconvgated",
}

// OptionalOps are the ops of Ops that a device may not have (an optional
// interface of package gpu): Run checks them only where the queue has
// them, and says why others have none.
var OptionalOps = map[string]string{
	"logmel": "gpu.LogMeler: without it the log-mel is computed on the host (package audio)",
}

// checkers maps every op name of Ops to its checks.
var checkers = map[string]func(*harness){
	"fill":            checkFill,
	"copy":            checkCopy,
	"write":           checkWrite,
	"matmulprompt":    checkMatMulPrompt,
	"logmel":          checkLogMel,
	"transpose":       checkTranspose,
	"add":             func(h *harness) { checkBinary(h, false) },
	"mul":             func(h *harness) { checkBinary(h, true) },
	"addrow":          func(h *harness) { checkRowOp(h, false) },
	"mulrow":          func(h *harness) { checkRowOp(h, true) },
	"scale":           checkScale,
	"roundbf16":       checkRoundBF16,
	"act":             checkAct,
	"glu":             checkGLU,
	"rmsnorm":         checkRMSNorm,
	"layernorm":       checkLayerNorm,
	"softmax":         checkSoftmax,
	"rope":            checkRoPE,
	"embed":           checkEmbed,
	"embedids":        checkEmbedIDs,
	"sample":          checkSample,
	"shortconv":       checkShortConv,
	"matmul":          checkMatMul,
	"attention":       checkAttention,
	"conv1d":          checkConv1D,
	"convtranspose1d": checkConvTranspose1D,
	"conv2d":          checkConv2D,
	"normmatmul":      checkNormMatMul,
	"headnormrope":    checkHeadNormRoPE,
	"attentionseqs":   checkAttentionSeqs,
	"shortconvseqs":   checkShortConvSeqs,
	"copyrows":        checkCopyRows,
	"copymany":        checkCopyMany,
	"relposscores":    checkRelPosScores,
	"headsmatmul":     checkHeadsMatMul,
	"block":           checkBlock,
	"normglu":         checkNormGLU,
	"shortconvgated":  checkShortConvGated,
}

// Run checks every op of a queue of dev against a float64 host replay and
// returns one Check per case. seed makes the random inputs; every op draws
// from its own stream (seed and the op's name), so a run restricted to some
// ops sees the same inputs. Run leaves dev open.
func Run(dev gpu.Device, seed uint64) Report { return RunWith(dev, seed, Options{}) }

// Options describe a backend's documented numerics where they differ from
// the default contract.
type Options struct {
	// TensorCoreMatMul states that MatMul splits x into three bf16 parts
	// and sums on tensor cores, whose fp32 accumulation truncates (products
	// are exact; each addition may lose up to one ulp, 2u, not u: Fasi,
	// Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor
	// cores", PeerJ CS 2021). The bound becomes γ′_{3K+17}·Σ|x·w| with unit
	// roundoff 2u (3K part products, the 16 class sums added, the bias)
	// plus 2^-24·Σ|x·w| for the split's remainder.
	TensorCoreMatMul bool
	// Ops restricts the run to these ops (all of Ops when empty).
	Ops []string
}

// RunWith is Run with a backend's Options.
func RunWith(dev gpu.Device, seed uint64, o Options) Report {
	var only func(string) bool
	if len(o.Ops) > 0 {
		only = func(op string) bool { return slices.Contains(o.Ops, op) }
	}
	return run(dev, seed, only, o)
}

// run is Run restricted to the ops for which only returns true (all when
// only is nil).
func run(dev gpu.Device, seed uint64, only func(op string) bool, o Options) Report {
	q := dev.NewQueue("gputest")
	var rep Report
	for _, op := range Ops {
		if only != nil && !only(op) {
			continue
		}
		h := &harness{dev: dev, q: q, op: op, rng: rand.New(rand.NewPCG(seed, opStream(op))), opts: o}
		h.run(checkers[op])
		rep.Checks = append(rep.Checks, h.checks...)
	}
	return rep
}

// opStream is the second PCG seed word of an op: a hash of its name.
func opStream(op string) uint64 {
	f := fnv.New64a()
	f.Write([]byte(op))
	return f.Sum64()
}

// u is the unit roundoff of float32 (round to nearest).
const u = 1.0 / (1 << 24)

// gamma is Higham's γ_n = n·u/(1−n·u): |fl(Σ_{i≤n} x_i·y_i) − Σ x_i·y_i| ≤
// γ_n·Σ|x_i·y_i| for any summation order, with or without fused
// multiply-adds.
func gamma(n int) float64 { return float64(n) * u / (1 - float64(n)*u) }

// ulp returns the spacing of float32 values at |x| (the distance from
// |x|, rounded to float32, to the next float32 away from zero).
func ulp(x float64) float64 {
	a := math.Abs(x)
	if a < 0x1p-126 {
		return 0x1p-149
	}
	_, e := math.Frexp(a) // a = f·2^e, f ∈ [0.5, 1): the binade [2^(e−1), 2^e)
	return math.Ldexp(1, e-24)
}

// The poison values: quiet NaNs with a payload that no op produces from
// finite inputs.
var (
	poison     = math.Float32frombits(0x7fc5_a5a5)
	poisonBF16 = uint16(0x7fc5)
	poisonF16  = uint16(0x7e5a)
)

func isPoison(f float32) bool { return math.Float32bits(f) == math.Float32bits(poison) }

// harness holds the state of one op's checks.
type harness struct {
	dev    gpu.Device
	q      gpu.Queue
	op     string
	rng    *rand.Rand
	checks []Check
	owned  []gpu.Tensor // buffers to free when the op's checks end
	keep   [][]byte     // bytes of Load'ed tensors (the CPU backend aliases them)
	opts   Options
	// top, when not 0, fixes the poisoned rows above an unstrided view at
	// top − 1 instead of drawing 0 or 1 (a backend may treat a weight that
	// starts at its buffer's first row apart: package cuda's tiled copies).
	top int
}

// run calls fn, turning a panic into a failed Check, and frees every buffer
// the op allocated.
func (h *harness) run(fn func(*harness)) {
	defer func() {
		for _, t := range h.owned {
			h.dev.Free(t)
		}
		h.owned, h.keep = nil, nil
	}()
	defer func() {
		if r := recover(); r != nil {
			h.checks = append(h.checks, Check{
				Op: h.op, Case: "panic",
				Detail: fmt.Sprintf("panic: %v\n%s", r, firstLines(string(debug.Stack()), 24)),
			})
		}
	}()
	fn(h)
	if err := h.q.Sync(); err != nil {
		h.fail("sync", "Sync: %v", err)
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// fail records a failed check without numbers (an error from the queue).
func (h *harness) fail(cs, format string, args ...any) {
	h.checks = append(h.checks, Check{Op: h.op, Case: cs, Detail: fmt.Sprintf(format, args...)})
}

// ---- random values ---------------------------------------------------------

// value returns a random float32: an exact small integer in [−2, 2] one time
// in eight, else U(−1, 1).
func (h *harness) value() float32 {
	if h.rng.IntN(8) == 0 {
		return float32(h.rng.IntN(5) - 2)
	}
	return float32(2*h.rng.Float64() - 1)
}

// values returns n random values (value), scaled by s, never all zeros.
func (h *harness) values(n int, s float32) []float32 {
	v := make([]float32, n)
	nz := false
	for i := range v {
		v[i] = h.value() * s
		nz = nz || v[i] != 0
	}
	if !nz && n > 0 {
		v[h.rng.IntN(n)] = s
	}
	return v
}

// bf16Values returns n random values rounded to bfloat16.
func (h *harness) bf16Values(n int, s float32) []float32 {
	v := h.values(n, s)
	for i := range v {
		v[i] = gpu.RoundBF16(v[i])
	}
	return v
}

// f16Bits returns a random IEEE half: a small integer one time in eight, a
// subnormal one time in 32, else a normal value of magnitude in [2⁻⁸, 2).
func (h *harness) f16Bits() uint16 {
	sign := uint16(h.rng.IntN(2)) << 15
	switch h.rng.IntN(32) {
	case 0, 1, 2, 3:
		return [...]uint16{0, 0x3c00, 0x4000, 0xbc00}[h.rng.IntN(4)]
	case 4:
		return sign | uint16(1+h.rng.IntN(0x3ff))
	}
	return sign | uint16(7+h.rng.IntN(9))<<10 | uint16(h.rng.IntN(0x400))
}

// ---- device operands -------------------------------------------------------

// operand is a device tensor view with the host image of its whole buffer.
type operand struct {
	view  gpu.Tensor
	whole gpu.Tensor // the whole buffer, [wholeRows, wholeCols], contiguous
	host  []float32  // the whole buffer as written (F32 operands)
	vals  []float32  // the view's values, row-major (rows·cols)
	dt    gpu.DType
}

// at returns the index in the whole buffer of the view's element (r, c).
func (o operand) at(r, c int) int { return o.view.Off - o.whole.Off + r*o.view.Stride + c }

// layout picks the whole buffer of a [rows, cols] view: strided views sit
// at a random row and column offset inside a wider, taller buffer;
// contiguous ones are followed (and sometimes preceded) by one guard row.
// It returns the whole buffer's shape and the view's offset and stride.
func (h *harness) layout(rows, cols int, strided bool) (wr, wc, off, stride int) {
	if strided {
		l, r := 1+h.rng.IntN(3), 1+h.rng.IntN(4)
		top := 1 + h.rng.IntN(2)
		wr, wc = rows+top+1, l+cols+r
		return wr, wc, top*wc + l, wc
	}
	top := h.rng.IntN(2)
	if h.top != 0 {
		top = h.top - 1
	}
	return rows + top + 1, cols, top * cols, cols
}

// f32 allocates a poisoned F32 view of [rows, cols].
func (h *harness) f32(rows, cols int, strided bool) operand {
	wr, wc, off, stride := h.layout(rows, cols, strided)
	whole := h.dev.Alloc(gpu.F32, wr, wc)
	h.owned = append(h.owned, whole)
	o := operand{whole: whole, dt: gpu.F32}
	o.view = gpu.Tensor{Buf: whole.Buf, Off: whole.Off + off, Rows: rows, Cols: cols, Stride: stride}
	o.host = make([]float32, wr*wc)
	for i := range o.host {
		o.host[i] = poison
	}
	h.q.Write(whole, o.host)
	return o
}

// input allocates an F32 view of [rows, cols] holding vals (poison around).
func (h *harness) input(rows, cols int, strided bool, vals []float32) operand {
	if len(vals) != rows*cols {
		panic(fmt.Sprintf("gputest: %d values for [%d,%d]", len(vals), rows, cols))
	}
	o := h.f32(rows, cols, strided)
	o.vals = vals
	for r := 0; r < rows; r++ {
		copy(o.host[o.at(r, 0):o.at(r, cols)], vals[r*cols:(r+1)*cols])
	}
	h.q.Write(o.view, vals)
	return o
}

// output returns where an op on the F32 view a writes in mode: a itself
// ("inplace") or a fresh F32 view of a's shape (strided for "strided"),
// and the sources verify must find unchanged: a unless it is the output,
// then others.
func (h *harness) output(a operand, mode string, others ...operand) (dst operand, srcs []operand) {
	if mode == "inplace" {
		return a, others
	}
	return h.f32(a.view.Rows, a.view.Cols, mode == "strided"), append([]operand{a}, others...)
}

// load makes a [rows, cols] view of dt (F32, BF16 or F16) with dev.Load, the
// rest of its buffer a NaN. vals holds the view's values; for BF16 they must
// be bf16 values, for F16 bits gives the halves instead. With vals and bits
// nil the view is poisoned too.
func (h *harness) load(dt gpu.DType, rows, cols int, strided bool, vals []float32, bits []uint16) operand {
	wr, wc, off, stride := h.layout(rows, cols, strided)
	n := wr * wc
	data := make([]byte, max(8, n*dt.Size()))[:n*dt.Size()] // 8-byte aligned start
	h.keep = append(h.keep, data)
	put := func(i int, f float32, b uint16) {
		switch dt {
		case gpu.F32:
			x := math.Float32bits(f)
			data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		default:
			data[2*i], data[2*i+1] = byte(b), byte(b>>8)
		}
	}
	half := poisonBF16
	if dt == gpu.F16 {
		half = poisonF16
	}
	for i := 0; i < n; i++ {
		put(i, poison, half)
	}
	o := operand{dt: dt, vals: vals}
	for r := 0; r < rows && (vals != nil || bits != nil); r++ {
		for c := 0; c < cols; c++ {
			i := off + r*stride + c
			switch dt {
			case gpu.F32:
				put(i, vals[r*cols+c], 0)
			case gpu.BF16:
				b := gpu.F32ToBF16(vals[r*cols+c])
				if gpu.BF16ToF32(b) != vals[r*cols+c] {
					panic("gputest: load of a value that is not bf16")
				}
				put(i, 0, b)
			case gpu.F16:
				put(i, 0, bits[r*cols+c])
			default:
				panic(fmt.Sprintf("gputest: load of %v", dt))
			}
		}
	}
	whole, err := h.dev.Load(dt, wr, wc, data)
	if err != nil {
		panic(fmt.Sprintf("gputest: load %v[%d,%d]: %v", dt, wr, wc, err))
	}
	h.owned = append(h.owned, whole)
	o.whole = whole
	o.view = gpu.Tensor{Buf: whole.Buf, Off: whole.Off + off, Rows: rows, Cols: cols, Stride: stride}
	return o
}

// weight makes a [rows, cols] weight of dt with random values (scaled by s)
// and returns it with its values as float32 (exact: the device's widening of
// the stored elements).
func (h *harness) weight(dt gpu.DType, rows, cols int, strided bool, s float32) operand {
	switch dt {
	case gpu.F32:
		return h.load(dt, rows, cols, strided, h.values(rows*cols, s), nil)
	case gpu.BF16:
		return h.load(dt, rows, cols, strided, h.bf16Values(rows*cols, s), nil)
	case gpu.F16:
		bits := make([]uint16, rows*cols)
		vals := make([]float32, len(bits))
		for i := range bits {
			bits[i] = h.f16Bits()
			vals[i] = gpu.F16ToF32(bits[i])
		}
		return h.load(dt, rows, cols, strided, vals, bits)
	}
	panic(fmt.Sprintf("gputest: weight of %v", dt))
}

// vector makes a [1, n] operand of dt (a bias or a norm weight): an F32
// view inside a poisoned buffer, or a loaded BF16/F16 vector.
func (h *harness) vector(dt gpu.DType, n int, s float32) operand {
	if dt == gpu.F32 {
		return h.input(1, n, h.rng.IntN(2) == 0, h.values(n, s))
	}
	return h.weight(dt, 1, n, h.rng.IntN(2) == 0, s)
}

// read returns the whole buffer of an F32 operand.
func (h *harness) read(o operand) ([]float32, error) {
	got := make([]float32, o.whole.Len())
	if err := h.q.Read(got, o.whole); err != nil {
		return nil, fmt.Errorf("read %v: %w", o.whole, err)
	}
	return got, nil
}

// ---- comparison ------------------------------------------------------------

// diff is the comparison of a view with its replay.
type diff struct {
	n, bad     int     // elements, elements out of bound
	worst      int     // index (row-major in the view) of the worst element
	ratio      float64 // worst error / bound (+Inf for an exact mismatch)
	err, bound float64
	got        float32
	want       float64
	pads       int // padding elements that lost their poison
	firstPad   int
	cols       int
}

// compare compares the view of o inside got (its whole buffer) with want;
// bound == nil asks for the float32 rounding of want bit for bit (NaN
// matching NaN). Every element of got outside the view must be the poison
// when checkPad is set.
func compare(o operand, got []float32, want, bound []float64, checkPad bool) diff {
	d := diff{n: len(want), worst: -1, firstPad: -1, cols: o.view.Cols}
	inView := make([]bool, len(got))
	for r := 0; r < o.view.Rows; r++ {
		for c := 0; c < o.view.Cols; c++ {
			i := r*o.view.Cols + c
			idx := o.at(r, c)
			inView[idx] = true
			g, w := got[idx], want[i]
			var e, b, ratio float64
			if bound == nil {
				w32 := float32(w)
				ok := math.Float32bits(g) == math.Float32bits(w32) || (g != g && w32 != w32)
				e = math.Abs(float64(g) - float64(w32))
				if !ok {
					d.bad++
					ratio = math.Inf(1)
					if e != e {
						e = math.Inf(1)
					}
				}
			} else {
				b = bound[i]
				e = math.Abs(float64(g) - w)
				switch {
				case e != e:
					e, ratio = math.Inf(1), math.Inf(1)
					d.bad++
				case e > b:
					ratio = math.Inf(1)
					if b > 0 {
						ratio = e / b
					}
					d.bad++
				case b > 0:
					ratio = e / b
				}
			}
			if d.worst < 0 || ratio > d.ratio || (ratio == d.ratio && e > d.err) {
				d.worst, d.ratio, d.err, d.bound, d.got, d.want = i, ratio, e, b, g, w
			}
		}
	}
	if checkPad {
		for i, g := range got {
			if !inView[i] && !isPoison(g) {
				if d.pads == 0 {
					d.firstPad = i
				}
				d.pads++
			}
		}
	}
	return d
}

func (d diff) ok() bool { return d.bad == 0 && d.pads == 0 }

func (d diff) String() string {
	var s []string
	if d.worst >= 0 {
		r, c := d.worst/d.cols, d.worst%d.cols
		s = append(s, fmt.Sprintf("worst [%d,%d]: got %.9g want %.9g (err %.3g, bound %.3g)", r, c, d.got, d.want, d.err, d.bound))
	}
	if d.bad > 0 {
		s = append(s, fmt.Sprintf("%d/%d elements out of bound", d.bad, d.n))
	}
	if d.pads > 0 {
		s = append(s, fmt.Sprintf("%d elements outside the view written (first at buffer index %d)", d.pads, d.firstPad))
	}
	return strings.Join(s, "; ")
}

// verify reads dst back and records a Check of its view against want (bound
// nil: exact), requiring the padding around the view to keep its poison and
// the whole buffers of srcs (F32 operands other than dst) to be unchanged.
func (h *harness) verify(cs string, dst operand, want, bound []float64, srcs ...operand) bool {
	got, err := h.read(dst)
	if err != nil {
		h.fail(cs, "%v", err)
		return false
	}
	d := compare(dst, got, want, bound, true)
	c := Check{Op: h.op, Case: cs, Err: d.err, Bound: d.bound, Pass: d.ok(), Detail: d.String()}
	if msg := h.unchanged(srcs...); msg != "" {
		c.Pass = false
		c.Detail += "; " + msg
	}
	h.checks = append(h.checks, c)
	return c.Pass
}

// unchanged reads back the F32 sources and describes any element that no
// longer holds what was written ("" when none changed).
func (h *harness) unchanged(srcs ...operand) string {
	var msgs []string
	for k, s := range srcs {
		if s.dt != gpu.F32 || s.host == nil {
			continue
		}
		got, err := h.read(s)
		if err != nil {
			msgs = append(msgs, err.Error())
			continue
		}
		n, first := 0, -1
		for i, g := range got {
			if math.Float32bits(g) != math.Float32bits(s.host[i]) {
				if n == 0 {
					first = i
				}
				n++
			}
		}
		if n > 0 {
			msgs = append(msgs, fmt.Sprintf("source %d: %d elements changed (first at buffer index %d)", k, n, first))
		}
	}
	return strings.Join(msgs, "; ")
}

// record appends a check built from explicit numbers.
func (h *harness) record(cs string, pass bool, err, bound float64, detail string) {
	h.checks = append(h.checks, Check{Op: h.op, Case: cs, Err: err, Bound: bound, Pass: pass, Detail: detail})
}

// tag returns "/strided" for strided views.
func tag(strided bool) string {
	if strided {
		return "/strided"
	}
	return ""
}

func dtName(dt gpu.DType) string { return strings.ToLower(dt.String()) }

// widen returns float32 values as float64.
func widen(v []float32) []float64 {
	w := make([]float64, len(v))
	for i, x := range v {
		w[i] = float64(x)
	}
	return w
}
