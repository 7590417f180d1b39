package mimi

import (
	"fmt"
	"math"
)

// A float64 replay of moshi's MimiModel.decode (non-streaming), written
// from the PyTorch module definitions with plain loops over [time][channel]
// slices: causal convolutions pad (K−1)·dilation rows on the left, the
// transposed convolutions compute their full output and trim K−stride rows
// on the right, attention masks 0 ≤ pos_q − pos_k < context. It shares no
// code with the package, so it checks the layout permutations, the
// streaming state and every option of the configuration.

type refModel struct {
	c   Config
	set *tensorSet
}

func (m refModel) w(name string) []float64 {
	v, ok := m.set.vals[name]
	if !ok {
		panic("replay: no tensor " + name)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func (m refModel) has(name string) bool { _, ok := m.set.vals[name]; return ok }

func mat(T, C int) [][]float64 {
	x := make([][]float64, T)
	for t := range x {
		x[t] = make([]float64, C)
	}
	return x
}

// linear: y[t][o] = Σ_c w[o][c] x[t][c] (+ b[o]).
func linear(x [][]float64, w []float64, out int, b []float64) [][]float64 {
	in := len(x[0])
	y := mat(len(x), out)
	for t := range x {
		for o := 0; o < out; o++ {
			var s float64
			for c := 0; c < in; c++ {
				s += w[o*in+c] * x[t][c]
			}
			if b != nil {
				s += b[o]
			}
			y[t][o] = s
		}
	}
	return y
}

// conv1dRef is StreamingConv1d (stride 1) over a whole input.
func conv1dRef(x [][]float64, w []float64, b []float64, cout, k, dil int, replicate bool) [][]float64 {
	T, cin := len(x), len(x[0])
	pad := (k - 1) * dil
	at := func(t, c int) float64 {
		if t < 0 {
			if replicate {
				return x[0][c]
			}
			return 0
		}
		return x[t][c]
	}
	y := mat(T, cout)
	for t := 0; t < T; t++ {
		for o := 0; o < cout; o++ {
			s := b[o]
			for c := 0; c < cin; c++ {
				for j := 0; j < k; j++ {
					s += w[(o*cin+c)*k+j] * at(t+j*dil-pad, c)
				}
			}
			y[t][o] = s
		}
	}
	return y
}

// convTrRef is StreamingConvTranspose1d over a whole input: the full
// output of (T−1)·stride+K rows, trimmed to T·stride. w is PyTorch's
// [cin, cout/groups, K].
func convTrRef(x [][]float64, w []float64, b []float64, cout, k, stride, groups int) [][]float64 {
	T, cin := len(x), len(x[0])
	cg, og := cin/groups, cout/groups
	full := mat((T-1)*stride+k, cout)
	for t := 0; t < T; t++ {
		for c := 0; c < cin; c++ {
			g := c / cg
			for oi := 0; oi < og; oi++ {
				for j := 0; j < k; j++ {
					full[t*stride+j][g*og+oi] += x[t][c] * w[(c*og+oi)*k+j]
				}
			}
		}
	}
	y := full[:T*stride]
	if b != nil {
		for t := range y {
			for o := range y[t] {
				y[t][o] += b[o]
			}
		}
	}
	return y
}

func eluRef(x [][]float64) [][]float64 {
	y := mat(len(x), len(x[0]))
	for t := range x {
		for c, v := range x[t] {
			if v > 0 {
				y[t][c] = v
			} else {
				y[t][c] = math.Expm1(v)
			}
		}
	}
	return y
}

func layerNormRef(x [][]float64, w, b []float64) [][]float64 {
	y := mat(len(x), len(x[0]))
	for t, row := range x {
		var mean, vr float64
		for _, v := range row {
			mean += v
		}
		mean /= float64(len(row))
		for _, v := range row {
			vr += (v - mean) * (v - mean)
		}
		vr /= float64(len(row))
		inv := 1 / math.Sqrt(vr+1e-5)
		for c, v := range row {
			y[t][c] = (v-mean)*inv*w[c] + b[c]
		}
	}
	return y
}

// decode replays MimiModel.decode(codes).
func (m refModel) decode(codes [][]int) []float64 {
	c := m.c
	s, qc, tc := c.SEANet, c.Quantizer, c.Transformer
	T := len(codes)

	// Quantizer: per part, Σ codebook vectors, then output_proj.
	part := func(name string, first, n int) [][]float64 {
		sum := mat(T, qc.Dimension)
		for i := 0; i < n; i++ {
			p := fmt.Sprintf("quantizer.%s.vq.layers.%d._codebook.", name, i)
			es, cu := m.w(p+"embedding_sum"), m.w(p+"cluster_usage")
			for t := range codes {
				code := codes[t][first+i]
				// The codebook is computed in float32 by the reference.
				u := max(float32(cu[code]), float32(1e-5))
				for d := 0; d < qc.Dimension; d++ {
					sum[t][d] += float64(float32(es[code*qc.Dimension+d]) / u)
				}
			}
		}
		return linear(sum, m.w("quantizer."+name+".output_proj.weight"), qc.OutputDimension, nil)
	}
	x := part("rvq_first", 0, qc.NQSemantic)
	rest := part("rvq_rest", qc.NQSemantic, len(codes[0])-qc.NQSemantic)
	for t := range x {
		for d := range x[t] {
			x[t][d] += rest[t][d]
		}
	}

	// Upsample.
	if u, _ := c.upsampleStride(); u > 1 {
		groups := 1
		if c.channelWise() {
			groups = s.Dimension
		}
		x = convTrRef(x, m.w("upsample.convtr.convtr.convtr.weight"), nil, s.Dimension, 2*u, u, groups)
	}

	// Transformer.
	d := tc.DModel
	if m.has("decoder_transformer.input_proj.weight") {
		x = linear(x, m.w("decoder_transformer.input_proj.weight"), d, nil)
	}
	hd := d / tc.NumHeads
	for i := 0; i < tc.NumLayers; i++ {
		p := fmt.Sprintf("decoder_transformer.transformer.layers.%d.", i)
		inName, outName := p+"self_attn.in_projs.0.weight", p+"self_attn.out_projs.0.weight"
		if m.has(p + "self_attn.in_proj_weight") {
			inName, outName = p+"self_attn.in_proj_weight", p+"self_attn.out_proj.weight"
		}
		h := layerNormRef(x, m.w(p+"norm1.weight"), m.w(p+"norm1.bias"))
		qkv := linear(h, m.w(inName), 3*d, nil)
		if tc.PositionalEmbedding == "rope" {
			for t := range qkv {
				for j := 0; j < hd/2; j++ {
					freq := math.Exp(float64(j) * (-math.Log(tc.MaxPeriod) * 2 / float64(hd)))
					cs, sn := math.Cos(float64(t)*freq), math.Sin(float64(t)*freq)
					for hh := 0; hh < 2*tc.NumHeads; hh++ { // q and k heads
						i0 := hh*hd + 2*j
						r, im := qkv[t][i0], qkv[t][i0+1]
						qkv[t][i0], qkv[t][i0+1] = r*cs-im*sn, r*sn+im*cs
					}
				}
			}
		}
		att := mat(len(x), d)
		for t := range x {
			for hh := 0; hh < tc.NumHeads; hh++ {
				var ws []float64
				var ks []int
				mx := math.Inf(-1)
				for k := 0; k <= t; k++ {
					if tc.Context != nil && t-k >= *tc.Context {
						continue
					}
					var dot float64
					for e := 0; e < hd; e++ {
						dot += qkv[t][hh*hd+e] * qkv[k][d+hh*hd+e]
					}
					dot /= math.Sqrt(float64(hd))
					ws, ks = append(ws, dot), append(ks, k)
					mx = max(mx, dot)
				}
				var z float64
				for j := range ws {
					ws[j] = math.Exp(ws[j] - mx)
					z += ws[j]
				}
				for j, k := range ks {
					for e := 0; e < hd; e++ {
						att[t][hh*hd+e] += ws[j] / z * qkv[k][2*d+hh*hd+e]
					}
				}
			}
		}
		upd := linear(att, m.w(outName), d, nil)
		scale := func(name string, v [][]float64) {
			if tc.LayerScale == nil {
				return
			}
			sc := m.w(name)
			for t := range v {
				for e := range v[t] {
					v[t][e] *= sc[e]
				}
			}
		}
		add := func(v [][]float64) {
			for t := range x {
				for e := range x[t] {
					x[t][e] += v[t][e]
				}
			}
		}
		scale(p+"layer_scale_1.scale", upd)
		add(upd)
		h = layerNormRef(x, m.w(p+"norm2.weight"), m.w(p+"norm2.bias"))
		f := linear(h, m.w(p+"linear1.weight"), tc.DimFeedforward, nil)
		for t := range f {
			for e, v := range f[t] {
				f[t][e] = 0.5 * v * (1 + math.Erf(v/math.Sqrt2))
			}
		}
		upd = linear(f, m.w(p+"linear2.weight"), d, nil)
		scale(p+"layer_scale_2.scale", upd)
		add(upd)
	}
	if m.has("decoder_transformer.output_projs.0.weight") {
		x = linear(x, m.w("decoder_transformer.output_projs.0.weight"), tc.OutputDimensions[0], nil)
	}

	// SEANet decoder.
	rep := s.PadMode == "replicate"
	conv := func(p string, x [][]float64, cout, k, dil int) [][]float64 {
		return conv1dRef(x, m.w(p+".weight"), m.w(p+".bias"), cout, k, dil, rep)
	}
	mult := 1 << len(s.Ratios)
	x = conv("decoder.model.0.conv.conv", x, mult*s.NFilters, s.KernelSize, 1)
	idx := 1
	for _, r := range s.Ratios {
		ch := mult * s.NFilters / 2
		p := fmt.Sprintf("decoder.model.%d.convtr.convtr", idx+1)
		x = convTrRef(eluRef(x), m.w(p+".weight"), m.w(p+".bias"), ch, 2*r, r, 1)
		idx += 2
		dil := 1
		for j := 0; j < s.NResidualLayers; j++ {
			p := fmt.Sprintf("decoder.model.%d.", idx)
			v := conv(p+"block.1.conv.conv", eluRef(x), ch/s.Compress, s.ResidualKernelSize, dil)
			v = conv(p+"block.3.conv.conv", eluRef(v), ch, 1, 1)
			u := x
			if !s.TrueSkip {
				u = conv(p+"shortcut.conv.conv", x, ch, 1, 1)
			}
			for t := range v {
				for e := range v[t] {
					v[t][e] += u[t][e]
				}
			}
			x = v
			idx++
			dil *= s.DilationBase
		}
		mult /= 2
	}
	x = conv(fmt.Sprintf("decoder.model.%d.conv.conv", idx+1), eluRef(x), s.Channels, s.LastKernelSize, 1)
	out := make([]float64, 0, len(x))
	for _, row := range x {
		out = append(out, row[0])
	}
	return out
}
