package mimi

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/codectest"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
)

// TestBatchEqualsOneByOne: decoding several streams' frames in one
// DecodeBatch pass gives every stream exactly (bit for bit) the samples of
// decoding its frames on its own with AppendFrames, on every device, for
// ragged calls: streams joining late, sitting calls out, 1-frame calls and
// calls longer than a pass.
func TestBatchEqualsOneByOne(t *testing.T) {
	testdev.Run(t, batchEqualsOneByOne)
}

// batchSchedule is a codectest.Schedule with the pass sizes it runs at.
type batchSchedule struct {
	codectest.Schedule
	maxChunk int
	maxPass  int // 0: the default
}

func batchSchedules() []batchSchedule {
	sc := func(name string, streams, maxChunk int, calls [][]int, maxPass int) batchSchedule {
		return batchSchedule{codectest.Schedule{Name: name, Streams: streams, Calls: calls}, maxChunk, maxPass}
	}
	return []batchSchedule{
		sc("frame-by-frame", 4, defaultMaxChunk, [][]int{
			{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1},
		}, 0),
		sc("ragged", 3, defaultMaxChunk, [][]int{
			{3, 1, 5}, {1, 4, 1}, {2, 0, 7}, {1, 1, 1},
		}, 0),
		sc("join-late", 4, defaultMaxChunk, [][]int{
			{2, -1, -1, -1}, {1, 3, -1, -1}, {4, 1, 1, -1}, {1, 1, 2, 1}, {-1, 1, 1, 6},
		}, 0),
		sc("past-a-pass", 3, 3, [][]int{
			{7, 1, -1}, {1, 8, 2}, {4, -1, 1}, {1, 1, 1},
		}, 0),
		sc("passes-full", 3, 4, [][]int{
			{4, 4, 4}, {1, 6, 2}, {9, -1, 1}, {1, 1, 1},
		}, 5),
		sc("one-stream", 1, defaultMaxChunk, [][]int{{1}, {5}, {2}}, 0),
		sc("gpu-pass", 12, defaultMaxChunk, [][]int{ // a GPU's pass: 12 streams' frames at once
			{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}, {1, 9, 2, 16, 1, 1, 3, 1, 1, 5, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
		}, gpuMaxPass),
	}
}

func batchEqualsOneByOne(t *testing.T, dev gpu.Device) {
	ctx := context.Background()
	for _, tc := range testConfigs() {
		d, _ := newTestDecoderOn(t, dev, tc.cfg, 3, tc.opts)
		codec := codectest.Codec[*Stream]{
			New:   d.NewStream,
			Close: (*Stream).Close,
			Codes: func(rng *rand.Rand, n int) [][]int {
				return randomCodes(rng, n, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
			},
			Alone:   func(s *Stream, codes [][]int) ([]float32, error) { return s.DecodeFrames(ctx, codes) },
			Batch:   func(ss []*Stream, codes [][][]int) ([][]float32, error) { return d.DecodeBatch(ctx, ss, codes) },
			Frames:  (*Stream).Frames,
			Samples: func(frames int) int { return frames * d.FrameSamples() },
		}
		for _, sc := range batchSchedules() {
			t.Run(tc.name+"/"+sc.Name, func(t *testing.T) {
				d.maxChunk, d.maxPass = sc.maxChunk, defaultMaxPass
				if sc.maxPass > 0 {
					d.maxPass = sc.maxPass
				}
				defer func() { d.maxChunk, d.maxPass = defaultMaxChunk, defaultMaxPass }()
				codectest.Check(t, codec, sc.Schedule, 4)
			})
		}
	}
}

// TestDecodeBatchErrors: a bad code in any stream's frames, a stream named
// twice, a closed stream or a stream of another decoder refuse the whole
// call before any stream advances; an empty batch decodes nothing.
func TestDecodeBatchErrors(t *testing.T) {
	tc := testConfigs()[0]
	d, _ := newTestDecoder(t, tc.cfg, 5, tc.opts)
	other, _ := newTestDecoder(t, tc.cfg, 5, tc.opts)
	ctx := context.Background()
	k, bins := tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins
	rng := rand.New(rand.NewPCG(6, 6))
	good := func() [][]int { return randomCodes(rng, 2, k, bins) }
	eoa := good()
	eoa[1][0] = bins
	a, b := d.NewStream(), d.NewStream()
	defer a.Close()
	defer b.Close()
	closed := d.NewStream()
	closed.Close()
	foreign := other.NewStream()
	defer foreign.Close()

	for _, c := range []struct {
		name    string
		streams []*Stream
		codes   [][][]int
		is      error
	}{
		{"end-of-audio", []*Stream{a, b}, [][][]int{good(), eoa}, ErrEndOfAudio},
		{"twice", []*Stream{a, a}, [][][]int{good(), good()}, nil},
		{"closed", []*Stream{a, closed}, [][][]int{good(), good()}, nil},
		{"foreign", []*Stream{a, foreign}, [][][]int{good(), good()}, nil},
		{"lengths", []*Stream{a, b}, [][][]int{good()}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.DecodeBatch(ctx, c.streams, c.codes)
			if err == nil {
				t.Fatal("no error")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v, want one wrapping %v", err, c.is)
			}
			if a.Frames() != 0 || b.Frames() != 0 {
				t.Errorf("streams advanced to %d, %d frames", a.Frames(), b.Frames())
			}
		})
	}
	out, err := d.DecodeBatch(ctx, nil, nil)
	if err != nil || len(out) != 0 {
		t.Errorf("empty batch: %v, %v", out, err)
	}
}

// TestBatchScratchBounded: a batch's passes hold at most maxPass frames in
// all, so the decoder's scratch does not grow with the batch: 16 streams of
// 4 frames need about the scratch of one pass of 8 frames.
func TestBatchScratchBounded(t *testing.T) {
	tc := testConfigs()[0]
	dev := cpu.New(1)
	defer dev.Close()
	d, _ := newTestDecoderOn(t, dev, tc.cfg, 7, tc.opts)
	d.maxChunk, d.maxPass = 4, 8
	streams := make([]*Stream, 16)
	for i := range streams {
		streams[i] = d.NewStream()
		defer streams[i].Close()
	}
	base := dev.Info().MemUsed
	// scratch is the device memory beyond the streams' states and caches.
	scratch := func() int64 {
		used := dev.Info().MemUsed - base
		for _, s := range streams {
			for _, c := range s.kv {
				if !c.k.IsNil() {
					used -= int64(c.k.Len()+c.v.Len()) * 4
				}
			}
		}
		return used
	}
	rng := rand.New(rand.NewPCG(8, 8))
	call := func(n, frames int) {
		codes := make([][][]int, n)
		for i := range codes {
			codes[i] = randomCodes(rng, frames, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
		}
		if _, err := d.DecodeBatch(context.Background(), streams[:n], codes); err != nil {
			t.Fatal(err)
		}
	}
	call(2, 4) // one pass of 8 frames
	one := scratch()
	call(16, 4)
	if all := scratch(); float64(all) > 1.5*float64(one) {
		t.Errorf("16 streams of 4 frames left %d bytes of scratch, one pass of 8 frames %d", all, one)
	}
}

// TestMaxPassFor: a pass holds defaultMaxPass frames on the CPU (a GPU's
// gpuMaxPass needs one), OMNIPIPE_MIMI_PASS sets it within 1–1024, and a
// value outside that or not a number leaves the default.
func TestMaxPassFor(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	for _, tc := range []struct {
		env  string
		want int
	}{{"", defaultMaxPass}, {"100", 100}, {"1", 1}, {"1024", 1024}, {"0", defaultMaxPass}, {"2000", defaultMaxPass}, {"lots", defaultMaxPass}} {
		t.Setenv("OMNIPIPE_MIMI_PASS", tc.env)
		if got := maxPassFor(dev); got != tc.want {
			t.Errorf("OMNIPIPE_MIMI_PASS=%q: %d frames a pass, want %d", tc.env, got, tc.want)
		}
	}
}

// TestGPUPass: a GPU's pass takes as many frames as 1 % of its memory
// holds in scratch, at least defaultMaxPass and at most gpuMaxPass.
func TestGPUPass(t *testing.T) {
	for _, tc := range []struct {
		mem  int64
		want int
	}{{143771 << 20, gpuMaxPass}, {80 << 30, 74}, {24 << 30, defaultMaxPass}, {0, defaultMaxPass}, {1 << 50, gpuMaxPass}} {
		if got := gpuPass(tc.mem); got != tc.want {
			t.Errorf("gpuPass(%d MiB) = %d, want %d", tc.mem>>20, got, tc.want)
		}
	}
}
