package pipeline

import (
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// TestScratchFor: rows written through scratchFor land at their rows of x,
// whether the rows are consecutive (written in place) or scattered (a
// scratch tensor and one row copy), and no other row changes.
func TestScratchFor(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	c := nn.NewCtx(dev, dev.NewQueue("t"), nn.F32)
	defer c.A.Free()
	for _, rows := range [][]int32{{1, 2, 3}, {4, 0, 2}, {3}} {
		x := c.Tmp(5, 2)
		c.Q.Fill(x, -1)
		dst, scatter := scratchFor(c, x, rows)
		vals := make([]float32, 2*len(rows))
		for i := range vals {
			vals[i] = float32(i + 1)
		}
		c.Q.Write(dst, vals)
		scatter()
		got := make([]float32, 10)
		if err := c.Q.Read(got, x); err != nil {
			t.Fatal(err)
		}
		want := slices.Repeat([]float32{-1}, 10)
		for j, r := range rows {
			want[2*r], want[2*r+1] = vals[2*j], vals[2*j+1]
		}
		if !slices.Equal(got, want) {
			t.Errorf("rows %v: x %v, want %v", rows, got, want)
		}
	}
}
