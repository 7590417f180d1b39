package mimi

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// TestBatchOpsIndependentOfStreams: a batched decode frame gives the queue
// as many ops for 8 streams as for 2, frame after frame — from the first
// frames (replicate padding, growing caches) past the attention context
// and the caches' compaction — so that on a GPU (an op a launch) a frame
// of hundreds of streams costs the launches of one. The streams decode in
// lockstep, so that every stream's caches grow and compact in the same
// frame; a frame where only some streams compact differs by the
// compaction's one op, whatever the number of streams.
func TestBatchOpsIndependentOfStreams(t *testing.T) {
	const frames = 36 // past the tiny context's first compaction (64 rows)
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDecoder(t, tc.cfg, 11, tc.opts)
			oc := gputest.NewCountingQueue(d.q)
			d.q = oc
			// frameOps decodes frames frames of n streams in lockstep and
			// returns each frame's ops by method.
			frameOps := func(n int) []map[string]int {
				rng := rand.New(rand.NewPCG(12, uint64(n)))
				streams := make([]*Stream, n)
				for i := range streams {
					streams[i] = d.NewStream()
					defer streams[i].Close()
				}
				var out []map[string]int
				for range frames {
					codes := make([][][]int, n)
					for i := range codes {
						codes[i] = randomCodes(rng, 1, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
					}
					oc.Ops = map[string]int{}
					if _, err := d.DecodeBatch(context.Background(), streams, codes); err != nil {
						t.Fatal(err)
					}
					out = append(out, oc.Ops)
				}
				return out
			}
			two, eight := frameOps(2), frameOps(8)
			t.Logf("frame 0: %d ops for 2 streams, %d for 8; frame %d: %d, %d",
				sum(two[0]), sum(eight[0]), frames-1, sum(two[frames-1]), sum(eight[frames-1]))
			bad := 0
			for f := range frames {
				if diff := opsDiff(two[f], eight[f]); diff != "" {
					if bad++; bad <= 3 {
						t.Errorf("frame %d: %d ops for 2 streams, %d for 8 (%s)", f, sum(two[f]), sum(eight[f]), diff)
					}
				}
			}
			if bad > 3 {
				t.Errorf("… and %d more frames", bad-3)
			}
		})
	}
}

func sum(ops map[string]int) int {
	n := 0
	for _, v := range ops {
		n += v
	}
	return n
}

// opsDiff lists the methods whose counts differ between a and b.
func opsDiff(a, b map[string]int) string {
	names := maps.Clone(a)
	maps.Copy(names, b)
	var diff []string
	for _, k := range slices.Sorted(maps.Keys(names)) {
		if a[k] != b[k] {
			diff = append(diff, fmt.Sprintf("%s %d→%d", k, a[k], b[k]))
		}
	}
	return strings.Join(diff, ", ")
}
