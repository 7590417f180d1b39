package conformer

import (
	"math"
	"sync"
)

// posTable caches RelPositionalEncoding's table: for a capacity n, the
// rows of positions n−1, n−2, …, −(n−1), each d wide. A clip of T frames
// uses the middle 2T−1 rows (positions T−1 … −(T−1)), exactly the slice
// the reference's forward takes. Rows do not depend on n, so the table
// only grows; slices handed out stay valid after growth.
type posTable struct {
	d    int
	mu   sync.Mutex
	n    int
	vals []float32 // [2n−1, d]
}

// rows returns the fp32 rows of positions T−1 … −(T−1), [2T−1, d]
// row-major. The caller must not modify them.
func (p *posTable) rows(T int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if T > p.n {
		p.n = max(T, 2*p.n, 64)
		p.vals = relPositions(p.n, p.d)
	}
	return p.vals[(p.n-T)*p.d : (p.n+T-1)*p.d]
}

// relPositions builds RelPositionalEncoding.create_pe for positions n−1
// down to −(n−1) as the reference does in fp32: div = exp(2i·(−ln 10000/d))
// with the product in fp32, angle = position·div in fp32, then
// pe[:, 2i] = sin(angle) and pe[:, 2i+1] = cos(angle) rounded to fp32
// (computed in float64: the correctly rounded value, which CUDA's sinf,
// cosf and expf match to an ulp or two).
func relPositions(n, d int) []float32 {
	negLog := float32(-(math.Log(10000) / float64(d)))
	div := make([]float32, (d+1)/2)
	for i := range div {
		div[i] = float32(math.Exp(float64(float32(2*i) * negLog)))
	}
	out := make([]float32, (2*n-1)*d)
	for r := range 2*n - 1 {
		pos := float32(n - 1 - r)
		row := out[r*d : (r+1)*d]
		for i, f := range div {
			a := float64(pos * f)
			row[2*i] = float32(math.Sin(a))
			if 2*i+1 < d {
				row[2*i+1] = float32(math.Cos(a))
			}
		}
	}
	return out
}
