package mimi

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// A synthetic checkpoint: every tensor moshi's MimiModel.state_dict() holds
// for the decoding half, plus encoder-side tensors the loader must skip,
// with random values scaled like the fixture's (N(0, 1/fan_in) weights), so
// that activations stay of order one through the network.

type synthOpts struct {
	fusedAttnNames bool // in_proj_weight / out_proj.weight (older checkpoints)
	skipEncoder    bool // leave the encoder-side tensors out
}

// tensorSet maps names to host values and shapes (what the float64 replay
// reads) and converts to a safetensors file.
type tensorSet struct {
	names  []string
	vals   map[string][]float32
	shapes map[string][]int
}

func (s *tensorSet) add(name string, v []float32, shape ...int) {
	if s.vals == nil {
		s.vals, s.shapes = map[string][]float32{}, map[string][]int{}
	}
	if _, dup := s.vals[name]; dup {
		panic("duplicate tensor " + name)
	}
	s.names = append(s.names, name)
	s.vals[name] = v
	s.shapes[name] = shape
}

func (s *tensorSet) file(t testing.TB, drop string, reshape map[string][]int) *safetensors.File {
	t.Helper()
	var ts []*safetensors.Tensor
	size := 1 << 20 // header
	for _, n := range s.names {
		size += 4 * len(s.vals[n])
		if n == drop {
			continue
		}
		shape := s.shapes[n]
		if r, ok := reshape[n]; ok {
			shape = r
		}
		ts = append(ts, safetensors.NewF32(n, s.vals[n], shape...))
	}
	var buf bytes.Buffer
	buf.Grow(size)
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Parse(buf.Bytes(), "synthetic.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

type synth struct {
	rng *rand.Rand
	set tensorSet
}

func (g *synth) normal(n int, std float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(g.rng.NormFloat64() * std)
	}
	return v
}

func (g *synth) weight(name string, shape ...int) {
	n, fan := 1, 1
	for i, d := range shape {
		n *= d
		if i > 0 {
			fan *= d
		}
	}
	g.set.add(name, g.normal(n, 1/math.Sqrt(float64(fan))), shape...)
}

func (g *synth) bias(name string, n int) { g.set.add(name, g.normal(n, 0.05), n) }

// norm adds a norm or LayerScale-like vector: around one or (scale) in
// [lo, hi).
func (g *synth) around(name string, n int, center, spread float64) {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(center + spread*(2*g.rng.Float64()-1))
	}
	g.set.add(name, v, n)
}

func (g *synth) conv(prefix string, cout, cin, k int) {
	g.weight(prefix+".weight", cout, cin, k)
	g.bias(prefix+".bias", cout)
}

// convTr adds a ConvTranspose1d; its fan-in is in/groups·k/stride.
func (g *synth) convTr(prefix string, cin, coutPerGroup, k, stride int, bias bool) {
	std := 1 / math.Sqrt(float64(cin*k/stride))
	if coutPerGroup == 1 && cin > 1 { // depthwise
		std = 1 / math.Sqrt(float64(k/stride))
	}
	g.set.add(prefix+".weight", g.normal(cin*coutPerGroup*k, std), cin, coutPerGroup, k)
	if bias {
		g.bias(prefix+".bias", coutPerGroup)
	}
}

// synthCheckpoint builds the tensors of a Mimi model with configuration c.
func synthCheckpoint(c Config, seed uint64, o synthOpts) *tensorSet {
	g := &synth{rng: rand.New(rand.NewPCG(seed, 0x6d696d69))}
	s, qc, tc := c.SEANet, c.Quantizer, c.Transformer
	dim := s.Dimension

	if !o.skipEncoder {
		g.conv("encoder.model.0.conv.conv", s.NFilters, 1, s.KernelSize)
		g.weight("encoder_transformer.transformer.layers.0.linear1.weight", 4, dim)
		g.weight("downsample.conv.conv.conv.weight", dim, dim, 4)
	}

	// Quantizer.
	for _, part := range []struct {
		name string
		n    int
	}{{"rvq_first", qc.NQSemantic}, {"rvq_rest", qc.NQ - qc.NQSemantic}} {
		p := "quantizer." + part.name
		if !o.skipEncoder {
			g.weight(p+".input_proj.weight", qc.Dimension, qc.InputDimension, 1)
		}
		g.weight(p+".output_proj.weight", qc.OutputDimension, qc.Dimension, 1)
		for i := 0; i < part.n; i++ {
			cb := fmt.Sprintf("%s.vq.layers.%d._codebook.", p, i)
			g.set.add(cb+"_initialized", []float32{1}, 1)
			usage := make([]float32, qc.Bins)
			for j := range usage {
				usage[j] = float32(0.5 + 1.5*g.rng.Float64())
			}
			if i == 0 {
				usage[1] = 0 // clamped to epsilon by the codebook
			}
			sum := g.normal(qc.Bins*qc.Dimension, 1)
			for j := range sum {
				u := usage[j/qc.Dimension]
				if u == 0 {
					u = 1e-6 // a used-up code: embedding_sum tiny, usage 0
				}
				sum[j] *= u
			}
			g.set.add(cb+"cluster_usage", usage, qc.Bins)
			g.set.add(cb+"embedding_sum", sum, qc.Bins, qc.Dimension)
		}
	}

	// Upsample.
	u, err := c.upsampleStride()
	if err != nil {
		panic(err)
	}
	if u > 1 {
		if c.channelWise() {
			g.convTr("upsample.convtr.convtr.convtr", dim, 1, 2*u, u, false)
		} else {
			g.convTr("upsample.convtr.convtr.convtr", dim, dim, 2*u, u, false)
		}
	}

	// Decoder transformer.
	d := tc.DModel
	if tc.InputDimension != d {
		g.weight("decoder_transformer.input_proj.weight", d, tc.InputDimension)
	}
	if tc.OutputDimensions[0] != d {
		g.weight("decoder_transformer.output_projs.0.weight", tc.OutputDimensions[0], d)
	}
	for i := 0; i < tc.NumLayers; i++ {
		p := fmt.Sprintf("decoder_transformer.transformer.layers.%d.", i)
		if o.fusedAttnNames {
			g.weight(p+"self_attn.in_proj_weight", 3*d, d)
			g.weight(p+"self_attn.out_proj.weight", d, d)
		} else {
			g.weight(p+"self_attn.in_projs.0.weight", 3*d, d)
			g.weight(p+"self_attn.out_projs.0.weight", d, d)
		}
		g.around(p+"norm1.weight", d, 1, 0.2)
		g.bias(p+"norm1.bias", d)
		g.around(p+"norm2.weight", d, 1, 0.2)
		g.bias(p+"norm2.bias", d)
		g.weight(p+"linear1.weight", tc.DimFeedforward, d)
		g.weight(p+"linear2.weight", d, tc.DimFeedforward)
		if tc.LayerScale != nil {
			g.around(p+"layer_scale_1.scale", d, 0.4, 0.2)
			g.around(p+"layer_scale_2.scale", d, 0.4, 0.2)
		}
	}

	// SEANet decoder.
	mult := 1 << len(s.Ratios)
	g.conv("decoder.model.0.conv.conv", mult*s.NFilters, dim, s.KernelSize)
	idx := 1
	for _, r := range s.Ratios {
		ch := mult * s.NFilters / 2
		g.convTr(fmt.Sprintf("decoder.model.%d.convtr.convtr", idx+1), mult*s.NFilters, ch, 2*r, r, true)
		idx += 2
		for j := 0; j < s.NResidualLayers; j++ {
			p := fmt.Sprintf("decoder.model.%d.", idx)
			g.conv(p+"block.1.conv.conv", ch/s.Compress, ch, s.ResidualKernelSize)
			g.conv(p+"block.3.conv.conv", ch, ch/s.Compress, 1)
			if !s.TrueSkip {
				g.conv(p+"shortcut.conv.conv", ch, ch, 1)
			}
			idx++
		}
		mult /= 2
	}
	g.conv(fmt.Sprintf("decoder.model.%d.conv.conv", idx+1), s.Channels, s.NFilters, s.LastKernelSize)
	return &g.set
}

// tinyConfig is the fixture's shape (the official structure, small widths)
// with a short attention context, so that tests reach the window and the
// cache compaction within a few frames.
func tinyConfig() Config {
	c := DefaultConfig()
	c.SEANet.NFilters, c.SEANet.Dimension = 2, 16
	c.Quantizer = QuantizerConfig{Dimension: 8, NQ: 10, Bins: 2048, InputDimension: 16, OutputDimension: 16, NQSemantic: 1}
	c.Transformer.DModel, c.Transformer.NumHeads, c.Transformer.NumLayers = 16, 2, 2
	c.Transformer.DimFeedforward, c.Transformer.InputDimension = 24, 16
	c.Transformer.OutputDimensions = []int{16}
	ctx := 7
	c.Transformer.Context = &ctx
	return c
}

// variantConfig exercises the options the official model leaves unused:
// other ratios and frame rate, two dilated residual layers with 1×1
// shortcuts, replicate padding, no LayerScale, unlimited context, projected
// transformer, dense upsampling, two semantic codebooks, a small codebook.
func variantConfig() Config {
	c := DefaultConfig()
	c.SEANet.NFilters, c.SEANet.Dimension = 3, 12
	c.SEANet.Ratios = []int{3, 2}
	c.SEANet.NResidualLayers, c.SEANet.TrueSkip, c.SEANet.PadMode = 2, false, "replicate"
	c.SEANet.Compress, c.SEANet.KernelSize, c.SEANet.LastKernelSize = 3, 5, 4
	c.SampleRate, c.FrameRate = 24, 2 // SEANet at 4 Hz: ×2 upsampling
	c.Quantizer = QuantizerConfig{Dimension: 6, NQ: 8, Bins: 37, InputDimension: 12, OutputDimension: 12, NQSemantic: 2}
	c.Transformer.DModel, c.Transformer.NumHeads, c.Transformer.NumLayers = 8, 2, 2
	c.Transformer.DimFeedforward, c.Transformer.InputDimension = 20, 12
	c.Transformer.OutputDimensions = []int{12}
	c.Transformer.LayerScale, c.Transformer.Context = nil, nil
	c.Transformer.MaxPeriod = 100
	f := false
	c.UpsampleChannelWise = &f
	return c
}

func newTestDecoder(t testing.TB, c Config, seed uint64, o synthOpts) (*Decoder, *tensorSet) {
	t.Helper()
	dev := cpu.New(2)
	t.Cleanup(func() { dev.Close() })
	return newTestDecoderOn(t, dev, c, seed, o)
}

// newTestDecoderOn is newTestDecoder on dev.
func newTestDecoderOn(t testing.TB, dev gpu.Device, c Config, seed uint64, o synthOpts) (*Decoder, *tensorSet) {
	t.Helper()
	set := synthCheckpoint(c, seed, o)
	d, err := New(dev, set.file(t, "", nil), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, set
}

// randomCodes returns n frames of k random codes below bins.
func randomCodes(rng *rand.Rand, n, k, bins int) [][]int {
	codes := make([][]int, n)
	for f := range codes {
		codes[f] = make([]int, k)
		for i := range codes[f] {
			codes[f][i] = rng.IntN(bins)
		}
	}
	return codes
}
