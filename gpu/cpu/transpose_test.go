package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// transposeReplay is the float64 replay of Transpose: out[c][r] = in[r][c].
func transposeReplay(in [][]float64) [][]float64 {
	if len(in) == 0 {
		return nil
	}
	out := make([][]float64, len(in[0]))
	for c := range out {
		out[c] = make([]float64, len(in))
		for r := range in {
			out[c][r] = in[r][c]
		}
	}
	return out
}

func TestTranspose(t *testing.T) {
	dev := New(2)
	defer dev.Close()
	q := dev.NewQueue("test")
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name            string
		rows, cols      int
		srcPad, dstPad  int // extra columns around the views (strided operands)
		plantSwapFirst2 bool
		wantFaultCaught bool
	}{
		{name: "1x1", rows: 1, cols: 1},
		{name: "row", rows: 1, cols: 70},
		{name: "column", rows: 45, cols: 1},
		{name: "square tile edge", rows: 32, cols: 32},
		{name: "ragged tiles", rows: 33, cols: 67},
		{name: "strided views", rows: 40, cols: 9, srcPad: 5, dstPad: 3},
		{name: "planted fault", rows: 5, cols: 6, plantSwapFirst2: true, wantFaultCaught: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := make([][]float64, tc.rows)
			sb := dev.Alloc(gpu.F32, tc.rows, tc.cols+tc.srcPad)
			src := sb.ColSlice(tc.srcPad/2, tc.srcPad/2+tc.cols)
			host := F32(sb)
			for r := range in {
				in[r] = make([]float64, tc.cols)
				for c := range in[r] {
					v := float32(rng.NormFloat64())
					in[r][c] = float64(v)
					host[r*sb.Stride+tc.srcPad/2+c] = v
				}
			}
			db := dev.Alloc(gpu.F32, tc.cols, tc.rows+tc.dstPad)
			dst := db.ColSlice(tc.dstPad, tc.dstPad+tc.rows)
			q.Transpose(dst, src)
			got := make([]float32, dst.Len())
			if err := q.Read(got, dst); err != nil {
				t.Fatal(err)
			}
			if tc.plantSwapFirst2 {
				got[0], got[1] = got[1], got[0]
			}
			want := transposeReplay(in)
			bad := 0
			for c := range want {
				for r := range want[c] {
					if float64(got[c*tc.rows+r]) != want[c][r] {
						bad++
					}
				}
			}
			if caught := bad > 0; caught != tc.wantFaultCaught {
				t.Errorf("%d of %d elements differ from the replay (fault planted: %v)", bad, dst.Len(), tc.wantFaultCaught)
			}
			// The padding around the destination view is untouched.
			dh := F32(db)
			for c := 0; c < tc.cols; c++ {
				for j := 0; j < tc.dstPad; j++ {
					if dh[c*db.Stride+j] != 0 {
						t.Fatalf("transpose wrote outside dst at row %d column %d", c, j)
					}
				}
			}
		})
	}
}
