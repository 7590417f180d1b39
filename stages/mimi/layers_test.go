package mimi

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/gpu/gputest"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// TestLayersStreamed: a convolution or a transposed convolution gives
// every stream's rows bit for bit alike however they are split between
// calls and batched with other streams' rows — calls shorter than the
// layer's history included (a dilated window, a transposed kernel over
// more than two strides, which no Mimi configuration has) — and the whole
// rows match the float64 replay.
func TestLayersStreamed(t *testing.T) {
	for _, c := range []struct {
		name                 string
		tr                   bool
		cin, cout, k, dil, s int
		depthwise, replicate bool
	}{
		{name: "conv k3", cin: 3, cout: 4, k: 3, dil: 1},
		{name: "conv k3 dil3 replicate", cin: 3, cout: 2, k: 3, dil: 3, replicate: true},
		{name: "conv k7", cin: 2, cout: 3, k: 7, dil: 1},
		{name: "convtr k4 s2", tr: true, cin: 3, cout: 4, k: 4, s: 2},
		{name: "convtr k6 s2", tr: true, cin: 3, cout: 2, k: 6, s: 2},
		{name: "convtr k5 s2", tr: true, cin: 2, cout: 3, k: 5, s: 2},
		{name: "convtr k8 s2 depthwise", tr: true, cin: 3, cout: 3, k: 8, s: 2, depthwise: true},
		{name: "convtr k3 s3", tr: true, cin: 2, cout: 2, k: 3, s: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev := cpu.New(1)
			defer dev.Close()
			d := &Decoder{dev: dev, q: dev.NewQueue("layers"), arena: nn.NewArena(dev)}
			defer d.arena.Free()
			if fp, ok := d.q.(gpu.FP32Products); ok {
				fp.UseFP32Products()
			}
			g := &synth{rng: rand.New(rand.NewPCG(21, uint64(c.k)))}
			groups, cpg := 1, c.cout
			if c.tr && c.depthwise {
				groups, cpg = c.cin, 1
			}
			bias := !c.depthwise // as the upsampling has none
			if c.tr {
				g.convTr("l", c.cin, cpg, c.k, c.s, bias)
			} else {
				g.conv("l", c.cout, c.cin, c.k)
			}
			bl := &builder{dev: dev, q: d.q}
			wb := weights.New(dev, g.set.file(t, "", nil))
			// forward runs the layer over every stream's rows xs[i] in one
			// batch and returns each stream's output rows.
			var forward func(b *batch, dst, x gpu.Tensor)
			out := c.cout
			if c.tr {
				l := newConvTr(bl, wb.Sub("l"), c.cin, c.cout, c.k, c.s, c.depthwise, bias)
				forward = func(b *batch, dst, x gpu.Tensor) { l.forward(d, b, dst, x) }
			} else {
				l := newConv1d(bl, wb.Sub("l"), c.cin, c.cout, c.k, c.dil, c.replicate)
				forward = func(b *batch, dst, x gpu.Tensor) { l.forward(d, b, dst, x) }
			}
			if err := wb.Err(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, o := range bl.owned {
					dev.Free(o)
				}
			}()
			newStream := func() *Stream {
				s := &Stream{}
				for _, sh := range bl.states {
					st := dev.Alloc(gpu.F32, sh.rows, sh.cols)
					d.q.Fill(st, 0)
					s.state = append(s.state, st)
					t.Cleanup(func() { dev.Free(st) })
				}
				return s
			}
			rowsOut := 1
			if c.tr {
				rowsOut = c.s
			}
			run := func(streams []*Stream, xs [][]float32) [][]float32 {
				b := &batch{streams: streams}
				var all []float32
				for _, x := range xs {
					n := len(x) / c.cin
					b.n, b.off = append(b.n, n), append(b.off, b.frames)
					b.frames += n
					all = append(all, x...)
				}
				d.arena.Reset()
				x := d.arena.Get(b.frames, c.cin)
				d.q.Write(x, all)
				dst := d.arena.Get(b.frames*rowsOut, out)
				forward(b, dst, x)
				got := make([]float32, dst.Len())
				if err := d.q.Read(got, dst); err != nil {
					t.Fatal(err)
				}
				res := make([][]float32, len(xs))
				for k, s := range streams {
					per := rowsOut * out
					res[k] = got[b.off[k]*per : (b.off[k]+b.n[k])*per]
					s.frames += b.n[k]
				}
				return res
			}

			const T = 9
			x := g.normal(T*c.cin, 1)
			rows := func(lo, hi int) []float32 { return x[lo*c.cin : hi*c.cin] }
			whole := run([]*Stream{newStream()}, [][]float32{x})[0]

			ref := mat(T, c.cin)
			for i := range ref {
				for j := range ref[i] {
					ref[i][j] = float64(x[i*c.cin+j])
				}
			}
			m := refModel{set: &g.set}
			var want [][]float64
			if c.tr {
				var b []float64
				if bias {
					b = m.w("l.bias")
				}
				want = convTrRef(ref, m.w("l.weight"), b, c.cout, c.k, c.s, groups)
			} else {
				want = conv1dRef(ref, m.w("l.weight"), m.w("l.bias"), c.cout, c.k, c.dil, c.replicate)
			}
			for i, row := range want {
				for j, v := range row {
					if got := float64(whole[i*out+j]); math.Abs(got-v) > 1e-5*(1+math.Abs(v)) {
						t.Fatalf("row %d col %d: %g, replay %g", i, j, got, v)
					}
				}
			}

			// Two streams: a in calls of 1, 1, 2, 1, 4 rows; b in calls
			// of 3, 1, 5 rows, batched with a's first three.
			a, bs := newStream(), newStream()
			var gotA, gotB []float32
			for _, call := range []struct{ a, b [2]int }{
				{[2]int{0, 1}, [2]int{0, 3}},
				{[2]int{1, 2}, [2]int{3, 4}},
				{[2]int{2, 4}, [2]int{4, 9}},
				{[2]int{4, 5}, [2]int{}},
				{[2]int{5, 9}, [2]int{}},
			} {
				if call.b[1] == 0 {
					gotA = append(gotA, run([]*Stream{a}, [][]float32{rows(call.a[0], call.a[1])})[0]...)
					continue
				}
				r := run([]*Stream{a, bs}, [][]float32{rows(call.a[0], call.a[1]), rows(call.b[0], call.b[1])})
				gotA, gotB = append(gotA, r[0]...), append(gotB, r[1]...)
			}
			for name, got := range map[string][]float32{"a": gotA, "b": gotB} {
				if i := gputest.FirstDiff(got, whole); i >= 0 {
					t.Errorf("stream %s differs from the whole rows at %d (%d values, want %d)", name, i, len(got), len(whole))
				}
			}
		})
	}
}
