// Package codectest checks a codec's batched decode against decoding each
// stream on its own, over a schedule of ragged calls; the Mimi and the
// detokenizer packages' tests share it.
package codectest

import (
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// Schedule is a sequence of batched calls over streams: Calls[c][s] is the
// frames stream s decodes in call c (-1: s is not in the call; a stream is
// created at its first call).
type Schedule struct {
	Name    string
	Streams int
	Calls   [][]int
}

// Codec adapts one codec's streams of type S to Check.
type Codec[S comparable] struct {
	New    func() S
	Close  func(S)
	Codes  func(rng *rand.Rand, frames int) [][]int                // random valid frames
	Alone  func(s S, codes [][]int) ([]float32, error)             // one stream's own decode
	Batch  func(streams []S, codes [][][]int) ([][]float32, error) // the batched decode
	Frames func(S) int                                             // frames a stream has decoded
	// Samples, when set, is the exact number of samples frames decode to
	// (a codec without a lag); otherwise only some samples are required.
	Samples func(frames int) int
}

// Check runs sc through c with codes drawn from seed: every call's batched
// samples and every stream's frame count equal, bit for bit, those of its
// twin stream decoding the same frames alone. It returns the batched
// streams and their twins, by stream index (closed when t ends), for the
// caller's end-of-stream checks.
func Check[S comparable](t *testing.T, c Codec[S], sc Schedule, seed uint64) (batched, alone []S) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(sc.Streams)))
	batched, alone = make([]S, sc.Streams), make([]S, sc.Streams)
	made := make([]bool, sc.Streams)
	t.Cleanup(func() {
		for i := range made {
			if made[i] {
				c.Close(batched[i])
				c.Close(alone[i])
			}
		}
	})
	for call, frames := range sc.Calls {
		var streams []S
		var ids []int
		var codes [][][]int
		var want [][]float32
		for s, n := range frames {
			if n < 0 {
				continue
			}
			if !made[s] {
				batched[s], alone[s], made[s] = c.New(), c.New(), true
			}
			fr := c.Codes(rng, n)
			w, err := c.Alone(alone[s], fr)
			if err != nil {
				t.Fatal(err)
			}
			streams, ids = append(streams, batched[s]), append(ids, s)
			codes, want = append(codes, fr), append(want, w)
		}
		got, err := c.Batch(streams, codes)
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if len(got) != len(streams) {
			t.Fatalf("call %d: %d results for %d streams", call, len(got), len(streams))
		}
		for i := range streams {
			switch {
			case c.Samples != nil && len(want[i]) != c.Samples(len(codes[i])):
				t.Fatalf("call %d stream %d: one-by-one gave %d samples, want %d", call, ids[i], len(want[i]), c.Samples(len(codes[i])))
			case len(codes[i]) > 0 && len(want[i]) == 0:
				t.Fatalf("call %d stream %d: one-by-one gave no samples", call, ids[i])
			}
			if j := gputest.FirstDiff(got[i], want[i]); j >= 0 {
				t.Errorf("call %d stream %d: sample %d differs from decoding it alone (%d vs %d samples)",
					call, ids[i], j, len(got[i]), len(want[i]))
			}
			if got, want := c.Frames(streams[i]), c.Frames(alone[ids[i]]); got != want {
				t.Errorf("call %d stream %d: %d frames, alone %d", call, ids[i], got, want)
			}
		}
	}
	return batched, alone
}
