package gputest

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

func newCPU(t *testing.T) gpu.Device {
	dev := cpu.New(2)
	t.Cleanup(func() { dev.Close() })
	return dev
}

// TestCPU runs the whole contract on the CPU backend: every check passes
// and every op is checked (the time it took is logged, never judged).
func TestCPU(t *testing.T) {
	dev := newCPU(t)
	start := time.Now()
	rep := Run(dev, 1)
	el := time.Since(start)
	t.Logf("%s in %v", rep.Summary(), el)
	for _, c := range rep.Failed() {
		t.Errorf("%s %s: %s", c.Op, c.Case, c.Detail)
	}
	seen := map[string]bool{}
	for _, c := range rep.Checks {
		seen[c.Op] = true
	}
	for _, op := range Ops {
		if why, optional := OptionalOps[op]; !seen[op] && optional {
			t.Logf("no check of %s on the CPU (%s)", op, why)
		} else if !seen[op] {
			t.Errorf("no check of %s", op)
		}
	}
}

// TestSeeds: other seeds pass too (the bounds do not depend on lucky inputs).
func TestSeeds(t *testing.T) {
	dev := newCPU(t)
	for _, seed := range []uint64{2, 3, 0xdecafbad, 20261201} {
		rep := Run(dev, seed)
		for _, c := range rep.Failed() {
			t.Errorf("seed %d: %s %s: %s", seed, c.Op, c.Case, c.Detail)
		}
	}
}

// TestRequiredCases pins the cases the CUDA backend's planted faults rely on.
func TestRequiredCases(t *testing.T) {
	rep := Run(newCPU(t), 1)
	has := func(op string, parts ...string) bool {
		for _, c := range rep.Checks {
			if c.Op != op {
				continue
			}
			all := true
			for _, p := range parts {
				all = all && strings.Contains(c.Case+"/", p)
			}
			if all {
				return true
			}
		}
		return false
	}
	for _, w := range []string{"w=f32/", "w=bf16/", "w=f16/"} {
		for _, b := range []string{"bias=none", "bias=f32", "bias=bf16"} {
			if !has("matmul", w, b) {
				t.Errorf("matmul: no case with %s and %s", w, b)
			}
		}
		for _, m := range []string{"/M=1/", "/M=2/", "/M=3/", "/M=5/", "/M=9/", "/M=17/"} {
			for _, k := range []string{"/K=1/", "/K=7/", "/K=24/", "/K=300/", "/K=1030/"} {
				for _, n := range []string{"/N=1/", "/N=5/", "/N=33/"} {
					if !has("matmul", w, m, k, n) {
						t.Errorf("matmul: no case %s%s%s%s", w, m, k, n)
					}
				}
			}
		}
	}
	required := []struct {
		op    string
		parts []string
	}{
		{"matmul", []string{"w=f32-view/"}},
		{"matmul", []string{"batch-invariance"}},
		{"addrow", []string{"v=f32/", "x33/"}}, {"addrow", []string{"v=bf16/", "x257"}},
		{"mulrow", []string{"v=f32/", "x33/"}}, {"mulrow", []string{"v=bf16/", "x257"}},
		{"layernorm", []string{"w=f32/b=f32/"}}, {"layernorm", []string{"w=bf16/b=bf16/"}},
		{"layernorm", []string{"w=f32/nobias/"}}, {"layernorm", []string{"w=bf16/nobias/"}},
		{"rmsnorm", []string{"eps=0.5"}}, {"rmsnorm", []string{"eps=1e-05"}},
		{"softmax", []string{"len=1/"}}, {"softmax", []string{"len=257/"}},
		{"embed", []string{"table=f32/n=1/"}}, {"embed", []string{"table=f32/n=3/"}},
		{"embed", []string{"table=bf16/n=1/"}}, {"embed", []string{"table=bf16/n=3/"}},
		{"shortconv", []string{"L=3/", "/T=1/"}}, {"shortconv", []string{"L=4/", "/T=5/"}},
		{"shortconv", []string{"call3/", "/state"}},
		{"attention", []string{"window=3/qpos0=8", "prob=bf16"}}, {"attention", []string{"noncausal", "prob=f32"}},
		{"attention", []string{"kv=2/hd=2/"}}, {"attention", []string{"heads=4/kv=2/hd=64/"}}, {"attention", []string{"hd=6/"}},
		{"attention", []string{"decode-steps"}},
		{"attention", []string{"paged=", "decode-steps"}}, {"attention", []string{"paged=", "window="}},
		{"attention", []string{"paged=1/"}}, {"attention", []string{"paged=", "hd=136/"}},
		{"conv1d", []string{"k=3/s=2/d=1/pad=1/g=1/"}}, {"conv1d", []string{"s=1/d=2/pad=4/"}}, {"conv1d", []string{"depthwise", "b=f32"}},
		{"convtranspose1d", []string{"k=4/s=2/pad=1/g=1/"}}, {"convtranspose1d", []string{"k=4/s=2/pad=1/depthwise/"}},
		{"conv2d", []string{"3x3/s=2x2/p=1x1/g=1/"}}, {"conv2d", []string{"3x3/s=2x2/p=1x1/depthwise/"}},
		{"transpose", []string{"33x70/strided"}},
		{"glu", []string{"strided"}},
		{"attentionseqs", []string{"paged+contiguous", "prob=bf16"}}, {"attentionseqs", []string{"window=7", "prob=f32"}},
		{"attentionseqs", []string{"noncausal"}},
		{"shortconvseqs", []string{"call3/", "/state"}}, {"shortconvseqs", []string{"w=bf16/seqs=4/"}},
		{"copyrows", []string{"cols=2100"}},
		{"relposscores", []string{"T=1/", "bf16"}}, {"relposscores", []string{"T=7/", "heads=3/", "f32"}},
		{"relposscores", []string{"hd=300/"}}, {"headsmatmul", []string{"heads=3/"}}, {"headsmatmul", []string{"L=300/"}},
	}
	for _, r := range required {
		if !has(r.op, r.parts...) {
			t.Errorf("%s: no case with %q", r.op, r.parts)
		}
	}
	for _, f := range []string{"silu/", "gelu/", "relu/", "elu/", "sigmoid/"} {
		if !has("act", f) {
			t.Errorf("act: no %s case", f)
		}
	}
	for _, s := range []string{"rotate-half/f32/", "rotate-half/bf16/", "interleaved/f32/", "interleaved/bf16/"} {
		if !has("rope", s, "pos=7..") {
			t.Errorf("rope: no %s case at positions from 7", s)
		}
	}
}

// faultDev wraps a device so that its queues perturb one op (fault names
// "op/what"), for the self-test of the contract.
type faultDev struct {
	gpu.Device
	fault string
}

func (d faultDev) NewQueue(name string) gpu.Queue {
	return &faultQueue{Queue: d.Device.NewQueue(name), fault: d.fault}
}

type faultQueue struct {
	gpu.Queue
	fault string
}

// host applies f to t's values through the host (Read, then Write).
func (q *faultQueue) host(t gpu.Tensor, f func(v []float32)) {
	v := make([]float32, t.Len())
	if err := q.Queue.Read(v, t); err != nil {
		panic(err)
	}
	f(v)
	q.Queue.Write(t, v)
}

func lastCol(t gpu.Tensor) gpu.Tensor { return t.ColSlice(t.Cols-1, t.Cols) }

// allButLastRow returns t without its last row, and whether any row is left.
func allButLastRow(t gpu.Tensor) (gpu.Tensor, bool) { return t.Slice(0, max(t.Rows-1, 0)), t.Rows > 1 }

func (q *faultQueue) Fill(dst gpu.Tensor, v float32) {
	if q.fault == "fill/last-row" {
		if d, ok := allButLastRow(dst); ok {
			q.Queue.Fill(d, v)
		}
		return
	}
	q.Queue.Fill(dst, v)
}

func (q *faultQueue) Copy(dst, src gpu.Tensor) {
	if q.fault == "copy/last-row" {
		if d, ok := allButLastRow(dst); ok {
			s, _ := allButLastRow(src)
			q.Queue.Copy(d, s)
		}
		return
	}
	q.Queue.Copy(dst, src)
}

func (q *faultQueue) Write(dst gpu.Tensor, src []float32) {
	if q.fault == "write/strided-last" && !dst.Contiguous() {
		src = slices.Clone(src)
		src[len(src)-1] += 1
	}
	q.Queue.Write(dst, src)
}

func (q *faultQueue) Transpose(dst, src gpu.Tensor) {
	q.Queue.Transpose(dst, src)
	if q.fault == "transpose/one-element" {
		q.host(dst, func(v []float32) { v[len(v)-1] += 1 })
	}
}

func (q *faultQueue) Add(dst, a, b gpu.Tensor) {
	if q.fault == "relposscores/shift+1" && dst.Rows > 1 {
		// CUDA's FAULT_RELPOS_SCORES: the rows after the first take the
		// relative shift one column on (the sequence's only Add).
		n := dst.Rows
		b1 := b.Slice(1, n)
		b1.Off++
		q.Queue.Add(dst.Row(0), a.Row(0), b.Row(0))
		q.Queue.Add(dst.Slice(1, n), a.Slice(1, n), b1)
		return
	}
	if q.fault == "add/last-col" && dst.Cols > 1 {
		n := dst.Cols - 1
		q.Queue.Add(dst.ColSlice(0, n), a.ColSlice(0, n), b.ColSlice(0, n))
		return
	}
	q.Queue.Add(dst, a, b)
}

func (q *faultQueue) Mul(dst, a, b gpu.Tensor) {
	q.Queue.Mul(dst, a, b)
	switch q.fault {
	case "mul/last-col-half":
		q.Queue.Scale(lastCol(dst), lastCol(dst), 0.5)
	case "mul/source-write":
		q.Queue.Fill(b.Slice(0, 1).ColSlice(0, 1), 7)
	}
}

// rowOp computes dst[:, c] = a[:, c] ∘ v[c−1] for c ≥ 1 when the fault
// shifts the row vector (CUDA's FAULT_ROWOP).
func (q *faultQueue) rowOp(op func(dst, a, v gpu.Tensor), dst, a, v gpu.Tensor, shift bool) {
	if !shift || dst.Cols < 2 {
		op(dst, a, v)
		return
	}
	n := dst.Cols
	op(dst.ColSlice(1, n), a.ColSlice(1, n), v.ColSlice(0, n-1))
	op(dst.ColSlice(0, 1), a.ColSlice(0, 1), v.ColSlice(0, 1))
}

func (q *faultQueue) AddRow(dst, a, v gpu.Tensor) {
	q.rowOp(q.Queue.AddRow, dst, a, v, q.fault == "addrow/shifted-v")
}

func (q *faultQueue) MulRow(dst, a, v gpu.Tensor) {
	q.rowOp(q.Queue.MulRow, dst, a, v, q.fault == "mulrow/shifted-v")
}

func (q *faultQueue) Scale(dst, a gpu.Tensor, s float32) {
	switch q.fault {
	case "scale/next-float":
		s = math.Nextafter32(s, float32(math.Inf(1)))
	case "scale/pad-write":
		q.Queue.Scale(dst, a, s)
		if dst.Off > 0 && !dst.Contiguous() {
			q.Queue.Fill(gpu.Tensor{Buf: dst.Buf, Off: dst.Off - 1, Rows: 1, Cols: 1, Stride: 1}, 0)
		}
		return
	}
	q.Queue.Scale(dst, a, s)
}

func (q *faultQueue) RoundBF16(dst gpu.Tensor) {
	if q.fault == "roundbf16/truncate" {
		q.host(dst, func(v []float32) {
			for i, x := range v {
				v[i] = math.Float32frombits(math.Float32bits(x) & 0xffff0000)
			}
		})
		return
	}
	q.Queue.RoundBF16(dst)
}

func (q *faultQueue) Act(dst, a gpu.Tensor, f gpu.Activation) {
	var g func(x float32) float32
	switch {
	case q.fault == "act/silu-sign" && f == gpu.SiLU: // CUDA's FAULT_ACT
		g = func(x float32) float32 { return x / (1 + float32(math.Exp(float64(x)))) }
	case q.fault == "act/elu-exp-minus-1" && f == gpu.ELU: // exp(x) − 1 in float32: cancels near 0
		g = func(x float32) float32 {
			if x > 0 {
				return x
			}
			return float32(math.Exp(float64(x))) - 1
		}
	}
	if g == nil {
		q.Queue.Act(dst, a, f)
		return
	}
	v := make([]float32, a.Len())
	if err := q.Queue.Read(v, a); err != nil {
		panic(err)
	}
	for i, x := range v {
		v[i] = g(x)
	}
	q.Queue.Write(dst, v)
}

func (q *faultQueue) GLU(dst, a gpu.Tensor) {
	switch q.fault {
	case "glu/panic":
		panic("planted glu panic")
	case "glu/16-ulp":
		q.Queue.GLU(dst, a)
		q.host(dst, func(v []float32) {
			for i := range v {
				v[i] *= 1 + 0x1p-19
			}
		})
		return
	}
	q.Queue.GLU(dst, a)
}

func (q *faultQueue) RMSNorm(dst, a gpu.Tensor, eps float32) {
	if q.fault == "rmsnorm/no-eps" {
		eps = 0
	}
	q.Queue.RMSNorm(dst, a, eps)
}

func (q *faultQueue) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	if q.fault == "layernorm/no-bias" {
		b = gpu.Tensor{}
	}
	q.Queue.LayerNorm(dst, a, w, b, eps)
}

func (q *faultQueue) Softmax(dst gpu.Tensor) {
	q.Queue.Softmax(dst)
	if q.fault == "softmax/sum-1e-4" {
		q.Queue.Scale(dst, dst, 1/1.0001)
	}
}

// NormMatMul and PrepHeads make faultQueue a gpu.NormFuser, so the
// fused ops' checks can be shown to catch a fused kernel's faults.
func (q *faultQueue) NormMatMul(dst, h, x gpu.Tensor, n gpu.RowNorm, w, bias gpu.Tensor) {
	if q.fault == "normmatmul/no-eps" {
		n.Eps = 0
	}
	gpu.NormMatMul(q.Queue, dst, h, x, n, w, bias)
}

// ShortConvSeqsGated makes faultQueue a gpu.GatedConvolver: its planted
// fault convolves x without the gate's b.
func (q *faultQueue) ShortConvSeqsGated(dst, b, x, w gpu.Tensor, states []gpu.Tensor, rows []int, round bool) bool {
	if q.fault != "shortconvgated/gate-dropped" {
		return false
	}
	gpu.ShortConvSeqs(q.Queue, dst, x, w, states, rows)
	return true
}

func (q *faultQueue) PrepHeads(rp gpu.RoPEParams, round bool, items []gpu.HeadPrep) {
	if q.fault == "headnormrope/freq-reversed" {
		inv := slices.Clone(rp.InvFreq)
		slices.Reverse(inv)
		rp.InvFreq = inv
	}
	gpu.PrepHeads(q.Queue, rp, round, items...)
}

func (q *faultQueue) RoPE(dst gpu.Tensor, p gpu.RoPEParams) {
	switch q.fault {
	case "rope/pos+1":
		pos := make([]int32, len(p.Pos))
		for i, x := range p.Pos {
			pos[i] = x + 1
		}
		p.Pos = pos
	case "rope/bf16-ignored":
		p.BF16 = false
	}
	q.Queue.RoPE(dst, p)
}

func (q *faultQueue) Embed(dst, table gpu.Tensor, ids []int32) {
	if n := len(ids) / max(dst.Rows, 1); q.fault == "embed/first-id" && n > 1 {
		ids = slices.Clone(ids)
		for r := 0; r < dst.Rows; r++ {
			ids[r*n] = ids[r*n+1]
		}
	}
	q.Queue.Embed(dst, table, ids)
}

func (q *faultQueue) EmbedIDs(dst, table, ids gpu.Tensor) {
	if q.fault == "embedids/last-id" && ids.Cols > 1 {
		ids = ids.ColSlice(0, ids.Cols-1) // drops the last id of every row
	}
	q.Queue.EmbedIDs(dst, table, ids)
}

func (q *faultQueue) Sample(ids, logits gpu.Tensor, rows []gpu.SampleRow) {
	rows = slices.Clone(rows)
	for r := range rows {
		switch q.fault {
		case "sample/u-next-float": // one ulp: only the rows on a boundary see it
			rows[r].U = math.Nextafter(rows[r].U, 1)
		case "sample/topk+1":
			if rows[r].TopK > 1 {
				rows[r].TopK++
			}
		case "sample/history-dropped":
			rows[r].History = nil
		case "sample/suppress-ignored":
			rows[r].Suppress = nil
		}
	}
	q.Queue.Sample(ids, logits, rows)
}

func (q *faultQueue) ShortConv(dst, x, w, state gpu.Tensor) {
	if q.fault == "shortconv/state-dropped" {
		q.Queue.Fill(state, 0)
	}
	q.Queue.ShortConv(dst, x, w, state)
	if q.fault == "shortconv/t0-zero" {
		q.Queue.Fill(dst.Row(0), 0)
	}
}

func (q *faultQueue) MatMul(dst, x, w, bias gpu.Tensor) {
	switch q.fault {
	case "matmul/no-bias":
		bias = gpu.Tensor{}
	case "matmul/last-row":
		d, ok := allButLastRow(dst)
		if ok {
			xs, _ := allButLastRow(x)
			q.Queue.MatMul(d, xs, w, bias)
		}
		return
	case "matmul/bias-shift": // CUDA's FAULT_MATMUL: column n gets bias[n−1]
		q.Queue.MatMul(dst, x, w, gpu.Tensor{})
		if !bias.IsNil() {
			n := dst.Cols
			q.Queue.AddRow(dst.ColSlice(1, n), dst.ColSlice(1, n), bias.ColSlice(0, n-1))
		}
		return
	case "matmul/batch-variant":
		q.Queue.MatMul(dst, x, w, bias)
		if dst.Rows > 1 {
			q.Queue.Scale(dst, dst, 1+0x1p-23)
		}
		return
	}
	q.Queue.MatMul(dst, x, w, bias)
}

func (q *faultQueue) Attention(dst, qt, k, v gpu.Tensor, p gpu.AttnParams) {
	switch q.fault {
	case "attention/prob-not-rounded":
		p.ProbBF16 = false
	case "attention/window+1":
		if p.Window > 0 {
			p.Window++
		}
	case "attention/table-ignored": // CUDA's FAULT_PAGED: pool rows read as if contiguous
		if !p.Blocks.IsNil() {
			k, v = k.Slice(0, p.Keys), v.Slice(0, p.Keys)
			p.Blocks = gpu.Tensor{}
		}
	}
	q.Queue.Attention(dst, qt, k, v, p)
}

// AttentionSeqs, ShortConvSeqs and CopyRows make the wrapper a batching
// queue (the CPU runs their op sequences); their faults stand for CUDA's
// FAULT_ATTN_SEQS, FAULT_SHORTCONV_SEQS and FAULT_COPY_ROWS.
func (q *faultQueue) AttentionSeqs(dst, qt gpu.Tensor, p gpu.AttnParams, seqs []gpu.AttnSeq) {
	if q.fault == "attentionseqs/first-seq" {
		seqs = slices.Clone(seqs)
		for i := range seqs {
			s0 := seqs[0]
			seqs[i].K, seqs[i].V, seqs[i].Blocks, seqs[i].Keys = s0.K, s0.V, s0.Blocks, s0.Keys
		}
	}
	gpu.AttentionSeqs(q.Queue, dst, qt, p, seqs)
}

func (q *faultQueue) ShortConvSeqs(dst, x, w gpu.Tensor, states []gpu.Tensor, rows []int) {
	if q.fault == "shortconvseqs/first-state" {
		states = slices.Clone(states)
		for i := range states {
			states[i] = states[0]
		}
	}
	gpu.ShortConvSeqs(q.Queue, dst, x, w, states, rows)
}

func (q *faultQueue) CopyRows(dst, src gpu.Tensor, dstRows, srcRows []int32) {
	if q.fault == "copyrows/first-source" {
		srcRows = slices.Clone(srcRows)
		for i := range srcRows {
			srcRows[i] = srcRows[0]
		}
	}
	gpu.CopyRows(q.Queue, dst, src, dstRows, srcRows)
}

func (q *faultQueue) CopyMany(pairs []gpu.CopyPair) {
	if q.fault == "copymany/last-row" { // CUDA's FAULT_COPY_MANY
		pairs = slices.Clone(pairs)
		for i, p := range pairs {
			if p.Dst.Rows > 1 {
				pairs[i] = gpu.CopyPair{Dst: p.Dst.Slice(0, p.Dst.Rows-1), Src: p.Src.Slice(0, p.Src.Rows-1)}
			}
		}
	}
	gpu.CopyMany(q.Queue, pairs)
}

// HeadsMatMul makes the wrapper a fusing queue; its fault stands for
// CUDA's FAULT_HEADS_MATMUL: every head after the first reads vt one row
// early.
func (q *faultQueue) HeadsMatMul(o, probs, vt gpu.Tensor, heads int) {
	if q.fault != "headsmatmul/head-offset" {
		gpu.HeadsMatMulSeq(q, o, probs, vt, heads)
		return
	}
	T, hd := o.Rows, o.Cols/heads
	for h := range heads {
		lo := h*hd - min(h, 1)
		q.Queue.MatMul(o.ColSlice(h*hd, (h+1)*hd), probs.Slice(h*T, (h+1)*T), vt.Slice(lo, lo+hd), gpu.Tensor{})
	}
}

func (q *faultQueue) Conv1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	if q.fault == "conv1d/shift" && p.PadLeft > 0 {
		p.PadLeft--
	}
	q.Queue.Conv1D(dst, x, w, bias, p)
}

func (q *faultQueue) ConvTranspose1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	if q.fault == "convtranspose1d/shift" {
		p.PadLeft++
	}
	q.Queue.ConvTranspose1D(dst, x, w, bias, p)
}

func (q *faultQueue) Conv2D(dst, x, w, bias gpu.Tensor, p gpu.Conv2DParams) {
	if q.fault == "conv2d/shift" {
		p.PadW++
	}
	q.Queue.Conv2D(dst, x, w, bias, p)
}

// TestFaults proves that the contract catches faults without a GPU: a
// wrapper perturbs one op of the CPU backend, and Run must report that op
// as failed; where the fault only affects some cases (mustFail), every one
// of them must fail.
func TestFaults(t *testing.T) {
	contains := func(s string) func(Check) bool { return func(c Check) bool { return strings.Contains(c.Case, s) } }
	for _, tc := range []struct {
		fault    string
		mustFail func(Check) bool // nil: at least one check of the op fails
		detail   string           // when set, some failed check's Detail contains it
	}{
		{fault: "fill/last-row"},
		{fault: "copy/last-row"},
		{fault: "write/strided-last", mustFail: func(c Check) bool { // one-row views are contiguous
			return strings.Contains(c.Case, "strided") && !strings.Contains(c.Case, "/1x")
		}},
		{fault: "transpose/one-element", mustFail: contains("")},
		{fault: "add/last-col"},
		{fault: "mul/last-col-half"},
		{fault: "mul/source-write", detail: "source"},
		{fault: "addrow/shifted-v", mustFail: contains("x33")},
		{fault: "mulrow/shifted-v", mustFail: contains("x257")},
		{fault: "scale/next-float"},
		{fault: "scale/pad-write", detail: "outside the view written"},
		{fault: "roundbf16/truncate", mustFail: contains("")},
		{fault: "act/silu-sign", mustFail: contains("silu/")},
		{fault: "act/elu-exp-minus-1"},
		{fault: "glu/16-ulp", mustFail: contains("")},
		{fault: "rmsnorm/no-eps", mustFail: contains("eps=0.5")},
		{fault: "layernorm/no-bias", mustFail: contains("/b=")},
		{fault: "softmax/sum-1e-4", mustFail: func(c Check) bool { return !strings.HasPrefix(c.Case, "len=1/") }},
		{fault: "rope/pos+1", mustFail: contains("")},
		{fault: "rope/bf16-ignored", mustFail: contains("/bf16/")},
		{fault: "embed/first-id", mustFail: contains("/n=3/")},
		{fault: "embedids/last-id", mustFail: func(c Check) bool { return !strings.Contains(c.Case, "/n=1/") && !strings.HasPrefix(c.Case, "readint") }},
		{fault: "sample/u-next-float", mustFail: func(c Check) bool {
			return !strings.Contains(c.Case, "greedy") && !strings.HasPrefix(c.Case, "one-entry")
		}},
		{fault: "sample/topk+1", mustFail: contains("audio-topk4")},
		{fault: "sample/history-dropped", mustFail: contains("penalty")},
		{fault: "sample/suppress-ignored", mustFail: contains("suppress-")},
		{fault: "shortconv/t0-zero", mustFail: func(c Check) bool { return !strings.HasSuffix(c.Case, "/state") }},
		{fault: "shortconv/state-dropped", mustFail: func(c Check) bool { // later calls' state may come from x alone
			return strings.Contains(c.Case, "call2/") && !strings.HasSuffix(c.Case, "/state")
		}},
		{fault: "matmul/no-bias", mustFail: func(c Check) bool {
			return strings.Contains(c.Case, "/bias=") && !strings.Contains(c.Case, "bias=none")
		}},
		{fault: "matmul/last-row", mustFail: contains("/M=")},
		{fault: "matmul/bias-shift", mustFail: func(c Check) bool {
			return strings.Contains(c.Case, "/bias=") && !strings.Contains(c.Case, "bias=none") && !strings.Contains(c.Case, "/N=1/")
		}},
		{fault: "matmul/batch-variant", mustFail: contains("batch-invariance")},
		// Over thousands of keys p's rounding errors average out below the
		// bound (about 2⁻⁹·|v|/√L): the long cases need not catch it.
		{fault: "attention/prob-not-rounded", mustFail: func(c Check) bool {
			return strings.Contains(c.Case, "prob=bf16") && !strings.Contains(c.Case, "beyond-shared")
		}},
		{fault: "attention/window+1", mustFail: contains("window=")},
		{fault: "attention/table-ignored", mustFail: contains("paged=")},
		{fault: "conv1d/shift", mustFail: func(c Check) bool { return !strings.Contains(c.Case, "pad=0") }},
		{fault: "convtranspose1d/shift", mustFail: contains("")},
		{fault: "conv2d/shift", mustFail: contains("")},
		{fault: "normmatmul/no-eps", mustFail: func(c Check) bool { // the product is checked from the h written
			return strings.Contains(c.Case, "eps=0.5") && strings.HasSuffix(c.Case, "/norm")
		}},
		{fault: "attentionseqs/first-seq", mustFail: contains("")},
		{fault: "shortconvseqs/first-state", mustFail: func(c Check) bool {
			return !strings.Contains(c.Case, "seqs=1/") && !strings.Contains(c.Case, "/state")
		}},
		{fault: "copyrows/first-source", mustFail: contains("")},
		{fault: "copymany/last-row", mustFail: func(c Check) bool { return !strings.Contains(c.Case, "/1x") }},
		{fault: "headnormrope/freq-reversed", mustFail: func(c Check) bool { return c.Case != "prep/v-copy" }},
		{fault: "shortconvgated/gate-dropped", mustFail: func(c Check) bool { return !strings.Contains(c.Case, "/state") }},
		{fault: "relposscores/shift+1", mustFail: func(c Check) bool { return !strings.HasPrefix(c.Case, "T=1/") }},
		{fault: "headsmatmul/head-offset", mustFail: func(c Check) bool { return !strings.Contains(c.Case, "/heads=1/") }},
	} {
		t.Run(strings.ReplaceAll(tc.fault, "/", "_"), func(t *testing.T) {
			op, _, _ := strings.Cut(tc.fault, "/")
			rep := run(faultDev{newCPU(t), tc.fault}, 1, func(o string) bool { return o == op }, Options{})
			if !rep.FailedOps()[op] {
				t.Fatalf("fault %s not caught: %s", tc.fault, rep.Summary())
			}
			var details []string
			for _, c := range rep.Checks {
				if c.Op != op {
					t.Errorf("check of %s in a run of %s only", c.Op, op)
				}
				if tc.mustFail != nil && tc.mustFail(c) && c.Pass {
					t.Errorf("fault %s: %s passed (err %g, bound %g)", tc.fault, c.Case, c.Err, c.Bound)
				}
				if !c.Pass {
					details = append(details, c.Detail)
				}
			}
			if tc.detail != "" && !strings.Contains(strings.Join(details, "\n"), tc.detail) {
				t.Errorf("fault %s: no failure says %q: %q", tc.fault, tc.detail, details)
			}
			t.Logf("%s: %s", tc.fault, rep.Summary())
		})
	}
}

// TestPanic: a panic in one op's check becomes a failed Check with its text,
// and the other ops still run and pass.
func TestPanic(t *testing.T) {
	rep := run(faultDev{newCPU(t), "glu/panic"}, 1, func(o string) bool { return o == "glu" || o == "rmsnorm" || o == "act" }, Options{})
	if got := rep.FailedOps(); len(got) != 1 || !got["glu"] {
		t.Fatalf("failed ops %v, want only glu", got)
	}
	f := rep.Failed()
	if len(f) != 1 || f[0].Case != "panic" || !strings.Contains(f[0].Detail, "planted glu panic") {
		t.Fatalf("failed checks %+v, want one glu panic check", f)
	}
	var rms bool
	for _, c := range rep.Checks {
		rms = rms || c.Op == "rmsnorm"
	}
	if !rms {
		t.Error("rmsnorm did not run after the glu panic")
	}
	if s := rep.Summary(); !strings.Contains(s, "(failed: glu)") {
		t.Errorf("Summary %q does not name glu", s)
	}
}

func TestReport(t *testing.T) {
	r := Report{Checks: []Check{
		{Op: "add", Case: "a", Pass: true}, {Op: "matmul", Case: "b"}, {Op: "matmul", Case: "c", Pass: true},
		{Op: "rope", Case: "d"},
	}}
	if f := r.Failed(); len(f) != 2 || f[0].Case != "b" || f[1].Case != "d" {
		t.Errorf("Failed = %+v", f)
	}
	if ops := r.FailedOps(); len(ops) != 2 || !ops["matmul"] || !ops["rope"] {
		t.Errorf("FailedOps = %v", ops)
	}
	if s := r.Summary(); s != "2/4 checks passed (failed: rope, matmul)" {
		t.Errorf("Summary = %q", s)
	}
	if s := (Report{Checks: []Check{{Pass: true}}}).Summary(); s != "1/1 checks passed" {
		t.Errorf("Summary = %q", s)
	}
}

func TestUlp(t *testing.T) {
	for _, c := range []struct{ x, want float64 }{
		{1, 0x1p-23}, {1.5, 0x1p-23}, {0.75, 0x1p-24}, {-2, 0x1p-22}, {0, 0x1p-149}, {1e-40, 0x1p-149}, {0x1p-126, 0x1p-149},
	} {
		if got := ulp(c.x); got != c.want {
			t.Errorf("ulp(%g) = %g, want %g", c.x, got, c.want)
		}
	}
}
