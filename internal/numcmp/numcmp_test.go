package numcmp

import (
	"math"
	"testing"
)

func TestCompare(t *testing.T) {
	d := Compare([]float32{1, 2, 3, 4}, []float64{1, 2, 3, 4})
	if d.MaxAbs != 0 || d.RelL2 != 0 || d.Cosine != 1 || !math.IsInf(d.SNRdB, 1) {
		t.Errorf("identical: %+v", d)
	}
	d = Compare([]float64{1, 0, 0}, []float64{0, 1, 0})
	if d.Cosine != 0 || d.MaxAbs != 1 || d.ArgMax != 0 {
		t.Errorf("orthogonal: %+v", d)
	}
	d = Compare([]float32{1.1, 2}, []float32{1, 2})
	if math.Abs(d.MaxAbs-0.1) > 1e-6 || math.Abs(d.RelL2-0.1/math.Sqrt(5)) > 1e-6 {
		t.Errorf("small error: %+v", d)
	}
	if d := Compare([]float32{float32(math.NaN()), 1}, []float32{0, 1}); d.NaNs != 1 {
		t.Errorf("NaN not counted: %+v", d)
	}
}

func TestArgmaxAndMargin(t *testing.T) {
	x := []float32{1, 3, float32(math.NaN()), 3, 2}
	if got := Argmax(x); got != 1 {
		t.Errorf("Argmax = %d, want 1 (first of the tied maxima, NaN never wins)", got)
	}
	if got := Margin(x); got != 0 {
		t.Errorf("Margin of a tie = %v", got)
	}
	if got := Margin([]float64{5, 3, 1}); got != 2 {
		t.Errorf("Margin = %v, want 2", got)
	}
}

func TestRowCosines(t *testing.T) {
	all, min := RowCosines([]float32{1, 0, 0, 1}, []float32{1, 0, 1, 0}, 2)
	if len(all) != 2 || all[0] != 1 || min != 0 {
		t.Errorf("rows %v, min %v", all, min)
	}
}
