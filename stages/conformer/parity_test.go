package conformer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// f32Tolerance bounds the relative L2 distance between the nn.F32 mode
// and a float64 evaluation of the same network. Every value passes through
// a few hundred fp32 roundings (dot products of up to d_ff terms, norms,
// softmax), whose errors add up like a random walk: about √N·u with
// u = 2⁻²⁴, so some 20u. 64u = 3.8e-6 leaves room for other summation
// orders (blocked or FMA kernels); measured: 1.9e-7 to 2.4e-7 (3–4u).
const f32Tolerance = 64.0 / (1 << 24)

// TestFloat64Reference checks nn.F32 mode against the reference encoder and
// adapter evaluated in float64 on CUDA (conformer-ref: the same module
// calls with float64 weights and activations, fed the bf16 mel and the
// fp32 positional table; liquid-audio has no float64 path of its own).
func TestFloat64Reference(t *testing.T) {
	dev := newDevice(t)
	e := loadFixture(t, dev)
	ref := openFile(t, refFile)
	for _, name := range []string{"case1_question_16k", "case2_tone_noise_24k"} {
		t.Run(name, func(t *testing.T) {
			mel, frames, _ := caseMel(t, openFile(t, fixtureDir+name+".safetensors"))
			enc, out := run(t, e, dev, nn.F32, mel, frames)
			for _, c := range []struct {
				what string
				got  []float32
				want []float64
			}{
				{"encoder", enc, values64(t, ref, name[:5]+".encoder_out_f64")},
				{"adapter", out, values64(t, ref, name[:5]+".adapter_out_f64")},
			} {
				d := numcmp.Compare(c.got, c.want)
				t.Logf("%s f32 vs float64: %v", c.what, d)
				if d.RelL2 > f32Tolerance || d.NaNs > 0 {
					t.Errorf("%s: relative L2 distance %.3g to the float64 reference exceeds %.3g", c.what, d.RelL2, f32Tolerance)
				}
			}
		})
	}
}

// TestParity compares both precisions with the bf16 reference's
// encoder_out and adapter_out on the fixture cases. The reference's own
// bf16 noise, its distance to the float64 evaluation of the same clip,
// sets the bound: a bf16 computation that rounds where the reference
// rounds drifts from it by fp32 summation-order flips that cascade through
// the layers (short clips, TestShortClips, stay bit-exact), so over a long
// clip it ends about as far from the reference as the reference is from
// the exact result. Measured in bf16 mode: relative L2 0.70–1.05 times the
// reference's noise and 1−cos (worst row) 0.6–1.3 times; the bound is 2×
// in relative L2 and 4× in 1−cos (cosine distance goes with its square).
func TestParity(t *testing.T) {
	dev := newDevice(t)
	e := loadFixture(t, dev)
	ref := openFile(t, refFile)
	for _, tc := range []struct{ name, f64 string }{
		{"case1_question_16k", "case1"},
		{"case2_tone_noise_24k", "case2"},
		{"case4_two_turn", "case2"}, // case 4's user audio is case 2's clip
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := openFile(t, fixtureDir+tc.name+".safetensors")
			mel, frames, _ := caseMel(t, f)
			if tc.f64 != tc.name[:5] {
				other, _, _ := caseMel(t, openFile(t, fixtureDir+"case2_tone_noise_24k.safetensors"))
				if !slices.Equal(mel, other) {
					t.Fatalf("%s's mel is not case 2's: no float64 evaluation to compare with", tc.name)
				}
			}
			wantEnc, _ := values(t, f, "encoder_out")
			wantOut, _ := values(t, f, "adapter_out")
			outputs := []struct {
				what string
				want []float32
				f64  []float64
				cols int
			}{
				{"encoder", wantEnc, values64(t, ref, tc.f64+".encoder_out_f64"), e.FeatOut},
				{"adapter", wantOut, values64(t, ref, tc.f64+".adapter_out_f64"), e.Hidden},
			}
			got := map[nn.Precision][2][]float32{}
			for _, p := range []nn.Precision{nn.BF16, nn.F32} {
				enc, out := run(t, e, dev, p, mel, frames)
				got[p] = [2][]float32{enc, out}
			}
			for i, o := range outputs {
				noise := numcmp.Compare(o.want, o.f64)
				_, noiseCos := numcmp.RowCosines(o.want, o.f64, o.cols)
				t.Logf("%s: reference bf16 vs float64: %v, worst row cos %.7f", o.what, noise, noiseCos)
				for _, p := range []nn.Precision{nn.BF16, nn.F32} {
					d := numcmp.Compare(got[p][i], o.want)
					_, cos := numcmp.RowCosines(got[p][i], o.want, o.cols)
					differ, _ := bf16ULPs(got[p][i], o.want)
					t.Logf("%s %v vs reference: %v, worst row cos %.7f, %d of %d values differ", o.what, p, d, cos, differ, len(o.want))
					if p != nn.BF16 {
						continue
					}
					if d.RelL2 > 2*noise.RelL2 || d.NaNs > 0 {
						t.Errorf("%s: relative L2 %.3g to the reference exceeds twice its bf16 noise %.3g", o.what, d.RelL2, noise.RelL2)
					}
					if 1-cos > 4*(1-noiseCos) {
						t.Errorf("%s: worst row cosine %.7f; the reference's own worst row is %.7f from float64", o.what, cos, noiseCos)
					}
				}
			}
		})
	}
}

// TestShortClips runs prefixes of case 2's mel of 1 to 40 frames (1 to 5
// encoder frames, the T = 1 edge cases of rel_shift and BatchNorm
// included) against the bf16 reference. Rounding where the reference
// rounds, these come out bit-identical; the bound allows the rare
// summation-order flip a different matmul kernel may cause by asking only
// that bf16 mode be at least 4× closer to the reference than the exact
// (nn.F32) result is.
func TestShortClips(t *testing.T) {
	dev := newDevice(t)
	e := loadFixture(t, dev)
	ref := openFile(t, refFile)
	mel, _, feats := caseMel(t, openFile(t, fixtureDir+"case2_tone_noise_24k.safetensors"))
	for _, n := range []int{1, 2, 5, 8, 9, 16, 17, 40} {
		t.Run(fmt.Sprintf("%d_frames", n), func(t *testing.T) {
			bfEnc, bfOut := run(t, e, dev, nn.BF16, mel[:n*feats], n)
			fEnc, fOut := run(t, e, dev, nn.F32, mel[:n*feats], n)
			for _, o := range []struct {
				what      string
				bf16, f32 []float32
				name      string
			}{
				{"encoder", bfEnc, fEnc, fmt.Sprintf("short%d.encoder_out", n)},
				{"adapter", bfOut, fOut, fmt.Sprintf("short%d.adapter_out", n)},
			} {
				want, _ := values(t, ref, o.name)
				db, df := numcmp.Compare(o.bf16, want), numcmp.Compare(o.f32, want)
				differ, ulps := bf16ULPs(o.bf16, want)
				t.Logf("%s: bf16 mode %d of %d values differ (max %d ulp), rel L2 %.3g; f32 mode rel L2 %.3g",
					o.what, differ, len(want), ulps, db.RelL2, df.RelL2)
				if db.RelL2 > df.RelL2/4 || db.NaNs > 0 {
					t.Errorf("%s: bf16 mode is %.3g from the reference, the f32 mode %.3g", o.what, db.RelL2, df.RelL2)
				}
			}
		})
	}
}
