package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// blockCase is a random gpu.Block of one row on a device: its weights,
// the caches with pos earlier rows filled, and the row.
type blockCase struct {
	b    gpu.Block
	x    []float32 // the input row
	kc   []float32 // the caches' initial contents
	vc   []float32
	free []gpu.Tensor
	// host holds every loaded weight's values (row-major), by its buffer.
	host map[gpu.Buffer][]float32
}

// blockShape is a block's dimensions and position.
type blockShape struct {
	D, H, KVH, hd, F, pos int
	ropeBF16              bool
}

func (s blockShape) String() string {
	return fmt.Sprintf("D=%d/heads=%d/%d/hd=%d/F=%d/pos=%d/ropebf16=%v", s.D, s.H, s.KVH, s.hd, s.F, s.pos, s.ropeBF16)
}

// blockShapes are the contract's and the equality test's blocks: the
// depthformer's head layout at a small width, ragged widths (D, F not
// multiples of 16 or 64), a 64-wide head with rotate-half RoPE in bf16,
// heads narrower and wider than a 16-row tile and not dividing it, the
// first and later positions.
var blockShapes = []blockShape{
	{D: 128, H: 4, KVH: 1, hd: 32, F: 352, pos: 3},
	{D: 200, H: 2, KVH: 2, hd: 64, F: 136, pos: 0, ropeBF16: true},
	{D: 96, H: 6, KVH: 3, hd: 16, F: 88, pos: 7},
	{D: 128, H: 32, KVH: 8, hd: 4, F: 352, pos: 5}, // the tiny fixture's depthformer: four heads a tile
	{D: 144, H: 3, KVH: 1, hd: 48, F: 64, pos: 1},  // three tiles, one head
	{D: 112, H: 5, KVH: 1, hd: 24, F: 40, pos: 2},  // two heads, three tiles; the last unit ragged
	{D: 64, H: 2, KVH: 1, hd: 32, F: 48, pos: 40},  // a long cache: attn_rows' keys beyond its first 32 threads
}

func newBlockCase(d *Device, s blockShape, seed uint64) (*blockCase, error) {
	rng := rand.New(rand.NewPCG(seed, 77))
	c := &blockCase{host: map[gpu.Buffer][]float32{}}
	vals := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((rng.Float64()*2 - 1) * scale)
		}
		return v
	}
	load := func(rows, cols int, scale, offset float64) (gpu.Tensor, error) {
		b := make([]byte, 2*rows*cols)
		hv := vals(rows*cols, scale)
		for i, v := range hv {
			h := gpu.F32ToBF16(v + float32(offset))
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
			hv[i] = gpu.BF16ToF32(h)
		}
		t, err := d.Load(gpu.BF16, rows, cols, b)
		if err == nil {
			c.free = append(c.free, t)
			c.host[t.Buf] = hv
		}
		return t, err
	}
	hq, kvd := s.H*s.hd, s.KVH*s.hd
	type wt struct {
		t            *gpu.Tensor
		rows, cols   int
		scale, shift float64
	}
	var opn, ffn, qn, kn gpu.Tensor
	b := gpu.Block{Heads: s.H, KVHeads: s.KVH, HeadDim: s.hd, Pos: s.pos, Round: true, ProbBF16: true,
		Scale: gpu.AttnScale(s.hd)}
	for _, w := range []wt{
		{&b.QKV, hq + 2*kvd, s.D, 1 / math.Sqrt(float64(s.D)), 0}, {&b.Out, s.D, hq, 1 / math.Sqrt(float64(hq)), 0},
		{&b.W1, s.F, s.D, 1 / math.Sqrt(float64(s.D)), 0}, {&b.W3, s.F, s.D, 1 / math.Sqrt(float64(s.D)), 0},
		{&b.W2, s.D, s.F, 1 / math.Sqrt(float64(s.F)), 0},
		{&opn, 1, s.D, 0.3, 1}, {&ffn, 1, s.D, 0.3, 1}, {&qn, 1, s.hd, 0.3, 1}, {&kn, 1, s.hd, 0.3, 1},
	} {
		t, err := load(w.rows, w.cols, w.scale, w.shift)
		if err != nil {
			return nil, err
		}
		*w.t = t
	}
	// The depthformer's norms: the weight's product rounded once.
	b.OpNorm = gpu.RowNorm{Eps: 1e-5, W: opn, RoundW: true}
	b.FFNNorm = gpu.RowNorm{Eps: 1e-5, W: ffn, RoundW: true}
	b.QNorm = gpu.RowNorm{Eps: 1e-5, W: qn, RoundW: true}
	b.KNorm = gpu.RowNorm{Eps: 0.5, W: kn, RoundW: true} // a norm that drops eps shows
	invf := make([]float32, s.hd/2)
	for j := range invf {
		invf[j] = float32(math.Pow(1e6, -2*float64(j)/float64(s.hd)))
	}
	b.RoPE = gpu.RoPEParams{Style: gpu.Interleaved, InvFreq: invf, BF16: s.ropeBF16}
	if s.ropeBF16 {
		b.RoPE.Style = gpu.RotateHalf
	}
	rows := s.pos + 2 // a row past pos, which the block must not touch
	b.K, b.V = d.Alloc(gpu.F32, rows, kvd), d.Alloc(gpu.F32, rows, kvd)
	b.X = d.Alloc(gpu.F32, 1, s.D)
	c.free = append(c.free, b.K, b.V, b.X)
	c.x, c.kc, c.vc = bf16s(vals(s.D, 2)), bf16s(vals(rows*kvd, 1)), bf16s(vals(rows*kvd, 1))
	c.b = b
	return c, nil
}

// bf16s rounds v to bfloat16 values (the activations a bf16 network holds).
func bf16s(v []float32) []float32 {
	for i := range v {
		v[i] = gpu.BF16ToF32(gpu.F32ToBF16(v[i]))
	}
	return v
}

// run writes the case's inputs, runs the block on q (fused or its
// sequence) and reads back the row and the caches.
func (c *blockCase) run(q *Queue, fused bool) (x, k, v []float32, launches int, err error) {
	q.Write(c.b.X, c.x)
	q.Write(c.b.K, c.kc)
	q.Write(c.b.V, c.vc)
	if err := q.Sync(); err != nil {
		return nil, nil, nil, 0, err
	}
	var tmps []gpu.Tensor
	tmp := func(rows, cols int) gpu.Tensor {
		t := q.d.Alloc(gpu.F32, rows, cols)
		tmps = append(tmps, t)
		return t
	}
	before := len(q.rec.cmds)
	if fused {
		if why := q.blockUnfusable(c.b); why != "" {
			return nil, nil, nil, 0, fmt.Errorf("the block is not fused: %s", why)
		}
		gpu.RunBlock(q, c.b, tmp)
	} else {
		gpu.BlockSeq(q, c.b, tmp)
	}
	launches = len(q.rec.cmds) - before
	x, k, v = make([]float32, c.b.X.Len()), make([]float32, c.b.K.Len()), make([]float32, c.b.V.Len())
	for _, r := range []struct {
		dst []float32
		t   gpu.Tensor
	}{{x, c.b.X}, {k, c.b.K}, {v, c.b.V}} {
		if err := q.Read(r.dst, r.t); err != nil {
			return nil, nil, nil, 0, err
		}
	}
	for _, t := range tmps {
		q.d.Free(t)
	}
	return x, k, v, launches, nil
}

func (c *blockCase) close(d *Device) {
	for _, t := range c.free {
		d.Free(t)
	}
}

// sameBits returns the first index where a and b differ in bits, or −1.
func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestStdBlockEqualsSeq holds std_block_f32 to the op sequence it stands
// for (gpu.BlockSeq on a queue that fuses nothing), bit for bit: the row
// and both caches, on every shape of blockShapes. On a GPU it also holds
// the one-launch kernel (grid barriers between its phases) to the same
// kernel launched a phase at a time, and counts the launches: one for
// the block where the sequence takes seven or more. A phase a launch runs
// both the kernels of one phase each (the fused block's default) and the five-phase
// kernel (Options.OneKernelBlock). The sequence reads the weights' rows;
// the block runs on their tiled copies (std_blockt_f32) and on the rows
// (std_block_f32).
func TestStdBlockEqualsSeq(t *testing.T) {
	d := openTestDevice(t, Options{MatMul: "mma", FusedBlock: true})
	fq := d.NewQueue("fused").(*Queue)
	sq := d.NewQueue("seq").(*Queue)
	sq.unfused = true
	sq.untiled = true // the sequence on the weights' rows; the block on both (tiled.go)
	for i, s := range blockShapes {
		t.Run(s.String(), func(t *testing.T) {
			c, err := newBlockCase(d, s, uint64(i))
			if err != nil {
				t.Fatal(err)
			}
			defer c.close(d)
			wx, wk, wv, seqN, err := c.run(sq, false)
			if err != nil {
				t.Fatal(err)
			}
			type mode struct{ phased, one bool }
			modes := []mode{{true, false}, {true, true}} // the emulator: always a phase a launch
			if !d.Emulated() {
				modes = append(modes, mode{false, false})
			}
			defer func() { d.phasedBlock, d.oneKernelBlock, fq.untiled = true, false, false }()
			for m := range 2 * len(modes) {
				phased := modes[m/2].phased
				d.phasedBlock, d.oneKernelBlock, fq.untiled = phased, modes[m/2].one, m%2 == 1
				x, k, v, n, err := c.run(fq, true)
				if err != nil {
					t.Fatal(err)
				}
				want := 1
				if phased || d.Emulated() {
					want = blockPhases
				}
				if n != want || seqN < 7 {
					t.Errorf("%+v untiled=%v: %d launches (the sequence %d), want %d", modes[m/2], fq.untiled, n, seqN, want)
				}
				for _, o := range []struct {
					name      string
					got, want []float32
				}{{"x", x, wx}, {"k", k, wk}, {"v", v, wv}} {
					if j := sameBits(o.got, o.want); j >= 0 {
						t.Errorf("%+v untiled=%v: %s[%d] = %v, the sequence %v", modes[m/2], fq.untiled, o.name, j, o.got[j], o.want[j])
					}
				}
				// The cache row past pos is the input's (untouched).
				kvd := s.KVH * s.hd
				if j := sameBits(k[(s.pos+1)*kvd:], c.kc[(s.pos+1)*kvd:]); j >= 0 {
					t.Errorf("%+v untiled=%v: k row %d written", modes[m/2], fq.untiled, s.pos+1)
				}
			}
		})
	}
}

// BenchmarkStdBlock times a one-session depthformer frame's blocks at
// the released sizes (D 1024, 32 heads of 32, 8 KV heads, F 2816): six
// layers' weights (135 MB, beyond L2) through positions 0 … 7, 48 blocks
// a frame as the depthformer runs them, replayed as graphs. Modes: fused
// (std_block_f32, one launch a block), phased (a launch a phase, each the
// kernel of that phase alone), phased-onekernel (a launch a phase, each
// the five-phase kernel) and ops (the op sequence, the default). It
// reports µs a block. GPU only: the emulator's time
// means nothing.
func BenchmarkStdBlock(b *testing.B) {
	d := openTestDevice(b, Options{MatMul: "mma", FusedBlock: true})
	if d.Emulated() {
		b.Skip("timing a kernel needs a GPU")
	}
	s := blockShape{D: 1024, H: 32, KVH: 8, hd: 32, F: 2816, pos: 7}
	var layers []*blockCase
	for l := range 6 {
		c, err := newBlockCase(d, s, uint64(l))
		if err != nil {
			b.Fatal(err)
		}
		defer c.close(d)
		layers = append(layers, c)
	}
	q := d.NewQueue("blocks").(*Queue) // one queue: a device fuses blocks on one
	x := layers[0].b.X
	q.Write(x, layers[0].x)
	var tmps []gpu.Tensor
	next := 0
	tmp := func(rows, cols int) gpu.Tensor { // the sequence's scratch, the same tensors every block
		if next == len(tmps) {
			tmps = append(tmps, d.Alloc(gpu.F32, 1, 4096))
		}
		t := tmps[next]
		next++
		return gpu.Tensor{Buf: t.Buf, Rows: rows, Cols: cols, Stride: cols}
	}
	defer func() {
		for _, t := range tmps {
			d.Free(t)
		}
	}()
	frame := func(ops bool) error {
		for pos := 0; pos <= s.pos; pos++ {
			for _, c := range layers {
				blk := c.b
				blk.X, blk.Pos = x, pos
				next = 0
				if ops { // the sequence as the engine runs it without the fused block
					gpu.BlockSeq(q, blk, tmp)
				} else {
					gpu.RunBlock(q, blk, tmp)
				}
			}
		}
		return q.Sync()
	}
	defer func() { d.phasedBlock, d.oneKernelBlock = true, false }()
	for _, mode := range []string{"fused", "phased", "phased-onekernel", "ops"} {
		b.Run(mode, func(b *testing.B) {
			d.phasedBlock = strings.HasPrefix(mode, "phased")
			d.oneKernelBlock = mode == "phased-onekernel"
			for range 3 { // graphs are built on the second sight
				if err := frame(mode == "ops"); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if err := frame(mode == "ops"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(layers)*(s.pos+1)), "µs/block")
		})
	}
}

// TestShortConvGatedEqualsSeq holds shortconv_seqs_gated_f32
// (gpu.ShortConvSeqsGated's one launch) to its ops (Mul, RoundBF16 and
// shortconv_seqs_f32, on a queue that fuses nothing), bit for bit — the
// output after the epilogue LFM2 folds into it (RoundBF16, ⊙ C,
// RoundBF16) and every state — for a decode step of three sequences, a
// prefill of 40 rows (chunks of rows) and the gate unrounded.
func TestShortConvGatedEqualsSeq(t *testing.T) {
	d := openTestDevice(t, Options{MatMul: "mma"})
	fq := d.NewQueue("fused").(*Queue)
	sq := d.NewQueue("seq").(*Queue)
	sq.unfused = true
	rng := rand.New(rand.NewPCG(43, 44))
	const C, L = 300, 3
	wb := make([]byte, 2*C*L)
	for i := range C * L {
		h := gpu.F32ToBF16(float32(rng.NormFloat64()))
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	w, err := d.Load(gpu.BF16, C, L, wb)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(w)
	for _, c := range []struct {
		rows  []int
		round bool
	}{{[]int{1, 1, 1}, true}, {[]int{40}, true}, {[]int{2, 5}, false}} {
		t.Run(fmt.Sprintf("rows=%v/round=%v", c.rows, c.round), func(t *testing.T) {
			T := 0
			for _, r := range c.rows {
				T += r
			}
			bcx := normals(rng, T*3*C)
			st0 := make([][]float32, len(c.rows))
			for i := range st0 {
				st0[i] = normals(rng, (L-1)*C)
			}
			run := func(q *Queue) (out []float32, states [][]float32, launched map[string]int) {
				x, dst, bx := d.Alloc(gpu.F32, T, 3*C), d.Alloc(gpu.F32, T, C), d.Alloc(gpu.F32, T, C)
				defer func() { d.Free(x); d.Free(dst); d.Free(bx) }()
				sts := make([]gpu.Tensor, len(c.rows))
				for i := range sts {
					sts[i] = d.Alloc(gpu.F32, L-1, C)
					defer d.Free(sts[i])
					q.Write(sts[i], st0[i])
				}
				q.Write(x, bcx)
				q.Fill(dst, float32(math.NaN()))
				stop := d.countLaunches()
				B, Cg, X := x.ColSlice(0, C), x.ColSlice(C, 2*C), x.ColSlice(2*C, 3*C)
				gpu.ShortConvSeqsGated(q, dst, bx, B, X, w, sts, c.rows, c.round)
				q.RoundBF16(dst)
				q.Mul(dst, Cg, dst)
				q.RoundBF16(dst)
				out = make([]float32, T*C)
				if err := q.Read(out, dst); err != nil {
					t.Fatal(err)
				}
				for _, s := range sts {
					v := make([]float32, (L-1)*C)
					if err := q.Read(v, s); err != nil {
						t.Fatal(err)
					}
					states = append(states, v)
				}
				return out, states, stop()
			}
			want, wantSt, ns := run(sq)
			got, gotSt, nf := run(fq)
			if ns["shortconv_seqs_gated_f32"] != 0 || nf["shortconv_seqs_gated_f32"] != 1 || nf["binary_f32"] != 0 {
				t.Errorf("launches: the sequence %v, fused %v", ns, nf)
			}
			if j := sameBits(got, want); j >= 0 {
				t.Errorf("out[%d] = %v, the sequence %v", j, got[j], want[j])
			}
			for i := range gotSt {
				if j := sameBits(gotSt[i], wantSt[i]); j >= 0 {
					t.Errorf("state %d [%d] = %v, the sequence %v", i, j, gotSt[i][j], wantSt[i][j])
				}
			}
		})
	}
}
