package nn

import (
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

func TestArenaHandsOutDistinctBuffers(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	a := NewArena(dev)
	x, y := a.Get(2, 3), a.Get(4, 4)
	if x.Buf == y.Buf {
		t.Fatal("two live temporaries share a buffer")
	}
	m := a.Mark()
	z := a.Get(1, 1)
	a.Release(m)
	if w := a.Get(8, 8); w.Buf == x.Buf || w.Buf == y.Buf || w.Rows != 8 || w.Cols != 8 {
		t.Errorf("after Release: %v reuses a live buffer or has the wrong shape", w)
	}
	_ = z
	a.Reset()
	if again := a.Get(2, 3); again.Buf != x.Buf {
		t.Error("Reset did not recycle the first buffer")
	}
	defer func() {
		if recover() == nil {
			t.Error("Release past the arena's position did not panic")
		}
	}()
	a.Release(99)
}

func TestParsePrecision(t *testing.T) {
	for s, want := range map[string]Precision{"": BF16, "bf16": BF16, "f32": F32, "fp32": F32} {
		if p, err := ParsePrecision(s); err != nil || p != want {
			t.Errorf("ParsePrecision(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := ParsePrecision("fp8"); err == nil {
		t.Error("fp8 accepted")
	}
}
