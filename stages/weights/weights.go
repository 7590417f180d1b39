// Package weights binds checkpoint tensors to the networks' structs by name:
// every expected tensor must be present with the expected shape, and what
// the checkpoint holds beyond that is listed. All problems are collected and
// reported together, naming each tensor, so that a bad checkpoint fails at
// load time with one clear error and never later with a panic.
package weights

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// Binder hands out device tensors for checkpoint names.
type Binder struct {
	dev    gpu.Device
	file   *safetensors.File
	prefix string
	st     *state
}

type state struct {
	used   map[string]bool
	errs   []error
	params int64
	bound  []string
	seen   map[string]bool
}

// record counts a bound tensor once, however often it is bound.
func (s *state) record(name string, n int64) {
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	if s.seen[name] {
		return
	}
	s.seen[name] = true
	s.params += n
	s.bound = append(s.bound, name)
}

// New returns a Binder over file whose tensors become device memory of dev.
func New(dev gpu.Device, file *safetensors.File) *Binder {
	return &Binder{dev: dev, file: file, st: &state{used: map[string]bool{}}}
}

// Sub returns a Binder for names under prefix + ".".
func (b *Binder) Sub(prefix string) *Binder {
	c := *b
	c.prefix = b.name(prefix) + "."
	return &c
}

// Subf is Sub with a formatted prefix.
func (b *Binder) Subf(format string, args ...any) *Binder { return b.Sub(fmt.Sprintf(format, args...)) }

func (b *Binder) name(n string) string { return b.prefix + n }

// Device returns the device tensors are bound on.
func (b *Binder) Device() gpu.Device { return b.dev }

func (b *Binder) fail(err error) { b.st.errs = append(b.st.errs, err) }

// Has reports whether the checkpoint holds name.
func (b *Binder) Has(name string) bool { return b.file.Tensor(b.name(name)) != nil }

// Tensor binds name, which must have exactly shape (PyTorch order); the
// result is 2-D: [shape[0], product of the rest] (a vector is [1, n]). On
// failure it records an error and returns a stand-in of the asked-for
// shape backed by no memory (see standIn), so that loading can continue and
// report every problem at once.
func (b *Binder) Tensor(name string, shape ...int) gpu.Tensor {
	t, ok := b.lookup(name, shape, true)
	if !ok {
		return b.standIn(shape)
	}
	return t
}

// Optional binds name if present (checking its shape) and reports whether
// it was.
func (b *Binder) Optional(name string, shape ...int) (gpu.Tensor, bool) {
	if !b.Has(name) {
		return gpu.Tensor{}, false
	}
	t, ok := b.lookup(name, shape, true)
	if !ok {
		return b.standIn(shape), false
	}
	return t, true
}

// Rows binds the named tensors, each of its shape in shapes (PyTorch
// order; the same dtype and the same columns), as one tensor of their rows
// one after another: a layer's q, k and v projections, whose products then
// run as one (every output of a product depends only on its own weight
// row, on every backend, so the floats do not change). The result is
// [Σ shapes[i][0], columns]; on failure it records the errors and returns
// a stand-in of that shape (see standIn). The rows are copied into one
// buffer on the host before the device loads them.
func (b *Binder) Rows(names []string, shapes [][]int) gpu.Tensor {
	if len(names) != len(shapes) || len(names) == 0 {
		panic(fmt.Sprintf("weights: Rows of %d names and %d shapes", len(names), len(shapes)))
	}
	rows, cols := 0, -1
	ok := true
	for i, sh := range shapes {
		r, c := dims(sh)
		rows += r
		if cols >= 0 && c != cols {
			panic(fmt.Sprintf("weights: Rows of %v: columns %d and %d", names, cols, c))
		}
		cols = c
		ok = b.check(names[i], sh) && ok
	}
	full := []int{rows, cols}
	if !ok {
		return b.standIn(full)
	}
	first := b.file.Tensor(b.name(names[0]))
	size := 0
	for _, n := range names {
		size += len(b.file.Tensor(b.name(n)).Data)
	}
	data := make([]byte, 0, size)
	for _, n := range names {
		t := b.file.Tensor(b.name(n))
		if t.DType != first.DType {
			b.fail(fmt.Errorf("tensor %q has dtype %s, %q %s: rows bound together must share one", b.name(n), t.DType, b.name(names[0]), first.DType))
			return b.standIn(full)
		}
		data = append(data, t.Data...)
	}
	dt, err := deviceDType(first)
	if err != nil {
		b.fail(err)
		return b.standIn(full)
	}
	g, err := b.dev.Load(dt, rows, cols, data)
	if err != nil {
		b.fail(fmt.Errorf("tensors %v as one: %w", names, err))
		return b.standIn(full)
	}
	for i, n := range names {
		r, c := dims(shapes[i])
		b.st.record(b.name(n), int64(r*c))
	}
	return g
}

// check reports whether the checkpoint holds name with exactly shape,
// marking it used, and records an error where it does not.
func (b *Binder) check(name string, shape []int) bool {
	full := b.name(name)
	t := b.file.Tensor(full)
	if t == nil {
		b.fail(fmt.Errorf("missing tensor %q (want shape %v)", full, shape))
		return false
	}
	b.st.used[full] = true
	if !slices.Equal(t.Shape, shape) {
		b.fail(fmt.Errorf("tensor %q has shape %v, want %v", full, t.Shape, shape))
		return false
	}
	return true
}

// deviceDType is the device dtype of a checkpoint tensor's, for weights.
func deviceDType(t *safetensors.Tensor) (gpu.DType, error) {
	switch t.DType {
	case safetensors.BF16:
		return gpu.BF16, nil
	case safetensors.F16:
		return gpu.F16, nil
	case safetensors.F32:
		return gpu.F32, nil
	}
	return 0, fmt.Errorf("tensor %q has dtype %s; weights must be BF16, F16 or F32", t.Name, t.DType)
}

// Values returns name's values as float32 on the host (for small buffers
// that setup code transforms: BatchNorm statistics, codebooks), checking the
// shape.
func (b *Binder) Values(name string, shape ...int) []float32 {
	full := b.name(name)
	t := b.file.Tensor(full)
	if t == nil {
		b.fail(fmt.Errorf("missing tensor %q (want shape %v)", full, shape))
		return make([]float32, prod(shape))
	}
	b.st.used[full] = true
	if !slices.Equal(t.Shape, shape) {
		b.fail(fmt.Errorf("tensor %q has shape %v, want %v", full, t.Shape, shape))
		return make([]float32, prod(shape))
	}
	v, err := t.Float32s()
	if err != nil {
		b.fail(err)
		return make([]float32, prod(shape))
	}
	b.st.record(full, int64(len(v)))
	return v
}

// Skip marks names as known but unused (training buffers and the like).
func (b *Binder) Skip(names ...string) {
	for _, n := range names {
		b.st.used[b.name(n)] = true
	}
}

// SkipPrefix marks every tensor under prefix as known but unused.
func (b *Binder) SkipPrefix(prefix string) {
	p := b.name(prefix)
	for _, n := range b.file.Names() {
		if strings.HasPrefix(n, p) {
			b.st.used[n] = true
		}
	}
}

// maxListed is how many binding problems Err spells out; a configuration
// far from its checkpoint can miss thousands of tensors.
const maxListed = 20

// Err returns the binding problems so far (the first maxListed of them and
// the count of the rest), or nil.
func (b *Binder) Err() error {
	if len(b.st.errs) == 0 {
		return nil
	}
	label := b.file.Path
	if label == "" {
		label = "checkpoint"
	}
	errs := b.st.errs
	if n := len(errs); n > maxListed {
		errs = append(errs[:maxListed:maxListed], fmt.Errorf("… and %d more", n-maxListed))
	}
	return fmt.Errorf("%s: %w", label, errors.Join(errs...))
}

// Unexpected returns the checkpoint's tensors that nothing bound or skipped.
func (b *Binder) Unexpected() []string {
	var out []string
	for _, n := range b.file.Names() {
		if !b.st.used[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Params returns the number of parameters bound so far (each tensor once).
func (b *Binder) Params() int64 { return b.st.params }

// Bound returns the names bound so far, in binding order.
func (b *Binder) Bound() []string { return append([]string(nil), b.st.bound...) }

func (b *Binder) lookup(name string, shape []int, record bool) (gpu.Tensor, bool) {
	full := b.name(name)
	if !b.check(name, shape) {
		return gpu.Tensor{}, false
	}
	t := b.file.Tensor(full)
	dt, err := deviceDType(t)
	if err != nil {
		b.fail(err)
		return gpu.Tensor{}, false
	}
	rows, cols := dims(shape)
	g, err := b.dev.Load(dt, rows, cols, t.Data)
	if err != nil {
		b.fail(fmt.Errorf("tensor %q: %w", full, err))
		return gpu.Tensor{}, false
	}
	if record {
		b.st.record(full, int64(rows*cols))
	}
	return g, true
}

// standIn returns a tensor of shape's 2-D dimensions that refers to no
// memory (IsNil). It allocates nothing: a checkpoint that does not match its
// configuration fails at Err, and the configuration's sizes must not cost
// memory before that (a config.json asking for a million codebooks once
// made a 196 GB stand-in). Code between binding and Err may slice and
// reshape stand-ins but must not compute with them.
func (b *Binder) standIn(shape []int) gpu.Tensor {
	rows, cols := dims(shape)
	return gpu.Tensor{Rows: rows, Cols: cols, Stride: cols}
}

func dims(shape []int) (rows, cols int) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return 1, shape[0]
	}
	return shape[0], prod(shape[1:])
}

func prod(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}
