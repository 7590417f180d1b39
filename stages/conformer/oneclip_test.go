package conformer

import (
	"math"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// This file keeps the encoder as the package computed it before
// EncodeBatch: one clip at a time, every op over that clip's rows alone
// (the formulation TestParity and TestFloat64Replay validated). The batch
// tests hold EncodeBatch to it bit for bit.

// oneClipEncode is Encode of one clip, mel [T_mel, feat_in].
func oneClipEncode(e *Encoder, c *nn.Ctx, mel gpu.Tensor) gpu.Tensor {
	T := e.OutLen(mel.Rows)
	out := c.Tmp(T, e.FeatOut)
	mark := c.A.Mark()
	defer c.A.Release(mark)
	in := c.Tmp(mel.Rows, mel.Cols)
	c.Q.Copy(in, mel)
	c.Round(in)
	x := out
	if !e.OutProj.W.IsNil() {
		x = c.Tmp(T, e.DModel)
	}
	oneClipSubsampling(&e.Sub, c, x, in)
	if e.Cfg.XScaling {
		c.Q.Scale(x, x, float32(math.Sqrt(float64(e.DModel))))
		c.Round(x)
	}
	pos := c.Tmp(2*T-1, e.DModel)
	c.Q.Write(pos, e.pe.rows(T))
	c.Round(pos)
	for i := range e.Layers {
		oneClipLayer(e, c, &e.Layers[i], x, pos)
	}
	if !e.OutProj.W.IsNil() {
		linear(c, out, x, e.OutProj)
	}
	return out
}

func oneClipSubsampling(s *Subsampling, c *nn.Ctx, dst, in gpu.Tensor) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	x := c.Tmp(halve(in.Rows), s.Channels*s.Widths[1])
	c.Q.Conv2D(x, in, s.Conv0, gpu.Tensor{}, strided(1, s.Widths[0], s.Widths[1], 1))
	c.Round(x)
	c.Q.AddRow(x, x, s.Conv0B)
	c.Round(x)
	c.Q.Act(x, x, gpu.ReLU)
	C := s.Channels
	for i := range s.Stages {
		st := &s.Stages[i]
		y := c.Tmp(halve(x.Rows), C*s.Widths[i+2])
		c.Q.Conv2D(y, x, st.DW, st.DWB, strided(C, s.Widths[i+1], s.Widths[i+2], C))
		c.Round(y)
		W := s.Widths[i+2]
		z := c.Tmp(y.Rows, C*W)
		c.Q.Conv2D(z, y, st.PW, gpu.Tensor{}, gpu.Conv2DParams{
			Cin: C, W: W, Wout: W, KH: 1, KW: 1, StrideH: 1, StrideW: 1, Groups: 1,
		})
		c.Round(z)
		c.Q.AddRow(z, z, st.PWB)
		c.Round(z)
		x = z
		c.Q.Act(x, x, gpu.ReLU)
	}
	linear(c, dst, x, s.Out)
}

func oneClipLayer(e *Encoder, c *nn.Ctx, l *Layer, x, pos gpu.Tensor) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	T, d := x.Rows, x.Cols
	xn := c.Tmp(T, d)
	y := c.Tmp(T, d)
	layerNorm(c, xn, x, l.NormFF1)
	oneClipFeedForward(c, y, xn, &l.FF1)
	halfResidual(c, x, y)
	layerNorm(c, xn, x, l.NormAtt)
	oneClipAttention(e, c, y, xn, pos, &l.Attn)
	residual(c, x, y)
	layerNorm(c, xn, x, l.NormConv)
	oneClipConv(&l.Conv, c, y, xn)
	residual(c, x, y)
	layerNorm(c, xn, x, l.NormFF2)
	oneClipFeedForward(c, y, xn, &l.FF2)
	halfResidual(c, x, y)
	layerNorm(c, x, x, l.NormOut)
}

func oneClipFeedForward(c *nn.Ctx, dst, x gpu.Tensor, f *FeedForward) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	h := c.Tmp(x.Rows, f.Linear1.W.Rows)
	linear(c, h, x, f.Linear1)
	act(c, h, gpu.SiLU)
	linear(c, dst, h, f.Linear2)
}

func oneClipAttention(e *Encoder, c *nn.Ctx, dst, x, pos gpu.Tensor, a *Attention) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	T, d, hd := x.Rows, x.Cols, e.HeadDim
	P := pos.Rows
	q, k, v := c.Tmp(T, d), c.Tmp(T, d), c.Tmp(T, d)
	linear(c, q, x, a.Q)
	linear(c, k, x, a.K)
	linear(c, v, x, a.V)
	p := c.Tmp(P, d)
	c.Q.MatMul(p, pos, a.Pos, gpu.Tensor{})
	c.Round(p)
	qu, qv := c.Tmp(T, d), c.Tmp(T, d)
	c.Q.AddRow(qu, q, a.BiasU)
	c.Round(qu)
	c.Q.AddRow(qv, q, a.BiasV)
	c.Round(qv)
	vt := c.Tmp(d, T)
	c.Q.Transpose(vt, v)
	scale := 1 / float32(math.Sqrt(float64(hd)))
	ac, bd := c.Tmp(T, T), c.Tmp(T, P)
	o := c.Tmp(T, d)
	for h := range e.Heads {
		lo, hi := h*hd, (h+1)*hd
		c.Q.MatMul(bd, qv.ColSlice(lo, hi), p.ColSlice(lo, hi), gpu.Tensor{})
		c.Round(bd)
		c.Q.MatMul(ac, qu.ColSlice(lo, hi), k.ColSlice(lo, hi), gpu.Tensor{})
		c.Round(ac)
		c.Q.Add(ac, ac, gpu.RelShift(bd))
		c.Round(ac)
		c.Q.Scale(ac, ac, scale)
		c.Round(ac)
		c.Q.Softmax(ac)
		c.Round(ac)
		c.Q.MatMul(o.ColSlice(lo, hi), ac, vt.Slice(lo, hi), gpu.Tensor{})
	}
	c.Round(o)
	linear(c, dst, o, a.Out)
}

func oneClipConv(m *ConvModule, c *nn.Ctx, dst, x gpu.Tensor) {
	mark := c.A.Mark()
	defer c.A.Release(mark)
	T, d := x.Rows, x.Cols
	a := c.Tmp(T, 2*d)
	cudnnConv1x1(c, a, x, m.PW1)
	g := c.Tmp(T, d)
	c.Q.GLU(g, a)
	c.Round(g)
	y := c.Tmp(T, d)
	c.Q.Conv1D(y, g, m.DW, m.DWB, gpu.ConvParams{K: m.Kernel, Stride: 1, Dilation: 1, Groups: g.Cols, PadLeft: m.PadLeft})
	c.Round(y)
	m.batchNorm(c, y)
	act(c, y, gpu.SiLU)
	cudnnConv1x1(c, dst, y, m.PW2)
}
