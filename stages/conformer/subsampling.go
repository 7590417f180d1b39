package conformer

import (
	"fmt"
	"math/bits"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// Subsampling is ConvSubsampling with dw_striding: conv.0 (3×3, stride 2,
// padding 1, 1 → C channels) and ReLU, then for each further factor of two
// a depthwise 3×3 stride-2 convolution, a pointwise 1×1 convolution and
// ReLU; the channels and the remaining frequency bins are flattened
// (index c·F′ + f) and projected by the `out` Linear to d_model.
//
// Activations are laid out [time, channel·freq] (gpu.Conv2D's layout: H is
// time, W the mel bins), which is also the flatten order `out` expects.
type Subsampling struct {
	Channels int
	// Widths holds the frequency width before each stage and after the
	// last: Widths[0] = feat_in, Widths[i+1] = ⌈Widths[i]/2⌉.
	Widths []int
	Conv0  gpu.Tensor // [C, 1·3·3]
	// Conv0B is conv.0's bias broadcast over its output width, [1, C·W₁]
	// (cuDNN path: added after the rounded convolution).
	Conv0B gpu.Tensor
	Stages []SubStage
	Out    Linear // [d_model, C·W_last]
}

// SubStage is one depthwise-separable stride-2 stage.
type SubStage struct {
	DW, DWB gpu.Tensor // conv.{3i+2}: depthwise [C, 3·3], bias [1, C]
	PW      gpu.Tensor // conv.{3i+3}: pointwise [C, C]
	PWB     gpu.Tensor // its bias broadcast over the width, [1, C·W]
}

// Kernel size, stride and padding of dw_striding's strided convolutions.
const (
	subKernel = 3
	subStride = 2
	subPad    = 1
)

// halve is one strided convolution's length rule, floor((n + 2·pad −
// kernel)/stride) + 1, which is ⌈n/2⌉.
func halve(n int) int { return (n+2*subPad-subKernel)/subStride + 1 }

func loadSubsampling(b *weights.Binder, cfg config.Encoder) (Subsampling, error) {
	C := cfg.SubsamplingConvChannels
	if C == -1 {
		C = cfg.DModel
	}
	n := bits.TrailingZeros(uint(cfg.SubsamplingFactor)) // number of stride-2 stages
	s := Subsampling{Channels: C, Widths: []int{cfg.FeatIn}}
	for i := range n {
		s.Widths = append(s.Widths, halve(s.Widths[i]))
	}
	dev := b.Device()
	var err error
	s.Conv0 = b.Tensor("conv.0.weight", C, 1, subKernel, subKernel)
	if s.Conv0B, err = loadF32(dev, broadcast(b.Values("conv.0.bias", C), s.Widths[1])); err != nil {
		return s, err
	}
	for i := range n - 1 {
		dw, pw := fmt.Sprintf("conv.%d", 3*i+2), fmt.Sprintf("conv.%d", 3*i+3)
		st := SubStage{
			DW:  b.Tensor(dw+".weight", C, 1, subKernel, subKernel),
			DWB: b.Tensor(dw+".bias", C),
			PW:  b.Tensor(pw+".weight", C, C, 1, 1),
		}
		if st.PWB, err = loadF32(dev, broadcast(b.Values(pw+".bias", C), s.Widths[i+2])); err != nil {
			return s, err
		}
		s.Stages = append(s.Stages, st)
	}
	s.Out = loadLinear(b, "out", cfg.DModel, C*s.Widths[n])
	return s, nil
}

// broadcast repeats each per-channel value w times: [C] -> [C·w] in the
// [channel·width] layout.
func broadcast(v []float32, w int) []float32 {
	out := make([]float32, 0, len(v)*w)
	for _, x := range v {
		for range w {
			out = append(out, x)
		}
	}
	return out
}

// OutLen returns the number of frames after subsampling tMel frames: the
// strided length rule applied once per stage, which equals ⌈tMel/2ⁿ⌉.
func (s *Subsampling) OutLen(tMel int) int {
	for range len(s.Widths) - 1 {
		tMel = halve(tMel)
	}
	return tMel
}

// forward runs the subsampling on in [Σ T_mel, feat_in], the mel rows of
// the clips l, into dst [Σ OutLen(T_mel), d_model]. MaskedConvSequential's
// masks are all ones for unpadded clips. The 3×3 convolutions run on each
// clip's rows (their zero padding is the clip's edge); the pointwise
// convolutions, bias adds, ReLUs and roundings are row-wise and run once.
func (s *Subsampling) forward(c *nn.Ctx, dst, in gpu.Tensor, l clips) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	x, l := s.conv0(c, in, l)
	c.Q.Act(x, x, gpu.ReLU) // exact on bf16 values: no rounding
	for i := range s.Stages {
		var y gpu.Tensor
		y, l = s.depthwise(c, i, x, l)
		x = s.pointwise(c, i, y)
		c.Q.Act(x, x, gpu.ReLU)
	}
	// x.transpose(1, 2).reshape(b, t, c·f) is x's row layout already.
	linear(c, dst, x, s.Out)
}

// conv0 is conv.0 before its ReLU over the clips l of in: [T, feat_in] ->
// [⌈T/2⌉, C·W₁] per clip; it returns the output and its layout. It runs
// on cuDNN: the convolution is rounded, then ConvNd's bias add.
func (s *Subsampling) conv0(c *nn.Ctx, in gpu.Tensor, l clips) (gpu.Tensor, clips) {
	lo := l.halved()
	x := c.Tmp(lo.rows, s.Channels*s.Widths[1])
	p := strided(1, s.Widths[0], s.Widths[1], 1)
	for i := range l.n {
		c.Q.Conv2D(lo.view(x, i), l.view(in, i), s.Conv0, gpu.Tensor{}, p)
	}
	c.Round(x)
	c.Q.AddRow(x, x, s.Conv0B)
	c.Round(x)
	return x, lo
}

// depthwise is stage i's depthwise stride-2 convolution over the clips l
// of x: [T, C·W] -> [⌈T/2⌉, C·⌈W/2⌉] per clip; it returns the output and
// its layout. PyTorch's own depthwise kernel adds the bias inside its fp32
// sum: one rounding.
func (s *Subsampling) depthwise(c *nn.Ctx, i int, x gpu.Tensor, l clips) (gpu.Tensor, clips) {
	C, st := s.Channels, &s.Stages[i]
	lo := l.halved()
	y := c.Tmp(lo.rows, C*s.Widths[i+2])
	p := strided(C, s.Widths[i+1], s.Widths[i+2], C)
	for j := range l.n {
		c.Q.Conv2D(lo.view(y, j), l.view(x, j), st.DW, st.DWB, p)
	}
	c.Round(y)
	return y, lo
}

// pointwise is stage i's 1×1 convolution before its ReLU, on cuDNN like
// conv.0. Each output row reads only its own input row (kernel height 1,
// no padding along time), so it runs over all clips' rows at once.
func (s *Subsampling) pointwise(c *nn.Ctx, i int, y gpu.Tensor) gpu.Tensor {
	C, W, st := s.Channels, s.Widths[i+2], &s.Stages[i]
	z := c.Tmp(y.Rows, C*W)
	c.Q.Conv2D(z, y, st.PW, gpu.Tensor{}, gpu.Conv2DParams{
		Cin: C, W: W, Wout: W, KH: 1, KW: 1, StrideH: 1, StrideW: 1, Groups: 1,
	})
	c.Round(z)
	c.Q.AddRow(z, z, st.PWB)
	c.Round(z)
	return z
}

// strided returns the parameters of a 3×3 stride-2 padding-1 convolution
// from cin channels of width w to width wout.
func strided(cin, w, wout, groups int) gpu.Conv2DParams {
	return gpu.Conv2DParams{
		Cin: cin, W: w, Wout: wout,
		KH: subKernel, KW: subKernel, StrideH: subStride, StrideW: subStride,
		PadH: subPad, PadW: subPad, Groups: groups,
	}
}
