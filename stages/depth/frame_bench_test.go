package depth_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// BenchmarkDepthFrame samples one audio frame — depth_linear, then 8
// codebooks each through the 6 × 1024 depthformer and its 2049 × 1024
// logits table, the logits read back and the argmax fed to the next —
// at LFM2-Audio-1.5B's real size with random bf16 weights from bench's
// synthetic checkpoint, for 1, 2, 4 and 8 sessions batched. GB/s is the
// frame's weight bytes per second; floor-ms and memcpy-floor-ms are those
// bytes over the measured streaming-read and memcpy bandwidths (the same for
// a batch, which reads the weights once); x-sessions1 is the frame's time
// over the one-session frame's (while the frame is bandwidth-bound a batch
// should cost little more than one session).
func BenchmarkDepthFrame(b *testing.B) {
	ck := bench.Real()
	specs, err := ck.ModelTensors()
	if err != nil {
		b.Fatal(err)
	}
	data, err := bench.Safetensors(bench.WithPrefix(specs, "depth_linear.", "depthformer.", "depth_embeddings."), ck.Seed, nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := safetensors.Parse(data, "synthetic depthformer")
	if err != nil {
		b.Fatal(err)
	}
	dev := cpu.New(0)
	defer dev.Close()
	wb := weights.New(dev, f)
	cfg := ck.Config
	d, err := depth.Load(wb, cfg.Depthformer, cfg.Codebooks, ck.Mimi.Quantizer.Bins, cfg.LFM.HiddenSize)
	if err == nil {
		err = wb.Err()
	}
	if err != nil {
		b.Fatal(err)
	}
	bytes := bench.DepthFrameBytes(d)
	bw := bench.MeasureBandwidth(dev.Workers())
	H := cfg.LFM.HiddenSize
	one := 0.0 // ms/frame of one session
	for _, sessions := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			c := nn.NewCtx(dev, dev.NewQueue("bench"), nn.BF16)
			defer c.A.Free()
			rng := rand.New(rand.NewPCG(1, 2))
			hidden := make([]float32, sessions*H)
			for i := range hidden {
				hidden[i] = float32(rng.NormFloat64())
			}
			greedy := func(_, _ int, logits []float32) int {
				best := 0
				for i, v := range logits {
					if v > logits[best] {
						best = i
					}
				}
				return best
			}
			for b.Loop() {
				c.A.Reset()
				h := c.Tmp(sessions, H)
				c.Q.Write(h, hidden)
				if _, err := d.Frame(c, h, greedy); err != nil {
					b.Fatal(err)
				}
			}
			per := b.Elapsed().Seconds() / float64(b.N)
			floor := float64(bytes) / (bw.ReadGBs * 1e9)
			b.ReportMetric(per*1e3, "ms/frame")
			b.ReportMetric(float64(bytes)/per/1e9, "GB/s")
			b.ReportMetric(floor*1e3, "floor-ms")
			b.ReportMetric(float64(bytes)/(bw.CopyGBs*1e9)*1e3, "memcpy-floor-ms")
			b.ReportMetric(per/floor, "x-floor")
			if sessions == 1 {
				one = per
			} else if one > 0 {
				b.ReportMetric(per/one, "x-sessions1")
			}
		})
	}
}
