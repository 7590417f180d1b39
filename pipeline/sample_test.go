package pipeline

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestGreedyFirstIndexWinsTies(t *testing.T) {
	s := NewSampler(Sampling{}, 1, 1)
	if got := s.Pick([]float32{1, 3, 2, 3}, nil); got != 1 {
		t.Errorf("greedy pick %d, want 1 (first of the tied maxima)", got)
	}
	// top_k 1 is greedy whatever the temperature.
	s = NewSampler(Sampling{Temperature: 5, TopK: 1}, 1, 1)
	for i := 0; i < 20; i++ {
		if got := s.Pick([]float32{0, 2, 2, 1}, nil); got != 1 {
			t.Fatalf("top_k 1 picked %d", got)
		}
	}
}

func counts(s *Sampler, logits []float32, n int) []int {
	c := make([]int, len(logits))
	for i := 0; i < n; i++ {
		c[s.Pick(logits, nil)]++
	}
	return c
}

func TestTopKKeepsTiesAtThreshold(t *testing.T) {
	s := NewSampler(Sampling{Temperature: 1, TopK: 2}, 7, 1)
	c := counts(s, []float32{5, 5, 5, 1, 4.9}, 3000)
	if c[3] != 0 || c[4] != 0 {
		t.Errorf("entries below the 2nd largest were picked: %v", c)
	}
	for i := 0; i < 3; i++ {
		if c[i] < 800 { // each ≈ 1000
			t.Errorf("tied entry %d picked %d times of 3000: %v", i, c[i], c)
		}
	}
}

func TestTemperatureDistribution(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	const T, n = 0.7, 40000
	s := NewSampler(Sampling{Temperature: T}, 42, 1)
	c := counts(s, logits, n)
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l) / T)
	}
	for i, l := range logits {
		p := math.Exp(float64(l)/T) / z
		sd := math.Sqrt(n * p * (1 - p))
		if math.Abs(float64(c[i])-n*p) > 5*sd {
			t.Errorf("entry %d: %d picks, expected %.0f ± %.0f", i, c[i], n*p, 5*sd)
		}
	}
}

func TestTopP(t *testing.T) {
	// probabilities ∝ exp(logits): 0.64, 0.23, 0.09, 0.03, 0.01
	logits := []float32{3, 2, 1, 0, -1}
	s := NewSampler(Sampling{Temperature: 1, TopP: 0.8}, 3, 1)
	c := counts(s, logits, 5000)
	if c[2] != 0 || c[3] != 0 || c[4] != 0 {
		t.Errorf("top_p 0.8 sampled outside the nucleus {0,1}: %v", c)
	}
	if c[0] == 0 || c[1] == 0 {
		t.Errorf("nucleus entries never picked: %v", c)
	}
	// A tiny top_p still keeps the most likely entry.
	s = NewSampler(Sampling{Temperature: 1, TopP: 1e-9}, 3, 1)
	if c := counts(s, logits, 100); c[0] != 100 {
		t.Errorf("top_p→0 picks %v, want only entry 0", c)
	}
}

func TestRepetitionPenalty(t *testing.T) {
	s := NewSampler(Sampling{RepetitionPenalty: 2, RepetitionWindow: 2}, 1, 1)
	logits := []float32{3, 2, -1}
	if got := s.Pick(logits, []int{0}); got != 1 {
		t.Errorf("penalised 3/2 = 1.5 < 2: picked %d, want 1", got)
	}
	if got := s.Pick(logits, []int{0, 2, 2}); got != 0 {
		t.Errorf("0 outside the window of 2: picked %d, want 0", got)
	}
	if logits[0] != 3 {
		t.Error("Pick modified the logits")
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := make([]float32, 50)
	for i := range logits {
		logits[i] = float32(i%7) * 0.3
	}
	cfg := Sampling{Temperature: 1, TopK: 20}
	draw := func(seed uint64) []int {
		s := NewSampler(cfg, seed, 2)
		out := make([]int, 64)
		for i := range out {
			out[i] = s.Pick(logits, nil)
		}
		return out
	}
	a, b, c := draw(9), draw(9), draw(10)
	same := func(x, y []int) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("same seed, different picks")
	}
	if same(a, c) {
		t.Error("different seeds, identical 64 picks")
	}
}

// maxSource makes Float64 return its largest value, 1 − 2⁻⁵³.
type maxSource struct{}

func (maxSource) Uint64() uint64 { return math.MaxUint64 }

func TestDrawNearOneNeverPicksZeroProbability(t *testing.T) {
	s := &Sampler{cfg: Sampling{Temperature: 1, TopK: 2}, rng: rand.New(maxSource{})}
	if u := s.rng.Float64(); u >= 1 {
		t.Fatalf("uniform draw %v is not below 1", u)
	}
	// Entries 2 and 3 are cut by top-k: the draw must land on entry 1.
	if got := s.Pick([]float32{1, 1, -5, -6}, nil); got != 1 {
		t.Errorf("picked %d, want 1 (the last entry with probability)", got)
	}
}

func TestSamplingValidate(t *testing.T) {
	bad := []Sampling{
		{Temperature: -1}, {Temperature: math.NaN()}, {TopK: -2}, {TopP: 1.5},
		{RepetitionPenalty: -1}, {RepetitionWindow: -1},
	}
	for _, s := range bad {
		if s.Validate() == nil {
			t.Errorf("%+v validated", s)
		}
	}
	if err := DefaultAudio.Validate(); err != nil || DefaultAudio.Greedy() || !DefaultText.Greedy() {
		t.Errorf("defaults: %v, audio greedy %v, text greedy %v", err, DefaultAudio.Greedy(), DefaultText.Greedy())
	}
}

// TestSuppress: a suppressed id is never picked, greedy or sampled, even
// when it holds the largest logit.
func TestSuppress(t *testing.T) {
	for _, cfg := range []Sampling{{}, {Temperature: 1, TopK: 2}, {Temperature: 2}} {
		s := NewSampler(cfg, 3, 1)
		s.Suppress(1, 99) // 99 is out of range: ignored
		for i := 0; i < 200; i++ {
			if got := s.Pick([]float32{0, 9, 8.5, 1}, nil); got == 1 {
				t.Fatalf("%+v: picked the suppressed id", cfg)
			}
		}
	}
}
