package mimi

import (
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// Streaming layers. Every layer keeps what it needs from earlier calls in
// the Stream (inputs for a convolution, partial sums' inputs for a
// transposed convolution) and computes each output row with the same float
// operations in the same order whatever the number of rows per call: a
// convolution's window is gathered into one row of an im2col matrix and
// reduced by MatMul (whose rows are batch-independent), a transposed
// convolution's contributions are per-input-row MatMul rows summed in a
// fixed order. So streamed decoding equals whole decoding bit for bit.

// builder collects what the layers of a Decoder need while binding: the
// device tensors it allocated (freed by Close) and the shapes of the
// per-stream states.
type builder struct {
	dev    gpu.Device
	q      gpu.Queue
	owned  []gpu.Tensor
	states []stateShape
}

type stateShape struct{ rows, cols int }

// upload copies host values into a new device tensor [rows, cols].
func (b *builder) upload(rows, cols int, v []float32) gpu.Tensor {
	t := b.dev.Alloc(gpu.F32, rows, cols)
	b.owned = append(b.owned, t)
	b.q.Write(t, v)
	return t
}

// state registers a per-stream state tensor and returns its index.
func (b *builder) state(rows, cols int) int {
	b.states = append(b.states, stateShape{rows, cols})
	return len(b.states) - 1
}

// conv1d is moshi's StreamingConv1d with stride 1 (every convolution of the
// SEANet decoder): causal, left-padded with (K−1)·dilation rows that are
// zeros ("constant") or copies of the first input row ("replicate").
type conv1d struct {
	cin, cout, k, dil int
	replicate         bool
	// w is [cout, k·cin]: column k·cin+c holds PyTorch's weight[o, c, k],
	// so that one im2col row (the k input rows side by side) meets it in a
	// single dot product.
	w gpu.Tensor
	b gpu.Tensor // [1, cout], or nil
	// hist indexes the stream's last (k−1)·dil input rows.
	hist int
}

func newConv1d(bl *builder, wb *weights.Binder, cin, cout, k, dil int, replicate bool) *conv1d {
	c := &conv1d{cin: cin, cout: cout, k: k, dil: dil, replicate: replicate, hist: -1}
	pt := wb.Values("weight", cout, cin, k) // [o][c][k]
	w := make([]float32, len(pt))
	for o := 0; o < cout; o++ {
		for ci := 0; ci < cin; ci++ {
			for j := 0; j < k; j++ {
				w[o*k*cin+j*cin+ci] = pt[(o*cin+ci)*k+j]
			}
		}
	}
	c.w = bl.upload(cout, k*cin, w)
	c.b = wb.Tensor("bias", cout)
	if h := (k - 1) * dil; h > 0 {
		c.hist = bl.state(h, cin)
	}
	return c
}

// forward sets dst [T, cout] to the convolution of x [T, cin], each
// stream's rows continued from its own history: the windows are gathered
// per stream, the product runs once over every stream's rows.
func (c *conv1d) forward(d *Decoder, b *batch, dst, x gpu.Tensor) {
	q := d.q
	if c.hist < 0 { // kernel 1: no history
		q.MatMul(dst, x, c.w, c.b)
		return
	}
	h := (c.k - 1) * c.dil
	col := d.arena.Get(x.Rows, c.k*c.cin)
	for k, s := range b.streams {
		// The stream's scratch is the next stream's (the queue runs in
		// order), so that the arena does not grow with the batch.
		mark := d.arena.Mark()
		lo, hi := b.rows(k, x.Rows)
		T, xs := hi-lo, x.Slice(lo, hi)
		hist := s.state[c.hist]
		if c.replicate && s.frames == 0 {
			for r := 0; r < h; r++ {
				q.Copy(hist.Row(r), xs.Row(0))
			}
		}
		// cat = [history; x], then im2col: row t holds cat rows t, t+dil, …
		cat := d.arena.Get(h+T, c.cin)
		q.Copy(cat.Slice(0, h), hist)
		q.Copy(cat.Slice(h, h+T), xs)
		cs := col.Slice(lo, hi)
		for j := 0; j < c.k; j++ {
			q.Copy(cs.ColSlice(j*c.cin, (j+1)*c.cin), cat.Slice(j*c.dil, j*c.dil+T))
		}
		q.Copy(hist, cat.Slice(T, T+h))
		d.arena.Release(mark)
	}
	q.MatMul(dst, col, c.w, c.b)
}

// convTr is moshi's StreamingConvTranspose1d with all the trimming on the
// right (trim_right_ratio 1): T input rows give T·stride output rows, and
// the K−stride rows that later inputs still add to are completed by the
// next call. groups is 1 or the channel count (depthwise).
type convTr struct {
	cin, cout, k, stride int
	// m = ceil(k/stride): an output row sums the contributions of m
	// consecutive input rows.
	m         int
	depthwise bool
	// w is [m·stride·cout, cin] (groups 1): row j·cout+o holds PyTorch's
	// weight[:, o, j] (zero for j ≥ k), so that x·wᵀ gives every input row's
	// contribution to its m·stride output rows side by side.
	w gpu.Tensor
	// dw holds the depthwise taps: dw[j] is [1, cout] = weight[:, 0, j].
	dw []gpu.Tensor
	b  gpu.Tensor // [1, cout], or nil
	// tail indexes the stream's contributions of its last m−1 input rows.
	tail int
}

func newConvTr(bl *builder, wb *weights.Binder, cin, cout, k, stride int, depthwise, bias bool) *convTr {
	c := &convTr{cin: cin, cout: cout, k: k, stride: stride, m: (k + stride - 1) / stride, depthwise: depthwise, tail: -1}
	width := c.m * stride // padded kernel
	if depthwise {
		pt := wb.Values("weight", cin, 1, k) // [c][0][k]
		c.dw = make([]gpu.Tensor, width)
		for j := range c.dw {
			v := make([]float32, cout)
			if j < k {
				for ch := range v {
					v[ch] = pt[ch*k+j]
				}
			}
			c.dw[j] = bl.upload(1, cout, v)
		}
	} else {
		pt := wb.Values("weight", cin, cout, k) // [c][o][k]
		w := make([]float32, width*cout*cin)
		for ci := 0; ci < cin; ci++ {
			for o := 0; o < cout; o++ {
				for j := 0; j < k; j++ {
					w[(j*cout+o)*cin+ci] = pt[(ci*cout+o)*k+j]
				}
			}
		}
		c.w = bl.upload(width*cout, cin, w)
	}
	if bias {
		c.b = wb.Tensor("bias", cout)
	}
	if c.m > 1 {
		c.tail = bl.state(c.m-1, width*cout)
	}
	return c
}

// forward sets dst [T·stride, cout] from x [T, cin]: every input row's
// contributions in one product over every stream's rows, then each
// stream's output rows summed from its own contributions and the pending
// ones of its previous call.
func (c *convTr) forward(d *Decoder, b *batch, dst, x gpu.Tensor) {
	q, a := d.q, d.arena
	m, W := c.m, c.stride*c.cout
	// Row m−1+t of a stream's z holds its input row t's contributions to
	// output rows t·stride … t·stride+m·stride−1, in m blocks of W columns;
	// rows 0…m−2 hold its previous call's last input rows. One stream's
	// contributions are computed into its z directly; a batch's into zn,
	// then copied into each stream's z.
	single := len(b.streams) == 1 && m > 1
	var z0, zn gpu.Tensor
	if single {
		z0 = a.Get(m-1+x.Rows, m*W)
		zn = z0.Slice(m-1, m-1+x.Rows)
	} else {
		zn = a.Get(x.Rows, m*W)
	}
	if c.depthwise {
		for j, v := range c.dw {
			q.MulRow(zn.ColSlice(j*c.cout, (j+1)*c.cout), x, v)
		}
	} else {
		q.MatMul(zn, x, c.w, gpu.Tensor{})
	}
	for k, s := range b.streams {
		mark := a.Mark() // the stream's z is the next stream's
		lo, hi := b.rows(k, x.Rows)
		T := hi - lo
		var z gpu.Tensor
		switch {
		case m == 1:
			z = zn.Slice(lo, hi)
		case single:
			z = z0
		default:
			z = a.Get(m-1+T, m*W)
			q.Copy(z.Slice(m-1, m-1+T), zn.Slice(lo, hi))
		}
		if c.tail >= 0 {
			q.Copy(z.Slice(0, m-1), s.state[c.tail])
		}
		// Output rows t·stride+r (r < stride) = Σ_j block j of input row t−j.
		out := dst.Slice(lo*c.stride, hi*c.stride).Reshape(T, W)
		block := func(j int) gpu.Tensor { return z.Slice(m-1-j, m-1-j+T).ColSlice(j*W, (j+1)*W) }
		if m == 1 {
			q.Copy(out, block(0))
		} else {
			q.Add(out, block(0), block(1))
		}
		for j := 2; j < m; j++ {
			q.Add(out, out, block(j))
		}
		if c.tail >= 0 {
			q.Copy(s.state[c.tail], z.Slice(T, T+m-1))
		}
		a.Release(mark)
	}
	if !c.b.IsNil() {
		q.AddRow(dst, dst, c.b)
	}
}
