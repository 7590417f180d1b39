package conformer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// realConfig is LFM2-Audio-1.5B's encoder (the encoder section of its
// released config.json).
func realConfig() config.Encoder {
	return config.Encoder{
		FeatIn: 128, FeatOut: -1, NLayers: 17, DModel: 512, NHeads: 8,
		Subsampling: "dw_striding", SubsamplingFactor: 8, SubsamplingConvChannels: 256,
		FFExpansionFactor: 4, SelfAttentionModel: "rel_pos", AttContextSize: []int{-1, -1},
		UntieBiases: true, PosEmbMaxLen: 5000, ConvKernelSize: 9, ConvNormType: "batch_norm",
	}
}

// BenchmarkEncode runs the encoder and adapter at the real size (17 × 512,
// 8 heads, 256 subsampling channels, adapter 512 → 2048 → 2048) with
// random bf16 weights on clips of 1 and 5 s (101 and 501 mel frames),
// reporting the cost per second of audio.
func BenchmarkEncode(b *testing.B) {
	const hidden = 2048
	cfg := realConfig()
	dev := cpu.New(runtime.NumCPU())
	defer dev.Close()
	e, err := Load(weights.New(dev, randomCheckpoint(b, cfg, hidden, 1)), cfg, hidden)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, seconds := range []int{1, 5} {
		frames := 100*seconds + 1 // 16 kHz, hop 160, centred STFT
		mel := make([]float32, frames*cfg.FeatIn)
		for i := range mel {
			mel[i] = gpu.RoundBF16(float32(rng.NormFloat64()))
		}
		for _, p := range []nn.Precision{nn.BF16, nn.F32} {
			b.Run(fmt.Sprintf("%ds/%v", seconds, p), func(b *testing.B) {
				c := nn.NewCtx(dev, dev.NewQueue("bench"), p)
				defer c.A.Free()
				in := upload(c, mel, frames, cfg.FeatIn)
				mark := c.A.Mark()
				for b.Loop() {
					e.Forward(c, in)
					if err := c.Q.Sync(); err != nil {
						b.Fatal(err)
					}
					c.A.Release(mark)
				}
				perOp := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(1000*perOp/float64(seconds), "ms/audio-s")
			})
		}
	}
}
