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
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
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

func dotName(dt dtype, s shape) string  { return fmt.Sprintf("dot%s_%dx%d", dt.name, s.mr, s.nr) }
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

func (g *gen) dot(dt dtype, s shape) {
	name := dotName(dt, s)
	na := s.mr * s.nr
	acc := func(i, j int) int { return i*s.nr + j }
	wreg := func(j int) int { return na + j }
	xreg := na + s.nr
	pf := s.mr <= prefetchRows
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

func main() {
	var s gen
	s.p("// Code generated by gen_kernels.go; DO NOT EDIT.")
	s.p("")
	s.p("//go:build amd64 && !purego")
	s.p("")
	s.p("#include \"textflag.h\"")
	s.p("")
	for _, dt := range dtypes {
		for _, sh := range dotShapes {
			s.dot(dt, sh)
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
		for _, sh := range axpyShapes {
			names = append(names, axpyName(dt, sh))
		}
	}
	for _, n := range names {
		pr("//go:noescape")
		pr("func %s(a *tileArgs)", n)
		pr("")
	}
	table := func(kind string, shapes []shape, name func(dtype, shape) string) {
		pr("// %sTiles[dtype][mr][nr] is the %s kernel for an mr×nr tile (nil where", kind, kind)
		pr("// the shape does not fit the 16 vector registers).")
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
	table("dot", dotShapes, dotName)
	table("axpy", axpyShapes, axpyName)
	src, err := format.Source(d.Bytes())
	if err != nil {
		log.Fatalf("format: %v\n%s", err, d.Bytes())
	}
	if err := os.WriteFile("kernels_amd64_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}
