// Package safetensors reads and writes the safetensors checkpoint format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header naming every tensor's dtype, shape and byte
// span, then the raw little-endian data.
//
// Open memory-maps the file, so tensor data are zero-copy views of the
// page cache: a 3 GB checkpoint opens in microseconds and costs no heap.
// Every header is validated before use (length, JSON, dtype, shape × dtype
// size against the span, spans inside the data and not overlapping); errors
// name the file and the tensor.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// DType is a safetensors element type, spelled as in the header.
type DType string

// The dtypes of the format. omni-pipe computes with BF16, F16 and F32
// weights and reads I64 and F64 reference tensors; the rest parse but
// their values are refused by name.
const (
	BOOL   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	F8E5M2 DType = "F8_E5M2"
	F8E4M3 DType = "F8_E4M3"
	F8E8M0 DType = "F8_E8M0"
	I16    DType = "I16"
	U16    DType = "U16"
	F16    DType = "F16"
	BF16   DType = "BF16"
	I32    DType = "I32"
	U32    DType = "U32"
	F32    DType = "F32"
	F64    DType = "F64"
	I64    DType = "I64"
	U64    DType = "U64"
	F4     DType = "F4"
	F6E2M3 DType = "F6_E2M3"
	F6E3M2 DType = "F6_E3M2"
	C64    DType = "C64"
)

// bits per element of each known dtype.
var dtypeBits = map[DType]int{
	BOOL: 8, U8: 8, I8: 8, F8E5M2: 8, F8E4M3: 8, F8E8M0: 8,
	I16: 16, U16: 16, F16: 16, BF16: 16,
	I32: 32, U32: 32, F32: 32,
	F64: 64, I64: 64, U64: 64, C64: 64,
	F4: 4, F6E2M3: 6, F6E3M2: 6,
}

// MaxHeaderLen bounds the JSON header (the reference implementation uses
// 100 MB).
const MaxHeaderLen = 100 << 20

// Tensor is one tensor of a file: its metadata and a view of its bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	// Data aliases the file's memory; it is valid until the File is closed.
	Data []byte
}

// Len returns the number of elements.
func (t *Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a parsed safetensors file.
type File struct {
	// Path names the file in errors ("" for in-memory data).
	Path     string
	Metadata map[string]string
	tensors  map[string]*Tensor
	names    []string // in data order
	closer   func() error
}

type headerEntry struct {
	DType       DType   `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// Parse parses a complete safetensors file held in data; name labels it in
// errors. The tensors alias data.
func Parse(data []byte, name string) (*File, error) {
	f, err := parse(data, name)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func parse(data []byte, name string) (*File, error) {
	label := name
	if label == "" {
		label = "safetensors data"
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", label, fmt.Sprintf(format, args...))
	}
	if len(data) < 8 {
		return nil, fail("truncated: %d bytes, not even the 8-byte header length", len(data))
	}
	hl := binary.LittleEndian.Uint64(data[:8])
	if hl > MaxHeaderLen {
		return nil, fail("header length %d exceeds the %d-byte limit", hl, MaxHeaderLen)
	}
	if hl > uint64(len(data)-8) {
		return nil, fail("truncated: header length %d but only %d bytes follow", hl, len(data)-8)
	}
	hdr := data[8 : 8+hl]
	body := data[8+hl:]
	// The format allows trailing spaces as padding.
	hdr = bytes.TrimRight(hdr, " ")
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, fail("header is not a JSON object")
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if err := dec.Decode(&raw); err != nil {
		return nil, fail("header JSON: %v", err)
	}
	if dec.More() {
		return nil, fail("header JSON: trailing data after the object")
	}
	f := &File{Path: name, tensors: make(map[string]*Tensor, len(raw))}
	// Entries are checked in name order so that a bad file gets the same
	// error every time.
	keys := make([]string, 0, len(raw))
	for key := range raw {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	type entry struct {
		key string
		headerEntry
		bits       int
		begin, end int64
	}
	entries := make([]entry, 0, len(keys))
	var extent int64 // the data bytes the header describes
	for _, key := range keys {
		msg := raw[key]
		if key == "__metadata__" {
			if err := json.Unmarshal(msg, &f.Metadata); err != nil {
				return nil, fail("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		e := entry{key: key}
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e.headerEntry); err != nil {
			return nil, fail("tensor %q: header entry: %v", key, err)
		}
		var ok bool
		if e.bits, ok = dtypeBits[e.DType]; !ok {
			return nil, fail("tensor %q: unknown dtype %q", key, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, fail("tensor %q: data_offsets must hold 2 numbers, has %d", key, len(e.DataOffsets))
		}
		e.begin, e.end = e.DataOffsets[0], e.DataOffsets[1]
		if e.begin < 0 || e.end < e.begin {
			return nil, fail("tensor %q: data_offsets [%d, %d] are not a span", key, e.begin, e.end)
		}
		extent = max(extent, e.end)
		entries = append(entries, e)
	}
	// A file cut short (an interrupted download or copy) ends before the
	// data its header describes.
	if extent > int64(len(body)) && extent <= math.MaxInt64-8-int64(hl) {
		return nil, fail("truncated: file has %d bytes, header needs %d", len(data), 8+int64(hl)+extent)
	}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(entries))
	for _, e := range entries {
		key, begin, end := e.key, e.begin, e.end
		if end > int64(len(body)) {
			return nil, fail("tensor %q: data_offsets [%d, %d] outside the %d data bytes", key, begin, end, len(body))
		}
		n := int64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || (d > 0 && n > math.MaxInt64/8/d) {
				return nil, fail("tensor %q: bad shape %v", key, e.Shape)
			}
			n *= d
			shape[i] = int(d)
		}
		if want := (n*int64(e.bits) + 7) / 8; want != end-begin {
			return nil, fail("tensor %q: shape %v of %s needs %d bytes, data_offsets span %d", key, e.Shape, e.DType, want, end-begin)
		}
		f.tensors[key] = &Tensor{Name: key, DType: e.DType, Shape: shape, Data: body[begin:end:end]}
		spans = append(spans, span{key, begin, end})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].name < spans[j].name
	})
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if b.begin < a.end && b.end > b.begin {
			return nil, fail("tensors %q [%d, %d) and %q [%d, %d) overlap", a.name, a.begin, a.end, b.name, b.begin, b.end)
		}
	}
	for _, s := range spans {
		f.names = append(f.names, s.name)
	}
	return f, nil
}

// Close releases the file's memory; tensor data must not be used afterwards.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	c := f.closer
	f.closer = nil
	return c()
}

// Names returns the tensor names in data order.
func (f *File) Names() []string { return append([]string(nil), f.names...) }

// Tensor returns the named tensor, or nil.
func (f *File) Tensor(name string) *Tensor { return f.tensors[name] }

// Lookup returns the named tensor or an error naming the file and tensor.
func (f *File) Lookup(name string) (*Tensor, error) {
	t := f.tensors[name]
	if t == nil {
		return nil, fmt.Errorf("%s: no tensor %q", f.label(), name)
	}
	return t, nil
}

func (f *File) label() string {
	if f.Path == "" {
		return "safetensors data"
	}
	return f.Path
}

// Float32s returns the values of a BF16, F16, F32 or F64 tensor as float32
// (a copy).
func (t *Tensor) Float32s() ([]float32, error) {
	n := t.Len()
	out := make([]float32, n)
	switch t.DType {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = gpu.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = gpu.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:])))
		}
	default:
		return nil, fmt.Errorf("tensor %q: dtype %s is not supported as floating point", t.Name, t.DType)
	}
	return out, nil
}

// Float64s returns the values of a floating-point tensor as float64.
func (t *Tensor) Float64s() ([]float64, error) {
	if t.DType == F64 {
		out := make([]float64, t.Len())
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
		}
		return out, nil
	}
	f, err := t.Float32s()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out, nil
}

// Int64s returns the values of an I64, I32 or U8 tensor.
func (t *Tensor) Int64s() ([]int64, error) {
	n := t.Len()
	out := make([]int64, n)
	switch t.DType {
	case I64:
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
		}
	case I32:
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(t.Data[4*i:])))
		}
	case U8:
		for i := range out {
			out[i] = int64(t.Data[i])
		}
	default:
		return nil, fmt.Errorf("tensor %q: dtype %s is not supported as integer", t.Name, t.DType)
	}
	return out, nil
}

// Uint16s returns a zero-copy view of a BF16 or F16 tensor's bit patterns
// when the data are 2-byte aligned (always true for Open on amd64 files), or
// a copy otherwise.
func (t *Tensor) Uint16s() ([]uint16, error) {
	if t.DType != BF16 && t.DType != F16 {
		return nil, fmt.Errorf("tensor %q: dtype %s is not 16-bit floating point", t.Name, t.DType)
	}
	n := t.Len()
	if n == 0 {
		return nil, nil
	}
	p := unsafe.Pointer(unsafe.SliceData(t.Data))
	if uintptr(p)%2 == 0 {
		return unsafe.Slice((*uint16)(p), n), nil
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(t.Data[2*i:])
	}
	return out, nil
}
