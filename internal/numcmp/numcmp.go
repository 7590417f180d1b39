// Package numcmp measures how far one array of numbers is from another:
// the distances omni-pipe's parity tests and the `parity` command report.
package numcmp

import (
	"fmt"
	"math"
)

// Diff summarises got against want.
type Diff struct {
	N      int
	MaxAbs float64 // max |got − want|
	Peak   float64 // max |want|
	ArgMax int     // index of MaxAbs
	RelL2  float64 // ‖got − want‖ / ‖want‖
	Cosine float64 // got·want / (‖got‖‖want‖)
	SNRdB  float64 // 10·log10(‖want‖² / ‖got − want‖²); +Inf when equal
	NaNs   int     // positions where exactly one side is NaN
}

func (d Diff) String() string {
	return fmt.Sprintf("max|Δ| %.3g (at %d), rel L2 %.3g, cos %.7f, SNR %.1f dB", d.MaxAbs, d.ArgMax, d.RelL2, d.Cosine, d.SNRdB)
}

// Compare returns the distance of got from want; the lengths must match.
func Compare[T, U float32 | float64](got []T, want []U) Diff {
	if len(got) != len(want) {
		panic(fmt.Sprintf("numcmp: %d values against %d", len(got), len(want)))
	}
	d := Diff{N: len(got)}
	var dot, gg, ww, ee float64
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) != math.IsNaN(w) {
			d.NaNs++
			continue
		}
		if math.IsNaN(g) {
			continue
		}
		d.Peak = max(d.Peak, math.Abs(w))
		e := g - w
		if a := math.Abs(e); a > d.MaxAbs {
			d.MaxAbs, d.ArgMax = a, i
		}
		dot += g * w
		gg += g * g
		ww += w * w
		ee += e * e
	}
	if ww > 0 {
		d.RelL2 = math.Sqrt(ee / ww)
	}
	if gg > 0 && ww > 0 {
		d.Cosine = dot / math.Sqrt(gg*ww)
	} else if gg == ww {
		d.Cosine = 1
	}
	if ee == 0 {
		d.SNRdB = math.Inf(1)
	} else {
		d.SNRdB = 10 * math.Log10(ww/ee)
	}
	return d
}

// RowCosines returns the cosine of every row ([rows, cols] row-major) and
// the smallest one.
func RowCosines[T, U float32 | float64](got []T, want []U, cols int) (all []float64, min float64) {
	min = 1
	for r := 0; r*cols < len(got); r++ {
		c := Compare(got[r*cols:(r+1)*cols], want[r*cols:(r+1)*cols]).Cosine
		all = append(all, c)
		if c < min {
			min = c
		}
	}
	return all, min
}

// Argmax returns the first index of the largest value (NaN never wins),
// as torch.argmax on bf16 logits breaks ties.
func Argmax[T float32 | float64](x []T) int {
	best := -1
	for i, v := range x {
		if v != v {
			continue
		}
		if best < 0 || v > x[best] {
			best = i
		}
	}
	return best
}

// Margin returns top1 − top2 of x (0 on an exact tie).
func Margin[T float32 | float64](x []T) float64 {
	a := Argmax(x)
	if a < 0 {
		return math.NaN()
	}
	second := math.Inf(-1)
	for i, v := range x {
		if i != a && float64(v) > second {
			second = float64(v)
		}
	}
	return float64(x[a]) - second
}
