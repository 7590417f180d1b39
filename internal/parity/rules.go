package parity

import (
	"fmt"
	"math"
)

// The pick rules measure a miss by the reference's own top-1 margin in bf16
// ulps of its top logit: the reference's logits are bf16, so a margin of k
// ulps is a decision that k roundings of the logit could have reversed.
const (
	// depthUlps bounds every miss of the depthformer fed the reference's
	// own backbone rows: with the reference's rounding points the logits
	// match it bit for bit almost everywhere, so only a pick the reference
	// won by a rounding or two may differ.
	depthUlps = 2
	// loopUlps bounds every miss of the teacher-forced loop, where the
	// depthformer and the text head see omni-pipe's own backbone rows.
	loopUlps = 8
	// divergenceUlps bounds the reference's margin where the free-running
	// greedy run first leaves the reference's trace.
	divergenceUlps = 2
)

// ulp is one bf16 ulp at the magnitude of top: 2^(⌊log2|top|⌋ − 7).
func ulp(top float64) float64 {
	if top == 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return math.NaN()
	}
	return math.Ldexp(1, math.Ilogb(top)-7)
}

// A Miss is a greedy pick that differs from the reference's.
type Miss struct {
	Step     int
	Codebook int // −1: a text token
	Ours     int // our pick
	Ref      int // the reference's pick
	// RefMargin is the reference's top-1 margin (its top logit minus the
	// runner-up) and RefTop its top logit: the stored logit where the
	// reference's full logits are stored, else our logit of its pick (the
	// same binade but at a power of two).
	RefMargin, RefTop float64
	// OurGap is our logit of our pick minus our logit of the reference's.
	OurGap float64
}

// Ulps is the reference's margin in ulps of its top logit (NaN where the
// margin is unknown: that miss fails every rule).
func (m Miss) Ulps() float64 { return m.RefMargin / ulp(m.RefTop) }

func (m Miss) String() string {
	where := fmt.Sprintf("step %d", m.Step)
	if m.Codebook >= 0 {
		where += fmt.Sprintf(" codebook %d", m.Codebook)
	}
	u := ulp(m.RefTop)
	return fmt.Sprintf("%s: ours %d, reference %d; reference margin %.4g = %.3g ulps (1 ulp %.4g at its top logit %.4g); our gap %.4g = %.3g ulps",
		where, m.Ours, m.Ref, m.RefMargin, m.Ulps(), u, m.RefTop, m.OurGap, m.OurGap/u)
}

// within reports whether the miss's reference margin is at most n ulps.
func (m Miss) within(n float64) bool { return m.Ulps() <= n }

// depthRule is the rule for the depthformer on the reference's own states:
// every miss within depthUlps.
func depthRule(misses []Miss) bool {
	for _, m := range misses {
		if !m.within(depthUlps) {
			return false
		}
	}
	return true
}

// loopRule is the rule for the teacher-forced loop: no more misses than
// the F32 run has (the reference's own noise through the loop), each within
// loopUlps.
func loopRule(misses []Miss, f32Misses int) bool {
	if len(misses) > f32Misses {
		return false
	}
	for _, m := range misses {
		if !m.within(loopUlps) {
			return false
		}
	}
	return true
}

// divergenceRule is the rule for the free-running greedy run: its first
// departure from the reference's trace (nil: none) is at a pick the
// reference won by at most divergenceUlps.
func divergenceRule(first *Miss) bool {
	return first == nil || first.within(divergenceUlps)
}

// newMiss builds the miss at a pick: ours are our logits of the evaluation,
// stored the reference's (nil where it stored none).
func newMiss(step, cb, pick, ref int, refMargin float64, ours, stored []float32) Miss {
	m := Miss{Step: step, Codebook: cb, Ours: pick, Ref: ref, RefMargin: refMargin, RefTop: math.NaN(), OurGap: math.NaN()}
	if ref >= 0 && ref < len(ours) && pick >= 0 && pick < len(ours) {
		m.RefTop = float64(ours[ref])
		m.OurGap = float64(ours[pick] - ours[ref])
	}
	if len(stored) > 0 {
		top := float64(stored[0])
		for _, v := range stored {
			top = math.Max(top, float64(v))
		}
		m.RefTop = top
	}
	return m
}
