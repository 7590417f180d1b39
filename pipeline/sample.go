package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/omni-pipe/omni-pipe/gpu"
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
// stream; a seed gives reproducible picks. The pick itself is
// gpu.SampleHost (the same function a device's Queue.Sample computes), so
// a row that Row prepares picks the same entry on the host and on a device.
type Sampler struct {
	cfg      Sampling
	rng      *rand.Rand
	scratch  gpu.SampleScratch
	suppress []int32
}

// Suppress makes the sampler never pick ids (their logits count as −∞).
func (s *Sampler) Suppress(ids ...int) {
	for _, id := range ids {
		if id >= 0 && id <= math.MaxInt32 {
			s.suppress = append(s.suppress, int32(id))
		}
	}
}

// NewSampler returns a sampler whose random stream is determined by seed
// and stream (use distinct streams for text and audio).
func NewSampler(cfg Sampling, seed, stream uint64) *Sampler {
	return &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(seed, stream))}
}

// Row returns the next pick's parameters: the configuration, the window
// of history the repetition penalty applies to, and — unless the pick is
// greedy — the next uniform draw of the stream. Each call that samples
// consumes one draw, so rows must be made in the order of the picks.
func (s *Sampler) Row(history []int) gpu.SampleRow {
	c := s.cfg
	r := gpu.SampleRow{Temperature: c.Temperature, TopK: c.TopK, TopP: c.TopP, Penalty: c.RepetitionPenalty, Suppress: s.suppress}
	if r.Penalty > 0 && r.Penalty != 1 && len(history) > 0 {
		w := history
		if c.RepetitionWindow > 0 && len(w) > c.RepetitionWindow {
			w = w[len(w)-c.RepetitionWindow:]
		}
		r.History = make([]int32, len(w))
		for i, id := range w {
			r.History[i] = int32(min(max(id, -1), math.MaxInt32))
		}
	}
	if !r.Greedy() {
		r.U = s.rng.Float64()
	}
	return r
}

// Pick returns the chosen index of logits. history holds earlier picks of
// the same kind (for the repetition penalty; may be nil). logits are not
// modified.
func (s *Sampler) Pick(logits []float32, history []int) int {
	if len(logits) == 0 {
		panic("pipeline: sampling from no logits")
	}
	return gpu.SampleHost(logits, s.Row(history), &s.scratch)
}
