package gpu

import (
	"math"
	"sort"
)

// SampleRow configures Queue.Sample for one row of logits. The zero value
// is greedy.
//
// The pick is a pure function of the logits and the row: the random draw
// is U, made by the caller (from the session's seeded stream), so a device
// that samples returns the same index as the host replay SampleHost, bit
// for bit: every step below is an IEEE operation in float64 in a stated
// order, and the one transcendental, exp, is SampleExp, written out in
// those operations so that every backend computes the same bits.
type SampleRow struct {
	// Temperature divides the logits; ≤ 0 means greedy.
	Temperature float64
	// TopK keeps the K largest (ties at the K-th value kept); 0 keeps all,
	// 1 is greedy.
	TopK int
	// TopP keeps the smallest most-likely set whose probability reaches
	// TopP; 0 or ≥ 1 keeps all.
	TopP float64
	// Penalty is the repetition penalty applied once to each distinct id
	// of History that indexes the row (positive logits divided by it,
	// others multiplied: the CTRL/transformers rule); 0 or 1 is off.
	Penalty float64
	// History holds the ids the penalty applies to, already windowed.
	History []int32
	// U is the uniform draw in [0, 1) that a sampled (not greedy) pick
	// uses.
	U float64
	// Suppress holds ids whose logits count as −∞ before anything else
	// (never picked unless every entry is; ids out of range are ignored):
	// stop tokens a benchmark keeps the model from choosing.
	Suppress []int32
}

// Greedy reports whether r picks the largest entry.
func (r SampleRow) Greedy() bool { return r.Temperature <= 0 || r.TopK == 1 }

// Penalizes reports whether the repetition penalty changes any logit.
func (r SampleRow) Penalizes() bool {
	return r.Penalty > 0 && r.Penalty != 1 && len(r.History) > 0
}

// SampleScratch is SampleHost's reusable memory; the zero value is ready.
type SampleScratch struct {
	p, e   []float64
	idx    []int
	seen   map[int32]bool
	masked []float32
}

// SampleHost is the specification of Queue.Sample for one row, in the
// order every backend follows (after the Suppress ids' logits are set to
// −∞):
//
//  1. greedy without a penalty: the first index of the largest logit
//     (NaN never wins; 0 when every logit is NaN);
//  2. p = float64(logit); the penalty once per distinct History id in
//     range (p > 0: p / Penalty, else p · Penalty);
//  3. greedy: the first index of the largest p;
//  4. q = p / Temperature; any NaN in q: step 1's pick;
//  5. 0 < TopK < len: entries below the TopK-th largest q become −∞;
//  6. m = max q; m = −∞: step 1's pick;
//  7. e = SampleExp(q − m), summed in index order; p = e / sum;
//  8. 0 < TopP < 1: the entries in descending p (ties: lower index first)
//     up to and including the one where the running sum reaches TopP are
//     kept, the rest zeroed, and every p divided by the kept sum (summed in
//     that descending order);
//  9. the first index (ascending, p > 0 only) where the running sum of p
//     exceeds U, or the last index with p > 0 when rounding leaves the sum
//     at or below U.
func SampleHost(logits []float32, r SampleRow, s *SampleScratch) int {
	if len(logits) == 0 {
		panic("gpu: sampling from no logits")
	}
	if len(r.Suppress) > 0 {
		s.masked = append(s.masked[:0], logits...)
		for _, id := range r.Suppress {
			if id >= 0 && int(id) < len(logits) {
				s.masked[id] = float32(math.Inf(-1))
			}
		}
		logits = s.masked
	}
	pen := r.Penalizes()
	if r.Greedy() && !pen {
		return argmaxOf(logits)
	}
	n := len(logits)
	if cap(s.p) < n {
		s.p, s.e, s.idx = make([]float64, n), make([]float64, n), make([]int, n)
	}
	p, e := s.p[:n], s.e[:n]
	for i, v := range logits {
		p[i] = float64(v)
	}
	if pen {
		if s.seen == nil {
			s.seen = map[int32]bool{}
		}
		clear(s.seen)
		for _, id := range r.History {
			if id >= 0 && int(id) < n && !s.seen[id] {
				s.seen[id] = true
				if p[id] > 0 {
					p[id] /= r.Penalty
				} else {
					p[id] *= r.Penalty
				}
			}
		}
	}
	if r.Greedy() {
		return argmaxOf(p)
	}
	for i := range p {
		p[i] /= r.Temperature
		if math.IsNaN(p[i]) {
			return argmaxOf(logits)
		}
	}
	if r.TopK > 0 && r.TopK < n {
		th := kthLargest(p, r.TopK, s.idx[:n])
		for i, v := range p {
			if v < th {
				p[i] = math.Inf(-1)
			}
		}
	}
	m := math.Inf(-1)
	for _, v := range p {
		m = max(m, v)
	}
	if math.IsInf(m, -1) {
		return argmaxOf(logits)
	}
	var sum float64
	for i, v := range p {
		e[i] = SampleExp(v - m)
		sum += e[i]
	}
	for i := range p {
		p[i] = e[i] / sum
	}
	if r.TopP > 0 && r.TopP < 1 {
		topP(p, r.TopP, s.idx[:n])
	}
	var acc float64
	last := -1
	for i, v := range p {
		if v <= 0 {
			continue
		}
		acc += v
		last = i
		if r.U < acc {
			return i
		}
	}
	return last
}

// argmaxOf returns the first index of the largest value (NaN never wins),
// or 0 when every value is NaN.
func argmaxOf[T float32 | float64](x []T) int {
	best := -1
	for i, v := range x {
		if v == v && (best < 0 || v > x[best]) {
			best = i
		}
	}
	return max(best, 0)
}

// kthLargest returns the k-th largest value of p (1-based; p holds no NaN).
func kthLargest(p []float64, k int, idx []int) float64 {
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	return p[idx[k-1]]
}

// topP is step 8 of SampleHost.
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

// Coefficients of SampleExp: ln 2 split so that k·ln2Hi is exact for
// |k| < 2^11, and the Taylor series of e^r to r^13/13! on |r| ≤ ln2/2
// (truncation error below 2^-60 relative).
const (
	sampleLn2Hi  = 6.93147180369123816490e-01 // 0x3fe62e42fee00000
	sampleLn2Lo  = 1.90821492927058770002e-10 // 0x3dea39ef35793c76
	sampleLog2e  = 1.44269504088896338700e+00
	sampleExpMin = -708.0
)

var sampleExpPoly = [...]float64{
	1.0 / 6227020800, // 1/13!
	1.0 / 479001600,
	1.0 / 39916800,
	1.0 / 3628800,
	1.0 / 362880,
	1.0 / 40320,
	1.0 / 5040,
	1.0 / 720,
	1.0 / 120,
	1.0 / 24,
	1.0 / 6,
	1.0 / 2,
	1,
	1,
}

// SampleExp returns e^x for x ≤ 0 (0 below −708, where e^x nears the subnormals; NaN for NaN) through
// IEEE float64 additions, multiplications and an exact power-of-two
// scaling only, each rounded on its own (no fused multiply-add: Go may
// fuse x·y + z on some platforms, so every product is converted
// explicitly), so that the host and every device compute the same bits.
// Accurate to a few ulps, which sampling needs; what it must be is the
// same everywhere.
func SampleExp(x float64) float64 {
	if x != x {
		return x
	}
	if x < sampleExpMin {
		return 0
	}
	k := math.RoundToEven(float64(x * sampleLog2e))
	r := float64(x - float64(k*sampleLn2Hi))
	r = float64(r - float64(k*sampleLn2Lo))
	y := sampleExpPoly[0]
	for _, c := range sampleExpPoly[1:] {
		y = float64(float64(y*r) + c)
	}
	return math.Ldexp(y, int(k))
}
