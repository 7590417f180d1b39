package cuda

import (
	"runtime"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The tiled layout of a bf16 weight [N, K] for the few-row tensor-core
// products (kernels.cu: mmv_tile's TL). mmv_tile gives each warp the
// weights of a 16-row tile one 64-wide superblock at a time: in rows of K
// elements those are 16 pieces of 128 bytes, a row apart, each thread's
// four 16-byte loads from two rows. In the tiled layout the superblock
// (tile t, superblock s) is 2 KiB in one place, at element (t·nsb + s)·1024
// (nsb = ⌈K/64⌉), and a thread's four loads are 512 contiguous bytes of
// its warp each: piece p (0–3) of lane l = 4g + q is the 8 elements at
// 8·(32p + l), row 16t + g + 8·(p >> 1), columns 64s + 8q + 32·(p & 1) ….
// Rows past N and columns past K are zeros, where mma_wload reads zeros
// (columns) or a row whose outputs are not stored (rows). The registers
// get the same values, so the products' bits do not change
// (TestMmvVariantsBitIdentical: tiled against rows against the tile
// kernel).
//
// Device.Load keeps such a copy beside the rows of every bf16 matrix the
// few-row kernels may take (tileable); the many-row kernels read the rows.
// A weight's view uses the copy where it is whole rows starting at a
// multiple of 16 (tiledView).

// tileable reports whether Load keeps a tiled copy of a bf16 [rows, cols]
// tensor: a matrix (at least one whole tile of rows) the few-row kernels
// take (mmvMaxN).
func tileable(rows, cols int) bool { return rows >= 16 && rows <= mmvMaxN && cols >= 1 }

// tiledLen is the tiled layout's length in elements.
func tiledLen(rows, cols int) int { return (rows + 15) / 16 * ((cols + 63) / 64) * 1024 }

// tileBF16 returns the tiled layout of data (little-endian bf16 [rows,
// cols], row-major), the tiles spread over the host's cores.
func tileBF16(data []byte, rows, cols int) []byte {
	nsb, tiles := (cols+63)/64, (rows+15)/16
	out := make([]byte, 2*tiledLen(rows, cols))
	tile := func(t int) {
		for s := range nsb {
			chunk := out[2*(t*nsb+s)*1024:][:2048]
			for p := range 4 {
				for l := range 32 {
					r := 16*t + l>>2 + 8*(p>>1)
					k := 64*s + 8*(l&3) + 32*(p&1)
					dst := chunk[16*(32*p+l):][:16]
					if r >= rows || k >= cols {
						continue // zeros
					}
					n := min(8, cols-k)
					copy(dst, data[2*(r*cols+k):][:2*n])
				}
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), tiles)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := w; t < tiles; t += workers {
				tile(t)
			}
		}()
	}
	wg.Wait()
	return out
}

// tiledView returns the address of w's tiles in its buffer's tiled copy,
// or false where w has none or is not whole rows of it from a multiple of
// 16 (a column slice, a strided view, an odd first row).
func tiledView(w gpu.Tensor) (int64, bool) {
	b, ok := w.Buf.(*buffer)
	if !ok || b.tiled == nil || w.Cols != b.tiledK || (w.Stride != b.tiledK && w.Rows > 1) || w.Off%(16*b.tiledK) != 0 {
		return 0, false
	}
	r0 := w.Off / b.tiledK
	nsb := (b.tiledK + 63) / 64
	return int64(b.tiled.ptr) + int64(r0/16)*int64(nsb)*1024*2, true
}
