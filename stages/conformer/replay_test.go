package conformer

import (
	"bytes"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// replay evaluates the reference ConformerEncoder and audio adapter in
// float64, written from liquid-audio's module code in its own layouts
// (NCHW convolutions, [C, T] Conv1d, rel_shift by padding and reshaping),
// independently of the package's time-major formulation.
type replay struct {
	cfg    config.Encoder
	hidden int
	f      *safetensors.File
	t      testing.TB
}

func (r *replay) w(name string) []float64 {
	ts, err := r.f.Lookup(name)
	if err != nil {
		r.t.Fatal(err)
	}
	v, err := ts.Float32s()
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// conv2d is F.conv2d on one image x [cin, h, w] with weight
// [cout, cin/groups, k, k]; it returns [cout, ho, wo].
func conv2d(x []float64, cin, h, w int, wt, b []float64, cout, k, stride, pad, groups int) ([]float64, int, int) {
	ho, wo := (h+2*pad-k)/stride+1, (w+2*pad-k)/stride+1
	cg, og := cin/groups, cout/groups
	out := make([]float64, cout*ho*wo)
	for o := range cout {
		g := o / og
		for i := range ho {
			for j := range wo {
				s := b[o]
				for c := range cg {
					for u := range k {
						for v := range k {
							y, z := i*stride+u-pad, j*stride+v-pad
							if y >= 0 && y < h && z >= 0 && z < w {
								s += wt[((o*cg+c)*k+u)*k+v] * x[((g*cg+c)*h+y)*w+z]
							}
						}
					}
				}
				out[(o*ho+i)*wo+j] = s
			}
		}
	}
	return out, ho, wo
}

// linear64 is F.linear on rows x [n, in].
func linear64(x []float64, in int, wt, b []float64) []float64 {
	n, out := len(x)/in, len(wt)/in
	y := make([]float64, n*out)
	for i := range n {
		for o := range out {
			var s float64
			if b != nil {
				s = b[o]
			}
			for k := range in {
				s += x[i*in+k] * wt[o*in+k]
			}
			y[i*out+o] = s
		}
	}
	return y
}

func layerNorm64(x []float64, n int, g, b []float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x); r += n {
		row := x[r : r+n]
		var mean, v float64
		for _, a := range row {
			mean += a
		}
		mean /= float64(n)
		for _, a := range row {
			v += (a - mean) * (a - mean)
		}
		inv := 1 / math.Sqrt(v/float64(n)+normEps)
		for i, a := range row {
			y[r+i] = (a-mean)*inv*g[i] + b[i]
		}
	}
	return y
}

func silu64(x float64) float64 { return x / (1 + math.Exp(-x)) }

func (r *replay) run(mel []float64, frames int) (enc, out []float64) {
	cfg := r.cfg
	F, d, H := cfg.FeatIn, cfg.DModel, cfg.NHeads
	dk := d / H
	C := cfg.SubsamplingConvChannels
	if C == -1 {
		C = d
	}
	// pre_encode: x [1, T, F] -> [1, 1, T, F]
	p := "conformer.pre_encode."
	x, h, w := conv2d(mel, 1, frames, F, r.w(p+"conv.0.weight"), r.w(p+"conv.0.bias"), C, 3, 2, 1, 1)
	for i := range x {
		x[i] = max(x[i], 0)
	}
	for i := 2; r.f.Tensor(fmt.Sprintf("%sconv.%d.weight", p, i)) != nil; i += 3 {
		x, h, w = conv2d(x, C, h, w, r.w(fmt.Sprintf("%sconv.%d.weight", p, i)), r.w(fmt.Sprintf("%sconv.%d.bias", p, i)), C, 3, 2, 1, C)
		x, h, w = conv2d(x, C, h, w, r.w(fmt.Sprintf("%sconv.%d.weight", p, i+1)), r.w(fmt.Sprintf("%sconv.%d.bias", p, i+1)), C, 1, 1, 0, 1)
		for i := range x {
			x[i] = max(x[i], 0)
		}
	}
	T := h
	flat := make([]float64, T*C*w) // transpose(1, 2).reshape(b, t, c·f)
	for c := range C {
		for t := range T {
			copy(flat[t*C*w+c*w:], x[(c*T+t)*w:(c*T+t+1)*w])
		}
	}
	x = linear64(flat, C*w, r.w(p+"out.weight"), r.w(p+"out.bias"))
	if cfg.XScaling {
		for i := range x {
			x[i] *= math.Sqrt(float64(d))
		}
	}
	// RelPositionalEncoding: positions T−1 … −(T−1).
	P := 2*T - 1
	pos := make([]float64, P*d)
	for i := range P {
		for j := 0; j < d; j += 2 {
			a := float64(T-1-i) * math.Exp(float64(j)*-(math.Log(10000)/float64(d)))
			pos[i*d+j], pos[i*d+j+1] = math.Sin(a), math.Cos(a)
		}
	}
	ln := func(pre, name string, v []float64) []float64 {
		return layerNorm64(v, d, r.w(pre+name+".weight"), r.w(pre+name+".bias"))
	}
	ff := func(pre string, v []float64) []float64 {
		h := linear64(v, d, r.w(pre+".linear1.weight"), r.w(pre+".linear1.bias"))
		for i := range h {
			h[i] = silu64(h[i])
		}
		return linear64(h, len(h)/T, r.w(pre+".linear2.weight"), r.w(pre+".linear2.bias"))
	}
	addScaled := func(x, y []float64, s float64) {
		for i := range x {
			x[i] += s * y[i]
		}
	}
	for li := range cfg.NLayers {
		pre := fmt.Sprintf("conformer.layers.%d.", li)
		addScaled(x, ff(pre+"feed_forward1", ln(pre, "norm_feed_forward1", x)), 0.5)
		// RelPositionMultiHeadAttention
		hN := ln(pre, "norm_self_att", x)
		a := pre + "self_attn."
		q := linear64(hN, d, r.w(a+"linear_q.weight"), r.w(a+"linear_q.bias"))
		k := linear64(hN, d, r.w(a+"linear_k.weight"), r.w(a+"linear_k.bias"))
		v := linear64(hN, d, r.w(a+"linear_v.weight"), r.w(a+"linear_v.bias"))
		pp := linear64(pos, d, r.w(a+"linear_pos.weight"), nil)
		u, vb := r.w(a+"pos_bias_u"), r.w(a+"pos_bias_v")
		att := make([]float64, T*d)
		for hh := range H {
			bd := make([]float64, T*P) // (q + v)·pᵀ, [T, 2T−1]
			ac := make([]float64, T*T) // (q + u)·kᵀ
			for i := range T {
				for j := range P {
					for c := range dk {
						bd[i*P+j] += (q[i*d+hh*dk+c] + vb[hh*dk+c]) * pp[j*d+hh*dk+c]
					}
				}
				for j := range T {
					for c := range dk {
						ac[i*T+j] += (q[i*d+hh*dk+c] + u[hh*dk+c]) * k[j*d+hh*dk+c]
					}
				}
			}
			// rel_shift: pad a zero column on the left, view as [P+1, T],
			// drop the first row, view as [T, P]; then keep [:, :T].
			padded := make([]float64, T*(P+1))
			for i := range T {
				copy(padded[i*(P+1)+1:], bd[i*P:(i+1)*P])
			}
			shifted := padded[T:]
			for i := range T {
				row := make([]float64, T)
				m := math.Inf(-1)
				for j := range T {
					row[j] = (ac[i*T+j] + shifted[i*P+j]) / math.Sqrt(float64(dk))
					m = max(m, row[j])
				}
				var sum float64
				for j := range row {
					row[j] = math.Exp(row[j] - m)
					sum += row[j]
				}
				for j := range T {
					for c := range dk {
						att[i*d+hh*dk+c] += row[j] / sum * v[j*d+hh*dk+c]
					}
				}
			}
		}
		addScaled(x, linear64(att, d, r.w(a+"linear_out.weight"), r.w(a+"linear_out.bias")), 1)
		// ConformerConvolution on [C, T]
		cv := pre + "conv."
		hc := linear64(ln(pre, "norm_conv", x), d, r.w(cv+"pointwise_conv1.weight"), r.w(cv+"pointwise_conv1.bias"))
		g := make([]float64, d*T) // glu, [d, T]
		for t := range T {
			for c := range d {
				g[c*T+t] = hc[t*2*d+c] / (1 + math.Exp(-hc[t*2*d+d+c]))
			}
		}
		K := cfg.ConvKernelSize
		left := (K - 1) / 2
		if len(cfg.ConvContextSize) == 2 {
			left = cfg.ConvContextSize[0]
		}
		dw, dwb := r.w(cv+"depthwise_conv.weight"), r.w(cv+"depthwise_conv.bias")
		mean, variance := r.w(cv+"batch_norm.running_mean"), r.w(cv+"batch_norm.running_var")
		gamma, beta := r.w(cv+"batch_norm.weight"), r.w(cv+"batch_norm.bias")
		y := make([]float64, T*d) // back to [T, d] for pointwise_conv2
		for c := range d {
			for t := range T {
				s := dwb[c]
				for j := range K {
					if tt := t + j - left; tt >= 0 && tt < T {
						s += dw[c*K+j] * g[c*T+tt]
					}
				}
				s = (s-mean[c])/math.Sqrt(variance[c]+normEps)*gamma[c] + beta[c]
				y[t*d+c] = silu64(s)
			}
		}
		addScaled(x, linear64(y, d, r.w(cv+"pointwise_conv2.weight"), r.w(cv+"pointwise_conv2.bias")), 1)
		addScaled(x, ff(pre+"feed_forward2", ln(pre, "norm_feed_forward2", x)), 0.5)
		x = ln(pre, "norm_out", x)
	}
	if cfg.FeatOut > 0 && cfg.FeatOut != d {
		x = linear64(x, d, r.w("conformer.out_proj.weight"), r.w("conformer.out_proj.bias"))
	}
	fo := len(x) / T
	a := "audio_adapter.model."
	y := linear64(layerNorm64(x, fo, r.w(a+"0.weight"), r.w(a+"0.bias")), fo, r.w(a+"1.weight"), r.w(a+"1.bias"))
	for i, v := range y {
		y[i] = 0.5 * v * (1 + math.Erf(v/math.Sqrt2))
	}
	return x, linear64(y, r.hidden, r.w(a+"3.weight"), r.w(a+"3.bias"))
}

// randomCheckpoint builds a checkpoint for cfg with bf16 weights drawn like
// the tiny fixture's: matrices N(0, 1/fan_in), biases N(0, 0.05), norm
// weights 1 + N(0, 0.1), pos_bias N(0, 0.1), BatchNorm running_mean
// N(0, 0.1) and running_var exp(N(0, 0.2)).
func randomCheckpoint(t testing.TB, cfg config.Encoder, hidden int, seed uint64) *safetensors.File {
	t.Helper()
	return checkpoint(t, randomTensors(cfg, hidden, seed))
}

// checkpoint serialises tensors and parses them back as a File.
func checkpoint(t testing.TB, ts []*safetensors.Tensor) *safetensors.File {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Parse(buf.Bytes(), "random")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// randomTensors returns randomCheckpoint's tensors.
func randomTensors(cfg config.Encoder, hidden int, seed uint64) []*safetensors.Tensor {
	rng := rand.New(rand.NewPCG(seed, 7))
	var ts []*safetensors.Tensor
	add := func(name string, f func() float64, shape ...int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		data := make([]byte, 2*n)
		for i := range n {
			h := gpu.F32ToBF16(float32(f()))
			data[2*i], data[2*i+1] = byte(h), byte(h>>8)
		}
		ts = append(ts, &safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Data: data})
	}
	normal := func(mean, std float64) func() float64 {
		return func() float64 { return mean + std*rng.NormFloat64() }
	}
	mat := func(name string, shape ...int) {
		fan := 1
		for _, s := range shape[1:] {
			fan *= s
		}
		add(name, normal(0, 1/math.Sqrt(float64(fan))), shape...)
	}
	lin := func(name string, out, in int) {
		mat(name+".weight", out, in)
		add(name+".bias", normal(0, 0.05), out)
	}
	norm := func(name string, n int) {
		add(name+".weight", normal(1, 0.1), n)
		add(name+".bias", normal(0, 0.05), n)
	}
	d, C := cfg.DModel, cfg.SubsamplingConvChannels
	if C == -1 {
		C = d
	}
	p := "conformer.pre_encode."
	mat(p+"conv.0.weight", C, 1, 3, 3)
	add(p+"conv.0.bias", normal(0, 0.05), C)
	w := halve(cfg.FeatIn)
	for s := range bits.TrailingZeros(uint(cfg.SubsamplingFactor)) - 1 {
		i := 3*s + 2 // conv.2/3, conv.5/6, …
		mat(fmt.Sprintf("%sconv.%d.weight", p, i), C, 1, 3, 3)
		add(fmt.Sprintf("%sconv.%d.bias", p, i), normal(0, 0.05), C)
		mat(fmt.Sprintf("%sconv.%d.weight", p, i+1), C, C, 1, 1)
		add(fmt.Sprintf("%sconv.%d.bias", p, i+1), normal(0, 0.05), C)
		w = halve(w)
	}
	lin(p+"out", d, C*w)
	ff, H := d*cfg.FFExpansionFactor, cfg.NHeads
	for l := range cfg.NLayers {
		pre := fmt.Sprintf("conformer.layers.%d.", l)
		for _, n := range []string{"norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"} {
			norm(pre+n, d)
		}
		for _, n := range []string{"feed_forward1", "feed_forward2"} {
			lin(pre+n+".linear1", ff, d)
			lin(pre+n+".linear2", d, ff)
		}
		for _, n := range []string{"linear_q", "linear_k", "linear_v", "linear_out"} {
			lin(pre+"self_attn."+n, d, d)
		}
		mat(pre+"self_attn.linear_pos.weight", d, d)
		add(pre+"self_attn.pos_bias_u", normal(0, 0.1), H, d/H)
		add(pre+"self_attn.pos_bias_v", normal(0, 0.1), H, d/H)
		cv := pre + "conv."
		mat(cv+"pointwise_conv1.weight", 2*d, d, 1)
		add(cv+"pointwise_conv1.bias", normal(0, 0.05), 2*d)
		mat(cv+"depthwise_conv.weight", d, 1, cfg.ConvKernelSize)
		add(cv+"depthwise_conv.bias", normal(0, 0.05), d)
		norm(cv+"batch_norm", d)
		add(cv+"batch_norm.running_mean", normal(0, 0.1), d)
		add(cv+"batch_norm.running_var", func() float64 { return math.Exp(0.2 * rng.NormFloat64()) }, d)
		ts = append(ts, safetensors.NewI64(cv+"batch_norm.num_batches_tracked", []int64{0}))
		mat(cv+"pointwise_conv2.weight", d, d, 1)
		add(cv+"pointwise_conv2.bias", normal(0, 0.05), d)
	}
	fo := d
	if cfg.FeatOut > 0 && cfg.FeatOut != d {
		lin("conformer.out_proj", cfg.FeatOut, d)
		fo = cfg.FeatOut
	}
	norm("audio_adapter.model.0", fo)
	lin("audio_adapter.model.1", hidden, fo)
	lin("audio_adapter.model.3", hidden, hidden)
	return ts
}

// tinyConfig is the encoder section of the tiny fixture's shape with
// everything this package varies changed: an odd mel width (20 → 10 → 5),
// subsampling ×4, an asymmetric depthwise kernel, xscaling, an out_proj.
func tinyConfig() config.Encoder {
	return config.Encoder{
		FeatIn: 20, FeatOut: 40, NLayers: 2, DModel: 48, NHeads: 3,
		Subsampling: "dw_striding", SubsamplingFactor: 4, SubsamplingConvChannels: 8,
		FFExpansionFactor: 2, SelfAttentionModel: "rel_pos", AttContextSize: []int{-1, -1},
		XScaling: true, UntieBiases: true, PosEmbMaxLen: 5000,
		ConvKernelSize: 5, ConvNormType: "batch_norm", ConvContextSize: []int{3, 1},
	}
}

// TestFloat64Replay compares nn.F32 mode with the float64 replay for the
// fixture model and for other shapes, at clip lengths from 1 frame up.
func TestFloat64Replay(t *testing.T) {
	dev := newDevice(t)
	wide := tinyConfig()
	wide.FeatIn, wide.FeatOut, wide.DModel, wide.NHeads = 33, -1, 32, 2
	wide.SubsamplingFactor, wide.SubsamplingConvChannels, wide.NLayers = 16, -1, 1
	wide.XScaling, wide.ConvKernelSize, wide.ConvContextSize = false, 3, nil
	fixture, err := config.ReadAudio(fixtureDir + "config.json")
	if err != nil {
		t.Fatal(err)
	}
	models := []struct {
		name   string
		cfg    config.Encoder
		hidden int
		file   *safetensors.File
		frames []int
	}{
		{"fixture", fixture.Encoder, fixture.LFM.HiddenSize, openFile(t, fixtureDir+"model.safetensors"),
			[]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 50}},
		{"x4_asymmetric_kernel_out_proj", tinyConfig(), 28, randomCheckpoint(t, tinyConfig(), 28, 1), []int{1, 3, 4, 5, 30}},
		{"x16_odd_width", wide, 20, randomCheckpoint(t, wide, 20, 2), []int{1, 16, 17, 70}},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, m := range models {
		e, err := Load(weights.New(dev, m.file), m.cfg, m.hidden)
		if err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		r := &replay{cfg: m.cfg, hidden: m.hidden, f: m.file, t: t}
		for _, frames := range m.frames {
			t.Run(fmt.Sprintf("%s/%d_frames", m.name, frames), func(t *testing.T) {
				mel := make([]float32, frames*m.cfg.FeatIn)
				mel64 := make([]float64, len(mel))
				for i := range mel {
					mel[i] = gpu.RoundBF16(float32(rng.NormFloat64()))
					mel64[i] = float64(mel[i])
				}
				enc, out := run(t, e, dev, nn.F32, mel, frames)
				wantEnc, wantOut := r.run(mel64, frames)
				if len(wantEnc) != len(enc) || len(wantOut) != len(out) {
					t.Fatalf("replay gives %d and %d values, the encoder %d and %d", len(wantEnc), len(wantOut), len(enc), len(out))
				}
				de, do := numcmp.Compare(enc, wantEnc), numcmp.Compare(out, wantOut)
				t.Logf("encoder: %v; adapter: %v", de, do)
				if de.RelL2 > f32Tolerance || do.RelL2 > f32Tolerance || de.NaNs+do.NaNs > 0 {
					t.Errorf("relative L2 to the float64 replay: encoder %.3g, adapter %.3g (bound %.3g)", de.RelL2, do.RelL2, f32Tolerance)
				}
			})
		}
	}
}
