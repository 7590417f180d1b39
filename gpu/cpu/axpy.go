package cpu

import (
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// xw is a product dst[M,N] = x[M,K] · w[K,N] whose right operand is
// row-major along N (a transposed convolution's weight, attention's values)
// over host memory. Its summation order, shared by every path: dst[m,n]
// starts at zero and adds x[m,k]·w[k,n] for k = 0 … K−1 in turn. The
// assembly kernels fuse each step (FMA) on columns in whole vectors of 8 and
// round the product first on the last N mod 8 columns, as the Go kernels do
// on all. An element depends only on its own row of x and column of w.
type xw struct {
	x       []float32
	xs      int
	wt      gpu.DType
	w32     []float32
	w16     []uint16
	ws      int
	dst     []float32
	ds      int
	M, N, K int
	// add continues the sums in dst instead of starting at zero: a product
	// over K rows cut into consecutive parts gives the floats of one product
	// over them all (paged attention's values).
	add bool
}

// Blocking of the assembly path: the output tile (4 rows × 24 columns)
// lives in registers over a K block; the w block (kcAxpy rows × ncAxpy
// columns) stays in L1/L2 while the tiles walk a row block.
const (
	kcAxpy = 256
	mcAxpy = 64
	ncAxpy = 96 // multiple of 24
)

func (g *xw) setWeight(w gpu.Tensor) {
	var m mm
	m.setWeight(w)
	g.wt, g.ws, g.w32, g.w16 = m.wt, m.ws, m.w32, m.w16
}

// run computes the outputs [m0,m1) × [n0,n1) on the calling goroutine.
// Column chunks must start at a multiple of 8.
func (g *xw) run(wk *work, m0, m1, n0, n1 int, asm bool) {
	if m0 >= m1 || n0 >= n1 {
		return
	}
	nv := n1
	if asm {
		nv = min(n1, g.N&^7)
		if nv > n0 {
			g.runAsm(wk, m0, m1, n0, nv)
		}
		n0 = max(n0, nv)
	}
	if n0 < n1 {
		g.runGo(wk, m0, m1, n0, n1)
	}
}

func (g *xw) runAsm(wk *work, m0, m1, n0, n1 int) {
	a, di := wk.argsFor(g.xs, g.ws, g.ds, g.wt)
	if g.K == 0 {
		if g.add {
			return
		}
		for m := m0; m < m1; m++ {
			clear(g.dst[m*g.ds+n0 : m*g.ds+n1])
		}
		return
	}
	for nb := n0; nb < n1; nb += ncAxpy {
		nbe := min(nb+ncAxpy, n1)
		for mb := m0; mb < m1; mb += mcAxpy {
			mbe := min(mb+mcAxpy, m1)
			for kb := 0; kb < g.K; kb += kcAxpy {
				kbe := min(kb+kcAxpy, g.K)
				a.k = uintptr(kbe - kb)
				a.mode = 0
				if kb > 0 || g.add {
					a.mode = modeLoad
				}
				for m := mb; m < mbe; m += 4 {
					tm := min(4, mbe-m)
					for n := nb; n < nbe; n += 24 {
						tv := min(3, (nbe-n)/8)
						a.x = unsafe.Pointer(&g.x[m*g.xs+kb])
						if g.w32 != nil {
							a.w = unsafe.Pointer(&g.w32[kb*g.ws+n])
						} else {
							a.w = unsafe.Pointer(&g.w16[kb*g.ws+n])
						}
						a.out = unsafe.Pointer(&g.dst[m*g.ds+n])
						axpyTiles[di][tm][tv](a)
					}
				}
			}
		}
	}
	a.x, a.w, a.out = nil, nil, nil // retain no tensor
}

// runGo computes rows of the product one at a time, sweeping w row by row.
func (g *xw) runGo(wk *work, m0, m1, n0, n1 int) {
	n := n1 - n0
	wk.row = grow(wk.row, n)
	wr := wk.row
	for m := m0; m < m1; m++ {
		d := g.dst[m*g.ds+n0 : m*g.ds+n1]
		if !g.add {
			clear(d)
		}
		xr := g.x[m*g.xs : m*g.xs+g.K]
		for k, xv := range xr {
			o := k*g.ws + n0
			switch g.wt {
			case gpu.F32:
				wr = g.w32[o : o+n]
			case gpu.BF16:
				widenBF16(wr, g.w16[o:o+n])
			case gpu.F16:
				widenF16(wr, g.w16[o:o+n])
			}
			axpyGo(d, xv, wr)
		}
	}
}

// axpyGo sets d[i] += float32(a·w[i]), the product rounded first.
func axpyGo(d []float32, a float32, w []float32) {
	w = w[:len(d)]
	for i, v := range w {
		d[i] += float32(a * v)
	}
}
