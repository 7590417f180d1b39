package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/omni-pipe/omni-pipe/internal/numcmp"
)

// Sampling configures how one kind of output (text or audio codes) is
// picked from its logits. The zero value is greedy.
type Sampling struct {
	// Temperature divides the logits; ≤ 0 means greedy.
	Temperature float64 `json:"temperature"`
	// TopK keeps the K largest logits (ties at the K-th value kept); 0 keeps
	// all, 1 is greedy.
	TopK int `json:"top_k"`
	// TopP keeps the smallest set of most likely entries whose probability
	// reaches TopP; 0 or 1 keeps all.
	TopP float64 `json:"top_p"`
	// RepetitionPenalty (> 1 discourages) applies to entries seen in the
	// last RepetitionWindow picks: positive logits are divided by it,
	// negative ones multiplied (the CTRL/transformers rule); 0 or 1 is off.
	RepetitionPenalty float64 `json:"repetition_penalty"`
	RepetitionWindow  int     `json:"repetition_window"`
}

// Greedy reports whether s picks the argmax (as liquid-audio: temperature
// None or ≤ 0, or top_k 1).
func (s Sampling) Greedy() bool { return s.Temperature <= 0 || s.TopK == 1 }

// Validate checks the ranges.
func (s Sampling) Validate() error {
	switch {
	case math.IsNaN(s.Temperature) || s.Temperature < 0 || s.Temperature > 100:
		return fmt.Errorf("temperature %v outside [0, 100]", s.Temperature)
	case s.TopK < 0:
		return fmt.Errorf("top_k %d is negative", s.TopK)
	case math.IsNaN(s.TopP) || s.TopP < 0 || s.TopP > 1:
		return fmt.Errorf("top_p %v outside [0, 1]", s.TopP)
	case math.IsNaN(s.RepetitionPenalty) || s.RepetitionPenalty < 0 || s.RepetitionPenalty > 100:
		return fmt.Errorf("repetition_penalty %v outside [0, 100]", s.RepetitionPenalty)
	case s.RepetitionWindow < 0:
		return fmt.Errorf("repetition_window %d is negative", s.RepetitionWindow)
	}
	return nil
}

// Defaults of the official code.
var (
	// DefaultText: the README's speech-to-speech chat samples text greedily.
	DefaultText = Sampling{}
	// DefaultAudio: temperature 1.0, top-k 4 (README, demo).
	DefaultAudio = Sampling{Temperature: 1, TopK: 4}
)

// Sampler picks entries from logits with one configuration and one random
// stream; a seed gives reproducible picks.
type Sampler struct {
	cfg   Sampling
	rng   *rand.Rand
	probs []float64
	idx   []int
}

// NewSampler returns a sampler whose random stream is determined by seed
// and stream (use distinct streams for text and audio).
func NewSampler(cfg Sampling, seed, stream uint64) *Sampler {
	return &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(seed, stream))}
}

// Pick returns the chosen index of logits. history holds earlier picks of
// the same kind (for the repetition penalty; may be nil). logits are not
// modified.
func (s *Sampler) Pick(logits []float32, history []int) int {
	if len(logits) == 0 {
		panic("pipeline: sampling from no logits")
	}
	c := s.cfg
	penalize := c.RepetitionPenalty > 0 && c.RepetitionPenalty != 1 && len(history) > 0
	if c.Greedy() && !penalize {
		return argmax(logits)
	}
	// Work in float64 on a copy.
	if cap(s.probs) < len(logits) {
		s.probs = make([]float64, len(logits))
		s.idx = make([]int, len(logits))
	}
	p := s.probs[:len(logits)]
	for i, v := range logits {
		p[i] = float64(v)
	}
	if penalize {
		w := history
		if c.RepetitionWindow > 0 && len(w) > c.RepetitionWindow {
			w = w[len(w)-c.RepetitionWindow:]
		}
		seen := make(map[int]bool, len(w))
		for _, id := range w {
			if id >= 0 && id < len(p) && !seen[id] {
				seen[id] = true
				if p[id] > 0 {
					p[id] /= c.RepetitionPenalty
				} else {
					p[id] *= c.RepetitionPenalty
				}
			}
		}
	}
	if c.Greedy() {
		return argmax(p)
	}
	for i := range p {
		p[i] /= c.Temperature
	}
	if c.TopK > 0 && c.TopK < len(p) {
		th := kthLargest(p, c.TopK, s.idx[:len(p)])
		for i, v := range p {
			if v < th {
				p[i] = math.Inf(-1)
			}
		}
	}
	// Softmax.
	m := math.Inf(-1)
	for _, v := range p {
		m = math.Max(m, v)
	}
	if math.IsInf(m, -1) || math.IsNaN(m) {
		return argmax(logits)
	}
	var sum float64
	for i, v := range p {
		e := math.Exp(v - m)
		p[i] = e
		sum += e
	}
	for i := range p {
		p[i] /= sum
	}
	if c.TopP > 0 && c.TopP < 1 {
		topP(p, c.TopP, s.idx[:len(p)])
	}
	// Inverse CDF with a uniform draw in [0, 1).
	u := s.rng.Float64()
	var acc float64
	last := -1
	for i, v := range p {
		if v <= 0 {
			continue
		}
		acc += v
		last = i
		if u < acc {
			return i
		}
	}
	return last // rounding left acc just below u: the last possible entry
}

// argmax returns the first index of the largest value (torch.argmax on
// bf16 logits; NaN never wins), or 0 when every value is NaN.
func argmax[T float32 | float64](x []T) int {
	return max(numcmp.Argmax(x), 0)
}

// kthLargest returns the k-th largest value of p (1-based).
func kthLargest(p []float64, k int, idx []int) float64 {
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	return p[idx[k-1]]
}

// topP zeroes every probability outside the smallest most-likely set whose
// mass reaches top (at least one entry is kept), then renormalises.
func topP(p []float64, top float64, idx []int) {
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	var acc float64
	cut := len(idx)
	for n, i := range idx {
		acc += p[i]
		if acc >= top {
			cut = n + 1
			break
		}
	}
	var kept float64
	for n, i := range idx {
		if n >= cut {
			p[i] = 0
		} else {
			kept += p[i]
		}
	}
	for i := range p {
		p[i] /= kept
	}
}
