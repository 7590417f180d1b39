package mimi

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
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

// batchSchedule is a sequence of DecodeBatch calls over streams; calls[c][s]
// is the frames stream s decodes in call c (-1: the stream is not in the
// call; a stream is created at its first call).
type batchSchedule struct {
	name     string
	streams  int
	maxChunk int
	calls    [][]int
	maxPass  int // 0: the default
}

func batchSchedules() []batchSchedule {
	return []batchSchedule{
		{"frame-by-frame", 4, defaultMaxChunk, [][]int{
			{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1},
		}, 0},
		{"ragged", 3, defaultMaxChunk, [][]int{
			{3, 1, 5}, {1, 4, 1}, {2, 0, 7}, {1, 1, 1},
		}, 0},
		{"join-late", 4, defaultMaxChunk, [][]int{
			{2, -1, -1, -1}, {1, 3, -1, -1}, {4, 1, 1, -1}, {1, 1, 2, 1}, {-1, 1, 1, 6},
		}, 0},
		{"past-a-pass", 3, 3, [][]int{
			{7, 1, -1}, {1, 8, 2}, {4, -1, 1}, {1, 1, 1},
		}, 0},
		{"passes-full", 3, 4, [][]int{
			{4, 4, 4}, {1, 6, 2}, {9, -1, 1}, {1, 1, 1},
		}, 5},
		{"one-stream", 1, defaultMaxChunk, [][]int{{1}, {5}, {2}}, 0},
	}
}

func batchEqualsOneByOne(t *testing.T, dev gpu.Device) {
	ctx := context.Background()
	for _, tc := range testConfigs() {
		d, _ := newTestDecoderOn(t, dev, tc.cfg, 3, tc.opts)
		for _, sc := range batchSchedules() {
			t.Run(tc.name+"/"+sc.name, func(t *testing.T) {
				d.maxChunk, d.maxPass = sc.maxChunk, defaultMaxPass
				if sc.maxPass > 0 {
					d.maxPass = sc.maxPass
				}
				defer func() { d.maxChunk, d.maxPass = defaultMaxChunk, defaultMaxPass }()
				rng := rand.New(rand.NewPCG(4, uint64(sc.streams)))
				batched := make([]*Stream, sc.streams)
				alone := make([]*Stream, sc.streams)
				defer func() {
					for i := range batched {
						if batched[i] != nil {
							batched[i].Close()
							alone[i].Close()
						}
					}
				}()
				for c, call := range sc.calls {
					var streams []*Stream
					var ids []int
					var codes [][][]int
					var want [][]float32
					for s, n := range call {
						if n < 0 {
							continue
						}
						if batched[s] == nil {
							batched[s], alone[s] = d.NewStream(), d.NewStream()
						}
						fr := randomCodes(rng, n, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
						w, err := alone[s].DecodeFrames(ctx, fr)
						if err != nil {
							t.Fatal(err)
						}
						streams, ids = append(streams, batched[s]), append(ids, s)
						codes, want = append(codes, fr), append(want, w)
					}
					got, err := d.DecodeBatch(ctx, streams, codes)
					if err != nil {
						t.Fatalf("call %d: %v", c, err)
					}
					if len(got) != len(streams) {
						t.Fatalf("call %d: %d results for %d streams", c, len(got), len(streams))
					}
					for i := range streams {
						if len(want[i]) != len(codes[i])*d.FrameSamples() {
							t.Fatalf("call %d stream %d: one-by-one gave %d samples", c, i, len(want[i]))
						}
						if j := firstDiff(got[i], want[i]); j >= 0 {
							t.Errorf("call %d, stream %d of the call: sample %d (frame %d) differs from decoding it alone (%d vs %d samples)",
								c, i, j, j/d.FrameSamples(), len(got[i]), len(want[i]))
						}
						if got, want := streams[i].Frames(), alone[ids[i]].Frames(); got != want {
							t.Errorf("call %d stream %d: %d frames, alone %d", c, ids[i], got, want)
						}
					}
				}
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
