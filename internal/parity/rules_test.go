package parity

import (
	"math"
	"strings"
	"testing"
)

func TestUlp(t *testing.T) {
	for _, c := range []struct{ top, want float64 }{
		{10, 0.0625}, {8, 0.0625}, {15.99, 0.0625}, {16, 0.125}, {-10, 0.0625},
		{1, 1.0 / 128}, {0.7, 1.0 / 256}, {-3, 1.0 / 64},
	} {
		if got := ulp(c.top); got != c.want {
			t.Errorf("ulp(%v) = %v, want %v", c.top, got, c.want)
		}
	}
	for _, top := range []float64{0, math.NaN(), math.Inf(1)} {
		if got := ulp(top); !math.IsNaN(got) {
			t.Errorf("ulp(%v) = %v, want NaN", top, got)
		}
	}
}

// miss is a miss whose reference won by k ulps at a top logit of 10.
func miss(k float64) Miss {
	return Miss{Step: 3, Codebook: 1, Ours: 5, Ref: 9, RefMargin: k * 0.0625, RefTop: 10, OurGap: 0.0625}
}

func TestDepthRule(t *testing.T) {
	for _, c := range []struct {
		name   string
		misses []Miss
		want   bool
	}{
		{"none", nil, true},
		{"an exact tie", []Miss{miss(0)}, true},
		{"two at 2 ulps", []Miss{miss(2), miss(2)}, true},
		{"one at 3 ulps", []Miss{miss(1), miss(3)}, false},
		{"one at 2.5 ulps", []Miss{miss(2.5)}, false},
		{"an unknown margin", []Miss{{RefMargin: math.NaN(), RefTop: 10}}, false},
		{"an unknown top", []Miss{{RefMargin: 0, RefTop: math.NaN()}}, false},
	} {
		if got := depthRule(c.misses); got != c.want {
			t.Errorf("%s: depthRule = %v, want %v", c.name, got, c.want)
		}
	}
}

// moved is an F32 run's miss whose reference won by k ulps and whose pair
// moved by mv ulps (our gap mv − k), at a top logit of 10.
func moved(k, mv float64) Miss {
	return Miss{Step: 2, Codebook: 0, Ours: 1, Ref: 2, RefMargin: k * 0.0625, RefTop: 10, OurGap: (mv - k) * 0.0625}
}

func TestNoiseBound(t *testing.T) {
	for _, c := range []struct {
		name string
		f32  []Miss
		want float64
	}{
		{"no f32 misses: the floor", nil, loopUlps},
		{"small moves: the floor", []Miss{moved(1, 2), moved(0, 3)}, loopUlps},
		{"√2 times the largest move", []Miss{moved(1, 2), moved(9, 10), moved(4, 6)}, math.Sqrt2 * 10},
		{"a move, not the margin", []Miss{moved(5, 12)}, math.Sqrt2 * 12},
		{"an unknown move is skipped", []Miss{moved(9, 10), {RefMargin: math.NaN(), RefTop: 10}}, math.Sqrt2 * 10},
	} {
		if got := noiseBound(c.f32); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: noiseBound = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLoopRule(t *testing.T) {
	f32 := func(n int, mv float64) []Miss {
		out := make([]Miss, n)
		for i := range out {
			out[i] = moved(0, 1)
		}
		if n > 0 {
			out[0] = moved(mv-1, mv)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		misses []Miss
		f32    []Miss
		want   bool
	}{
		{"none", nil, nil, true},
		{"as many as the f32 run, at 8 ulps", []Miss{miss(8), miss(1)}, f32(2, 1), true},
		{"fewer than the f32 run", []Miss{miss(3)}, f32(5, 1), true},
		{"one more than the f32 run", []Miss{miss(0), miss(0), miss(0)}, f32(2, 1), false},
		{"one at 9 ulps, the f32 run's moves small", []Miss{miss(9)}, f32(4, 2), false},
		{"one at 18 ulps, the f32 run moving 13", []Miss{miss(18)}, f32(4, 13), true},
		{"one at 19 ulps, the f32 run moving 13", []Miss{miss(19)}, f32(4, 13), false},
	} {
		if got := loopRule(c.misses, c.f32); got != c.want {
			t.Errorf("%s: loopRule = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDivergenceRule(t *testing.T) {
	at := func(k float64) *Miss { m := miss(k); return &m }
	other := func(k float64) *Miss { m := miss(k); m.Step++; return &m }
	wrongWay := func(k float64) *Miss { m := miss(k); m.Ours++; return &m }
	stopped := &Miss{Step: 5, Codebook: -1, Ours: -1, Ref: -1, RefMargin: math.NaN(), RefTop: math.NaN()}
	for _, c := range []struct {
		name          string
		first, forced *Miss
		want          bool
	}{
		{"never diverged, the forced run never missed", nil, nil, true},
		{"at the forced run's first miss, a tie", at(0), at(0), true},
		{"at the forced run's first miss, at the bound", at(8), at(8), true},
		{"at the forced run's first miss, past the bound", at(9), at(9), false},
		{"at another step than the forced run's first miss", at(1), other(1), false},
		{"the same pick gone another way", at(1), wrongWay(1), false},
		{"diverged where the forced run never missed", at(1), nil, false},
		{"never diverged though the forced run missed", nil, at(1), false},
		{"stopped short of the trace", stopped, nil, false},
	} {
		if got := divergenceRule(c.first, c.forced, 8); got != c.want {
			t.Errorf("%s: divergenceRule = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestNewMiss(t *testing.T) {
	ours := []float32{1, 9.5, 9.75, 3}
	// No stored reference logits: its top is our logit of its pick.
	m := newMiss(4, 2, 2, 1, 0.125, ours, nil)
	if m.RefTop != 9.5 || m.OurGap != 0.25 || m.Ulps() != 2 {
		t.Errorf("without stored logits: top %v gap %v ulps %v, want 9.5, 0.25, 2", m.RefTop, m.OurGap, m.Ulps())
	}
	// Stored logits: their maximum.
	m = newMiss(4, 2, 2, 1, 0.125, ours, []float32{17, 16.875, 0})
	if m.RefTop != 17 || m.Ulps() != 1 {
		t.Errorf("with stored logits: top %v ulps %v, want 17, 1", m.RefTop, m.Ulps())
	}
	s := m.String()
	for _, want := range []string{"step 4 codebook 2", "ours 2, reference 1", "= 1 ulps"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q lacks %q", s, want)
		}
	}
	if s := newMiss(7, -1, 3, 0, 0, ours, nil).String(); strings.Contains(s, "codebook") {
		t.Errorf("a text miss names a codebook: %q", s)
	}
}

func TestMarginShift(t *testing.T) {
	for _, c := range []struct {
		name      string
		logits    []float32
		want      int
		refMargin float64
		shift     float64
	}{
		// ulp at 9.5 is 0.0625.
		{"the reference's margin exactly", []float32{1, 9.5, 9.25}, 1, 0.25, 0},
		{"ours one ulp wider", []float32{1, 9.5, 9.1875}, 1, 0.25, 1},
		{"ours the other way: a miss", []float32{1, 9.5, 9.625}, 1, 0.125, -4},
		{"no logits", nil, 1, 0.25, math.NaN()},
		{"the pick out of range", []float32{1, 2}, 2, 0, math.NaN()},
	} {
		got := marginShift(c.logits, c.want, c.refMargin)
		if got != c.shift && !(math.IsNaN(got) && math.IsNaN(c.shift)) {
			t.Errorf("%s: marginShift = %v, want %v", c.name, got, c.shift)
		}
	}
}
