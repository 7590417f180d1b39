package detok

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
)

// TestBatchEqualsOneByOne: decoding several streams' frames in one
// DecodeBatch call gives every stream exactly (bit for bit) the samples of
// decoding its frames on its own stream, call by call and at the flush, on
// every device, for ragged calls: streams joining late, sitting calls out,
// 1-frame calls, calls longer than a pass and streams past the 30-step
// attention window.
func TestBatchEqualsOneByOne(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) { batchEqualsOneByOne(t, loadFixtureOn(t, dev)) })
}

// batchSchedule is a sequence of DecodeBatch calls over streams; calls[c][s]
// is the frames stream s decodes in call c (-1: the stream is not in the
// call; a stream is created at its first call).
type batchSchedule struct {
	name    string
	streams int
	maxPass int
	calls   [][]int
}

func batchSchedules() []batchSchedule {
	return []batchSchedule{
		{"frame-by-frame", 4, defaultMaxPass, [][]int{
			{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1},
		}},
		{"ragged", 3, defaultMaxPass, [][]int{
			{3, 1, 5}, {1, 4, 1}, {2, 0, 7}, {1, 1, 1},
		}},
		{"join-late", 4, defaultMaxPass, [][]int{
			{2, -1, -1, -1}, {1, 3, -1, -1}, {4, 1, 1, -1}, {1, 1, 2, 1}, {-1, 1, 1, 6},
		}},
		{"past-a-pass", 3, 4, [][]int{
			{7, 1, -1}, {1, 8, 2}, {4, -1, 1}, {1, 1, 1},
		}},
		{"past-the-window", 2, defaultMaxPass, [][]int{
			{3, 1}, {4, 6}, {1, 1}, {1, 1}, {2, 1},
		}},
		{"one-stream", 1, defaultMaxPass, [][]int{{1}, {5}, {2}}},
	}
}

func batchEqualsOneByOne(t *testing.T, d *Decoder) {
	ctx := context.Background()
	for _, sc := range batchSchedules() {
		t.Run(sc.name, func(t *testing.T) {
			d.maxPass = sc.maxPass
			defer func() { d.maxPass = defaultMaxPass }()
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
					fr := randomCodes(rng, n, d.Bins())
					w, err := alone[s].Decode(fr)
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
					if len(codes[i]) > 0 && len(want[i]) == 0 {
						t.Fatalf("call %d stream %d: one-by-one gave no samples", c, ids[i])
					}
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("call %d stream %d: %d samples batched differ from the %d decoded alone (first at %d)",
							c, ids[i], len(got[i]), len(want[i]), firstDiff(got[i], want[i]))
					}
					if got, want := streams[i].Frames(), alone[ids[i]].Frames(); got != want {
						t.Errorf("call %d stream %d: %d frames, alone %d", c, ids[i], got, want)
					}
				}
			}
			for s := range batched {
				if got, want := batched[s].Flush(), alone[s].Flush(); len(want) != d.Lag() || !slices.Equal(got, want) {
					t.Errorf("stream %d: the flush's %d samples differ from the %d alone", s, len(got), len(want))
				}
			}
		})
	}
}

// randomCodes returns n frames of random codes below bins.
func randomCodes(rng *rand.Rand, n, bins int) [][]int {
	out := make([][]int, n)
	for f := range out {
		out[f] = make([]int, Codebooks)
		for k := range out[f] {
			out[f][k] = rng.IntN(bins)
		}
	}
	return out
}

// firstDiff returns the first index where a and b differ (the shorter
// length when one is a prefix of the other), or -1.
func firstDiff(a, b []float32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestDecodeBatchErrors: a bad code in any stream's frames, a stream named
// twice, a closed or flushed stream, a stream of another decoder or
// mismatched lengths refuse the whole call before any stream advances; an
// empty batch decodes nothing, and the refused streams decode afterwards
// exactly as fresh ones.
func TestDecodeBatchErrors(t *testing.T) {
	d := loadFixture(t)
	other := loadFixture(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(6, 6))
	good := func() [][]int { return randomCodes(rng, 2, d.Bins()) }
	eoa := good()
	eoa[1][0] = d.Bins()
	outside := good()
	outside[0][3] = -1
	short := good()
	short[1] = short[1][:7]
	a, b := d.NewStream(), d.NewStream()
	defer a.Close()
	defer b.Close()
	closed := d.NewStream()
	closed.Close()
	flushed := d.NewStream()
	defer flushed.Close()
	if _, err := flushed.Decode(good()); err != nil {
		t.Fatal(err)
	}
	flushed.Flush()
	foreign := other.NewStream()
	defer foreign.Close()

	for _, c := range []struct {
		name    string
		streams []*Stream
		codes   [][][]int
		is      error
	}{
		{"end-of-audio", []*Stream{a, b}, [][][]int{good(), eoa}, ErrEndOfAudio},
		{"outside the codebook", []*Stream{a, b}, [][][]int{good(), outside}, nil},
		{"seven codes", []*Stream{a, b}, [][][]int{short, good()}, nil},
		{"twice", []*Stream{a, b, a}, [][][]int{good(), good(), good()}, nil},
		{"closed", []*Stream{a, b, closed}, [][][]int{good(), good(), good()}, nil},
		{"flushed", []*Stream{a, b, flushed}, [][][]int{good(), good(), nil}, nil},
		{"foreign", []*Stream{a, b, foreign}, [][][]int{good(), good(), good()}, nil},
		{"nil stream", []*Stream{a, nil}, [][][]int{good(), good()}, nil},
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
			for i, s := range []*Stream{a, b} {
				if s.Frames() != 0 || s.cache.Len() != 0 {
					t.Fatalf("stream %d advanced to %d frames, %d positions", i, s.Frames(), s.cache.Len())
				}
			}
		})
	}
	out, err := d.DecodeBatch(ctx, nil, nil)
	if err != nil || len(out) != 0 {
		t.Errorf("empty batch: %v, %v", out, err)
	}
	// The refused streams are untouched: they decode as a fresh stream.
	fr := good()
	fresh := d.NewStream()
	defer fresh.Close()
	want, err := fresh.Decode(fr)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.DecodeBatch(ctx, []*Stream{a, b}, [][][]int{fr, fr})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if !slices.Equal(got[i], want) {
			t.Errorf("stream %d after the refusals differs from a fresh stream", i)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.DecodeBatch(cctx, []*Stream{a}, [][][]int{good()}); !errors.Is(err, context.Canceled) || a.Frames() != 2 {
		t.Errorf("cancelled context: %v, stream at %d frames (want 2)", err, a.Frames())
	}
}
