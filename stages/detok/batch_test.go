package detok

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/codectest"
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

// batchSchedule is a codectest.Schedule with the pass size it runs at.
type batchSchedule struct {
	codectest.Schedule
	maxPass int
}

func batchSchedules() []batchSchedule {
	sc := func(name string, streams, maxPass int, calls [][]int) batchSchedule {
		return batchSchedule{codectest.Schedule{Name: name, Streams: streams, Calls: calls}, maxPass}
	}
	return []batchSchedule{
		sc("frame-by-frame", 4, defaultMaxPass, [][]int{
			{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1},
		}),
		sc("ragged", 3, defaultMaxPass, [][]int{
			{3, 1, 5}, {1, 4, 1}, {2, 0, 7}, {1, 1, 1},
		}),
		sc("join-late", 4, defaultMaxPass, [][]int{
			{2, -1, -1, -1}, {1, 3, -1, -1}, {4, 1, 1, -1}, {1, 1, 2, 1}, {-1, 1, 1, 6},
		}),
		sc("past-a-pass", 3, 4, [][]int{
			{7, 1, -1}, {1, 8, 2}, {4, -1, 1}, {1, 1, 1},
		}),
		sc("past-the-window", 2, defaultMaxPass, [][]int{
			{3, 1}, {4, 6}, {1, 1}, {1, 1}, {2, 1},
		}),
		sc("one-stream", 1, defaultMaxPass, [][]int{{1}, {5}, {2}}),
	}
}

func batchEqualsOneByOne(t *testing.T, d *Decoder) {
	ctx := context.Background()
	codec := codectest.Codec[*Stream]{
		New:    d.NewStream,
		Close:  (*Stream).Close,
		Codes:  func(rng *rand.Rand, n int) [][]int { return randomCodes(rng, n, d.Bins()) },
		Alone:  (*Stream).Decode,
		Batch:  func(ss []*Stream, codes [][][]int) ([][]float32, error) { return d.DecodeBatch(ctx, ss, codes) },
		Frames: (*Stream).Frames,
	}
	for _, sc := range batchSchedules() {
		t.Run(sc.Name, func(t *testing.T) {
			d.maxPass = sc.maxPass
			defer func() { d.maxPass = defaultMaxPass }()
			batched, alone := codectest.Check(t, codec, sc.Schedule, 4)
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
