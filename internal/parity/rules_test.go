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

func TestNoiseOf(t *testing.T) {
	for _, c := range []struct {
		name   string
		shifts []float64
		want   noise
	}{
		{"none", nil, noise{}},
		{"only unknown", []float64{math.NaN()}, noise{}},
		{"rms and reach", []float64{3, -4, math.NaN()}, noise{n: 2, rms: math.Sqrt(12.5), reach: 4}},
		{"zeros", []float64{0, 0, 0}, noise{n: 3}},
	} {
		if got := noiseOf(c.shifts); got.n != c.want.n || math.Abs(got.rms-c.want.rms) > 1e-12 || got.reach != c.want.reach {
			t.Errorf("%s: noiseOf = %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestNoiseBound(t *testing.T) {
	for _, c := range []struct {
		name string
		f32  noise
		want float64
	}{
		{"no f32 picks: the floor", noise{}, loopUlps},
		{"a small reach: the floor (the fixtures' 3.5–5.3)", noise{n: 288, rms: 1.2, reach: 5.34}, loopUlps},
		{"√2 times the reach", noise{n: 288, rms: 4.4, reach: 13.68}, math.Sqrt2 * 13.68},
	} {
		if got := noiseBound(c.f32); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: noiseBound = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestNoiseRule(t *testing.T) {
	f32 := noise{n: 288, rms: 4, reach: 13}
	for _, c := range []struct {
		name    string
		bf, f32 noise
		want    bool
	}{
		{"the reference's rounding: well inside", noise{n: 288, rms: 0.4}, f32, true},
		{"the same size", noise{n: 288, rms: 4}, f32, true},
		{"√2 times: at the bound", noise{n: 288, rms: 4 * math.Sqrt2}, f32, true},
		{"past √2 times", noise{n: 288, rms: 5.7}, f32, false},
		{"no shifts of ours", noise{}, f32, false},
		{"no shifts of the f32 run's", noise{n: 288, rms: 1}, noise{}, false},
	} {
		if got := noiseRule(c.bf, c.f32); got != c.want {
			t.Errorf("%s: noiseRule = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLoopRule(t *testing.T) {
	n := func(k int) []Miss { return make([]Miss, k) }
	quiet := noise{n: 288, rms: 1.2, reach: 5} // the fixtures' f32 runs
	loud := noise{n: 288, rms: 4.4, reach: 13} // the released sizes'
	for _, c := range []struct {
		name     string
		misses   []Miss
		f32      []Miss
		bf, f32n noise
		shared   bool
		want     bool
	}{
		{"none", nil, nil, noise{n: 288}, quiet, true, true},
		{"shared: as many as the f32 run, at 8 ulps", []Miss{miss(8), miss(1)}, n(2), noise{n: 288, rms: 0.5}, quiet, true, true},
		{"shared: fewer than the f32 run", []Miss{miss(3)}, n(5), noise{n: 288, rms: 0.5}, quiet, true, true},
		{"shared: one more than the f32 run", []Miss{miss(0), miss(0), miss(0)}, n(2), noise{n: 288, rms: 0.5}, quiet, true, false},
		{"shared: one at 9 ulps, the f32 run's reach small", []Miss{miss(9)}, n(4), noise{n: 288, rms: 0.5}, quiet, true, false},
		{"not shared: more misses than the f32 run, noise of its size", []Miss{miss(3), miss(1), miss(0)}, n(2), noise{n: 288, rms: 4.2}, loud, false, true},
		{"not shared: noise past √2 times the f32 run's", []Miss{miss(3)}, n(5), noise{n: 288, rms: 6.3}, loud, false, false},
		{"not shared: one at 18 ulps, the f32 run reaching 13", []Miss{miss(18)}, n(4), noise{n: 288, rms: 4}, loud, false, true},
		{"not shared: one at 19 ulps, the f32 run reaching 13", []Miss{miss(19)}, n(4), noise{n: 288, rms: 4}, loud, false, false},
		{"not shared: an unknown margin", []Miss{{RefMargin: math.NaN(), RefTop: 10}}, n(4), noise{n: 288, rms: 4}, loud, false, false},
	} {
		if got := loopRule(c.misses, c.f32, c.bf, c.f32n, c.shared); got != c.want {
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
