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
// for every stream at once, the product runs once over every stream's rows.
// The queue gets the same ops for any number of streams: k+1 CopyMany
// (every stream's [history; x], then each tap's im2col columns) and the
// product.
func (c *conv1d) forward(d *Decoder, b *batch, dst, x gpu.Tensor) {
	q := d.q
	if c.hist < 0 { // kernel 1: no history
		q.MatMul(dst, x, c.w, c.b)
		return
	}
	h := (c.k - 1) * c.dil
	// cat holds every stream's [history; x], one after another.
	cat := d.arena.Get(x.Rows+len(b.streams)*h, c.cin)
	streamCat := func(k int) (lo, hi int, cs gpu.Tensor) {
		lo, hi = b.rows(k, x.Rows)
		return lo, hi, cat.Slice(lo+k*h, hi+(k+1)*h)
	}
	pairs := b.pairs[:0]
	for k, s := range b.streams {
		lo, hi, cs := streamCat(k)
		xs := x.Slice(lo, hi)
		if c.replicate && s.frames == 0 {
			for r := 0; r < h; r++ {
				pairs = append(pairs, gpu.CopyPair{Dst: cs.Row(r), Src: xs.Row(0)})
			}
		} else {
			pairs = append(pairs, gpu.CopyPair{Dst: cs.Slice(0, h), Src: s.state[c.hist]})
		}
		pairs = append(pairs, gpu.CopyPair{Dst: cs.Slice(h, h+hi-lo), Src: xs})
	}
	gpu.CopyMany(q, pairs)
	// im2col: row t holds cat rows t, t+dil, …, a tap's columns per
	// CopyMany (the taps' columns of a row are not disjoint views); the
	// history becomes cat's last h rows.
	col := d.arena.Get(x.Rows, c.k*c.cin)
	for j := 0; j < c.k; j++ {
		pairs = pairs[:0]
		for k, s := range b.streams {
			lo, hi, cs := streamCat(k)
			T := hi - lo
			pairs = append(pairs, gpu.CopyPair{Dst: col.Slice(lo, hi).ColSlice(j*c.cin, (j+1)*c.cin), Src: cs.Slice(j*c.dil, j*c.dil+T)})
			if j == 0 {
				pairs = append(pairs, gpu.CopyPair{Dst: s.state[c.hist], Src: cs.Slice(T, T+h)})
			}
		}
		gpu.CopyMany(q, pairs)
	}
	b.pairs = pairs
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
// contributions in one product over every stream's rows, then every
// stream's output rows summed from its own contributions and the pending
// ones of its previous call, each term gathered for all the streams at
// once. The queue gets the same ops for any number of streams.
func (c *convTr) forward(d *Decoder, b *batch, dst, x gpu.Tensor) {
	q, a := d.q, d.arena
	m, W := c.m, c.stride*c.cout
	// Row t of zn holds input row t's contributions to output rows
	// t·stride … t·stride+m·stride−1, in m blocks of W columns.
	zn := a.Get(x.Rows, m*W)
	if c.depthwise {
		for j, v := range c.dw {
			q.MulRow(zn.ColSlice(j*c.cout, (j+1)*c.cout), x, v)
		}
	} else {
		q.MatMul(zn, x, c.w, gpu.Tensor{})
	}
	// Output rows t·stride+r (r < stride) = Σ_j block j of input row t−j,
	// where a stream's input rows before its first are the pending rows
	// of its tail (its previous call's last m−1 input rows).
	out := dst.Reshape(x.Rows, W)
	block := func(z gpu.Tensor, j int) gpu.Tensor { return z.ColSlice(j*W, (j+1)*W) }
	if m == 1 {
		q.Copy(out, block(zn, 0))
		if !c.b.IsNil() {
			q.AddRow(dst, dst, c.b)
		}
		return
	}
	// terms[j−1] holds the block-j terms of every output row: row lo+t of
	// stream k is block j of its input row t−j. A stream whose call has
	// fewer than m−1 rows keeps some of its old tail rows: the new tail
	// is put together in shift first (the old one is still read here).
	terms := make([]gpu.Tensor, m-1)
	for j := range terms {
		terms[j] = a.Get(x.Rows, W)
	}
	var shift gpu.Tensor
	pairs := b.pairs[:0]
	for k, s := range b.streams {
		lo, hi := b.rows(k, x.Rows)
		T, tail := hi-lo, s.state[c.tail]
		for j := 1; j < m; j++ {
			n := min(j, T) // rows from the tail
			pairs = append(pairs, gpu.CopyPair{Dst: terms[j-1].Slice(lo, lo+n), Src: block(tail.Slice(m-1-j, m-1-j+n), j)})
			if T > j {
				pairs = append(pairs, gpu.CopyPair{Dst: terms[j-1].Slice(lo+j, hi), Src: block(zn.Slice(lo, hi-j), j)})
			}
		}
		if T < m-1 {
			if shift.IsNil() {
				shift = a.Get(len(b.streams)*(m-1), m*W)
			}
			// New tail rows: old tail rows T … m−2, then the call's rows.
			sh := shift.Slice(k*(m-1), (k+1)*(m-1))
			pairs = append(pairs,
				gpu.CopyPair{Dst: sh.Slice(0, m-1-T), Src: tail.Slice(T, m-1)},
				gpu.CopyPair{Dst: sh.Slice(m-1-T, m-1), Src: zn.Slice(lo, hi)})
		}
	}
	gpu.CopyMany(q, pairs)
	q.Add(out, block(zn, 0), terms[0])
	for _, t := range terms[1:] {
		q.Add(out, out, t)
	}
	// Each stream's tail becomes the contributions of its last m−1 input
	// rows.
	pairs = pairs[:0]
	for k, s := range b.streams {
		lo, hi := b.rows(k, x.Rows)
		var src gpu.Tensor
		if hi-lo >= m-1 {
			src = zn.Slice(hi-(m-1), hi)
		} else {
			src = shift.Slice(k*(m-1), (k+1)*(m-1))
		}
		pairs = append(pairs, gpu.CopyPair{Dst: s.state[c.tail], Src: src})
	}
	gpu.CopyMany(q, pairs)
	b.pairs = pairs
	if !c.b.IsNil() {
		q.AddRow(dst, dst, c.b)
	}
}
