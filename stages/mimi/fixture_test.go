package mimi

import (
	"context"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const fixtureDir = "../../testdata/lfm2-audio-tiny"

var fixtureCases = []string{"case1_question_16k", "case2_tone_noise_24k", "case3_text_only", "case4_two_turn"}

// TestFixture decodes every reference case's codes with the fixture Mimi
// (mimi.safetensors + mimi_config.json, run by moshi in fp32 on CUDA with
// TF32 off) and compares our whole decode with mimi.decode(codes) and our
// frame-by-frame decode with moshi's streaming(1) decode.
func TestFixture(t *testing.T) {
	dev := cpu.New(2)
	defer dev.Close()
	d, err := Load(dev, fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.FrameSamples() != 1920 || d.SampleRate() != 24000 {
		t.Fatalf("frame %d samples at %d Hz, want 1920 at 24000", d.FrameSamples(), d.SampleRate())
	}
	for _, name := range fixtureCases {
		t.Run(name, func(t *testing.T) {
			f, err := safetensors.Open(fixtureDir + "/" + name + ".safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			codes := fixtureCodes(t, f)
			batch, stream := fixtureF32(t, f, "wav_mimi_batch"), fixtureF32(t, f, "wav_mimi_stream")
			if len(batch) != len(codes)*1920 || len(stream) != len(batch) {
				t.Fatalf("%d frames, wav %d/%d samples", len(codes), len(batch), len(stream))
			}

			whole, err := d.Decode(context.Background(), codes)
			if err != nil {
				t.Fatal(err)
			}
			streamed := decodeChunks(t, d, codes, 1)
			if i := gputest.FirstDiff(streamed, whole); i >= 0 {
				t.Errorf("streamed sample %d differs from the whole decode", i)
			}

			ref := numcmp.Compare(stream, batch) // the reference's own fp32 noise
			gb := numcmp.Compare(whole, batch)
			gs := numcmp.Compare(streamed, stream)
			t.Logf("peak %.3g; reference batch vs stream: max abs %.3g, SNR %.1f dB", gb.Peak, ref.MaxAbs, ref.SNRdB)
			t.Logf("ours whole vs reference batch:    max abs %.3g, SNR %.1f dB", gb.MaxAbs, gb.SNRdB)
			t.Logf("ours streamed vs reference stream: max abs %.3g, SNR %.1f dB", gs.MaxAbs, gs.SNRdB)
			// Both references and our decode evaluate the same fp32 network
			// with different summation orders (cuDNN's convolution algorithms
			// and moshi's streamed overlap-add, against our im2col MatMul). The
			// reference's own batch-vs-stream distance, 3.8e-6…5.5e-6 on these
			// cases (4–6 ulps of the ≈10 peak, ulp = 2^-20 ≈ 9.5e-7), is the
			// size of that rounding noise when only the order at the chunk
			// seams changes. Ours differs in every dot product, so we allow 4×
			// the reference's distance, and at least 2e-5 (21 ulps of the
			// peak) should a case's own distance happen to be tiny. A wrong
			// tap, row or mask moves samples by the order of the peak.
			tol := max(4*ref.MaxAbs, 2e-5)
			if gb.NaNs > 0 || gs.NaNs > 0 {
				t.Errorf("NaN samples: %d whole, %d streamed", gb.NaNs, gs.NaNs)
			}
			if gb.MaxAbs > tol {
				t.Errorf("whole decode: max abs %.3g > %.3g", gb.MaxAbs, tol)
			}
			if gs.MaxAbs > tol {
				t.Errorf("streamed decode: max abs %.3g > %.3g", gs.MaxAbs, tol)
			}
		})
	}
}

func fixtureCodes(t *testing.T, f *safetensors.File) [][]int {
	t.Helper()
	ct, err := f.Lookup("mimi_codes")
	if err != nil {
		t.Fatal(err)
	}
	if len(ct.Shape) != 2 || ct.Shape[0] != NumCodebooks {
		t.Fatalf("mimi_codes shape %v", ct.Shape)
	}
	v, err := ct.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	n := ct.Shape[1]
	codes := make([][]int, n)
	for j := range codes {
		codes[j] = make([]int, NumCodebooks)
	}
	for i := 0; i < NumCodebooks; i++ {
		for j := 0; j < n; j++ {
			codes[j][i] = int(v[i*n+j])
		}
	}
	return codes
}

func fixtureF32(t *testing.T, f *safetensors.File, name string) []float32 {
	t.Helper()
	tt, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}
