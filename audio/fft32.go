package audio

import (
	"math"
	"math/bits"
)

// fft32 transforms z in place (forward, unnormalised) with an iterative
// radix-2 decimation-in-time FFT in float32 arithmetic, twiddles rounded
// from float64: the textbook single-precision FFT. len(z) must be a power of
// two (NewLogMel refuses FFT32 otherwise).
func fft32(z []complex64) {
	n := len(z)
	shift := 64 - bits.Len(uint(n-1))
	for i := range n {
		if j := int(bits.Reverse64(uint64(i)) >> shift); j > i {
			z[i], z[j] = z[j], z[i]
		}
	}
	for size := 2; size <= n; size <<= 1 {
		half := size / 2
		for k := range half {
			a := -2 * math.Pi * float64(k) / float64(size)
			w := complex(float32(math.Cos(a)), float32(math.Sin(a)))
			for i := k; i < n; i += size {
				t := w * z[i+half]
				z[i+half] = z[i] - t
				z[i] += t
			}
		}
	}
}
