package conformer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// batchModel is a checkpoint the batch tests load on each device.
type batchModel struct {
	name   string
	cfg    config.Encoder
	hidden int
	file   func(t *testing.T) *safetensors.File
	clips  [][]int // mel frames of the clips of each batch
}

func batchModels(t *testing.T) []batchModel {
	fixture, err := config.ReadAudio(fixtureDir + "config.json")
	if err != nil {
		t.Fatal(err)
	}
	wide := tinyConfig()
	wide.FeatIn, wide.FeatOut, wide.DModel, wide.NHeads = 33, -1, 32, 2
	wide.SubsamplingFactor, wide.SubsamplingConvChannels, wide.NLayers = 16, -1, 1
	wide.XScaling, wide.ConvKernelSize, wide.ConvContextSize = false, 3, nil
	return []batchModel{
		// A one-frame clip (T = 1: rel_shift's and the convolutions' edge),
		// the longest not first (the positional rows of the batch are the
		// longest clip's), odd lengths, a clip repeated.
		{"fixture", fixture.Encoder, fixture.LFM.HiddenSize,
			func(t *testing.T) *safetensors.File { return openFile(t, fixtureDir+"model.safetensors") },
			[][]int{{57, 1, 130, 9}, {1}, {8, 8, 17}}},
		{"x4_asymmetric_kernel_out_proj", tinyConfig(), 28,
			func(t *testing.T) *safetensors.File { return randomCheckpoint(t, tinyConfig(), 28, 1) },
			[][]int{{3, 30, 1, 12}}},
		{"x16_odd_width", wide, 20,
			func(t *testing.T) *safetensors.File { return randomCheckpoint(t, wide, 20, 2) },
			[][]int{{70, 16, 17, 1}}},
	}
}

// randomMel returns frames rows of bf16 log-mel-like values.
func randomMel(rng *rand.Rand, frames, feats int) []float32 {
	mel := make([]float32, frames*feats)
	for i := range mel {
		mel[i] = gpu.RoundBF16(float32(rng.NormFloat64()))
	}
	return mel
}

// TestEncodeBatchEqualsOneByOne encodes batches of clips of different
// lengths and checks every clip's encoder and adapter rows against the
// clip encoded alone, bit for bit, in both precisions, on every device:
// against Encode and against the one-clip formulation the package had
// before batching (oneClipEncode).
func TestEncodeBatchEqualsOneByOne(t *testing.T) {
	testdev.Run(t, func(t *testing.T, dev gpu.Device) {
		for _, m := range batchModels(t) {
			e, err := Load(weights.New(dev, m.file(t)), m.cfg, m.hidden)
			if err != nil {
				t.Fatalf("%s: %v", m.name, err)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			for _, frames := range m.clips {
				for _, p := range []nn.Precision{nn.BF16, nn.F32} {
					t.Run(fmt.Sprintf("%s/%v/%v", m.name, frames, p), func(t *testing.T) {
						batchEqualsOneByOne(t, e, dev, p, rng, frames)
					})
				}
			}
		}
	})
}

func batchEqualsOneByOne(t *testing.T, e *Encoder, dev gpu.Device, p nn.Precision, rng *rand.Rand, frames []int) {
	feats := e.Cfg.FeatIn
	var all []float32
	mels := make([][]float32, len(frames))
	for i, n := range frames {
		mels[i] = randomMel(rng, n, feats)
		all = append(all, mels[i]...)
	}
	c := nn.NewCtx(dev, dev.NewQueue("batch"), p)
	defer c.A.Free()
	enc := e.EncodeBatch(c, upload(c, all, len(all)/feats, feats), frames)
	out := e.Adapt(c, enc)
	gotEnc, gotOut := download(t, c, enc), download(t, c, out)

	alone := nn.NewCtx(dev, dev.NewQueue("alone"), p)
	defer alone.A.Free()
	row := 0
	for i, n := range frames {
		T := e.OutLen(n)
		ge := gotEnc[row*e.FeatOut : (row+T)*e.FeatOut]
		gad := gotOut[row*e.Hidden : (row+T)*e.Hidden]
		row += T
		for _, ref := range []struct {
			name   string
			encode func(c *nn.Ctx, mel gpu.Tensor) gpu.Tensor
		}{
			{"Encode", e.Encode},
			{"oneClipEncode", func(c *nn.Ctx, mel gpu.Tensor) gpu.Tensor { return oneClipEncode(e, c, mel) }},
		} {
			alone.A.Reset()
			x := ref.encode(alone, upload(alone, mels[i], n, feats))
			y := e.Adapt(alone, x)
			we, wa := download(t, alone, x), download(t, alone, y)
			if d := gputest.FirstDiff(ge, we); d >= 0 {
				t.Errorf("clip %d (%d frames): encoder row %d col %d = %v in the batch, %v by %s alone",
					i, n, d/e.FeatOut, d%e.FeatOut, ge[d], we[d], ref.name)
			}
			if d := gputest.FirstDiff(gad, wa); d >= 0 {
				t.Errorf("clip %d (%d frames): adapter row %d col %d = %v in the batch, %v by %s alone",
					i, n, d/e.Hidden, d%e.Hidden, gad[d], wa[d], ref.name)
			}
		}
	}
	if row != enc.Rows || enc.Cols != e.FeatOut || out.Rows != row {
		t.Errorf("batch output %v, adapter %v; want %d rows", enc, out, row)
	}
}

func total(calls map[string]int) int {
	n := 0
	for _, k := range calls {
		n += k
	}
	return n
}

// TestEncodeBatchOps counts the queue ops of EncodeBatch and Adapt for 2
// and for 8 clips: only the work that mixes rows within a clip may grow
// with the clips, by exactly perClip ops a clip — the subsampling's 3×3
// convolutions (conv.0 and one depthwise stage each), and per layer the
// depthwise time convolution and the attention core, whatever the number
// of heads: the scores of all heads (gpu.RelPosScores: on CUDA one
// launch), their softmax and its rounding, and the products with the
// values (gpu.HeadsMatMul: one launch). Every other op, the row-wise
// ones, is issued once whatever the number of clips.
func TestEncodeBatchOps(t *testing.T) {
	dev := newDevice(t)
	e := loadFixture(t, dev)
	perLayer := 4 + 1
	perClip := 1 + len(e.Sub.Stages) + len(e.Layers)*perLayer
	perOp := map[string]int{ // the per-clip ops by method
		"Conv2D":       1 + len(e.Sub.Stages),
		"Conv1D":       len(e.Layers),
		"RelPosScores": len(e.Layers),
		"Softmax":      len(e.Layers),
		"RoundBF16":    len(e.Layers),
		"HeadsMatMul":  len(e.Layers),
	}
	rng := rand.New(rand.NewPCG(7, 8))
	lengths := []int{40, 9, 1, 57, 17, 33, 8, 25}
	count := func(clips int, batched bool) map[string]int {
		q := gputest.NewCountingQueue(dev.NewQueue("count"))
		c := nn.NewCtx(dev, q, nn.BF16)
		defer c.A.Free()
		frames := lengths[:clips]
		var all []float32
		for _, n := range frames {
			all = append(all, randomMel(rng, n, e.Cfg.FeatIn)...)
		}
		mel := upload(c, all, len(all)/e.Cfg.FeatIn, e.Cfg.FeatIn)
		clear(q.Ops)
		if batched {
			e.Adapt(c, e.EncodeBatch(c, mel, frames))
			return q.Ops
		}
		row := 0
		for _, n := range frames { // before EncodeBatch: one clip at a time
			e.Adapt(c, oneClipEncode(e, c, mel.Slice(row, row+n)))
			row += n
		}
		return q.Ops
	}
	two, eight := count(2, true), count(8, true)
	oldTwo, oldEight := count(2, false), count(8, false)
	t.Logf("queue ops: batched %d for 2 clips, %d for 8 (%d a clip); one by one %d and %d (%d a clip)",
		total(two), total(eight), (total(eight)-total(two))/6, total(oldTwo), total(oldEight), (total(oldEight)-total(oldTwo))/6)
	if got := total(eight) - total(two); got != 6*perClip {
		t.Errorf("8 clips take %d ops more than 2, want 6 × %d per-clip ops", got, perClip)
	}
	ops := slices.Sorted(func(yield func(string) bool) {
		for k := range eight {
			if !yield(k) {
				return
			}
		}
	})
	for _, op := range ops {
		if d := eight[op] - two[op]; d != 6*perOp[op] {
			t.Errorf("%s: %d calls for 8 clips, %d for 2: want %d more (%d a clip)", op, eight[op], two[op], 6*perOp[op], perOp[op])
		}
	}
}
