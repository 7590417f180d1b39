package mimi

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// BenchmarkDecodeFrame streams frames one at a time through the official
// Mimi dimensions (random weights built here; only the 8 decoded codebooks
// are materialised) and reports the cost per 80 ms frame. The CPU device
// gets 1 or 2 workers.
func BenchmarkDecodeFrame(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Quantizer.NQ = NumCodebooks
	set := synthCheckpoint(cfg, 1, synthOpts{skipEncoder: true})
	f := set.file(b, "", nil)
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			dev := cpu.New(workers)
			defer dev.Close()
			d, err := New(dev, f, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			s := d.NewStream()
			defer s.Close()
			codes := randomCodes(rand.New(rand.NewPCG(1, 2)), 64, NumCodebooks, cfg.Quantizer.Bins)
			ctx := context.Background()
			out := make([]float32, 0, d.FrameSamples())
			// Warm the arena and the caches.
			for i := 0; i < 4; i++ {
				if out, err = s.AppendFrames(ctx, out[:0], codes[i:i+1]); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if out, err = s.AppendFrames(ctx, out[:0], codes[i%64:i%64+1]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			msPerFrame := b.Elapsed().Seconds() * 1e3 / float64(b.N)
			b.ReportMetric(msPerFrame, "ms/frame")
			b.ReportMetric(msPerFrame/80, "x-realtime")
		})
	}
}

// BenchmarkDecodeBatch decodes one frame of each of 1, 4 or 16 streams per
// call (DecodeBatch) through the official Mimi dimensions on a two-worker
// CPU device, and reports the cost per call and per stream's 80 ms frame:
// the batch shares the weights' reads of the per-row layers.
func BenchmarkDecodeBatch(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Quantizer.NQ = NumCodebooks
	set := synthCheckpoint(cfg, 1, synthOpts{skipEncoder: true})
	f := set.file(b, "", nil)
	dev := cpu.New(2)
	defer dev.Close()
	d, err := New(dev, f, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	codes := randomCodes(rand.New(rand.NewPCG(1, 2)), 64, NumCodebooks, cfg.Quantizer.Bins)
	ctx := context.Background()
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			streams := make([]*Stream, n)
			for i := range streams {
				streams[i] = d.NewStream()
				defer streams[i].Close()
			}
			frames := make([][][]int, n)
			call := func(f int) {
				for i := range frames {
					frames[i] = codes[(f+7*i)%64 : (f+7*i)%64+1]
				}
				if _, err := d.DecodeBatch(ctx, streams, frames); err != nil {
					b.Fatal(err)
				}
			}
			for f := 0; f < 4; f++ { // warm the arena and the caches
				call(f)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				call(i)
			}
			b.StopTimer()
			ms := b.Elapsed().Seconds() * 1e3 / float64(b.N)
			b.ReportMetric(ms, "ms/call")
			b.ReportMetric(ms/float64(n), "ms/frame")
			b.ReportMetric(ms/float64(n)/80, "x-realtime")
		})
	}
}
