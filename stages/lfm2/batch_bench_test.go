package lfm2_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// BenchmarkBackboneBatchStep is one audio step of `sessions` conversations
// batched in one pass (a row each, each at its own position after a
// 93-row prompt), at LFM2-Audio-1.5B's real size: what continuous
// batching costs per step as sessions join. ms/step is the whole pass;
// ms/session its share. Issue 12's target on the CPU: 4 rows at most 1.3×
// one row while the step is bandwidth-bound.
func BenchmarkBackboneBatchStep(b *testing.B) {
	r := realModel(b)
	H, V := r.m.Cfg.HiddenSize, r.m.Cfg.VocabSize
	for _, sessions := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			c := nn.NewCtx(r.dev, r.dev.NewQueue("bench"), nn.BF16)
			defer c.A.Free()
			rng := rand.New(rand.NewPCG(1, uint64(sessions)))
			caches := make([]*lfm2.Cache, sessions)
			seqs := make([]lfm2.Seq, sessions)
			for i := range caches {
				caches[i] = r.prefill(b, c, rng, promptRows+i)
				caches[i].Grow(c.Q, promptRows+sessions+b.N+1)
				seqs[i] = lfm2.Seq{Cache: caches[i], Rows: 1}
			}
			defer func() {
				for _, cc := range caches {
					cc.Free()
				}
			}()
			hidden := make([]float32, sessions*H)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.A.Reset()
				x := c.Tmp(sessions, H)
				r.m.EmbedTokens(c, x, randomIDs(rng, sessions, V))
				h := r.m.Forward(c, x, seqs)
				if err := c.Q.Read(hidden, h); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			per := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(per*1e3/float64(sessions), "ms/session")
			reportFloor(b, "ms/step", r.body, r.bw)
		})
	}
}
