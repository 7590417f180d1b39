package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// FuzzMatMul explores shapes, strides and weight types: every output within
// the float32 bound of the float64 replay, every row equal (bitwise) to
// itself computed alone, nothing written outside dst.
func FuzzMatMul(f *testing.F) {
	f.Add(uint8(1), uint8(1), uint16(1), uint8(0), uint8(0), uint64(1))
	f.Add(uint8(5), uint8(13), uint16(1031), uint8(1), uint8(3), uint64(2))
	f.Add(uint8(9), uint8(40), uint16(17), uint8(2), uint8(1), uint64(3))
	f.Add(uint8(70), uint8(3), uint16(520), uint8(1), uint8(2), uint64(4))
	f.Fuzz(func(t *testing.T, m, n uint8, k uint16, dti, pad uint8, seed uint64) {
		M, N, K := 1+int(m)%80, 1+int(n)%64, 1+int(k)%1100
		P := int(pad) % 5
		dt := weightTypes[int(dti)%len(weightTypes)]
		for _, ks := range kernelSets(t) {
			dev, q := newTestDevice(t, 1+int(seed%3), ks.asm)
			rng := rand.New(rand.NewPCG(seed, uint64(M)))
			x := view(dev, gpu.F32, M, K, P, P)
			w := view(dev, dt, N, K, P, 1)
			fillRandom(rng, x)
			fillRandom(rng, w)
			var bias gpu.Tensor
			if seed%2 == 0 {
				bias = view(dev, gpu.F32, 1, N, 0, 0)
				fillRandom(rng, bias)
			}
			dst := view(dev, gpu.F32, M, N, P, 2)
			q.MatMul(dst, x, w, bias)
			checkPadding(t, dst)
			if st := checkMatMul(dst, x, w, bias); st.bad > 0 {
				t.Fatalf("%s %dx%dx%d %v: %d outside the bound; first %s", ks.name, M, N, K, dt, st.bad, st.first)
			}
			r := rng.IntN(M)
			one := view(dev, gpu.F32, 1, N, 0, 0)
			q.MatMul(one, x.Row(r), w, bias)
			if _, c, ok := bitsEqual(one, dst.Row(r)); !ok {
				t.Fatalf("%s %dx%dx%d %v: row %d alone differs at column %d", ks.name, M, N, K, dt, r, c)
			}
		}
	})
}

// FuzzConv1D explores convolution parameters: outputs within the bound of
// the float64 replay, and any output row range computed alone equal to the
// whole call.
func FuzzConv1D(f *testing.F) {
	f.Add(uint8(20), uint8(8), uint8(8), uint8(3), uint8(1), uint8(1), uint8(1), uint8(2), uint64(1))
	f.Add(uint8(50), uint8(6), uint8(6), uint8(9), uint8(1), uint8(1), uint8(6), uint8(4), uint64(2))
	f.Add(uint8(9), uint8(1), uint8(5), uint8(7), uint8(2), uint8(1), uint8(1), uint8(3), uint64(3))
	f.Add(uint8(30), uint8(12), uint8(4), uint8(1), uint8(3), uint8(1), uint8(2), uint8(0), uint64(4))
	f.Fuzz(func(t *testing.T, tin, cin, cout, k, stride, dil, groups, pad uint8, seed uint64) {
		G := 1 + int(groups)%4
		p := gpu.ConvParams{K: 1 + int(k)%9, Stride: 1 + int(stride)%4, Dilation: 1 + int(dil)%3, Groups: G}
		Cin, Cout := G*(1+int(cin)%6), G*(1+int(cout)%6)
		p.PadLeft = int(pad) % (p.Dilation*(p.K-1) + 1)
		Tin := 1 + int(tin)%60
		T := (Tin+p.PadLeft-p.Dilation*(p.K-1)-1)/p.Stride + 1
		if T < 1 {
			return
		}
		for _, ks := range kernelSets(t) {
			dev, q := newTestDevice(t, 2, ks.asm)
			rng := rand.New(rand.NewPCG(seed, 9))
			x := view(dev, gpu.F32, Tin, Cin, 1, 0)
			w := view(dev, gpu.BF16, Cout, Cin/G*p.K, 0, 0)
			fillRandom(rng, x)
			fillRandom(rng, w)
			dst := view(dev, gpu.F32, T, Cout, 2, 1)
			q.Conv1D(dst, x, w, gpu.Tensor{}, p)
			checkPadding(t, dst)
			if st := checkConvOut(dst, conv1dRef(x, w, gpu.Tensor{}, p, Cout), 0, false); st.bad > 0 {
				t.Fatalf("%s %+v: %d outside the bound; first %s", ks.name, p, st.bad, st.first)
			}
			a := rng.IntN(T)
			b := a + 1 + rng.IntN(T-a)
			start := a*p.Stride - p.PadLeft
			xp, pp := x, p
			if start >= 0 {
				xp, pp.PadLeft = x.Slice(start, x.Rows), 0
			} else {
				pp.PadLeft = -start
			}
			part := view(dev, gpu.F32, b-a, Cout, 0, 0)
			q.Conv1D(part, xp, w, gpu.Tensor{}, pp)
			if r, c, ok := bitsEqual(part, dst.Slice(a, b)); !ok {
				t.Fatalf("%s %+v: rows [%d,%d) alone differ at [%d,%d]", ks.name, p, a, b, a+r, c)
			}
		}
	})
}
