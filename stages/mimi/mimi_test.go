package mimi

import (
	"context"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
)

type testConfig struct {
	name string
	cfg  Config
	opts synthOpts
}

func testConfigs() []testConfig {
	sameRate := variantConfig()
	sameRate.FrameRate = 4 // the SEANet rate: no upsampling
	five := tinyConfig()
	five.NumCodebooksActive = 5 // a model emitting 5 codes per frame
	return []testConfig{
		{"tiny", tinyConfig(), synthOpts{}},
		{"variant", variantConfig(), synthOpts{fusedAttnNames: true}},
		{"same-rate", sameRate, synthOpts{}},
		{"five-codebooks", five, synthOpts{}},
	}
}

// decodeChunks streams codes through a fresh stream in calls of chunk
// frames.
func decodeChunks(t testing.TB, d *Decoder, codes [][]int, chunk int) []float32 {
	t.Helper()
	s := d.NewStream()
	defer s.Close()
	var out []float32
	for lo := 0; lo < len(codes); lo += chunk {
		var err error
		out, err = s.AppendFrames(context.Background(), out, codes[lo:min(lo+chunk, len(codes))])
		if err != nil {
			t.Fatal(err)
		}
	}
	if s.Frames() != len(codes) {
		t.Fatalf("stream reports %d frames, want %d", s.Frames(), len(codes))
	}
	return out
}

// TestStreamedEqualsWhole: decoding in chunks of 1, 2, 3 or 8 frames gives
// exactly (bit for bit) the samples of one pass over all frames, on every
// device.
func TestStreamedEqualsWhole(t *testing.T) {
	testdev.Run(t, streamedEqualsWhole)
}

func streamedEqualsWhole(t *testing.T, dev gpu.Device) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDecoderOn(t, dev, tc.cfg, 1, tc.opts)
			rng := rand.New(rand.NewPCG(2, 2))
			for _, n := range []int{1, 2, 5, 13, 40} {
				codes := randomCodes(rng, n, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
				d.maxChunk = 1 << 20 // the whole decode is one pass
				whole, err := d.Decode(context.Background(), codes)
				if err != nil {
					t.Fatal(err)
				}
				if len(whole) != n*d.FrameSamples() {
					t.Fatalf("%d frames: %d samples, want %d", n, len(whole), n*d.FrameSamples())
				}
				var energy float64
				for _, v := range whole {
					energy += float64(v) * float64(v)
				}
				if energy == 0 || math.IsNaN(energy) || math.IsInf(energy, 0) {
					t.Fatalf("%d frames: degenerate output (energy %v)", n, energy)
				}
				for _, chunk := range []int{1, 2, 3, 8} {
					got := decodeChunks(t, d, codes, chunk)
					if i := gputest.FirstDiff(got, whole); i >= 0 {
						t.Errorf("%d frames in chunks of %d: sample %d (frame %d) = %g, whole decode %g",
							n, chunk, i, i/d.FrameSamples(), got[i], whole[i])
					}
				}
				// The pass size used to bound memory does not change a sample.
				d.maxChunk = 3
				got, err := d.Decode(context.Background(), codes)
				if err != nil {
					t.Fatal(err)
				}
				if i := gputest.FirstDiff(got, whole); i >= 0 {
					t.Errorf("%d frames in passes of 3: sample %d differs", n, i)
				}
			}
		})
	}
}

// replayError returns the largest |ours − replay| and the replay's peak.
func replayError(got []float32, want []float64) (maxAbs, peak, snr float64) {
	var num, den float64
	for i := range got {
		e := math.Abs(float64(got[i]) - want[i])
		maxAbs = max(maxAbs, e)
		peak = max(peak, math.Abs(want[i]))
		num += e * e
		den += want[i] * want[i]
	}
	return maxAbs, peak, 10 * math.Log10(den/num)
}

// The network is ~30 float32 layers deep, each rounding at 2^-24 ≈ 6e-8
// relative inside dot products of up to a few hundred terms, compounded by
// the layers' gains: measured ≈ 5e-7 of the peak. 1e-5 of the peak leaves
// 20× room for other weights and codes and is far below a structural
// mistake (a wrong tap, row, sign or mask moves samples by the order of the
// peak; TestReplay's planted faults show it).
const replayTol = 1e-5

// TestReplay compares streamed decodes with the float64 replay of moshi's
// decode on both synthetic configurations, and checks that the comparison
// catches planted faults in the replay (a reversed kernel, a context one
// step longer).
func TestReplay(t *testing.T) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d, set := newTestDecoder(t, tc.cfg, 3, tc.opts)
			rng := rand.New(rand.NewPCG(4, 4))
			// 80 transformer rows: past the context (7) and the cache's first
			// compaction in "tiny", past the cache's first growth in "variant".
			codes := randomCodes(rng, 40, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
			got := decodeChunks(t, d, codes, 1)
			want := refModel{tc.cfg, set}.decode(codes)
			if len(got) != len(want) {
				t.Fatalf("%d samples, replay %d", len(got), len(want))
			}
			maxAbs, peak, snr := replayError(got, want)
			t.Logf("float32 vs float64 replay: max abs %.3g (peak %.3g), SNR %.1f dB", maxAbs, peak, snr)
			if maxAbs > replayTol*peak {
				t.Errorf("max abs error %.3g exceeds %g × peak %.3g", maxAbs, replayTol, peak)
			}

			// Planted faults must fail the same comparison.
			faulty := *set
			faulty.vals = maps.Clone(set.vals)
			name := "decoder.model.0.conv.conv.weight"
			w := slices.Clone(set.vals[name])
			k := tc.cfg.SEANet.KernelSize
			for i := 0; i < len(w); i += k {
				slices.Reverse(w[i : i+k])
			}
			faulty.vals[name] = w
			if e, p, _ := replayError(got, refModel{tc.cfg, &faulty}.decode(codes)); e <= replayTol*p {
				t.Errorf("a reversed %s passes: max abs %.3g", name, e)
			}
			if tc.cfg.Transformer.Context != nil {
				c := tc.cfg
				longer := *c.Transformer.Context + 1
				c.Transformer.Context = &longer
				if e, p, _ := replayError(got, refModel{c, set}.decode(codes)); e <= replayTol*p {
					t.Errorf("context %d passes for %d: max abs %.3g", longer, longer-1, e)
				}
			}
		})
	}
}

// TestEndOfAudio: a frame holding the EOA code (2048) or a code outside
// the codebook is refused with a clear error and leaves the stream as it
// was.
func TestEndOfAudio(t *testing.T) {
	cfg := tinyConfig()
	d, _ := newTestDecoder(t, cfg, 5, synthOpts{})
	rng := rand.New(rand.NewPCG(6, 6))
	codes := randomCodes(rng, 6, NumCodebooks, cfg.Quantizer.Bins)
	want := decodeChunks(t, d, codes, 6)

	for _, tc := range []struct {
		name  string
		code  int
		isEOA bool
		msg   string
	}{
		{"eoa", 2048, true, "end-of-audio"},
		{"negative", -1, false, "outside 0..2047"},
		{"too large", 4000, false, "outside 0..2047"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := d.NewStream()
			defer s.Close()
			if _, err := s.DecodeFrames(context.Background(), codes[:3]); err != nil {
				t.Fatal(err)
			}
			bad := make([][]int, len(codes)-3)
			for i, fr := range codes[3:] {
				bad[i] = append([]int(nil), fr...)
			}
			bad[1][4] = tc.code
			out, err := s.DecodeFrames(context.Background(), bad)
			if err == nil {
				t.Fatalf("code %d decoded to %d samples", tc.code, len(out))
			}
			if errors.Is(err, ErrEndOfAudio) != tc.isEOA {
				t.Errorf("errors.Is(%v, ErrEndOfAudio) = %v", err, !tc.isEOA)
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "frame 1 codebook 4") {
				t.Errorf("error %q does not name the frame, codebook and problem", err)
			}
			if len(out) != 0 || s.Frames() != 3 {
				t.Errorf("refused call returned %d samples, stream at frame %d", len(out), s.Frames())
			}
			// The stream continues as if the bad call never happened.
			rest, err := s.DecodeFrames(context.Background(), codes[3:])
			if err != nil {
				t.Fatal(err)
			}
			if i := gputest.FirstDiff(rest, want[3*d.FrameSamples():]); i >= 0 {
				t.Errorf("after the refused call, sample %d differs", i)
			}
		})
	}
}

func TestCanceled(t *testing.T) {
	d, _ := newTestDecoder(t, tinyConfig(), 7, synthOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := d.NewStream()
	defer s.Close()
	out, err := s.DecodeFrames(ctx, [][]int{make([]int, NumCodebooks), make([]int, NumCodebooks)})
	if !errors.Is(err, context.Canceled) || len(out) != 0 || s.Frames() != 0 {
		t.Errorf("canceled decode: %d samples, frames %d, err %v", len(out), s.Frames(), err)
	}
}

func TestReset(t *testing.T) {
	d, _ := newTestDecoder(t, tinyConfig(), 8, synthOpts{})
	codes := randomCodes(rand.New(rand.NewPCG(9, 9)), 5, NumCodebooks, 2048)
	want := decodeChunks(t, d, codes, 5)
	s := d.NewStream()
	defer s.Close()
	if _, err := s.DecodeFrames(context.Background(), randomCodes(rand.New(rand.NewPCG(1, 1)), 4, NumCodebooks, 2048)); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	got, err := s.DecodeFrames(context.Background(), codes)
	if err != nil {
		t.Fatal(err)
	}
	if i := gputest.FirstDiff(got, want); i >= 0 {
		t.Errorf("after Reset, sample %d differs from a fresh stream", i)
	}
	s.Close()
	s.Close()
	if _, err := s.DecodeFrames(context.Background(), codes); err == nil {
		t.Error("a closed stream decoded")
	}
}

// TestLoadErrors: a checkpoint that does not match the configuration fails
// to load with an error naming the tensor.
func TestLoadErrors(t *testing.T) {
	cfg := tinyConfig()
	set := synthCheckpoint(cfg, 10, synthOpts{})
	for _, tc := range []struct {
		name    string
		drop    string
		reshape map[string][]int
		cfg     func(*Config)
		want    []string
	}{
		{name: "missing conv", drop: "decoder.model.3.block.1.conv.conv.weight",
			want: []string{`missing tensor "decoder.model.3.block.1.conv.conv.weight"`}},
		{name: "missing codebook", drop: "quantizer.rvq_rest.vq.layers.6._codebook.cluster_usage",
			want: []string{`missing tensor "quantizer.rvq_rest.vq.layers.6._codebook.cluster_usage"`}},
		{name: "missing attention", drop: "decoder_transformer.transformer.layers.1.self_attn.in_projs.0.weight",
			want: []string{"decoder_transformer.transformer.layers.1.self_attn.in_projs.0.weight"}},
		{name: "bad shape", reshape: map[string][]int{"decoder.model.2.convtr.convtr.weight": {32, 16, 8, 2}},
			want: []string{`"decoder.model.2.convtr.convtr.weight" has shape [32 16 8 2], want [32 16 16]`}},
		{name: "bad bias", reshape: map[string][]int{"decoder.model.0.conv.conv.bias": {8, 4}},
			want: []string{`"decoder.model.0.conv.conv.bias" has shape [8 4], want [32]`}},
		{name: "config without layer", cfg: func(c *Config) { c.Transformer.NumLayers = 1 },
			want: []string{"does not use", "decoder_transformer.transformer.layers.1."}},
		{name: "config bigger", cfg: func(c *Config) { c.SEANet.NResidualLayers = 2 },
			want: []string{`missing tensor "decoder.model.4.block.1.conv.conv.weight"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			dev := cpu.New(1)
			defer dev.Close()
			d, err := New(dev, set.file(t, tc.drop, tc.reshape), c)
			if err == nil {
				d.Close()
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestSkipsEncoder: the encoder half and the unused codebooks are
// recognised, and a checkpoint without them loads too.
func TestSkipsEncoder(t *testing.T) {
	for _, skip := range []bool{false, true} {
		cfg := tinyConfig()
		set := synthCheckpoint(cfg, 11, synthOpts{skipEncoder: skip})
		dev := cpu.New(1)
		d, err := New(dev, set.file(t, "", nil), cfg)
		if err != nil {
			t.Fatalf("skipEncoder %v: %v", skip, err)
		}
		d.Close()
		dev.Close()
	}
}

func TestLoadPath(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	for _, p := range []string{"testdata-missing", t.TempDir()} {
		if _, err := Load(dev, p); err == nil {
			t.Errorf("Load(%q) succeeded", p)
		}
	}
	// A weights file path picks up the configuration beside it.
	d, err := Load(dev, fixtureDir+"/"+WeightsName)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.Config().SEANet.NFilters; got != 2 {
		t.Errorf("n_filters %d: %s not applied", got, ConfigName)
	}
}

// TestStreamedEqualsWholeFullWidth repeats the bitwise check at the
// official widths, where the matrix kernels take other blocking paths than
// at the tiny sizes (one transformer layer instead of 8 and 256 codes per
// codebook instead of 2048: neither changes which kernel paths run).
func TestStreamedEqualsWholeFullWidth(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Quantizer.NQ, cfg.Quantizer.Bins = NumCodebooks, 256
	cfg.Transformer.NumLayers = 1
	d, _ := newTestDecoder(t, cfg, 12, synthOpts{skipEncoder: true})
	codes := randomCodes(rand.New(rand.NewPCG(13, 13)), 5, NumCodebooks, cfg.Quantizer.Bins)
	d.maxChunk = 1 << 20
	whole, err := d.Decode(context.Background(), codes)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 2} {
		if i := gputest.FirstDiff(decodeChunks(t, d, codes, chunk), whole); i >= 0 {
			t.Errorf("chunks of %d: sample %d (frame %d) differs from the whole decode", chunk, i, i/d.FrameSamples())
		}
	}
}
