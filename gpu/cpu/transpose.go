package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// transposeTile is the edge of the square blocks Transpose copies, so that
// both the rows read and the rows written stay in cache.
const transposeTile = 32

// Transpose implements gpu.Queue.
func (q *Queue) Transpose(dst, src gpu.Tensor) {
	if dst.Rows != src.Cols || dst.Cols != src.Rows {
		panic(fmt.Sprintf("cpu: transpose %v into %v", src, dst))
	}
	if dst.Buf == src.Buf {
		panic("cpu: transpose dst aliases src")
	}
	if src.Rows == 0 || src.Cols == 0 {
		return
	}
	ss, ds := f32s(src), f32s(dst)
	tiles := (src.Rows + transposeTile - 1) / transposeTile
	q.dev.pool.For(tiles, 1, func(lo, hi int) {
		for r0 := lo * transposeTile; r0 < min(hi*transposeTile, src.Rows); r0 += transposeTile {
			r1 := min(r0+transposeTile, src.Rows)
			for c0 := 0; c0 < src.Cols; c0 += transposeTile {
				c1 := min(c0+transposeTile, src.Cols)
				for r := r0; r < r1; r++ {
					s := ss[r*src.Stride:]
					for c := c0; c < c1; c++ {
						ds[c*dst.Stride+r] = s[c]
					}
				}
			}
		}
	})
}
