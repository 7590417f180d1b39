package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
)

// NewF32 returns an F32 tensor holding values with the given shape.
func NewF32(name string, values []float32, shape ...int) *Tensor {
	data := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return &Tensor{Name: name, DType: F32, Shape: shape, Data: data}
}

// NewF64 returns an F64 tensor holding values with the given shape.
func NewF64(name string, values []float64, shape ...int) *Tensor {
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], math.Float64bits(v))
	}
	return &Tensor{Name: name, DType: F64, Shape: shape, Data: data}
}

// NewI64 returns an I64 tensor holding values with the given shape.
func NewI64(name string, values []int64, shape ...int) *Tensor {
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(v))
	}
	return &Tensor{Name: name, DType: I64, Shape: shape, Data: data}
}

// Write writes tensors (sorted by name, as the reference writer does) and
// metadata as a safetensors file.
func Write(w io.Writer, tensors []*Tensor, metadata map[string]string) error {
	ts := append([]*Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	hdr := make(map[string]any, len(ts)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for i, t := range ts {
		if i > 0 && ts[i-1].Name == t.Name {
			return fmt.Errorf("safetensors: duplicate tensor %q", t.Name)
		}
		bits, ok := dtypeBits[t.DType]
		if !ok {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if want := (int64(t.Len())*int64(bits) + 7) / 8; want != int64(len(t.Data)) {
			return fmt.Errorf("safetensors: tensor %q: shape %v needs %d bytes, has %d", t.Name, t.Shape, want, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("safetensors: header: %w", err)
	}
	for len(js)%8 != 0 { // keep the data 8-byte aligned
		js = append(js, ' ')
	}
	bw := bufio.NewWriter(w)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	bw.Write(n[:])
	bw.Write(js)
	for _, t := range ts {
		bw.Write(t.Data)
	}
	return bw.Flush()
}
