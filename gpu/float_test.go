package gpu

import (
	"math"
	"testing"
)

func TestBF16Rounding(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{1.00390625, 0x3f80}, // exactly half an ulp above 1: ties to even (down)
		{1.01171875, 0x3f82}, // half an ulp above 0x3f81: ties to even (up)
		{-2, 0xc000},
		{float32(math.Inf(1)), 0x7f80},
		{math.MaxFloat32, 0x7f80}, // rounds up to +Inf as torch does
	}
	for _, tt := range tests {
		if got := F32ToBF16(tt.in); got != tt.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
	if n := BF16ToF32(F32ToBF16(float32(math.NaN()))); !math.IsNaN(float64(n)) {
		t.Errorf("NaN rounded to %v", n)
	}
}

func TestF16ToF32(t *testing.T) {
	tests := []struct {
		in   uint16
		want float32
	}{
		{0x3c00, 1},
		{0xc000, -2},
		{0x7bff, 65504},
		{0x0001, 5.960464477539063e-08}, // smallest subnormal
		{0x0400, 6.103515625e-05},       // smallest normal
		{0x7c00, float32(math.Inf(1))},
	}
	for _, tt := range tests {
		if got := F16ToF32(tt.in); got != tt.want {
			t.Errorf("F16ToF32(%#04x) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
