package lfm2_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// The benchmarks run LFM2-Audio-1.5B's backbone at its real size (LFM2-1.2B:
// hidden 2048, 16 layers, attention at 2, 5, 8, 10, 12, 14, 32/8 heads, FFN
// 8192, vocabulary 65536) with random bf16 weights from bench's synthetic
// checkpoint, on a CPU device with one worker per core, in bf16 precision.
// The prompt is 93 rows, as in the reference speed measurement that
// docs/performance.md compares against (liquid-audio v1.0.0's README turn:
// its system prompt and assets/question.wav).

const promptRows = 93

type realBackbone struct {
	m   *lfm2.Model
	dev *cpu.Device
	bw  bench.Bandwidth
	// body and head are a step's weight bytes without and for the text head.
	body, head int64
}

// loadReal builds the backbone's 2.3 GB of weights once per process.
var loadReal = sync.OnceValues(func() (*realBackbone, error) {
	ck := bench.Real()
	specs, err := ck.ModelTensors()
	if err != nil {
		return nil, err
	}
	data, err := bench.Safetensors(bench.WithPrefix(specs, "lfm."), ck.Seed, nil)
	if err != nil {
		return nil, err
	}
	f, err := safetensors.Parse(data, "synthetic LFM2-1.2B")
	if err != nil {
		return nil, err
	}
	dev := cpu.New(0)
	b := weights.New(dev, f)
	m, err := lfm2.Load(b.Sub("lfm"), ck.Config.LFM)
	if err == nil {
		err = b.Err()
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	r := &realBackbone{m: m, dev: dev, bw: bench.MeasureBandwidth(dev.Workers())}
	r.body, r.head = bench.BackboneBytes(m)
	return r, nil
})

func realModel(b *testing.B) *realBackbone {
	b.Helper()
	r, err := loadReal()
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// prefill runs n random prompt rows into a new cache.
func (r *realBackbone) prefill(b *testing.B, c *nn.Ctx, rng *rand.Rand, n int) *lfm2.Cache {
	cache := r.m.NewCache(r.dev)
	c.A.Reset()
	x := c.Tmp(n, r.m.Cfg.HiddenSize)
	r.m.EmbedTokens(c, x, randomIDs(rng, n, r.m.Cfg.VocabSize))
	h := r.m.Forward(c, x, []lfm2.Seq{{Cache: cache, Rows: n}})
	last := make([]float32, r.m.Cfg.HiddenSize)
	if err := c.Q.Read(last, h.Row(n-1)); err != nil {
		b.Fatal(err)
	}
	return cache
}

func randomIDs(rng *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	return ids
}

// reportFloor reports the achieved weight-read rate and the step's
// memory-bandwidth floors: its weight bytes over the measured streaming-read
// rate (floor-ms; a step only reads its weights, so none can be faster) and
// over the memcpy rate (memcpy-floor-ms, the usual way a memory-bound
// decoder's floor is quoted: bytes over memcpy bandwidth).
func reportFloor(b *testing.B, unit string, bytes int64, bw bench.Bandwidth) {
	per := b.Elapsed().Seconds() / float64(b.N)
	floor := float64(bytes) / (bw.ReadGBs * 1e9)
	b.ReportMetric(per*1e3, unit)
	b.ReportMetric(float64(bytes)/per/1e9, "GB/s")
	b.ReportMetric(floor*1e3, "floor-ms")
	b.ReportMetric(float64(bytes)/(bw.CopyGBs*1e9)*1e3, "memcpy-floor-ms")
	b.ReportMetric(per/floor, "x-floor")
}

// BenchmarkBackboneDecodeStep is one generation step: one row through the
// 16 layers, then (text) the 65536 × 2048 tied text head and the logits
// read back, or (audio) the hidden row read back for the depthformer;
// audio+codec runs the audio step while another goroutine streams Mimi
// frames on the same device, as the engine's codec stage does while the
// backbone steps (docs/performance.md: the two stages' fork-join ops slow
// each other far more than sharing the cores explains). The
// cache grows from 93 to 153 positions and is then rebuilt, untimed, as in
// the reference's micro-benchmark. GB/s is weight bytes per second of step;
// floor-ms and memcpy-floor-ms are the weight bytes over the measured read
// and memcpy bandwidths (reportFloor).
func BenchmarkBackboneDecodeStep(b *testing.B) {
	r := realModel(b)
	H, V := r.m.Cfg.HiddenSize, r.m.Cfg.VocabSize
	for _, kind := range []string{"text", "audio", "audio+codec"} {
		b.Run(kind, func(b *testing.B) {
			if kind == "audio+codec" {
				stop := make(chan struct{})
				done := decodeLoop(b, r.dev, stop)
				defer func() { close(stop); <-done }()
			}
			c := nn.NewCtx(r.dev, r.dev.NewQueue("bench"), nn.BF16)
			defer c.A.Free()
			rng := rand.New(rand.NewPCG(1, 2))
			cache := r.prefill(b, c, rng, promptRows)
			logits, hidden := make([]float32, V), make([]float32, H)
			bytes := r.body
			if kind == "text" {
				bytes += r.head
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if cache.Len() >= promptRows+60 {
					b.StopTimer()
					cache.Free()
					cache = r.prefill(b, c, rng, promptRows)
					b.StartTimer()
				}
				c.A.Reset()
				x := c.Tmp(1, H)
				r.m.EmbedTokens(c, x, randomIDs(rng, 1, V))
				h := r.m.Forward(c, x, []lfm2.Seq{{Cache: cache, Rows: 1}})
				var err error
				if kind == "text" {
					lg := c.Tmp(1, V)
					r.m.Logits(c, lg, h)
					err = c.Q.Read(logits, lg)
				} else {
					err = c.Q.Read(hidden, h)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cache.Free()
			reportFloor(b, "ms/step", bytes, r.bw)
		})
	}
}

// decodeLoop streams Mimi frames (the official decoder's sizes, random
// weights) on dev until stop closes, as the engine's codec stage does
// while the backbone steps; done closes after.
func decodeLoop(b *testing.B, dev *cpu.Device, stop <-chan struct{}) (done <-chan struct{}) {
	cfg := mimi.DefaultConfig()
	specs, err := bench.MimiTensors(cfg)
	if err != nil {
		b.Fatal(err)
	}
	data, err := bench.Safetensors(specs, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := safetensors.Parse(data, "synthetic Mimi")
	if err != nil {
		b.Fatal(err)
	}
	d, err := mimi.New(dev, f, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer d.Close()
		s := d.NewStream()
		defer s.Close()
		frame := [][]int{make([]int, mimi.NumCodebooks)}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for c := range frame[0] {
				frame[0][c] = (i*7 + c*131) % cfg.Quantizer.Bins
			}
			if _, err := s.DecodeFrames(context.Background(), frame); err != nil {
				panic(err)
			}
		}
	}()
	return ch
}

// BenchmarkBackbonePrefill runs a 93-row prompt into a fresh cache and the
// text head on its last row (the turn's first text step). GFLOP/s counts
// 2 FLOP per weight per row, plus the head's.
func BenchmarkBackbonePrefill(b *testing.B) {
	r := realModel(b)
	H, V := r.m.Cfg.HiddenSize, r.m.Cfg.VocabSize
	for _, rows := range []int{promptRows} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			c := nn.NewCtx(r.dev, r.dev.NewQueue("bench"), nn.BF16)
			defer c.A.Free()
			rng := rand.New(rand.NewPCG(3, 4))
			ids := randomIDs(rng, rows, V)
			logits := make([]float32, V)
			for b.Loop() {
				c.A.Reset()
				cache := r.m.NewCache(r.dev)
				x := c.Tmp(rows, H)
				r.m.EmbedTokens(c, x, ids)
				h := r.m.Forward(c, x, []lfm2.Seq{{Cache: cache, Rows: rows}})
				lg := c.Tmp(1, V)
				r.m.Logits(c, lg, h.Row(rows-1))
				if err := c.Q.Read(logits, lg); err != nil {
					b.Fatal(err)
				}
				cache.Free()
			}
			per := b.Elapsed().Seconds() / float64(b.N)
			flop := 2 * (float64(r.body)/2*float64(rows) + float64(r.head)/2)
			b.ReportMetric(per*1e3, "ms/prefill")
			b.ReportMetric(per*1e3/float64(rows), "ms/row")
			b.ReportMetric(flop/per/1e9, "GFLOP/s")
		})
	}
}
