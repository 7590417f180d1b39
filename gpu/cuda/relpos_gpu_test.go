package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestRelPosFusedEqualsSeq runs a clip's attention core — the scores of
// all heads, their softmax and its rounding, the products with the values
// — once through the fused kernels (relpos_scores_f32, heads_matmul_f32)
// and once as the per-head op sequences (gpu.RelPosScoresSeq,
// gpu.HeadsMatMulSeq) on the same device, and requires the same bits:
// one row, T not a multiple of 8, an encoder clip (63 rows, 8 heads of
// 64), head dims 64, 80, 128 and past one 256-term chunk (300), 8, 3 and
// 2 heads, with and without the bf16 roundings. The inputs are views as
// the encoder passes them: a clip's rows of taller tensors (aligned, or
// one column off so that no row start is 16-byte aligned), vᵀ a column
// slice. The sequence runs on the warp tiles, and again with every product
// on the 64 × 64 tile kernel (the same bits, TestMatMulTiledBitIdentical),
// on the FMA and on the tensor-core device setting.
func TestRelPosFusedEqualsSeq(t *testing.T) {
	d := openGPU(t)
	defer func() { d.mmaMatMul = false }()
	rng := rand.New(rand.NewPCG(41, 42))
	type shape struct {
		T, heads, hd int
		round        bool
		col          int // the views' first column in their buffers
	}
	shapes := []shape{
		{1, 8, 64, true, 0}, {1, 3, 80, false, 1}, {2, 3, 64, true, 1}, {7, 3, 64, true, 0}, {7, 3, 64, false, 1},
		{9, 8, 64, false, 0}, {13, 3, 80, true, 1}, {20, 3, 128, true, 0}, {5, 2, 300, true, 0}, {5, 2, 300, false, 1},
		{63, 8, 64, true, 0}, {63, 8, 64, false, 1}, {130, 8, 64, true, 0},
	}
	for _, s := range shapes {
		T, dm := s.T, s.heads*s.hd
		const top = 2 // rows above the clip's in its buffers (another clip's)
		wide := dm + s.col + 3
		qu, qv, k := normals(rng, (T+top+1)*wide), normals(rng, (T+top+1)*wide), normals(rng, (T+top+1)*wide)
		P := 2*T - 1
		p := normals(rng, (P+top+1)*wide)
		vtCols := T + 5 // vᵀ of the whole batch: this clip's columns from 3
		vt := normals(rng, dm*vtCols)
		if s.round {
			for _, v := range [][]float32{qu, qv, k, p, vt} {
				for i := range v {
					v[i] = gpu.RoundBF16(v[i])
				}
			}
		}
		rp := gpu.RelPosParams{Heads: s.heads, HeadDim: s.hd, Scale: 1 / float32(math.Sqrt(float64(s.hd))), Round: s.round}
		run := func(fused bool, tiles int8) (scores, o []float32) {
			q := d.NewQueue("relpos").(*Queue)
			q.fmaTiles = tiles
			view := func(vals []float32, rows int) (gpu.Tensor, gpu.Tensor) {
				b := d.Alloc(gpu.F32, rows+top+1, wide)
				q.Write(b, vals)
				return b, b.Slice(top, top+rows).ColSlice(s.col, s.col+dm)
			}
			bqu, vqu := view(qu, T)
			bqv, vqv := view(qv, T)
			bk, vk := view(k, T)
			bp, vp := view(p, P)
			bvt := d.Alloc(gpu.F32, dm, vtCols)
			q.Write(bvt, vt)
			sc, work, out := d.Alloc(gpu.F32, s.heads*T, T), d.Alloc(gpu.F32, T, P), d.Alloc(gpu.F32, T, dm)
			for _, b := range []gpu.Tensor{sc, work, out} {
				q.Fill(b, float32(math.NaN()))
			}
			vtc := bvt.ColSlice(3, 3+T)
			if fused {
				gpu.RelPosScores(q, sc, work, vqu, vqv, vk, vp, rp)
			} else {
				gpu.RelPosScoresSeq(q, sc, work, vqu, vqv, vk, vp, rp)
			}
			scores = make([]float32, sc.Len())
			if err := q.Read(scores, sc); err != nil {
				t.Fatal(err)
			}
			q.Softmax(sc)
			if s.round {
				q.RoundBF16(sc)
			}
			if fused {
				gpu.HeadsMatMul(q, out, sc, vtc, s.heads)
			} else {
				gpu.HeadsMatMulSeq(q, out, sc, vtc, s.heads)
			}
			o = make([]float32, out.Len())
			if err := q.Read(o, out); err != nil {
				t.Fatal(err)
			}
			for _, b := range []gpu.Tensor{bqu, bqv, bk, bp, bvt, sc, work, out} {
				d.Free(b)
			}
			return scores, o
		}
		for _, mma := range []bool{false, true} {
			d.mmaMatMul = mma
			gotS, gotO := run(true, 0)
			for _, tiles := range []int8{-1, 1} {
				name := fmt.Sprintf("T=%d/heads=%d/hd=%d/round=%v/col=%d/mma=%v/tiles=%d", T, s.heads, s.hd, s.round, s.col, mma, tiles)
				wantS, wantO := run(false, tiles)
				if n := differing(gotS, wantS); n > 0 {
					i := firstDiffering(gotS, wantS)
					t.Errorf("%s: %d/%d scores differ from the sequence's; first [%d, %d]: fused %v, sequence %v",
						name, n, len(gotS), i/T, i%T, gotS[i], wantS[i])
				}
				if n := differing(gotO, wantO); n > 0 {
					i := firstDiffering(gotO, wantO)
					t.Errorf("%s: %d/%d products with v differ from the sequence's; first [%d, %d]: fused %v, sequence %v",
						name, n, len(gotO), i/dm, i%dm, gotO[i], wantO[i])
				}
				if nan := countNaN(gotS) + countNaN(gotO); nan > 0 {
					t.Errorf("%s: %d outputs left unwritten (NaN)", name, nan)
				}
			}
		}
	}
}

// TestRelPosLaunches: a clip's scores and products with v are one launch
// each whatever the number of heads (recorded, not run: no GPU needed).
func TestRelPosLaunches(t *testing.T) {
	q := hostQueue()
	const T, heads, hd = 9, 8, 64
	dm := heads * hd
	sc, work := fakeTensor(gpu.F32, heads*T, T), fakeTensor(gpu.F32, T, 2*T-1)
	qu, qv, k, p := fakeTensor(gpu.F32, T, dm), fakeTensor(gpu.F32, T, dm), fakeTensor(gpu.F32, T, dm), fakeTensor(gpu.F32, 2*T-1, dm)
	o, vt := fakeTensor(gpu.F32, T, dm), fakeTensor(gpu.F32, dm, T)
	gpu.RelPosScores(q, sc, work, qu, qv, k, p, gpu.RelPosParams{Heads: heads, HeadDim: hd, Scale: 0.125, Round: true})
	gpu.HeadsMatMul(q, o, sc, vt, heads)
	if n := len(q.rec.cmds); n != 2 {
		t.Fatalf("%d launches recorded, want 2", n)
	}
	for j, want := range []struct {
		name string
		grid [3]uint32
	}{{"relpos_scores_f32", [3]uint32{1, T, heads}}, {"heads_matmul_f32", [3]uint32{4, 2, heads}}} {
		c := q.rec.cmds[j]
		if got := kernelNames[c.fn-1]; got != want.name || c.grid != want.grid {
			t.Errorf("launch %d: %s grid %v, want %s grid %v", j, got, c.grid, want.name, want.grid)
		}
	}
	q.unfused = true
	q.rec.reset()
	gpu.RelPosScores(q, sc, work, qu, qv, k, p, gpu.RelPosParams{Heads: heads, HeadDim: hd, Scale: 0.125})
	gpu.HeadsMatMul(q, o, sc, vt, heads)
	// Per head the two score products (the add folds into the second's
	// epilogue: work is another buffer), the scale, per head a product.
	if n := len(q.rec.cmds); n != 3*heads+1 {
		t.Errorf("unfused: %d launches, want %d", n, 3*heads+1)
	}
}

func countNaN(v []float32) int {
	n := 0
	for _, x := range v {
		if x != x {
			n++
		}
	}
	return n
}
