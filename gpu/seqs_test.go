package gpu_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// copyCounter counts the Copy ops a queue runs.
type copyCounter struct {
	gpu.Queue
	copies []string
}

func (c *copyCounter) Copy(dst, src gpu.Tensor) {
	c.copies = append(c.copies, fmt.Sprintf("%d+%d<-%d", dst.Off, dst.Rows, src.Off))
	c.Queue.Copy(dst, src)
}

// TestCopyRowsSeq: on a queue without RowCopier, CopyRows copies each run of
// rows consecutive in both tensors with one Copy, and the rows land.
func TestCopyRowsSeq(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	q := &copyCounter{Queue: dev.NewQueue("t")}
	src, dst := dev.Alloc(gpu.F32, 8, 2), dev.Alloc(gpu.F32, 10, 2)
	sv := make([]float32, 16)
	for i := range sv {
		sv[i] = float32(i + 1)
	}
	q.Write(src, sv)
	q.Fill(dst, 0)
	gpu.CopyRows(q, dst, src, []int32{3, 4, 5, 9, 0}, []int32{0, 1, 2, 7, 2})
	if len(q.copies) != 3 {
		t.Errorf("copies %v, want 3 (rows 3–5 from 0–2 in one)", q.copies)
	}
	got := make([]float32, 20)
	if err := q.Read(got, dst); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, 20)
	for _, p := range [][2]int{{3, 0}, {4, 1}, {5, 2}, {9, 7}, {0, 2}} {
		want[2*p[0]], want[2*p[0]+1] = sv[2*p[1]], sv[2*p[1]+1]
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("dst %v, want %v", got, want)
		}
	}
}

// TestSameBufferDisjoint: views of one buffer whose extents do not overlap
// may be copied between (two scratch tensors of one arena).
func TestSameBufferDisjoint(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	q := dev.NewQueue("t")
	a := dev.Alloc(gpu.F32, 6, 2)
	q.Write(a, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	gpu.CopyRows(q, a.Slice(0, 3), a.Slice(3, 6), []int32{2, 0}, []int32{0, 1})
	gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Slice(1, 2), Src: a.Slice(5, 6)}, {Dst: a.Slice(3, 4), Src: a.Slice(4, 5)}})
	got := make([]float32, 12)
	if err := q.Read(got, a); err != nil {
		t.Fatal(err)
	}
	want := []float32{9, 10, 11, 12, 7, 8, 9, 10, 9, 10, 11, 12}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestBatchedOpArguments: the batched ops refuse bad arguments with a
// message that names the problem, before any work is queued.
func TestBatchedOpArguments(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	q := dev.NewQueue("t")
	a, b := dev.Alloc(gpu.F32, 4, 3), dev.Alloc(gpu.F32, 4, 3)
	wide := dev.Alloc(gpu.F32, 4, 5)
	ints := dev.Alloc(gpu.I32, 4, 3)
	w := dev.Alloc(gpu.F32, 3, 2)
	st := dev.Alloc(gpu.F32, 1, 3)
	for _, c := range []struct {
		name, want string
		op         func()
	}{
		{"rows: lengths differ", "copy 1 rows", func() { gpu.CopyRows(q, a, b, []int32{0, 1}, []int32{0}) }},
		{"rows: overlapping views", "copy 1 rows", func() { gpu.CopyRows(q, a.Slice(0, 3), a.Slice(2, 4), []int32{0}, []int32{0}) }},
		{"rows: columns differ", "copy 1 rows", func() { gpu.CopyRows(q, wide, b, []int32{0}, []int32{0}) }},
		{"rows: types differ", "copy 1 rows", func() { gpu.CopyRows(q, ints, b, []int32{0}, []int32{0}) }},
		{"rows: dst row outside", "copy row 0", func() { gpu.CopyRows(q, a, b, []int32{4}, []int32{0}) }},
		{"rows: src row negative", "copy row -1", func() { gpu.CopyRows(q, a, b, []int32{0}, []int32{-1}) }},
		{"rows: dst row twice", "written twice", func() { gpu.CopyRows(q, a, b, []int32{1, 1}, []int32{0, 2}) }},
		{"many: shapes differ", "gpu: copy", func() { gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Slice(0, 1), Src: b.Slice(0, 2)}}) }},
		{"many: dst over its src", "overlaps", func() { gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Slice(0, 2), Src: a.Slice(1, 3)}}) }},
		{"many: dst over another dst", "destination", func() {
			gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Slice(0, 2), Src: b.Slice(0, 2)}, {Dst: a.Slice(1, 3), Src: b.Slice(2, 4)}})
		}},
		{"many: src under another dst", "source", func() {
			gpu.CopyMany(q, []gpu.CopyPair{{Dst: a.Slice(0, 2), Src: b.Slice(0, 2)}, {Dst: b.Slice(2, 3), Src: a.Slice(1, 2)}})
		}},
		{"attention: rows differ", "attention of 2 sequence rows", func() {
			gpu.AttentionSeqs(q, a, b, gpu.AttnParams{Heads: 1, KVHeads: 1, HeadDim: 3}, []gpu.AttnSeq{{Rows: 2, K: a, V: b}})
		}},
		{"attention: negative rows", "sequence of -1 rows", func() {
			gpu.AttentionSeqs(q, a, b, gpu.AttnParams{Heads: 1, KVHeads: 1, HeadDim: 3}, []gpu.AttnSeq{{Rows: -1}, {Rows: 5}})
		}},
		{"conv: rows differ", "short conv of 1 sequences (3 rows)", func() { gpu.ShortConvSeqs(q, a, b, w, []gpu.Tensor{st}, []int{3}) }},
		{"conv: states and rows differ", "short conv of 2 sequences", func() { gpu.ShortConvSeqs(q, a, b, w, []gpu.Tensor{st, st}, []int{4}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), c.want) {
					t.Errorf("panic %v, want one saying %q", r, c.want)
				}
			}()
			c.op()
		})
	}
}
