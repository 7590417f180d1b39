package audio

import (
	"fmt"
	"math"
	"math/bits"
)

// maxFFT64 bounds fftPlan sizes (the bit-reversal table holds int32).
const maxFFT64 = 1 << 30

// fftPlan is a forward, unnormalised complex128 FFT of one power-of-two
// size: an iterative radix-2 decimation-in-time transform, in place, with
// precomputed twiddles and bit-reversal swaps, and no allocation or
// goroutine per call (go-dsp's radix2FFT starts workers and a channel on
// every call). A plan is immutable and safe for concurrent use.
//
// It performs the same float64 operations as go-dsp's radix-2 FFT — the
// same butterflies in the same order, on the same twiddles:
// sincos(-2π/n·k), exact at multiples of n/4 — so the two agree bit for bit
// up to the signs of zeros wherever the compiler fuses no multiply-add
// (amd64 below GOAMD64=v3), and to float64 rounding elsewhere; go-dsp is
// the tests' oracle.
// Two radix-2 stages run per pass over the data (the arithmetic of each
// stage unchanged) to halve the memory traffic.
type fftPlan struct {
	n     int
	swaps []int32 // bit-reversal transpositions (i, j), i < j, flattened
	// tw holds, for each stage size s = 2^m ≥ 2, its s/2 twiddles
	// exp(-2πi·j/s) at tw[s/2+j]; stage s of go-dsp reads them as
	// factors[j·n/s].
	tw []complex128
}

// newFFTPlan returns the plan for n points; n must be a power of two in
// 1..2^30.
func newFFTPlan(n int) (*fftPlan, error) {
	if n < 1 || n > maxFFT64 || n&(n-1) != 0 {
		return nil, fmt.Errorf("FFT size %d: want a power of two in 1..%d", n, maxFFT64)
	}
	p := &fftPlan{n: n}
	if n == 1 {
		return p, nil
	}
	shift := 64 - bits.Len(uint(n-1))
	for i := range n {
		if j := int(bits.Reverse64(uint64(i)) >> shift); j > i {
			p.swaps = append(p.swaps, int32(i), int32(j))
		}
	}
	// Twiddles of the full size, each from one sincos of its own angle
	// (not by recurrence); the quarter turns are exact.
	full := make([]complex128, n/2)
	for k := range full {
		switch {
		case k == 0:
			full[k] = 1
		case 4*k == n:
			full[k] = complex(0, -1)
		default:
			// -2π/n is exact (n a power of two), so this is
			// sincos(fl(-2π·k)/n), as go-dsp computes it.
			sin, cos := math.Sincos(-2 * math.Pi / float64(n) * float64(k))
			full[k] = complex(cos, sin)
		}
	}
	p.tw = make([]complex128, n)
	for s := 2; s <= n; s <<= 1 {
		h, stride := s/2, n/s
		for j := range h {
			p.tw[h+j] = full[j*stride]
		}
	}
	return p, nil
}

// transform replaces z (len(z) must be the plan's size) by its DFT,
// X[k] = Σ z[t]·exp(-2πi·kt/n).
func (p *fftPlan) transform(z []complex128) {
	n := p.n
	if len(z) != n {
		panic(fmt.Sprintf("audio: FFT of %d points with a %d-point plan", len(z), n))
	}
	if n < 2 {
		return
	}
	for i := 0; i < len(p.swaps); i += 2 {
		a, b := p.swaps[i], p.swaps[i+1]
		z[a], z[b] = z[b], z[a]
	}
	// Sizes 2 and 4: twiddles 1 and -i, exact (a product with them only
	// moves and negates parts; go-dsp's multiplication gives the same
	// values up to the signs of zeros).
	s := 2
	if n >= 4 {
		for i := 0; i < n; i += 4 {
			q := z[i : i+4 : i+4]
			a0, a1 := q[0]+q[1], q[0]-q[1]
			a2, a3 := q[2]+q[3], q[2]-q[3]
			a3 = complex(imag(a3), -real(a3)) // ·(-i)
			q[0], q[2] = a0+a2, a0-a2
			q[1], q[3] = a1+a3, a1-a3
		}
		s = 8
	} else {
		z[0], z[1] = z[0]+z[1], z[0]-z[1]
		return
	}
	// Stages s and 2s together: each group of four points i+j+{0,h,2h,3h}
	// (h = s/2) goes through its size-s butterflies, then its size-2s
	// ones, exactly as two separate passes would compute them.
	for ; 2*s <= n; s <<= 2 {
		h := s / 2
		w1 := p.tw[h : h+h : h+h]  // stage s
		w2a := p.tw[s : s+h : s+h] // stage 2s, first half
		w2b := p.tw[s+h:][:h:h]    // stage 2s, second half
		for i := 0; i < n; i += 2 * s {
			o1, o2, o3 := i+h, i+2*h, i+3*h
			q0 := z[i : i+h : i+h]
			q1 := z[o1 : o1+h : o1+h]
			q2 := z[o2 : o2+h : o2+h]
			q3 := z[o3 : o3+h : o3+h]
			for j := range h {
				wa, wb, wc := w1[j], w2a[j], w2b[j]
				u0, u1 := q0[j], q1[j]*wa
				u2, u3 := q2[j], q3[j]*wa
				b0, b1 := u0+u1, u0-u1
				b2, b3 := u2+u3, u2-u3
				b2, b3 = b2*wb, b3*wc
				q0[j], q2[j] = b0+b2, b0-b2
				q1[j], q3[j] = b1+b3, b1-b3
			}
		}
	}
	// An odd number of stages left one.
	if s <= n {
		h := s / 2
		w := p.tw[h:][:h:h]
		for i := 0; i < n; i += s {
			lo := z[i : i+h : i+h]
			hi := z[i+h:][:h:h]
			for j := range h {
				t := hi[j] * w[j]
				hi[j] = lo[j] - t
				lo[j] += t
			}
		}
	}
}
