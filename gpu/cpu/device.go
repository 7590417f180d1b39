// Package cpu is the CPU backend of package gpu: buffers are Go slices (or
// zero-copy views of memory-mapped checkpoints) and every op runs eagerly on
// a worker pool sized to the machine's cores.
//
// # Kernels
//
// On amd64 CPUs with AVX2, FMA and F16C the hot loops are assembly written
// by gen_kernels.go (`go generate`; its output is committed, and nothing
// imports the generator):
//
//   - dot tiles for x·wᵀ (MatMul, convolution im2col products, attention
//     scores): up to 4×3 outputs in registers, weights widened from BF16
//     (vpmovzxwd + vpslld) or F16 (vcvtph2ps) in registers. Up to 16 rows
//     of x (a decode step, one row per session of a batch) stream each
//     weight row once, with the next rows prefetched, against every row of
//     x in one pass over K; more rows run a blocked GEMM (K blocks of 512
//     with the 8-lane accumulators carried between blocks).
//   - x·w tiles for right operands laid out along N (ConvTranspose1D,
//     Conv2D, attention's weighted values): 4 rows × 24 columns.
//   - elementwise kernels (add, mul, bf16 rounding, exp-based activations,
//     softmax, norms) whose Go twins perform the same float32 operations,
//     so both agree bit for bit.
//
// Elsewhere (other architectures, the purego build tag, older CPUs), or when
// the environment variable OMNIPIPE_CPU_KERNELS is "go", portable Go kernels
// run instead. Every op is tested both ways against float64 replays.
//
// # Reproducibility
//
// A MatMul output element sums its K products in one documented order
// (matmul.go) whatever the number of rows, the tile that computes it or the
// split across workers, so a row computed alone equals the same row in any
// batch, bit for bit. Convolutions are products over gathered rows (or
// gathers of product rows), so an output row depends only on the input rows
// it reads: streamed decoding equals whole decoding. Attention computes each
// (row, KV head) pair on its own, over visible keys only. The assembly and
// Go kernels differ only where the assembly fuses multiply-adds (matrix
// products, convolutions); a process uses one kernel set throughout.
package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// buffer is the CPU backend's gpu.Buffer: exactly one of the slices is set.
type buffer struct {
	dt  gpu.DType
	f32 []float32
	u16 []uint16 // BF16 or F16 bit patterns
	i32 []int32
	// owned marks buffers the backend allocated (counted in Info's MemUsed).
	owned bool
}

func (b *buffer) DType() gpu.DType { return b.dt }

func (b *buffer) Len() int {
	switch b.dt {
	case gpu.F32:
		return len(b.f32)
	case gpu.BF16, gpu.F16:
		return len(b.u16)
	case gpu.I32:
		return len(b.i32)
	}
	return 0
}

// Device is the CPU device.
type Device struct {
	pool *pool
	name string
	asm  bool // run the assembly kernels
	mu   sync.Mutex
	shut bool
	used atomic.Int64 // bytes in buffers from Alloc and copying Loads
}

var (
	_ gpu.Device   = (*Device)(nil)
	_ gpu.Informer = (*Device)(nil)
)

// New returns a CPU device whose worker pool has workers goroutines
// (runtime.NumCPU() when workers ≤ 0). It runs the AVX2+FMA assembly
// kernels where the CPU has them, unless the environment variable
// OMNIPIPE_CPU_KERNELS is "go".
func New(workers int) *Device { return newDevice(workers, defaultAsm()) }

func newDevice(workers int, asm bool) *Device {
	if workers <= 0 {
		workers = envInt("OMNIPIPE_CPU_WORKERS", runtime.NumCPU())
	}
	asm = asm && haveAsm
	return &Device{
		pool: newPool(workers),
		asm:  asm,
		name: fmt.Sprintf("cpu (%d workers, %s)", workers, kernelName(asm)),
	}
}

// Name implements gpu.Device.
func (d *Device) Name() string { return d.name }

// Workers returns the size of the worker pool.
func (d *Device) Workers() int { return d.pool.workers }

// Alloc implements gpu.Device.
func (d *Device) Alloc(dt gpu.DType, rows, cols int) gpu.Tensor {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("cpu: alloc [%d,%d]", rows, cols))
	}
	n := rows * cols
	b := &buffer{dt: dt, owned: true}
	switch dt {
	case gpu.F32:
		b.f32 = make([]float32, n)
	case gpu.BF16, gpu.F16:
		b.u16 = make([]uint16, n)
	case gpu.I32:
		b.i32 = make([]int32, n)
	default:
		panic(fmt.Sprintf("cpu: alloc of %v", dt))
	}
	d.used.Add(int64(n * dt.Size()))
	return gpu.Tensor{Buf: b, Rows: rows, Cols: cols, Stride: cols}
}

// Info implements gpu.Informer.
func (d *Device) Info() gpu.Info {
	return gpu.Info{Kind: "cpu", Name: d.name, MemUsed: d.used.Load()}
}

// Load implements gpu.Device. The tensor aliases data.
func (d *Device) Load(dt gpu.DType, rows, cols int, data []byte) (gpu.Tensor, error) {
	n := rows * cols
	if rows < 0 || cols < 0 || len(data) != n*dt.Size() {
		return gpu.Tensor{}, fmt.Errorf("cpu: load %v[%d,%d] from %d bytes", dt, rows, cols, len(data))
	}
	b := &buffer{dt: dt}
	if n > 0 {
		p := unsafe.Pointer(unsafe.SliceData(data))
		switch dt {
		case gpu.F32, gpu.I32:
			if uintptr(p)%4 != 0 {
				return gpu.Tensor{}, fmt.Errorf("cpu: load %v: data not 4-byte aligned", dt)
			}
			if dt == gpu.F32 {
				b.f32 = unsafe.Slice((*float32)(p), n)
			} else {
				b.i32 = unsafe.Slice((*int32)(p), n)
			}
		case gpu.BF16, gpu.F16:
			if uintptr(p)%2 != 0 {
				// Misaligned views are legal on amd64 but not portable: copy.
				b.u16 = make([]uint16, n)
				for i := range b.u16 {
					b.u16[i] = uint16(data[2*i]) | uint16(data[2*i+1])<<8
				}
			} else {
				b.u16 = unsafe.Slice((*uint16)(p), n)
			}
		default:
			return gpu.Tensor{}, fmt.Errorf("cpu: load of %v", dt)
		}
	}
	return gpu.Tensor{Buf: b, Rows: rows, Cols: cols, Stride: cols}, nil
}

// Free implements gpu.Device. Memory returns to the Go heap through the
// garbage collector; Free drops the buffer's references so that stale views
// fail loudly.
func (d *Device) Free(t gpu.Tensor) {
	if b, ok := t.Buf.(*buffer); ok {
		if b.owned {
			d.used.Add(-int64(b.Len() * b.dt.Size()))
		}
		b.f32, b.u16, b.i32 = nil, nil, nil
	}
}

// NewQueue implements gpu.Device.
func (d *Device) NewQueue(name string) gpu.Queue {
	return &Queue{dev: d, name: name, asm: d.asm}
}

// Close implements gpu.Device: it stops the worker pool. Queues of a closed
// device run their ops on the calling goroutine.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.shut {
		d.shut = true
		d.pool.close()
	}
	return nil
}

func buf(t gpu.Tensor) *buffer {
	b, ok := t.Buf.(*buffer)
	if !ok {
		panic(fmt.Sprintf("cpu: tensor %v is not CPU memory", t))
	}
	return b
}

// f32s returns the F32 elements spanned by t (rows at t.Stride).
func f32s(t gpu.Tensor) []float32 {
	b := buf(t)
	if b.dt != gpu.F32 {
		panic(fmt.Sprintf("cpu: want F32, got %v", t))
	}
	if t.Rows == 0 || t.Cols == 0 {
		return nil
	}
	end := t.Off + (t.Rows-1)*t.Stride + t.Cols
	return b.f32[t.Off:end:end]
}

func i32s(t gpu.Tensor) []int32 {
	b := buf(t)
	if b.dt != gpu.I32 {
		panic(fmt.Sprintf("cpu: want I32, got %v", t))
	}
	if t.Rows == 0 || t.Cols == 0 {
		return nil
	}
	end := t.Off + (t.Rows-1)*t.Stride + t.Cols
	return b.i32[t.Off:end:end]
}

// F32 returns the host slice behind an F32 tensor of the CPU backend, for
// tests and zero-copy hand-offs on the CPU. Rows are t.Stride apart.
func F32(t gpu.Tensor) []float32 { return f32s(t) }
