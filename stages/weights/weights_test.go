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
