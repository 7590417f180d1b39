package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// pagedCopy scatters the rows of contiguous keys k into a new pool of
// blocks of br rows, the logical blocks in shuffled pool blocks with spare
// blocks among them; every row outside the keys' (the spares, the ragged
// last block's tail) holds the poison. It returns the pool, the table and
// the table as an I32 tensor.
func pagedCopy(d *Device, rng *rand.Rand, k gpu.Tensor, br, spare int) (pool gpu.Tensor, table []int32, blocks gpu.Tensor) {
	n := (k.Rows + br - 1) / br
	total := n + spare
	pool = view(d, gpu.F32, total*br, k.Cols, 0, 0)
	perm := rng.Perm(total)
	table = make([]int32, n)
	for b := range table {
		table[b] = int32(perm[b])
	}
	for j := 0; j < k.Rows; j++ {
		r := int(table[j/br])*br + j%br
		copy(f32s(pool)[r*pool.Stride:][:k.Cols], f32s(k)[j*k.Stride:][:k.Cols])
	}
	// The table sits inside a wider I32 buffer: only its view is read.
	full := d.Alloc(gpu.I32, 1, n+3)
	for i := range buf(full).i32 {
		buf(full).i32[i] = -7
	}
	blocks = gpu.Tensor{Buf: full.Buf, Off: 1, Rows: 1, Cols: n, Stride: n}
	copy(i32s(blocks), table)
	return pool, table, blocks
}

// TestAttentionPagedEqualsContiguous: keys read through a block table out
// of a shuffled pool give the contiguous keys' floats bit for bit, for every
// case of TestAttention and longer ones (runs of keys longer than the value
// product's K block), blocks of 1 to 64 rows (a ragged last block), with
// and without a window, GQA, several query rows and single decode rows,
// both weight modes, both kernel sets and worker counts.
func TestAttentionPagedEqualsContiguous(t *testing.T) {
	cases := append([]attnCase{
		{3, 600, gpu.AttnParams{Heads: 4, KVHeads: 2, HeadDim: 16, QPos0: 597, Causal: true}},
		{9, 530, gpu.AttnParams{Heads: 2, KVHeads: 1, HeadDim: 8, QPos0: 521, Causal: true, Window: 300}},
	}, attnCases...)
	for _, ks := range kernelSets(t) {
		for _, workers := range []int{1, 2} {
			dev, q := newTestDevice(t, workers, ks.asm)
			for ci, c := range cases {
				for _, br := range []int{1, 3, 16, 64} {
					for _, probBF16 := range []bool{false, true} {
						name := fmt.Sprintf("%s/w%d/case%d/block%d/probbf16=%v", ks.name, workers, ci, br, probBF16)
						t.Run(name, func(t *testing.T) {
							rng := rand.New(rand.NewPCG(uint64(ci), uint64(br)))
							c.p.ProbBF16 = probBF16
							c.p.Scale = float32(1 / math.Sqrt(float64(c.p.HeadDim)))
							qt, k, v := attnInputs(dev, rng, c)
							q.Scale(qt, qt, 3)
							want := view(dev, gpu.F32, c.rows, qt.Cols, 0, 0)
							q.Attention(want, qt, k, v, c.p)

							prng := rand.New(rand.NewPCG(uint64(ci), 99))
							kp, table, blocks := pagedCopy(dev, prng, k, br, 2)
							prng = rand.New(rand.NewPCG(uint64(ci), 99)) // the same shuffle for the values
							vp, _, _ := pagedCopy(dev, prng, v, br, 2)
							p := c.p
							p.Blocks, p.BlockRows, p.Keys = blocks, br, c.keys
							got := view(dev, gpu.F32, c.rows, qt.Cols, 1, 1)
							q.Attention(got, qt, kp, vp, p)
							checkPadding(t, got)
							if r, col, ok := bitsEqual(got, want); !ok {
								t.Fatalf("paged [%d,%d] = %v, contiguous %v (table %v)", r, col, at(got, r, col), at(want, r, col), table)
							}
							// Each row alone (a decode step through the table).
							for i := 0; i < c.rows; i++ {
								one := view(dev, gpu.F32, 1, qt.Cols, 0, 0)
								pi := p
								pi.QPos0 += i
								q.Attention(one, qt.Row(i), kp, vp, pi)
								if _, col, ok := bitsEqual(one, want.Row(i)); !ok {
									t.Fatalf("row %d alone through the table differs at column %d", i, col)
								}
							}
						})
					}
				}
			}
		}
	}
}

// attnInputs returns random contiguous q [rows, heads·hd], k and v [keys,
// kvheads·hd] for c.
func attnInputs(dev *Device, rng *rand.Rand, c attnCase) (qt, k, v gpu.Tensor) {
	kvw := c.p.KVHeads * c.p.HeadDim
	qt = view(dev, gpu.F32, c.rows, c.p.Heads*c.p.HeadDim, 0, 0)
	k = view(dev, gpu.F32, c.keys, kvw, 0, 0)
	v = view(dev, gpu.F32, c.keys, kvw, 0, 0)
	for _, x := range []gpu.Tensor{qt, k, v} {
		fillRandom(rng, x)
	}
	return qt, k, v
}

// TestAttentionPagedReadsTable: the result follows the table. Swapping two
// pool blocks' contents without updating the table changes the output;
// swapping the table entries too restores it bit for bit.
func TestAttentionPagedReadsTable(t *testing.T) {
	dev, q := newTestDevice(t, 2, haveAsm)
	c := attnCase{4, 40, gpu.AttnParams{Heads: 4, KVHeads: 2, HeadDim: 8, QPos0: 36, Causal: true, Scale: 0.35}}
	qt, k, v := attnInputs(dev, rand.New(rand.NewPCG(3, 3)), c)
	const br = 8
	kp, table, blocks := pagedCopy(dev, rand.New(rand.NewPCG(5, 5)), k, br, 0)
	vp, _, _ := pagedCopy(dev, rand.New(rand.NewPCG(5, 5)), v, br, 0)
	p := c.p
	p.Blocks, p.BlockRows, p.Keys = blocks, br, c.keys
	want := view(dev, gpu.F32, c.rows, qt.Cols, 0, 0)
	q.Attention(want, qt, kp, vp, p)

	swapRows := func(pool gpu.Tensor, a, b int32) {
		s := f32s(pool)
		for r := 0; r < br; r++ {
			ra, rb := (int(a)*br+r)*pool.Stride, (int(b)*br+r)*pool.Stride
			for col := 0; col < pool.Cols; col++ {
				s[ra+col], s[rb+col] = s[rb+col], s[ra+col]
			}
		}
	}
	swapRows(kp, table[1], table[3])
	swapRows(vp, table[1], table[3])
	stale := view(dev, gpu.F32, c.rows, qt.Cols, 0, 0)
	q.Attention(stale, qt, kp, vp, p)
	if _, _, ok := bitsEqual(stale, want); ok {
		t.Fatal("moving two blocks' rows without their table entries changed nothing")
	}
	tb := i32s(blocks)
	tb[1], tb[3] = tb[3], tb[1]
	again := view(dev, gpu.F32, c.rows, qt.Cols, 0, 0)
	q.Attention(again, qt, kp, vp, p)
	if r, col, ok := bitsEqual(again, want); !ok {
		t.Fatalf("table updated with the move: [%d,%d] differs", r, col)
	}
}

// TestAttentionPagedBadTable: a table naming a block outside the pool, too
// short for Keys, or a pool that is not whole blocks is a programmer error
// and panics before anything is computed.
func TestAttentionPagedBadTable(t *testing.T) {
	dev, q := newTestDevice(t, 1, false)
	p := gpu.AttnParams{Heads: 1, KVHeads: 1, HeadDim: 4, Scale: 0.5, Causal: true, QPos0: 9, BlockRows: 4, Keys: 10}
	qt := dev.Alloc(gpu.F32, 1, 4)
	pool := dev.Alloc(gpu.F32, 16, 4) // four blocks
	for _, tc := range []struct {
		name  string
		table []int32
		pool  gpu.Tensor
		keys  int
	}{
		{"block outside the pool", []int32{0, 4, 1}, pool, 10},
		{"negative block", []int32{0, -1, 1}, pool, 10},
		{"table too short", []int32{0, 1}, pool, 10},
		{"pool not whole blocks", []int32{0, 1, 2}, pool.Slice(0, 14), 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := dev.Alloc(gpu.I32, 1, len(tc.table))
			copy(i32s(b), tc.table)
			pp := p
			pp.Blocks, pp.Keys = b, tc.keys
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			q.Attention(dev.Alloc(gpu.F32, 1, 4), qt, tc.pool, tc.pool, pp)
		})
	}
}

// BenchmarkAttention: LFM2's GQA (32 query heads, 8 KV heads, 64 dims) for
// a 93-row prefill and for one decode row over 500 and 2000 cached keys,
// the keys contiguous and paged in blocks of 64 rows of a shuffled pool
// (what stages/lfm2's caches pass): the cost of the table.
func BenchmarkAttention(b *testing.B) {
	for _, ks := range benchKernels(b) {
		for _, c := range []struct{ rows, keys int }{{93, 93}, {1, 500}, {1, 2000}} {
			for _, paged := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/rows%d/keys%d/paged=%v", ks.name, c.rows, c.keys, paged), func(b *testing.B) {
					d := newDevice(benchWorkers, ks.asm)
					defer d.Close()
					q := d.NewQueue("bench")
					qt := benchTensor(d, gpu.F32, c.rows, 2048)
					k := benchTensor(d, gpu.F32, c.keys, 512)
					v := benchTensor(d, gpu.F32, c.keys, 512)
					o := d.Alloc(gpu.F32, c.rows, 2048)
					p := gpu.AttnParams{Heads: 32, KVHeads: 8, HeadDim: 64, Scale: 0.125, QPos0: c.keys - c.rows, Causal: true}
					if paged {
						rng := rand.New(rand.NewPCG(1, 2))
						k, _, p.Blocks = pagedCopy(d, rng, k, 64, 4)
						rng = rand.New(rand.NewPCG(1, 2))
						v, _, _ = pagedCopy(d, rng, v, 64, 4)
						p.BlockRows, p.Keys = 64, c.keys
					}
					best := timed(b, func() { q.Attention(o, qt, k, v, p) })
					b.ReportMetric(best.Seconds()*1e6, "µs-best")
				})
			}
		}
	}
}
