package weights

import (
	"bytes"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

func file(t *testing.T, ts ...*safetensors.Tensor) *safetensors.File {
	t.Helper()
	var b bytes.Buffer
	if err := safetensors.Write(&b, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Parse(b.Bytes(), "w.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestBinder(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	f := file(t,
		safetensors.NewF32("a.w", []float32{1, 2, 3, 4, 5, 6}, 2, 3),
		safetensors.NewF32("a.b", []float32{7, 8}, 2),
		safetensors.NewF32("extra", []float32{0}, 1),
		safetensors.NewI64("steps", []int64{3}, 1),
	)
	b := New(dev, f)
	a := b.Sub("a")
	w := a.Tensor("w", 2, 3)
	if w.Rows != 2 || w.Cols != 3 || w.DType() != gpu.F32 {
		t.Errorf("a.w bound as %v", w)
	}
	if _, ok := a.Optional("missing", 4); ok {
		t.Error("an absent optional tensor reported present")
	}
	if v := a.Values("b", 2); v[1] != 8 {
		t.Errorf("a.b values %v", v)
	}
	a.Tensor("b", 2) // bound twice: counted once
	b.Skip("steps")
	if got := b.Unexpected(); len(got) != 1 || got[0] != "extra" {
		t.Errorf("unexpected = %v, want [extra]", got)
	}
	if b.Params() != 8 || len(b.Bound()) != 2 || b.Err() != nil {
		t.Errorf("params %d, bound %v, err %v", b.Params(), b.Bound(), b.Err())
	}
	// Every problem is reported at once, each naming its tensor.
	a.Tensor("w", 3, 2)
	a.Tensor("nope", 5)
	b.Tensor("steps", 1)
	err := b.Err()
	for _, want := range []string{`"a.w" has shape [2 3], want [3 2]`, `missing tensor "a.nope"`, `"steps" has dtype I64`, "w.safetensors"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to contain %q", err, want)
		}
	}
}

// TestStandInsAllocateNothing: a tensor the checkpoint lacks or holds in
// another shape costs no device memory, however large the configuration
// says it is (a bad config.json must fail with an error, not exhaust
// memory first), and the stand-in still has the asked-for shape so that
// loading code can go on to report every problem.
func TestStandInsAllocateNothing(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	f := file(t, safetensors.NewF32("small", []float32{1, 2}, 2))
	b := New(dev, f)
	for _, tt := range []struct {
		t          gpu.Tensor
		rows, cols int
	}{
		{b.Tensor("missing", 4096, 4096), 4096, 4096},
		{b.Tensor("small", 1024, 1024, 2), 1024, 2048},
		{func() gpu.Tensor { t, _ := b.Optional("small", 3); return t }(), 1, 3},
	} {
		if tt.t.Rows != tt.rows || tt.t.Cols != tt.cols || tt.t.Stride != tt.cols {
			t.Errorf("stand-in %v, want [%d,%d]", tt.t, tt.rows, tt.cols)
		}
		tt.t.Reshape(tt.cols, tt.rows) // loading code may view it differently
	}
	if used := gpu.DescribeDevice(dev).MemUsed; used != 0 {
		t.Errorf("stand-ins allocated %d bytes", used)
	}
	if b.Err() == nil {
		t.Error("no error for the missing and misshapen tensors")
	}
}

// TestErrListsAFew: a config far from its checkpoint (thousands of missing
// tensors) gives an error of a few lines that says how many more there are.
func TestErrListsAFew(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	b := New(dev, file(t, safetensors.NewF32("x", []float32{1}, 1)))
	for i := range 5000 {
		b.Subf("layers.%d", i).Tensor("w", 2)
	}
	err := b.Err()
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if lines := strings.Count(msg, "\n") + 1; lines > maxListed+1 {
		t.Errorf("error of %d lines", lines)
	}
	for _, want := range []string{`missing tensor "layers.0.w"`, "and 4980 more"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %.300q… lacks %q", msg, want)
		}
	}
}

// TestRows: tensors bound as one hold their rows one after another, each
// name counted as bound; a missing one, another shape, mismatched columns'
// dtypes or one past the device's dtypes is reported by name, with a
// stand-in of the whole shape; columns that differ are the caller's error
// (a panic).
func TestRows(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	f := file(t,
		safetensors.NewF32("q", []float32{1, 2, 3, 4}, 2, 2),
		safetensors.NewF32("k", []float32{5, 6}, 1, 2),
		safetensors.NewF32("v", []float32{7, 8}, 1, 2),
		safetensors.NewI64("i", []int64{1, 2}, 1, 2),
	)
	b := New(dev, f)
	qkv := b.Rows([]string{"q", "k", "v"}, [][]int{{2, 2}, {1, 2}, {1, 2}})
	if qkv.Rows != 4 || qkv.Cols != 2 || b.Err() != nil {
		t.Fatalf("bound %v, err %v", qkv, b.Err())
	}
	got := make([]float32, 8)
	q := dev.NewQueue("t")
	if err := q.Read(got, qkv); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != float32(i+1) {
			t.Fatalf("rows %v, want 1 … 8", got)
		}
	}
	if b.Params() != 8 || len(b.Bound()) != 3 {
		t.Errorf("params %d, bound %v", b.Params(), b.Bound())
	}
	for _, c := range []struct {
		names  []string
		shapes [][]int
		want   string
	}{
		{[]string{"q", "nope"}, [][]int{{2, 2}, {1, 2}}, `missing tensor "nope"`},
		{[]string{"q", "k"}, [][]int{{2, 2}, {2, 2}}, `"k" has shape [1 2], want [2 2]`},
		{[]string{"q", "i"}, [][]int{{2, 2}, {1, 2}}, `"i" has dtype I64, "q" F32`},
		{[]string{"i"}, [][]int{{1, 2}}, `"i" has dtype I64; weights must be`},
	} {
		b := New(dev, f)
		r := b.Rows(c.names, c.shapes)
		err := b.Err()
		if err == nil || !strings.Contains(err.Error(), c.want) || !r.IsNil() {
			t.Errorf("Rows(%v): %v, err %v, want %q and a stand-in", c.names, r, err, c.want)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Rows of different columns did not panic")
			}
		}()
		New(dev, f).Rows([]string{"q", "k"}, [][]int{{2, 2}, {1, 3}})
	}()
}
