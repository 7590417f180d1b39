// Package gpu is omni-pipe's command-queue abstraction: the one small op set
// that every network (backbone, depthformer, encoder, codec) is written
// against, and the device/queue/buffer API that backends implement.
//
// The API is shaped for a GPU even when it runs on the CPU:
//
//   - Memory lives on the device. A Tensor is a view (buffer, offset, shape,
//     row stride) of device memory; host code never touches it directly. It
//     moves data with Queue.Write and Queue.Read, and reads back only what it
//     must (sampled logits, final audio).
//   - Work is submitted to a Queue. A stage owns one queue; ops on one queue
//     execute in submission order. A backend may run them asynchronously
//     (CUDA streams) or eagerly (the CPU backend runs each op on its worker
//     pool before the call returns). Read and Sync are the only points where
//     the host waits.
//   - Activations are float32. Weights may be BF16, F16 or F32. Ops never
//     round their outputs; networks that reproduce a bf16 reference call
//     RoundBF16 at the reference's rounding points.
//
// Layout conventions: every tensor is two-dimensional and row-major, [Rows,
// Cols] with a row stride ≥ Cols (a column slice of a wider tensor). Sequence
// data is time-major: one row per position, features in columns. Linear
// weights keep PyTorch's [out, in] layout.
package gpu

import (
	"errors"
	"fmt"
)

// DType is an element type of device memory.
type DType uint8

// The element types a buffer can hold.
const (
	F32 DType = iota + 1
	BF16
	F16
	I32
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case I32:
		return "I32"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Buffer is an allocation in device memory. Backends define the concrete
// type; code outside a backend only passes buffers around inside Tensors.
type Buffer interface {
	DType() DType
	// Len is the number of elements.
	Len() int
}

// Tensor is a two-dimensional view of a Buffer: element (r, c) is at
// Off + r*Stride + c.
type Tensor struct {
	Buf    Buffer
	Off    int
	Rows   int
	Cols   int
	Stride int
}

// IsNil reports whether t refers to no memory (an absent optional operand,
// such as a bias).
func (t Tensor) IsNil() bool { return t.Buf == nil }

// DType returns the element type of t's buffer.
func (t Tensor) DType() DType {
	if t.Buf == nil {
		return 0
	}
	return t.Buf.DType()
}

// Len returns Rows*Cols.
func (t Tensor) Len() int { return t.Rows * t.Cols }

// Contiguous reports whether the rows of t are adjacent in memory.
func (t Tensor) Contiguous() bool { return t.Stride == t.Cols || t.Rows <= 1 }

// Slice returns rows [lo, hi) of t.
func (t Tensor) Slice(lo, hi int) Tensor {
	if lo < 0 || hi > t.Rows || lo > hi {
		panic(fmt.Sprintf("gpu: row slice [%d:%d] of %d rows", lo, hi, t.Rows))
	}
	t.Off += lo * t.Stride
	t.Rows = hi - lo
	return t
}

// Row returns row r of t as a [1, Cols] tensor.
func (t Tensor) Row(r int) Tensor { return t.Slice(r, r+1) }

// ColSlice returns columns [lo, hi) of t (a strided view).
func (t Tensor) ColSlice(lo, hi int) Tensor {
	if lo < 0 || hi > t.Cols || lo > hi {
		panic(fmt.Sprintf("gpu: column slice [%d:%d] of %d columns", lo, hi, t.Cols))
	}
	t.Off += lo
	t.Cols = hi - lo
	return t
}

// Reshape returns a contiguous tensor viewed as [rows, cols]; the element
// count must not change.
func (t Tensor) Reshape(rows, cols int) Tensor {
	if !t.Contiguous() || rows*cols != t.Rows*t.Cols {
		panic(fmt.Sprintf("gpu: reshape [%d,%d] (stride %d) to [%d,%d]", t.Rows, t.Cols, t.Stride, rows, cols))
	}
	t.Rows, t.Cols, t.Stride = rows, cols, cols
	return t
}

func (t Tensor) String() string {
	return fmt.Sprintf("%v[%d,%d]", t.DType(), t.Rows, t.Cols)
}

// Device is a compute device: it allocates memory and creates queues.
type Device interface {
	// Name describes the device ("cpu (2 workers, avx2+fma)", "NVIDIA H200").
	Name() string
	// Alloc returns a zeroed, contiguous [rows, cols] tensor.
	Alloc(dt DType, rows, cols int) Tensor
	// Load makes host bytes (little-endian elements of dt) device memory,
	// e.g. a checkpoint tensor. The CPU backend aliases data without copying,
	// so data must stay valid and unmodified for the tensor's lifetime.
	Load(dt DType, rows, cols int, data []byte) (Tensor, error)
	// Free releases t's buffer. Using any view of it afterwards is a bug.
	Free(t Tensor)
	// NewQueue creates a command queue; name labels it in profiles.
	NewQueue(name string) Queue
	// Close releases the device's resources (worker goroutines, contexts).
	Close() error
}

// PriorityQueuer is a Device that can give a queue precedence: where
// queues compete for the device, the scheduler takes the priority queue's
// work first (CUDA, with OMNIPIPE_CUDA_PRIORITY=on: a stream of the
// greatest priority). The codec asks for it, since its frames are what a
// listener waits for; on an H200 it shortened the codec's call but slowed
// the backbone's step, which the next frame waits for, more (package
// cuda's NewPriorityQueue), so a backend may hand out a plain queue.
type PriorityQueuer interface {
	NewPriorityQueue(name string) Queue
}

// NewUrgentQueue returns d's priority queue where d has one, else a plain
// queue.
func NewUrgentQueue(d Device, name string) Queue {
	if p, ok := d.(PriorityQueuer); ok {
		return p.NewPriorityQueue(name)
	}
	return d.NewQueue(name)
}

// ErrClosed is returned by queues whose device was closed.
var ErrClosed = errors.New("gpu: device closed")

// Info describes a device for logs, /health, /metrics and bench reports.
type Info struct {
	// Kind is the backend: "cpu" or "cuda".
	Kind string `json:"kind"`
	// Name is the device's name ("NVIDIA H200", "cpu (16 workers, avx2+fma)").
	Name string `json:"name"`
	// Driver names the driver and its version where there is one
	// ("CUDA driver 13.0, NVRTC 13.0").
	Driver string `json:"driver,omitempty"`
	// MemUsed is the device memory this process holds in buffers, in bytes
	// (on the CPU: buffers allocated by the backend, not mapped weights).
	MemUsed int64 `json:"mem_used_bytes"`
	// MemTotal is the device's memory in bytes (0 where not meaningful).
	MemTotal int64 `json:"mem_total_bytes,omitempty"`
}

// Informer is implemented by devices that describe themselves.
type Informer interface {
	Info() Info
}

// DescribeDevice returns d's Info, or one built from Name when d does not
// implement Informer.
func DescribeDevice(d Device) Info {
	if i, ok := d.(Informer); ok {
		return i.Info()
	}
	return Info{Kind: "unknown", Name: d.Name()}
}

// BandwidthMeter is implemented by devices that measure their own memory
// bandwidth (a GPU's memory is not the host's).
type BandwidthMeter interface {
	// MeasureBandwidth returns the device's copy rate in bytes per second,
	// counting the bytes read and the bytes written: the rate at which a
	// pass that streams weights once can at best move them.
	MeasureBandwidth() (bytesPerSecond float64, err error)
}

// FP32Products is implemented by queues whose products may run on kernels
// that accumulate below IEEE fp32 — CUDA's tensor cores, whose additions
// truncate, used for networks whose reference runs in bf16 on tensor cores
// too. UseFP32Products makes every product of the queue accumulate in
// fp32 with FMA instead, as a network run in fp32 needs (its reference is
// fp32 with TF32 off); nn.NewCtx calls it for nn.F32. Call it before the
// queue's first product: a queue's products keep one summation order.
type FP32Products interface{ UseFP32Products() }
