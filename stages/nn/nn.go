// Package nn holds what every network of omni-pipe shares: the numerics
// mode, the per-call scratch arena and the execution context a forward pass
// runs in.
package nn

import (
	"fmt"
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Precision selects where activations are rounded.
type Precision uint8

const (
	// BF16 reproduces the official bf16 inference: every activation the
	// reference stores in bf16 is rounded to bf16 at the same point, with
	// fp32 arithmetic inside each op (as cuBLAS and PyTorch's bf16 kernels
	// accumulate in fp32). Greedy picks then agree with the reference
	// except at near-ties. This is the default.
	BF16 Precision = iota + 1
	// F32 keeps every activation in float32: closer to the exact (float64)
	// result than the bf16 reference, but no longer tracking its rounding.
	F32
)

func (p Precision) String() string {
	switch p {
	case BF16:
		return "bf16"
	case F32:
		return "f32"
	}
	return fmt.Sprintf("Precision(%d)", uint8(p))
}

// ParsePrecision parses "bf16" or "f32".
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "bf16", "":
		return BF16, nil
	case "f32", "fp32":
		return F32, nil
	}
	return 0, fmt.Errorf("unknown precision %q (want bf16 or f32)", s)
}

// Ctx is what a forward pass runs with: the device, the stage's queue, the
// precision, and a scratch arena for temporaries.
type Ctx struct {
	Dev gpu.Device
	Q   gpu.Queue
	P   Precision
	A   *Arena

	// The rows of the batch (promptRows of them) that belong to prompts,
	// as PromptRows set them: their products may run on the queue's
	// prompt product (gpu.PromptMatMuler).
	promptRows int
	prompt     []Run
}

// Run is the rows [Lo, Hi) of a batch.
type Run struct{ Lo, Hi int }

// PromptRows declares, until restore is called, that in the products over
// a batch of rows rows (x.Rows == rows) the rows of runs are a prompt's:
// in BF16, on a queue with a prompt product (gpu.PromptMatMuler), Linear,
// NormLinear and NormGLU run those rows on it and the other rows on the
// ordinary products (whose rows do not depend on the batch). A prompt row
// then agrees with the same row computed as a decode step only within fp32
// accumulation error (see gpu.PromptMatMuler). Runs must be ascending and
// disjoint.
func (c *Ctx) PromptRows(rows int, runs []Run) (restore func()) {
	pr, p := c.promptRows, c.prompt
	c.promptRows, c.prompt = rows, runs
	return func() { c.promptRows, c.prompt = pr, p }
}

// byRuns reports whether products over x split by prompt rows and, if so,
// calls fn on every maximal run of x's rows, prompt or not, in order.
func (c *Ctx) byRuns(x, w gpu.Tensor, fn func(lo, hi int, prompt bool)) bool {
	if len(c.prompt) == 0 || c.P != BF16 || x.Rows != c.promptRows || w.DType() != gpu.BF16 {
		return false
	}
	if _, ok := c.Q.(gpu.PromptMatMuler); !ok {
		return false
	}
	at := 0
	for _, r := range c.prompt {
		lo, hi := max(r.Lo, at), min(r.Hi, x.Rows)
		if lo >= hi {
			continue
		}
		if lo > at {
			fn(at, lo, false)
		}
		fn(lo, hi, true)
		at = hi
	}
	if at < x.Rows {
		fn(at, x.Rows, false)
	}
	return true
}

// NewCtx returns a context with its own arena. For nn.F32 it asks the
// queue for fp32 products (gpu.FP32Products): the network runs as its
// fp32 reference does.
func NewCtx(dev gpu.Device, q gpu.Queue, p Precision) *Ctx {
	if f, ok := q.(gpu.FP32Products); ok && p == F32 {
		f.UseFP32Products()
	}
	return &Ctx{Dev: dev, Q: q, P: p, A: NewArena(dev)}
}

// Round rounds t to bf16 when the precision asks for it (a rounding point
// of the reference).
func (c *Ctx) Round(t gpu.Tensor) {
	if c.P == BF16 {
		c.Q.RoundBF16(t)
	}
}

// Linear computes dst = x·wᵀ + b (b may be nil) and rounds it: an
// nn.Linear's output as the reference stores it.
func (c *Ctx) Linear(dst, x, w, b gpu.Tensor) {
	if !c.byRuns(x, w, func(lo, hi int, prompt bool) {
		if prompt {
			gpu.MatMulPrompt(c.Q, dst.Slice(lo, hi), x.Slice(lo, hi), w, b)
		} else {
			c.Q.MatMul(dst.Slice(lo, hi), x.Slice(lo, hi), w, b)
		}
	}) {
		c.Q.MatMul(dst, x, w, b)
	}
	c.Round(dst)
}

// NormLinear is Linear of the normalised rows of x: h = n(x) (written, for
// the products after it) and dst = h·wᵀ + b, rounded — one op on a queue
// that fuses the two (gpu.NormMatMul).
func (c *Ctx) NormLinear(dst, h, x gpu.Tensor, n gpu.RowNorm, w, b gpu.Tensor) {
	if !c.byRuns(x, w, func(lo, hi int, prompt bool) {
		if prompt {
			gpu.NormMatMulPrompt(c.Q, dst.Slice(lo, hi), h.Slice(lo, hi), x.Slice(lo, hi), n, w, b)
		} else {
			gpu.NormMatMul(c.Q, dst.Slice(lo, hi), h.Slice(lo, hi), x.Slice(lo, hi), n, w, b)
		}
	}) {
		gpu.NormMatMul(c.Q, dst, h, x, n, w, b)
	}
	c.Round(dst)
}

// NormGLU is gpu.NormGLU (a SwiGLU's norm, gate and up products, rounded
// at the reference's points in BF16) with the prompt rows (PromptRows) on
// the prompt products.
func (c *Ctx) NormGLU(dst, a, h, x gpu.Tensor, n gpu.RowNorm, w1, w3 gpu.Tensor) {
	round := c.P == BF16
	if !c.byRuns(x, w1, func(lo, hi int, prompt bool) {
		s := func(t gpu.Tensor) gpu.Tensor { return t.Slice(lo, hi) }
		if prompt {
			gpu.NormGLUPrompt(c.Q, s(dst), s(a), s(h), s(x), n, w1, w3, round)
		} else {
			gpu.NormGLU(c.Q, s(dst), s(a), s(h), s(x), n, w1, w3, round)
		}
	}) {
		gpu.NormGLU(c.Q, dst, a, h, x, n, w1, w3, round)
	}
}

// Tmp returns a scratch F32 tensor from the arena (valid until the arena's
// next Reset).
func (c *Ctx) Tmp(rows, cols int) gpu.Tensor { return c.A.Get(rows, cols) }

// Arena hands out scratch F32 tensors and reuses their memory across forward
// passes: Reset returns every tensor to it. Each Get returns a distinct
// buffer, so temporaries never alias one another. An Arena belongs to one
// goroutine.
type Arena struct {
	dev  gpu.Device
	bufs []gpu.Tensor // capacity tensors, [1, capacity]
	next int
	// ints and nextInt are the same for I32 tensors (GetI32).
	ints    []gpu.Tensor
	nextInt int
}

// NewArena returns an empty arena on dev.
func NewArena(dev gpu.Device) *Arena { return &Arena{dev: dev} }

// Get returns a zero-initialised-on-first-use (afterwards: stale) [rows,
// cols] F32 tensor. Callers must write it before reading it.
func (a *Arena) Get(rows, cols int) gpu.Tensor { return a.get(&a.bufs, &a.next, gpu.F32, rows, cols) }

// GetI32 is Get for an I32 tensor. I32 tensors are returned to the arena
// by Reset only (Release leaves them alone).
func (a *Arena) GetI32(rows, cols int) gpu.Tensor {
	return a.get(&a.ints, &a.nextInt, gpu.I32, rows, cols)
}

// get hands out the next buffer of list (growing it when too small).
func (a *Arena) get(list *[]gpu.Tensor, next *int, dt gpu.DType, rows, cols int) gpu.Tensor {
	n := rows * cols
	if *next < len(*list) && (*list)[*next].Cols < n {
		// Too small: replace it with a larger buffer.
		a.dev.Free((*list)[*next])
		(*list)[*next] = a.dev.Alloc(dt, 1, n)
	}
	if *next == len(*list) {
		*list = append(*list, a.dev.Alloc(dt, 1, max(n, 1)))
	}
	t := (*list)[*next]
	*next++
	return gpu.Tensor{Buf: t.Buf, Off: 0, Rows: rows, Cols: cols, Stride: cols}
}

// Reset makes every tensor handed out since the last Reset available again.
func (a *Arena) Reset() { a.next, a.nextInt = 0, 0 }

// Mark returns the arena's position, for Release.
func (a *Arena) Mark() int { return a.next }

// Release makes the tensors handed out since Mark returned m available
// again; tensors from before the mark stay valid.
func (a *Arena) Release(m int) {
	if m < 0 || m > a.next {
		panic(fmt.Sprintf("nn: release to mark %d at %d", m, a.next))
	}
	a.next = m
}

// Free releases the arena's memory.
func (a *Arena) Free() {
	for _, t := range a.bufs {
		a.dev.Free(t)
	}
	for _, t := range a.ints {
		a.dev.Free(t)
	}
	a.bufs, a.next, a.ints, a.nextInt = nil, 0, nil, 0
}

// RoPEInvFreq returns RoPE's default inverse frequencies 1/θ^(2j/d) for
// j < d/2, computed in fp32 as transformers and liquid-audio do (an fp32
// arange divided by d, an fp32 power, an fp32 reciprocal).
func RoPEInvFreq(theta float64, headDim int) []float32 {
	out := make([]float32, headDim/2)
	for j := range out {
		e := float32(2*j) / float32(headDim)
		p := float32(math.Pow(float64(float32(theta)), float64(e)))
		out[j] = float32(1 / float64(p))
	}
	return out
}
