package cuda

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// TestTileBF16Layout: every element of a weight lands where mma_wload's
// lane and register would take it from — found here from the element's
// row and column, the inverse of tileBF16's walk — and every other slot
// of the copy (rows past N, columns past K) is zero.
func TestTileBF16Layout(t *testing.T) {
	for _, sh := range []struct{ rows, cols int }{{16, 64}, {32, 128}, {17, 64}, {40, 7}, {48, 200}, {1, 70}, {100, 1030}} {
		data := make([]byte, 2*sh.rows*sh.cols)
		for i := range sh.rows * sh.cols {
			binary.LittleEndian.PutUint16(data[2*i:], uint16(i%65521+1)) // never zero
		}
		out := tileBF16(data, sh.rows, sh.cols)
		if len(out) != 2*tiledLen(sh.rows, sh.cols) {
			t.Fatalf("%v: %d bytes, want %d", sh, len(out), 2*tiledLen(sh.rows, sh.cols))
		}
		nsb := (sh.cols + 63) / 64
		seen := make([]bool, len(out)/2)
		for r := range sh.rows {
			for k := range sh.cols {
				tile, g, hh := r/16, r%8, (r%16)/8
				s, kk := k/64, k%64
				h, q, e := kk/32, (kk%32)/8, kk%8
				lane, piece := 4*g+q, 2*hh+h
				at := (tile*nsb+s)*1024 + 8*(32*piece+lane) + e
				got := binary.LittleEndian.Uint16(out[2*at:])
				want := binary.LittleEndian.Uint16(data[2*(r*sh.cols+k):])
				if got != want {
					t.Fatalf("%v: element (%d, %d) at %d holds %#x, want %#x", sh, r, k, at, got, want)
				}
				seen[at] = true
			}
		}
		for i, ok := range seen {
			if !ok && binary.LittleEndian.Uint16(out[2*i:]) != 0 {
				t.Fatalf("%v: padding slot %d holds %#x, want 0", sh, i, binary.LittleEndian.Uint16(out[2*i:]))
			}
		}
	}
}

// TestTiledView: a view of a tiled weight uses the copy only where it is
// whole rows from a multiple of 16 (its tiles then start at that row's
// tile); column slices, strided and odd views, and weights without a copy
// read their rows.
func TestTiledView(t *testing.T) {
	const rows, cols = 64, 130
	w := fakeTensor(gpu.BF16, rows, cols)
	tb := &buffer{ptr: 1 << 44, dt: gpu.BF16, n: tiledLen(rows, cols)}
	w.Buf.(*buffer).tiled, w.Buf.(*buffer).tiledK = tb, cols
	tileBytes := int64(3 * 1024 * 2) // ⌈130/64⌉ superblocks of 2 KiB
	for _, c := range []struct {
		name string
		v    gpu.Tensor
		ok   bool
		at   int64
	}{
		{"whole", w, true, 1 << 44},
		{"rows 32…", w.Slice(32, 64), true, 1<<44 + 2*tileBytes},
		{"row 16", w.Row(16), true, 1<<44 + tileBytes},
		{"rows 8…", w.Slice(8, 40), false, 0},
		{"columns", w.ColSlice(0, 64), false, 0},
		{"no copy", fakeTensor(gpu.BF16, rows, cols), false, 0},
	} {
		at, ok := tiledView(c.v)
		if ok != c.ok || at != c.at {
			t.Errorf("%s: %#x, %v; want %#x, %v", c.name, at, ok, c.at, c.ok)
		}
	}
	if !tileable(16, 1) || tileable(15, 2048) || tileable(mmvMaxN+1, 64) {
		t.Error("tileable: want matrices of 16 to mmvMaxN rows")
	}
}

// TestLoadKeepsTiledCopies: on the tensor-core products Load keeps a tiled
// copy of a bf16 matrix — its bytes the layout's, counted in MemUsed — and
// Free releases both; vectors, f32 weights, the FMA products and
// Options.NoTiledWeights get none. (A device: the GPU or the emulator.)
func TestLoadKeepsTiledCopies(t *testing.T) {
	const rows, cols = 40, 200
	data := make([]byte, 2*rows*cols)
	for i := range rows * cols {
		binary.LittleEndian.PutUint16(data[2*i:], gpu.F32ToBF16(float32(i%97)-48))
	}
	for _, c := range []struct {
		name   string
		o      Options
		dt     gpu.DType
		r      int
		copied bool
	}{
		{"bf16 matrix, tensor cores", Options{MatMul: "mma"}, gpu.BF16, rows, true},
		{"bf16 vector", Options{MatMul: "mma"}, gpu.BF16, 1, false},
		{"f32 matrix", Options{MatMul: "mma"}, gpu.F32, rows / 2, false},
		{"FMA products", Options{MatMul: "fma"}, gpu.BF16, rows, false},
		{"NoTiledWeights", Options{MatMul: "mma", NoTiledWeights: true}, gpu.BF16, rows, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := openTestDevice(t, c.o)
			before := d.Info().MemUsed
			w, err := d.Load(c.dt, c.r, len(data)/c.dt.Size()/c.r, data[:c.r*(len(data)/c.dt.Size()/c.r)*c.dt.Size()])
			if err != nil {
				t.Fatal(err)
			}
			b := w.Buf.(*buffer)
			if (b.tiled != nil) != c.copied {
				t.Fatalf("tiled copy %v, want %v", b.tiled != nil, c.copied)
			}
			want := b.bytes
			if c.copied {
				want += b.tiled.bytes
				if b.tiled.n != tiledLen(w.Rows, w.Cols) || b.tiledK != w.Cols {
					t.Errorf("copy of %d elements for %d columns, want %d and %d", b.tiled.n, b.tiledK, tiledLen(w.Rows, w.Cols), w.Cols)
				}
				got := make([]uint16, b.tiled.n)
				q := d.NewQueue("read").(*Queue)
				words := gpu.Tensor{Buf: b.tiled, Rows: 1, Cols: b.tiled.n / 2, Stride: b.tiled.n / 2}
				if err := q.readWords(unsafe.Pointer(&got[0]), words, &q.readBuf); err != nil {
					t.Fatal(err)
				}
				wantT := tileBF16(data, w.Rows, w.Cols)
				for i, v := range got {
					if v != binary.LittleEndian.Uint16(wantT[2*i:]) {
						t.Fatalf("the device's copy differs from tileBF16's at element %d", i)
					}
				}
			}
			if got := d.Info().MemUsed - before; got != want {
				t.Errorf("MemUsed grew by %d bytes, want %d", got, want)
			}
			d.Free(w)
			if got := d.Info().MemUsed; got != before {
				t.Errorf("MemUsed %d after Free, want %d", got, before)
			}
		})
	}
}
