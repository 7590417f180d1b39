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
	// loopUlps is the least bound of a miss where the depthformer and the
	// text head see omni-pipe's own backbone rows (noiseBound): at the
	// fixtures' sizes the F32 runs' shifts reach 2–4 ulps on text picks and
	// 3.5–5.3 on codes (at the released sizes 12.5–18 on codes).
	loopUlps = 8
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
func depthRule(misses []Miss) bool { return withinAll(misses, depthUlps) }

// noise is the size of a run's margin shifts (marginShift) over every
// pick of a kind: the noise between the run and the reference at each pick,
// where misses show only the draws that crossed a margin. n counts the
// picks with logits; rms and reach (the largest |shift|) are in ulps.
type noise struct {
	n          int
	rms, reach float64
}

// noiseOf measures shifts (NaNs, picks without logits, are skipped).
func noiseOf(shifts []float64) noise {
	var z noise
	sum := 0.0
	for _, d := range shifts {
		if math.IsNaN(d) {
			continue
		}
		z.n++
		sum += d * d
		z.reach = math.Max(z.reach, math.Abs(d))
	}
	if z.n > 0 {
		z.rms = math.Sqrt(sum / float64(z.n))
	}
	return z
}

// noiseBound is the largest reference margin a miss may have where
// omni-pipe's BF16 run sees its own backbone rows, from the F32 run's
// shifts on the same kind of picks: that run carries the reference's bf16
// noise alone, and its reach is how far that noise moved any pick's margin.
// The BF16 run adds its own rounding noise of at most the same size,
// independent of the reference's, so a pair's difference moves at most
// about √2 times as far; a miss the reference won by more than √2 times the
// F32 run's reach is more than the two noises explain. Never less than
// loopUlps.
func noiseBound(f32 noise) float64 {
	return math.Max(loopUlps, sqrt2*f32.reach)
}

// noiseRule bounds the BF16 run's noise by the F32 run's over every pick:
// its rms at most √2 times the F32 run's (two independent noises of the
// reference's size; a run that reproduces the reference's rounding is well
// inside it). A run without shifts fails.
func noiseRule(bf, f32 noise) bool {
	return bf.n > 0 && f32.n > 0 && bf.rms <= sqrt2*f32.rms
}

// loopRule is the rule for the teacher-forced loop on the reference's rows:
// each miss within noiseBound of the F32 run, and, where the BF16 run
// shares the reference's rounding (shared: its noise is a fraction of the
// F32 run's, so its misses are fewer), no more misses than the F32 run;
// where it does not (an independent draw of noise of the F32 run's size,
// whose miss count is a draw of the same law as the F32 run's), its noise
// within noiseRule.
func loopRule(misses, f32 []Miss, bf, f32n noise, shared bool) bool {
	if !withinAll(misses, noiseBound(f32n)) {
		return false
	}
	if shared {
		return len(misses) <= len(f32)
	}
	return noiseRule(bf, f32n)
}

// withinAll reports whether every miss's reference margin is at most
// bound ulps.
func withinAll(misses []Miss, bound float64) bool {
	for _, m := range misses {
		if !m.within(bound) {
			return false
		}
	}
	return true
}

// marginShift is how far a run's margin for the reference's pick want (its
// logit of want minus its best other logit) is from the reference's margin,
// in ulps of the run's logit of want; NaN where the run has no logits for
// the pick.
func marginShift(logits []float32, want int, refMargin float64) float64 {
	if want < 0 || want >= len(logits) || len(logits) < 2 {
		return math.NaN()
	}
	other := math.Inf(-1)
	for j, v := range logits {
		if j != want {
			other = math.Max(other, float64(v))
		}
	}
	top := float64(logits[want])
	return (top - other - refMargin) / ulp(top)
}

// samePick reports whether a and b are the same miss: the same pick
// (step and codebook) gone the same way.
func samePick(a, b Miss) bool {
	return a.Step == b.Step && a.Codebook == b.Codebook && a.Ours == b.Ours && a.Ref == b.Ref
}

// divergenceRule is the rule for a free-running greedy run against the
// teacher-forced run of the same inputs: until its first departure from
// the reference's trace its inputs are the teacher-forced run's, so it
// leaves the trace at the teacher-forced run's first miss (forced; nil:
// none) — the same pick gone the same way — and that miss is within bound
// ulps. A free run that stops short of the trace without a miss (first with
// Ours < 0) fails: it did not follow its own inputs.
func divergenceRule(first, forced *Miss, bound float64) bool {
	switch {
	case first == nil:
		return forced == nil
	case first.Ours < 0:
		return false
	case forced == nil:
		return false
	}
	return samePick(*first, *forced) && first.within(bound)
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
