package nn

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// promptQueue is a CPU queue with a prompt product (gpu.PromptMatMuler)
// that records the row counts it was given and computes what MatMul does
// (so a split run's floats can be compared with the unsplit op's).
type promptQueue struct {
	gpu.Queue
	calls []string
}

func (q *promptQueue) MatMulPrompt(dst, x, w, bias gpu.Tensor) {
	q.calls = append(q.calls, fmt.Sprintf("prompt %d", x.Rows))
	q.Queue.MatMul(dst, x, w, bias)
}

func (q *promptQueue) MatMul(dst, x, w, bias gpu.Tensor) {
	q.calls = append(q.calls, fmt.Sprintf("matmul %d", x.Rows))
	q.Queue.MatMul(dst, x, w, bias)
}

// TestPromptRowsSplitProducts: with PromptRows set, Linear, NormLinear and
// NormGLU run a batch's prompt runs on the prompt product and the rows
// between them on MatMul, with the floats of the unsplit ops; nothing is
// split for F32, for an F32 weight, for a product over another number of
// rows, or after restore.
func TestPromptRowsSplitProducts(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	const R, K, N = 10, 16, 12
	rng := rand.New(rand.NewPCG(1, 2))
	vals := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = gpu.RoundBF16(float32(rng.NormFloat64()))
		}
		return v
	}
	load := func(dt gpu.DType, rows, cols int) gpu.Tensor {
		v := vals(rows * cols)
		b := make([]byte, 0, len(v)*4)
		for _, f := range v {
			if dt == gpu.BF16 {
				b = binary.LittleEndian.AppendUint16(b, gpu.F32ToBF16(f))
			} else {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
		}
		w, err := dev.Load(dt, rows, cols, b)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w, w3, wf := load(gpu.BF16, N, K), load(gpu.BF16, N, K), load(gpu.F32, N, K)
	nw := load(gpu.BF16, 1, K)
	runs := []Run{{2, 5}, {7, 10}}
	for _, c := range []struct {
		name string
		p    Precision
		w    gpu.Tensor
		rows int
		want []string
	}{
		{"bf16", BF16, w, R, []string{"matmul 2", "prompt 3", "matmul 2", "prompt 3"}},
		{"f32 precision", F32, w, R, []string{"matmul 10"}},
		{"f32 weight", BF16, wf, R, []string{"matmul 10"}},
		{"other rows", BF16, w, R + 1, []string{"matmul 10"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &promptQueue{Queue: dev.NewQueue("prompt")}
			ctx := &Ctx{Dev: dev, Q: q, P: c.p, A: NewArena(dev)}
			defer ctx.A.Free()
			x := ctx.Tmp(R, K)
			q.Write(x, vals(R*K))
			plain := func(fn func(c *Ctx, dst gpu.Tensor)) []float32 {
				dst := ctx.Tmp(R, N)
				fn(ctx, dst)
				out := make([]float32, dst.Len())
				if err := q.Read(out, dst); err != nil {
					t.Fatal(err)
				}
				return out
			}
			norm := gpu.RowNorm{Eps: 1e-5, Round: true, W: nw, RoundW: true}
			run := func(op string, dst gpu.Tensor) {
				switch op {
				case "linear":
					ctx.Linear(dst, x, c.w, gpu.Tensor{})
				case "normlinear":
					ctx.NormLinear(dst, ctx.Tmp(R, K), x, norm, c.w, gpu.Tensor{})
				case "normglu":
					w3 := w3
					if c.w.DType() != gpu.BF16 {
						w3 = wf
					}
					ctx.NormGLU(dst, ctx.Tmp(R, N), ctx.Tmp(R, K), x, norm, c.w, w3)
				}
			}
			for _, op := range []string{"linear", "normlinear", "normglu"} {
				want := plain(func(_ *Ctx, dst gpu.Tensor) { run(op, dst) })
				q.calls = nil
				restore := ctx.PromptRows(c.rows, runs)
				got := plain(func(_ *Ctx, dst gpu.Tensor) { run(op, dst) })
				calls := q.calls
				restore()
				if !slices.Equal(got, want) {
					t.Errorf("%s: split floats differ from the unsplit op's", op)
				}
				wantCalls := c.want
				if op == "normglu" { // two products a run
					wantCalls = nil
					for _, s := range c.want {
						wantCalls = append(wantCalls, s, s)
					}
				}
				if !slices.Equal(calls, wantCalls) {
					t.Errorf("%s: products %q, want %q", op, calls, wantCalls)
				}
				q.calls = nil
				run(op, ctx.Tmp(R, N))
				if len(q.calls) > 0 && q.calls[0] != fmt.Sprintf("matmul %d", R) {
					t.Errorf("%s after restore: products %q", op, q.calls)
				}
			}
		})
	}
}
