package cpu

import (
	"fmt"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// ReadInt implements gpu.Queue.
func (q *Queue) ReadInt(dst []int32, src gpu.Tensor) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("cpu: read %v into %d ints", src, len(dst))
	}
	if src.DType() != gpu.I32 {
		return fmt.Errorf("cpu: read ints from %v", src)
	}
	s := i32s(src)
	for r := 0; r < src.Rows; r++ {
		copy(dst[r*src.Cols:(r+1)*src.Cols], s[r*src.Stride:r*src.Stride+src.Cols])
	}
	return nil
}

// EmbedIDs implements gpu.Queue.
func (q *Queue) EmbedIDs(dst, table, ids gpu.Tensor) {
	if ids.DType() != gpu.I32 || ids.Rows != dst.Rows {
		panic(fmt.Sprintf("cpu: embed ids %v into %v", ids, dst))
	}
	host := make([]int32, ids.Len())
	if err := q.ReadInt(host, ids); err != nil {
		panic(err)
	}
	q.Embed(dst, table, host)
}

// Sample implements gpu.Queue: gpu.SampleHost on every row.
func (q *Queue) Sample(ids, logits gpu.Tensor, rows []gpu.SampleRow) {
	if ids.DType() != gpu.I32 || ids.Rows != logits.Rows || ids.Cols != 1 || len(rows) != logits.Rows || logits.Cols == 0 {
		panic(fmt.Sprintf("cpu: sample %v (%d rows) into %v", logits, len(rows), ids))
	}
	l, d := f32s(logits), i32s(ids)
	for r, row := range rows {
		d[r*ids.Stride] = int32(gpu.SampleHost(l[r*logits.Stride:r*logits.Stride+logits.Cols], row, &q.sample))
	}
}
