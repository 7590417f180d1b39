//go:build ignore

// gen_kernels writes the AVX2+FMA tile kernels of package cpu:
// kernels_amd64.s (the code) and kernels_amd64_gen.go (their Go
// declarations and dispatch tables). Run it with `go generate ./gpu/cpu`
// after changing it; its output is committed, and nothing imports it.
//
// Two kernel families, each for F32, BF16 and F16 right operands:
//
//   - dot tiles (x·wᵀ, w row-major [N,K]): an mr×nr tile of outputs, each
//     with one 8-lane accumulator over K in steps of 8; lane l sums
//     x[k+l]·w[k+l] with one FMA per step. The end either stores the raw
//     accumulators (a K block that is not the last) or reduces each one as
//     ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)) and stores the sum. Every tile
//     shape performs exactly these operations per output, which is what makes
//     an output independent of the tile it was computed in.
//   - axpy tiles (x·w, w row-major [K,N]): mr rows × nv vectors of 8 output
//     columns, each column's sum running sequentially over K with one FMA per
//     step (broadcast x[m,k] times w row k).
//
// The dot tiles of up to prefetchRows rows prefetch the next tile's weight
// rows (they serve the one-pass GEMV of a decode step, which streams the
// weights from DRAM). The four-row tiles exist twice: without prefetch for
// the blocked GEMM (its weight block sits in L2) and with it ("s", stream)
// for the one-pass product of a batched decode step. The two perform the
// same arithmetic.
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
	"math"
	"os"
	"strings"
)

type dtype struct {
	name  string // F32, BF16, F16
	size  int    // bytes per element
	gotyp string
}

var dtypes = []dtype{{"F32", 4, "float32"}, {"BF16", 2, "uint16"}, {"F16", 2, "uint16"}}

// Offsets of the fields of tileArgs (kernels.go), 8 bytes each.
const (
	argX    = 0
	argXS   = 8
	argW    = 16
	argWS   = 24
	argK    = 32
	argAcc  = 40
	argOut  = 48
	argOS   = 56
	argMode = 64
)

type shape struct{ mr, nr int }

// Dot tiles: mr·nr accumulators + nr weight vectors + 1 x vector ≤ 16.
var dotShapes = []shape{
	{1, 1}, {1, 2}, {1, 3}, {1, 4},
	{2, 1}, {2, 2}, {2, 3}, {2, 4},
	{3, 1}, {3, 2}, {3, 3},
	{4, 1}, {4, 2}, {4, 3},
}

// Stream dot tiles: the prefetching twins of the dot tiles with more than
// prefetchRows rows, for the one-pass product (matmul.go's runStream).
var streamShapes = []shape{{4, 1}, {4, 2}, {4, 3}}

// Axpy tiles: mr rows × nv vectors of 8 columns; mr·nv + nv + 1 ≤ 16.
var axpyShapes = []shape{
	{1, 1}, {1, 2}, {1, 3}, {1, 4},
	{2, 1}, {2, 2}, {2, 3}, {2, 4},
	{3, 1}, {3, 2}, {3, 3},
	{4, 1}, {4, 2}, {4, 3},
}

type gen struct{ b bytes.Buffer }

func (g *gen) p(format string, a ...any) { fmt.Fprintf(&g.b, format+"\n", a...) }

func y(i int) string { return fmt.Sprintf("Y%d", i) }
func x(i int) string { return fmt.Sprintf("X%d", i) }

// row returns the address of row i (0..3) of a base register with stride
// register s and 3·stride register s3, plus a byte offset.
func row(base, s, s3 string, i, off int) string {
	o := ""
	if off != 0 {
		o = fmt.Sprint(off)
	}
	switch i {
	case 0:
		return fmt.Sprintf("%s(%s)", o, base)
	case 1:
		return fmt.Sprintf("%s(%s)(%s*1)", o, base, s)
	case 2:
		return fmt.Sprintf("%s(%s)(%s*2)", o, base, s)
	case 3:
		return fmt.Sprintf("%s(%s)(%s*1)", o, base, s3)
	}
	panic("row")
}

// load8 widens 8 elements at addr into register r as float32.
func (g *gen) load8(dt dtype, addr, r string) {
	switch dt.name {
	case "F32":
		g.p("\tVMOVUPS %s, %s", addr, r)
	case "BF16":
		g.p("\tVPMOVZXWD %s, %s", addr, r)
		g.p("\tVPSLLD $16, %s, %s", r, r)
	case "F16":
		g.p("\tVCVTPH2PS %s, %s", addr, r)
	}
}

func dotName(dt dtype, s shape) string { return fmt.Sprintf("dot%s_%dx%d", dt.name, s.mr, s.nr) }

// streamName names a stream dot tile: the dot tile itself when it
// prefetches anyway, else its prefetching twin.
func streamName(dt dtype, s shape) string {
	if s.mr <= prefetchRows {
		return dotName(dt, s)
	}
	return dotName(dt, s) + "s"
}
func axpyName(dt dtype, s shape) string { return fmt.Sprintf("axpy%s_%dx%d", dt.name, s.mr, s.nr) }

// Registers: AX the argument block; SI x, R8 x stride, R9 3·x stride; DI w,
// R10 w stride, R11 3·w stride; CX step count. The output registers (DX out,
// BX out stride, R12 3·out stride, R13 acc) are loaded by epilogue, so that
// R12 can serve the loop (a prefetch pointer).
func (g *gen) prologue(name string) {
	g.p("// func %s(a *tileArgs)", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-8", name)
	g.p("\tMOVQ a+0(FP), AX")
	g.p("\tMOVQ %d(AX), SI", argX)
	g.p("\tMOVQ %d(AX), R8", argXS)
	g.p("\tLEAQ (R8)(R8*2), R9")
	g.p("\tMOVQ %d(AX), DI", argW)
	g.p("\tMOVQ %d(AX), R10", argWS)
	g.p("\tLEAQ (R10)(R10*2), R11")
	g.p("\tMOVQ %d(AX), CX", argK)
}

func (g *gen) outRegs() {
	g.p("\tMOVQ %d(AX), R13", argAcc)
	g.p("\tMOVQ %d(AX), DX", argOut)
	g.p("\tMOVQ %d(AX), BX", argOS)
	g.p("\tLEAQ (BX)(BX*2), R12")
}

// prefetchRows: the dot kernels with this many rows of x or fewer (the GEMV
// of a decode step) prefetch the next tile's weight rows while they stream
// the current ones. Each row of a decode matmul is a few KB, so a tile's
// rows are short streams the hardware prefetcher barely ramps up on.
const prefetchRows = 3

// dot emits the dot tile of shape s; pf makes it prefetch the next tile's
// weight rows (the nr rows below, at the same column).
func (g *gen) dot(dt dtype, s shape, name string, pf bool) {
	na := s.mr * s.nr
	acc := func(i, j int) int { return i*s.nr + j }
	wreg := func(j int) int { return na + j }
	xreg := na + s.nr
	g.prologue(name)
	// Initial accumulators: zero, or the spilled ones of the previous K block.
	g.p("\tTESTQ $%d, %d(AX)", 1, argMode)
	g.p("\tJNZ %s_load", name)
	for i := 0; i < na; i++ {
		g.p("\tVXORPS %s, %s, %s", y(i), y(i), y(i))
	}
	g.p("\tJMP %s_start", name)
	g.p("%s_load:", name)
	g.p("\tMOVQ %d(AX), R13", argAcc)
	for i := 0; i < na; i++ {
		g.p("\tVMOVUPS %d(R13), %s", 32*i, y(i))
	}
	g.p("%s_start:", name)
	if pf {
		// R12: the same column of the weight row nr rows below.
		g.p("\tMOVQ R10, R12")
		g.p("\tIMULQ $%d, R12", s.nr)
		g.p("\tADDQ DI, R12")
	}
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %s_end", name)
	g.p("%s_loop:", name)
	if pf {
		for j := 0; j < s.nr; j++ {
			g.p("\tPREFETCHT0 %s", row("R12", "R10", "R11", j, 0))
		}
	}
	for j := 0; j < s.nr; j++ {
		g.load8(dt, row("DI", "R10", "R11", j, 0), y(wreg(j)))
	}
	for i := 0; i < s.mr; i++ {
		g.p("\tVMOVUPS %s, %s", row("SI", "R8", "R9", i, 0), y(xreg))
		for j := 0; j < s.nr; j++ {
			g.p("\tVFMADD231PS %s, %s, %s", y(wreg(j)), y(xreg), y(acc(i, j)))
		}
	}
	g.p("\tADDQ $32, SI")
	g.p("\tADDQ $%d, DI", 8*dt.size)
	if pf {
		g.p("\tADDQ $%d, R12", 8*dt.size)
	}
	g.p("\tDECQ CX")
	g.p("\tJNZ %s_loop", name)
	g.p("%s_end:", name)
	g.outRegs()
	g.p("\tTESTQ $%d, %d(AX)", 2, argMode)
	g.p("\tJZ %s_reduce", name)
	for i := 0; i < na; i++ {
		g.p("\tVMOVUPS %s, %d(R13)", y(i), 32*i)
	}
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("%s_reduce:", name)
	// Temporaries: the registers after the accumulators (free now).
	t1, t2 := na, na+1
	if t2 > 15 {
		panic("registers")
	}
	for i := 0; i < s.mr; i++ {
		a := func(j int) string { return y(acc(i, j)) }
		switch s.nr {
		case 1:
			g.p("\tVHADDPS %s, %s, %s", a(0), a(0), y(t1))
			g.p("\tVHADDPS %s, %s, %s", y(t1), y(t1), y(t1))
		case 2:
			g.p("\tVHADDPS %s, %s, %s", a(1), a(0), y(t1))
			g.p("\tVHADDPS %s, %s, %s", y(t1), y(t1), y(t1))
		case 3:
			g.p("\tVHADDPS %s, %s, %s", a(1), a(0), y(t1))
			g.p("\tVHADDPS %s, %s, %s", a(2), a(2), y(t2))
			g.p("\tVHADDPS %s, %s, %s", y(t2), y(t1), y(t1))
		case 4:
			g.p("\tVHADDPS %s, %s, %s", a(1), a(0), y(t1))
			g.p("\tVHADDPS %s, %s, %s", a(3), a(2), y(t2))
			g.p("\tVHADDPS %s, %s, %s", y(t2), y(t1), y(t1))
		}
		g.p("\tVEXTRACTF128 $1, %s, %s", y(t1), x(t2))
		g.p("\tVADDPS %s, %s, %s", x(t2), x(t1), x(t1))
		out := row("DX", "BX", "R12", i, 0)
		switch s.nr {
		case 1:
			g.p("\tVMOVSS %s, %s", x(t1), out)
		case 2:
			g.p("\tVMOVQ %s, %s", x(t1), out)
		case 3:
			g.p("\tVMOVQ %s, %s", x(t1), out)
			g.p("\tVEXTRACTPS $2, %s, %s", x(t1), row("DX", "BX", "R12", i, 8))
		case 4:
			g.p("\tVMOVUPS %s, %s", x(t1), out)
		}
	}
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("")
}

// axpy: out[m, 8v+l] = (mode&1 ? out : 0) + Σ_k x[m,k]·w[k, 8v+l], with x
// advancing 4 bytes and w one row (R10 bytes) per step.
func (g *gen) axpy(dt dtype, s shape) {
	name := axpyName(dt, s)
	nv := s.nr
	na := s.mr * nv
	acc := func(i, v int) int { return i*nv + v }
	wreg := func(v int) int { return na + v }
	xreg := na + nv
	g.prologue(name)
	g.outRegs()
	g.p("\tTESTQ $%d, %d(AX)", 1, argMode)
	g.p("\tJNZ %s_load", name)
	for i := 0; i < na; i++ {
		g.p("\tVXORPS %s, %s, %s", y(i), y(i), y(i))
	}
	g.p("\tJMP %s_start", name)
	g.p("%s_load:", name)
	for i := 0; i < s.mr; i++ {
		for v := 0; v < nv; v++ {
			g.p("\tVMOVUPS %s, %s", row("DX", "BX", "R12", i, 32*v), y(acc(i, v)))
		}
	}
	g.p("%s_start:", name)
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %s_end", name)
	g.p("%s_loop:", name)
	for v := 0; v < nv; v++ {
		off := ""
		if v > 0 {
			off = fmt.Sprint(8 * dt.size * v)
		}
		g.load8(dt, off+"(DI)", y(wreg(v)))
	}
	for i := 0; i < s.mr; i++ {
		g.p("\tVBROADCASTSS %s, %s", row("SI", "R8", "R9", i, 0), y(xreg))
		for v := 0; v < nv; v++ {
			g.p("\tVFMADD231PS %s, %s, %s", y(wreg(v)), y(xreg), y(acc(i, v)))
		}
	}
	g.p("\tADDQ $4, SI")
	g.p("\tADDQ R10, DI")
	g.p("\tDECQ CX")
	g.p("\tJNZ %s_loop", name)
	g.p("%s_end:", name)
	for i := 0; i < s.mr; i++ {
		for v := 0; v < nv; v++ {
			g.p("\tVMOVUPS %s, %s", y(acc(i, v)), row("DX", "BX", "R12", i, 32*v))
		}
	}
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("")
}

// ---- Elementwise kernels (elem.go holds their Go twins) ----
//
// Every kernel processes n elements, n a multiple of 8, and performs exactly
// the float32 operations of its Go twin, in the same order and without FMA
// (except vfma), so that both agree bit for bit.

// constants are 8 replicated 32-bit values in read-only memory, used as
// memory operands.
var constants = []struct {
	name string
	bits uint32
}{
	{"one", f32bits(1)},
	{"signbit", 0x80000000},
	{"absmask", 0x7fffffff},
	{"explo", f32bits(-104)},
	{"exphi", f32bits(89)},
	{"log2e", f32bits(1.44269504088896341)},
	{"c1", f32bits(0.693359375)},
	{"c2", f32bits(-2.12194440e-4)},
	{"p0", f32bits(1.9875691500e-4)},
	{"p1", f32bits(1.3981999507e-3)},
	{"p2", f32bits(8.3334519073e-3)},
	{"p3", f32bits(4.1665795894e-2)},
	{"p4", f32bits(1.6666665459e-1)},
	{"p5", f32bits(5.0000001201e-1)},
	{"bias127", 127},
	{"expm1cut", f32bits(0.3465736)},
	{"e2", f32bits(1.0 / 2)},
	{"e3", f32bits(1.0 / 6)},
	{"e4", f32bits(1.0 / 24)},
	{"e5", f32bits(1.0 / 120)},
	{"e6", f32bits(1.0 / 720)},
	{"e7", f32bits(1.0 / 5040)},
	{"e8", f32bits(1.0 / 40320)},
	{"ione", 1},
	{"i7fff", 0x7fff},
	{"hi16", 0xffff0000},
	{"inf", 0x7f800000},
	{"quiet", 0x00400000},
	{"neginf", 0xff800000},
}

func f32bits(v float64) uint32 { return math.Float32bits(float32(v)) }

func c(name string) string { return "·" + name + "<>(SB)" }

func (g *gen) consts() {
	for _, k := range constants {
		for i := 0; i < 8; i++ {
			g.p("DATA ·%s<>+%d(SB)/4, $0x%08x", k.name, 4*i, k.bits)
		}
		g.p("GLOBL ·%s<>(SB), RODATA|NOPTR, $32", k.name)
	}
	g.p("")
}

// exp8 sets register x to exp(x) (exp32 in elem.go); n, r, t are
// temporaries.
func (g *gen) exp8(x, n, r, t string) {
	g.p("\tVMOVUPS %s, %s", c("explo"), t)
	g.p("\tVMAXPS %s, %s, %s", x, t, x) // max(lo, x): a NaN x stays
	g.p("\tVMOVUPS %s, %s", c("exphi"), t)
	g.p("\tVMINPS %s, %s, %s", x, t, x)
	g.p("\tVMULPS %s, %s, %s", c("log2e"), x, n)
	g.p("\tVROUNDPS $0, %s, %s", n, n)
	g.p("\tVMULPS %s, %s, %s", c("c1"), n, r)
	g.p("\tVSUBPS %s, %s, %s", r, x, r) // r = x − n·C1
	g.p("\tVMULPS %s, %s, %s", c("c2"), n, t)
	g.p("\tVSUBPS %s, %s, %s", t, r, r) // r −= n·C2
	g.p("\tVMULPS %s, %s, %s", r, r, t) // z = r²
	g.p("\tVMULPS %s, %s, %s", c("p0"), r, x)
	for _, k := range []string{"p1", "p2", "p3", "p4"} {
		g.p("\tVADDPS %s, %s, %s", c(k), x, x)
		g.p("\tVMULPS %s, %s, %s", r, x, x)
	}
	g.p("\tVADDPS %s, %s, %s", c("p5"), x, x)
	g.p("\tVMULPS %s, %s, %s", t, x, x) // p·z
	g.p("\tVADDPS %s, %s, %s", r, x, x) // + r
	g.p("\tVADDPS %s, %s, %s", c("one"), x, x)
	g.p("\tVCVTPS2DQ %s, %s", n, n)
	g.p("\tVPSRAD $1, %s, %s", n, t)    // na = n >> 1
	g.p("\tVPSUBD %s, %s, %s", t, n, n) // nb = n − na
	g.p("\tVPADDD %s, %s, %s", c("bias127"), t, t)
	g.p("\tVPSLLD $23, %s, %s", t, t)
	g.p("\tVMULPS %s, %s, %s", t, x, x)
	g.p("\tVPADDD %s, %s, %s", c("bias127"), n, n)
	g.p("\tVPSLLD $23, %s, %s", n, n)
	g.p("\tVMULPS %s, %s, %s", n, x, x)
}

// elemLoop emits a loop over CX/8 blocks: body uses SI, DX, R8 (inputs)
// and DI (output), advanced by 32 bytes each.
func (g *gen) elemLoop(name string, ptrs []string, body func()) {
	g.p("\tSHRQ $3, CX")
	g.p("\tJZ %s_done", name)
	g.p("%s_loop:", name)
	body()
	for _, r := range ptrs {
		g.p("\tADDQ $32, %s", r)
	}
	g.p("\tDECQ CX")
	g.p("\tJNZ %s_loop", name)
	g.p("%s_done:", name)
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("")
}

type elemFn struct {
	name, sig string
	frame     int
	args      []string // asm loads, in order
	ptrs      []string
	body      func(g *gen)
	pre       func(g *gen)
	post      func(g *gen)
}

func (g *gen) elem(f elemFn) {
	g.p("// func %s%s", f.name, f.sig)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-%d", f.name, f.frame)
	for _, a := range f.args {
		g.p("\t%s", a)
	}
	if f.pre != nil {
		f.pre(g)
	}
	if f.post == nil {
		g.elemLoop(f.name, f.ptrs, func() { f.body(g) })
		return
	}
	g.p("\tSHRQ $3, CX")
	g.p("\tJZ %s_done", f.name)
	g.p("%s_loop:", f.name)
	f.body(g)
	for _, r := range f.ptrs {
		g.p("\tADDQ $32, %s", r)
	}
	g.p("\tDECQ CX")
	g.p("\tJNZ %s_loop", f.name)
	g.p("%s_done:", f.name)
	f.post(g)
	g.p("\tVZEROUPPER")
	g.p("\tRET")
	g.p("")
}

// reduce8 emits the sum ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) of Y0 into X0.
func (g *gen) reduce8() {
	g.p("\tVHADDPS Y0, Y0, Y0")
	g.p("\tVHADDPS Y0, Y0, Y0")
	g.p("\tVEXTRACTF128 $1, Y0, X1")
	g.p("\tVADDPS X1, X0, X0")
}

func elemFns() []elemFn {
	dab := []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "MOVQ b+16(FP), DX", "MOVQ n+24(FP), CX"}
	da := []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "MOVQ n+16(FP), CX"}
	binary := func(name, op string) elemFn {
		return elemFn{name: name, sig: "(d, a, b *float32, n int)", frame: 32, args: dab, ptrs: []string{"DI", "SI", "DX"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y0")
				g.p("\t%s (DX), Y0, Y0", op)
				g.p("\tVMOVUPS Y0, (DI)")
			}}
	}
	return []elemFn{
		binary("vadd", "VADDPS"),
		binary("vmul", "VMULPS"),
		{name: "vfma", sig: "(d, a, b *float32, n int)", frame: 32, args: dab, ptrs: []string{"DI", "SI", "DX"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (DI), Y0")
				g.p("\tVMOVUPS (SI), Y1")
				g.p("\tVFMADD231PS (DX), Y1, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vscale", sig: "(d, a *float32, s float32, n int)", frame: 32,
			args: []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "VBROADCASTSS s+16(FP), Y2", "MOVQ n+24(FP), CX"},
			ptrs: []string{"DI", "SI"},
			body: func(g *gen) {
				g.p("\tVMULPS (SI), Y2, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vdivs", sig: "(d *float32, s float32, n int)", frame: 24,
			args: []string{"MOVQ d+0(FP), DI", "VBROADCASTSS s+8(FP), Y2", "MOVQ n+16(FP), CX"},
			ptrs: []string{"DI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (DI), Y0")
				g.p("\tVDIVPS Y2, Y0, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vround", sig: "(d *float32, n int)", frame: 16,
			args: []string{"MOVQ d+0(FP), DI", "MOVQ n+8(FP), CX"},
			ptrs: []string{"DI"},
			body: func(g *gen) {
				g.p("\tVMOVDQU (DI), Y0")
				g.p("\tVPSRLD $16, Y0, Y1")
				g.p("\tVPAND %s, Y1, Y1", c("ione"))
				g.p("\tVPADDD %s, Y1, Y1", c("i7fff"))
				g.p("\tVPADDD Y1, Y0, Y1") // b + 0x7fff + lsb
				g.p("\tVPAND %s, Y1, Y1", c("hi16"))
				g.p("\tVPAND %s, Y0, Y2", c("absmask"))
				g.p("\tVPCMPGTD %s, Y2, Y2", c("inf")) // NaN lanes
				g.p("\tVPAND %s, Y0, Y3", c("hi16"))
				g.p("\tVPOR %s, Y3, Y3", c("quiet"))
				g.p("\tVPBLENDVB Y2, Y3, Y1, Y1")
				g.p("\tVMOVDQU Y1, (DI)")
			}},
		{name: "vexpshift", sig: "(d, a *float32, shift float32, n int)", frame: 32,
			args: []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "VBROADCASTSS shift+16(FP), Y5", "MOVQ n+24(FP), CX"},
			ptrs: []string{"DI", "SI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y0")
				g.p("\tVSUBPS Y5, Y0, Y0")
				g.exp8("Y0", "Y1", "Y2", "Y3")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vsilu", sig: "(d, a *float32, n int)", frame: 24, args: da, ptrs: []string{"DI", "SI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y4")
				g.p("\tVXORPS %s, Y4, Y0", c("signbit"))
				g.exp8("Y0", "Y1", "Y2", "Y3")
				g.p("\tVADDPS %s, Y0, Y0", c("one"))
				g.p("\tVDIVPS Y0, Y4, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vsigmoid", sig: "(d, a *float32, n int)", frame: 24, args: da, ptrs: []string{"DI", "SI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y0")
				g.p("\tVXORPS %s, Y0, Y0", c("signbit"))
				g.exp8("Y0", "Y1", "Y2", "Y3")
				g.p("\tVADDPS %s, Y0, Y0", c("one"))
				g.p("\tVMOVUPS %s, Y4", c("one"))
				g.p("\tVDIVPS Y0, Y4, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vglu", sig: "(d, a, gate *float32, n int)", frame: 32,
			args: []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "MOVQ gate+16(FP), DX", "MOVQ n+24(FP), CX"},
			ptrs: []string{"DI", "SI", "DX"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (DX), Y0")
				g.p("\tVXORPS %s, Y0, Y0", c("signbit"))
				g.exp8("Y0", "Y1", "Y2", "Y3")
				g.p("\tVADDPS %s, Y0, Y0", c("one"))
				g.p("\tVMOVUPS (SI), Y4")
				g.p("\tVDIVPS Y0, Y4, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "velu", sig: "(d, a *float32, n int)", frame: 24, args: da, ptrs: []string{"DI", "SI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y4")
				// e = exp(x) − 1
				g.p("\tVMOVAPS Y4, Y0")
				g.exp8("Y0", "Y1", "Y2", "Y3")
				g.p("\tVSUBPS %s, Y0, Y0", c("one"))
				// q = Taylor of expm1: ((… e8·x + e7)·x …)·x + e2; p = x²·q + x
				g.p("\tVMULPS %s, Y4, Y5", c("e8"))
				for _, k := range []string{"e7", "e6", "e5", "e4", "e3"} {
					g.p("\tVADDPS %s, Y5, Y5", c(k))
					g.p("\tVMULPS Y4, Y5, Y5")
				}
				g.p("\tVADDPS %s, Y5, Y5", c("e2"))
				g.p("\tVMULPS Y4, Y4, Y6")
				g.p("\tVMULPS Y5, Y6, Y5")
				g.p("\tVADDPS Y4, Y5, Y5")
				// |x| < cut: the polynomial
				g.p("\tVANDPS %s, Y4, Y6", c("absmask"))
				g.p("\tVCMPPS $0x11, %s, Y6, Y6", c("expm1cut")) // LT_OQ
				g.p("\tVBLENDVPS Y6, Y5, Y0, Y0")
				// x > 0: x
				g.p("\tVXORPS Y7, Y7, Y7")
				g.p("\tVCMPPS $0x1e, Y7, Y4, Y6") // GT_OQ
				g.p("\tVBLENDVPS Y6, Y4, Y0, Y0")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vlnorm", sig: "(d, a, w, b *float32, mean, inv float32, n int)", frame: 48,
			args: []string{"MOVQ d+0(FP), DI", "MOVQ a+8(FP), SI", "MOVQ w+16(FP), DX", "MOVQ b+24(FP), R8",
				"VBROADCASTSS mean+32(FP), Y4", "VBROADCASTSS inv+36(FP), Y5", "MOVQ n+40(FP), CX"},
			ptrs: []string{"DI", "SI", "DX"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y0")
				g.p("\tVSUBPS Y4, Y0, Y0")
				g.p("\tVMULPS Y5, Y0, Y0")
				g.p("\tVMULPS (DX), Y0, Y0")
				g.p("\tTESTQ R8, R8")
				g.p("\tJZ vlnorm_nob")
				g.p("\tVADDPS (R8), Y0, Y0")
				g.p("\tADDQ $32, R8")
				g.p("vlnorm_nob:")
				g.p("\tVMOVUPS Y0, (DI)")
			}},
		{name: "vsum", sig: "(a *float32, n int) float32", frame: 20,
			args: []string{"MOVQ a+0(FP), SI", "MOVQ n+8(FP), CX", "VXORPS Y0, Y0, Y0"},
			ptrs: []string{"SI"},
			body: func(g *gen) { g.p("\tVADDPS (SI), Y0, Y0") },
			post: func(g *gen) {
				g.reduce8()
				g.p("\tVMOVSS X0, ret+16(FP)")
			}},
		{name: "vsumsq", sig: "(a *float32, m float32, n int) float32", frame: 28,
			args: []string{"MOVQ a+0(FP), SI", "VBROADCASTSS m+8(FP), Y2", "MOVQ n+16(FP), CX", "VXORPS Y0, Y0, Y0"},
			ptrs: []string{"SI"},
			body: func(g *gen) {
				g.p("\tVMOVUPS (SI), Y1")
				g.p("\tVSUBPS Y2, Y1, Y1")
				g.p("\tVMULPS Y1, Y1, Y1")
				g.p("\tVADDPS Y1, Y0, Y0")
			},
			post: func(g *gen) {
				g.reduce8()
				g.p("\tVMOVSS X0, ret+24(FP)")
			}},
		// vstream reads n floats (n a multiple of 32) as fast as it can and
		// returns their sum in a scrambled order: the memory bandwidth probe
		// of the benchmarks.
		{name: "vstream", sig: "(a *float32, n int) float32", frame: 20,
			args: []string{"MOVQ a+0(FP), SI", "MOVQ n+8(FP), CX", "SHRQ $2, CX", "VXORPS Y0, Y0, Y0", "VXORPS Y1, Y1, Y1", "VXORPS Y2, Y2, Y2", "VXORPS Y3, Y3, Y3"},
			ptrs: []string{"SI"},
			body: func(g *gen) {
				g.p("\tVADDPS (SI), Y0, Y0")
				g.p("\tVADDPS 32(SI), Y1, Y1")
				g.p("\tVADDPS 64(SI), Y2, Y2")
				g.p("\tVADDPS 96(SI), Y3, Y3")
				g.p("\tADDQ $96, SI")
			},
			post: func(g *gen) {
				g.p("\tVADDPS Y1, Y0, Y0")
				g.p("\tVADDPS Y3, Y2, Y2")
				g.p("\tVADDPS Y2, Y0, Y0")
				g.reduce8()
				g.p("\tVMOVSS X0, ret+16(FP)")
			}},
		// vfmapeak runs n/8 iterations of 12 independent 8-lane FMAs on
		// registers (no memory): the FMA peak probe of the benchmarks.
		{name: "vfmapeak", sig: "(n int)", frame: 8,
			args: []string{"MOVQ n+0(FP), CX", "VXORPS Y0, Y0, Y0", "VXORPS Y1, Y1, Y1", "VXORPS Y2, Y2, Y2",
				"VXORPS Y3, Y3, Y3", "VXORPS Y4, Y4, Y4", "VXORPS Y5, Y5, Y5", "VXORPS Y6, Y6, Y6", "VXORPS Y7, Y7, Y7",
				"VXORPS Y8, Y8, Y8", "VXORPS Y9, Y9, Y9", "VXORPS Y10, Y10, Y10", "VXORPS Y11, Y11, Y11",
				"VXORPS Y12, Y12, Y12", "VXORPS Y13, Y13, Y13"},
			body: func(g *gen) {
				for i := 0; i < 12; i++ {
					g.p("\tVFMADD231PS Y12, Y13, Y%d", i)
				}
			}},
		{name: "vmax", sig: "(a *float32, n int) float32", frame: 20,
			args: []string{"MOVQ a+0(FP), SI", "MOVQ n+8(FP), CX", "VMOVUPS " + c("neginf") + ", Y0"},
			ptrs: []string{"SI"},
			body: func(g *gen) { g.p("\tVMAXPS (SI), Y0, Y0") },
			post: func(g *gen) {
				g.p("\tVEXTRACTF128 $1, Y0, X1")
				g.p("\tVMAXPS X1, X0, X0")
				g.p("\tVPERMILPS $0x4e, X0, X1")
				g.p("\tVMAXPS X1, X0, X0")
				g.p("\tVPERMILPS $0xb1, X0, X1")
				g.p("\tVMAXPS X1, X0, X0")
				g.p("\tVMOVSS X0, ret+16(FP)")
			}},
	}
}

func genElem() {
	var g gen
	g.p("// Code generated by gen_kernels.go; DO NOT EDIT.")
	g.p("")
	g.p("//go:build amd64 && !purego")
	g.p("")
	g.p("#include \"textflag.h\"")
	g.p("")
	g.consts()
	fns := elemFns()
	for _, f := range fns {
		g.elem(f)
	}
	if err := os.WriteFile("elem_amd64.s", g.b.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	var d bytes.Buffer
	pr := func(format string, a ...any) { fmt.Fprintf(&d, format+"\n", a...) }
	pr("// Code generated by gen_kernels.go; DO NOT EDIT.")
	pr("")
	pr("//go:build amd64 && !purego")
	pr("")
	pr("package cpu")
	pr("")
	for _, f := range fns {
		pr("//go:noescape")
		pr("func %s%s", f.name, f.sig)
		pr("")
	}
	src, err := format.Source(d.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("elem_amd64_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
	// Stubs for other architectures: never called (haveAsm is false).
	d.Reset()
	pr("// Code generated by gen_kernels.go; DO NOT EDIT.")
	pr("")
	pr("//go:build !amd64 || purego")
	pr("")
	pr("package cpu")
	pr("")
	for _, f := range fns {
		pr("func %s%s { panic(\"cpu: no assembly kernels on this architecture\") }", f.name, f.sig)
		pr("")
	}
	src, err = format.Source(d.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("elem_other_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}

func main() {
	genElem()
	var s gen
	s.p("// Code generated by gen_kernels.go; DO NOT EDIT.")
	s.p("")
	s.p("//go:build amd64 && !purego")
	s.p("")
	s.p("#include \"textflag.h\"")
	s.p("")
	for _, dt := range dtypes {
		for _, sh := range dotShapes {
			s.dot(dt, sh, dotName(dt, sh), sh.mr <= prefetchRows)
		}
		for _, sh := range streamShapes {
			s.dot(dt, sh, streamName(dt, sh), true)
		}
		for _, sh := range axpyShapes {
			s.axpy(dt, sh)
		}
	}
	if err := os.WriteFile("kernels_amd64.s", s.b.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}

	var d bytes.Buffer
	pr := func(format string, a ...any) { fmt.Fprintf(&d, format+"\n", a...) }
	pr("// Code generated by gen_kernels.go; DO NOT EDIT.")
	pr("")
	pr("//go:build amd64 && !purego")
	pr("")
	pr("package cpu")
	pr("")
	var names []string
	for _, dt := range dtypes {
		for _, sh := range dotShapes {
			names = append(names, dotName(dt, sh))
		}
		for _, sh := range streamShapes {
			names = append(names, streamName(dt, sh))
		}
		for _, sh := range axpyShapes {
			names = append(names, axpyName(dt, sh))
		}
	}
	for _, n := range names {
		pr("//go:noescape")
		pr("func %s(a *tileArgs)", n)
		pr("")
	}
	table := func(kind, what string, shapes []shape, name func(dtype, shape) string) {
		pr("// %sTiles[dtype][mr][nr] is the %s", kind, what)
		pr("// for an mr×nr tile (nil where the shape does not fit the 16 vector")
		pr("// registers).")
		pr("var %sTiles = [3][5][5]func(*tileArgs){", kind)
		for i, dt := range dtypes {
			pr("\t%d: { // %s", i, dt.name)
			for mr := 1; mr <= 4; mr++ {
				var ents []string
				for _, sh := range shapes {
					if sh.mr == mr {
						ents = append(ents, fmt.Sprintf("%d: %s", sh.nr, name(dt, sh)))
					}
				}
				pr("\t\t%d: {%s},", mr, strings.Join(ents, ", "))
			}
			pr("\t},")
		}
		pr("}")
		pr("")
	}
	table("dot", "dot kernel", dotShapes, dotName)
	var stream []shape
	for _, sh := range dotShapes {
		if sh.mr <= prefetchRows {
			stream = append(stream, sh)
		}
	}
	table("stream", "dot kernel of the one-pass product (prefetching)", append(stream, streamShapes...), streamName)
	table("axpy", "axpy kernel", axpyShapes, axpyName)
	src, err := format.Source(d.Bytes())
	if err != nil {
		log.Fatalf("format: %v\n%s", err, d.Bytes())
	}
	if err := os.WriteFile("kernels_amd64_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}
