package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Device attribute codes (CUdevice_attribute).
const (
	attrCCMajor  = 75
	attrCCMinor  = 76
	attrSMs      = 16
	poolRelease  = 4 // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
	streamNoSync = 1 // CU_STREAM_NON_BLOCKING
	hostMapped   = 2 // CU_MEMHOSTALLOC_DEVICEMAP
	hostPortable = 1 // CU_MEMHOSTALLOC_PORTABLE
	eventNoTime  = 2 // CU_EVENT_DISABLE_TIMING
)

// errNoGPU wraps a driver that is present but finds no usable GPU.
var errNoGPU = errors.New("cuda: no usable GPU")

// Device is a CUDA GPU. One goroutine locked to an OS thread owns the
// context and makes every driver call (CUDA contexts are per thread);
// queues record their ops and hand them to it in batches.
type Device struct {
	drv      *driver
	nv       *nvrtc
	ordinal  int
	ctx      uintptr
	name     string
	arch     string
	sms      int
	fmaTiles int // the fewest tiles an FMA product takes the tile kernel at (Options.FMATiles; 0: half of sms)
	drvVer   int
	nvVer    string
	totalMem int64
	fault    string
	graphs   bool // replay recurring batches as CUDA graphs
	// pdl launches kernels programmatically (launch.go); set by init,
	// cleared on the owner thread if the driver refuses a programmatic
	// graph edge.
	pdl       atomic.Bool
	prof      *profiler
	profPath  string
	fnNames   map[uintptr]string // kernel names, for the profile
	mmaMatMul bool               // BF16 weights on the tensor cores (Options.MatMul)
	// blockOwner is the one queue that may launch std_block_f32 as one
	// grid (see block.go: two such grids on two streams could wait on each
	// other's multiprocessors); nil until a queue first fuses a block so.
	// noBlock: none of Options.FusedBlock, GridBlock, OneKernelBlock.
	blockOwner atomic.Pointer[Queue]
	noBlock    bool
	// phasedBlock: std_block_f32 a phase a launch (not Options.GridBlock;
	// tests set it on devices of their own; the emulator always launches
	// a phase at a time).
	phasedBlock bool
	// oneKernelBlock: Options.OneKernelBlock (a phase a launch, each
	// launch the five-phase kernel).
	oneKernelBlock bool
	// noTiled: Options.NoTiledWeights (Load keeps no tiled copies).
	noTiled bool
	// devUploads: not Options.HostUploads (staging's mirror).
	devUploads bool
	// blas is cuBLAS for the prompt products (cublas.go), opened at the
	// first one (blasOnce); noBLAS: Options.NoCuBLAS.
	blas     *blas
	blasOnce sync.Once
	noBLAS   bool
	// resident is, for each kernel of normGridKernels, how many of its
	// blocks the GPU holds at once (multiprocessors × the driver's
	// occupancy at the most shared memory a fused norm takes), read once
	// at load; tilePerBlock: Options.TilePerBlock (normGrid then launches a
	// block a tile).
	resident     map[string]int
	tilePerBlock bool
	// logmel holds the log-mel specs' tables (logmel.go).
	logmel logmelCache

	mod      uintptr
	fns      map[string]uintptr
	compiled string // "compiled" or "cache"
	// census counts the launches of each kernel while a test counts them
	// (countLaunches): the kernel contract requires it reaches every one.
	census atomic.Pointer[census]

	work   chan func()
	exited chan struct{}
	// waits are the goroutines blocked on events the owner polls between
	// closures (owner thread only; see wait.go), napT its poll timer.
	waits  []waiter
	napT   *time.Timer
	query  func(ev uintptr) result // cuEventQuery (a fake in host tests)
	allocS uintptr                 // stream for allocation, zeroing and loads
	used   atomic.Int64
	mu     sync.RWMutex // guards closed (held shared while a closure is sent) and queues
	closed bool
	queues []*Queue
	// consts holds small constant arrays kernels read on every launch
	// (RoPE's inverse frequencies), uploaded once, keyed by their contents.
	constMu   sync.Mutex
	consts    map[string]*buffer
	closeOnce sync.Once
}

var (
	_ gpu.Device         = (*Device)(nil)
	_ gpu.Informer       = (*Device)(nil)
	_ gpu.BandwidthMeter = (*Device)(nil)
)

// buffer is device memory: a CUdeviceptr and its element type.
type buffer struct {
	ptr   uintptr
	dt    gpu.DType
	n     int
	bytes int64
	// last is the queue that last recorded an op on the buffer: Free
	// queues the release behind that queue's work (stream-ordered).
	last  atomic.Pointer[Queue]
	freed atomic.Bool
	// tiled is Load's copy of a bf16 matrix of tiledK columns in the
	// few-row products' tiled layout (tiled.go), freed with the buffer.
	tiled  *buffer
	tiledK int
}

func (b *buffer) DType() gpu.DType { return b.dt }
func (b *buffer) Len() int         { return b.n }

func openDevice(o Options) (*Device, error) {
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	nv, err := loadNVRTC()
	if err != nil {
		return nil, err
	}
	d := &Device{drv: drv, nv: nv, ordinal: o.Ordinal, fault: o.Fault, graphs: !o.NoGraphs, mmaMatMul: o.MatMul != "fma", noBlock: !o.FusedBlock && !o.GridBlock && !o.OneKernelBlock, phasedBlock: !o.GridBlock, oneKernelBlock: o.OneKernelBlock, noTiled: o.NoTiledWeights, devUploads: !o.HostUploads, noBLAS: o.NoCuBLAS, tilePerBlock: o.TilePerBlock, fmaTiles: o.FMATiles, work: make(chan func()), exited: make(chan struct{})}
	if o.Profile {
		p, err := newProfiler(drv)
		if err != nil {
			return nil, err
		}
		d.prof, d.profPath, d.graphs = p, o.profilePath, false
	}
	ready := make(chan error, 1)
	go d.owner(o, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

// owner is the goroutine that holds the context: it initialises the
// device, then runs every closure sent on d.work until the channel closes.
func (d *Device) owner(o Options, ready chan<- error) {
	runtime.LockOSThread()
	defer close(d.exited)
	if err := d.init(o); err != nil {
		ready <- err
		return
	}
	ready <- nil
	d.query = d.drv.queryEvent
	d.serve()
}

func (d *Device) init(o Options) error {
	c := d.drv
	if err := c.call("cuInit", c.cuInit, 0); err != nil {
		return fmt.Errorf("%w: %w", errNoGPU, err)
	}
	var ver int32
	if err := c.call("cuDriverGetVersion", c.cuDriverGetVersion, uintptr(unsafe.Pointer(&ver))); err != nil {
		return err
	}
	d.drvVer = int(ver)
	var dev int32
	if err := c.call("cuDeviceGet", c.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(o.Ordinal)); err != nil {
		return fmt.Errorf("cuda: GPU %d: %w", o.Ordinal, err)
	}
	name := make([]byte, 256)
	if err := c.call("cuDeviceGetName", c.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), 256, uintptr(dev)); err != nil {
		return err
	}
	d.name = goString(&name[0])
	attr := func(a int) int {
		var v int32
		c.call("cuDeviceGetAttribute", c.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev))
		return int(v)
	}
	d.arch = fmt.Sprintf("sm_%d%d", attr(attrCCMajor), attr(attrCCMinor))
	d.sms = attr(attrSMs)
	d.pdl.Store(pdlUsable(attr(attrCCMajor), c, o.NoPDL, d.prof != nil))
	var total uintptr
	c.call("cuDeviceTotalMem", c.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(dev))
	d.totalMem = int64(total)
	if err := c.call("cuDevicePrimaryCtxRetain", c.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(dev)); err != nil {
		return err
	}
	if err := c.call("cuCtxSetCurrent", c.cuCtxSetCurrent, d.ctx); err != nil {
		return err
	}
	// Keep freed memory in the pool (no trimming at every synchronisation).
	var pool uintptr
	if c.call("cuDeviceGetDefaultMemPool", c.cuDeviceGetDefaultMemPool, uintptr(unsafe.Pointer(&pool)), uintptr(dev)) == nil {
		thr := ^uint64(0)
		c.call("cuMemPoolSetAttribute", c.cuMemPoolSetAttribute, pool, poolRelease, uintptr(unsafe.Pointer(&thr)))
	}
	if err := c.call("cuStreamCreate", c.cuStreamCreate, uintptr(unsafe.Pointer(&d.allocS)), streamNoSync); err != nil {
		return err
	}
	maj, min := d.nv.Version()
	d.nvVer = fmt.Sprintf("%d.%d", maj, min)
	opts := d.moduleOptions(o.Fault)
	src, srcPath, err := kernelsToCompile()
	if err != nil {
		return err
	}
	file := cachePath(o.CacheDir, cacheKey(src, opts, d.drvVer, d.nvVer))
	if srcPath != "" {
		msg := fmt.Sprintf("cuda: kernels from %s (%s), not the binary's own", srcPath, KernelsEnv)
		if o.Log != nil {
			o.Log.Warn(msg)
		} else {
			fmt.Fprintln(os.Stderr, msg)
		}
	}
	cubin, cached, err := compileCached(d.nv, o.Log, d.arch, src, opts, file)
	if err != nil {
		return fmt.Errorf("cuda: compile kernels for %s: %w", d.arch, err)
	}
	d.compiled = "compiled"
	if cached {
		d.compiled = "cache"
	}
	if srcPath != "" {
		d.compiled += " of " + srcPath
	}
	if err := c.call("cuModuleLoadData", c.cuModuleLoadData, uintptr(unsafe.Pointer(&d.mod)), uintptr(unsafe.Pointer(&cubin[0]))); err != nil {
		if cached { // a stale or damaged cache entry: compile afresh
			cubin, err = d.nv.Compile(src, opts)
			if err == nil {
				err = c.call("cuModuleLoadData", c.cuModuleLoadData, uintptr(unsafe.Pointer(&d.mod)), uintptr(unsafe.Pointer(&cubin[0])))
			}
		}
		if err != nil {
			return fmt.Errorf("cuda: load kernels: %w", err)
		}
	}
	d.fns = make(map[string]uintptr, len(kernelNames))
	d.fnNames = make(map[uintptr]string, len(kernelNames))
	for _, k := range kernelNames {
		var f uintptr
		n := cString(k)
		if err := c.call("cuModuleGetFunction "+k, c.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), d.mod, uintptr(unsafe.Pointer(&n[0]))); err != nil {
			return err
		}
		d.fns[k] = f
		d.fnNames[f] = k
	}
	return d.readResidency()
}

// normGridKernels are the kernels that take their tiles in turn
// (MMV_NORM_TILES), so that their grid may be smaller than their tiles,
// each with the threads of the block fused.go launches it with: the
// fused-norm variants their own, the tiled twin and the SwiGLU kernels
// mmvNormDefault's.
func normGridKernels() map[string]uintptr {
	def := uintptr(mmvNormDefault.block()[0])
	m := map[string]uintptr{mmvNormTiled: def, "mmvng_bf16_w16": def, "mmvngt_bf16_w16": def}
	for _, v := range mmvNormVariants {
		m[v.name] = uintptr(v.block()[0])
	}
	return m
}

// readResidency fills d.resident on the owner thread: the driver's
// occupancy for each of normGridKernels at its block size and the most
// dynamic shared memory a fused norm asks (mmvNormMaxK floats), times the
// multiprocessors. A driver without the query (the host emulator), or one
// that refuses it, counts one block a multiprocessor, which is what these
// 512-thread kernels get on an H200 as well: the count only sizes a grid
// (normGrid), any count gives the same bits.
func (d *Device) readResidency() error {
	kernels := normGridKernels()
	d.resident = make(map[string]int, len(kernels))
	c := d.drv
	for k, threads := range kernels {
		f, ok := d.fns[k]
		if !ok {
			return fmt.Errorf("cuda: no kernel %q", k)
		}
		per := int32(1)
		if c.cuOccupancyMaxActiveBlocksPerMultiprocessor != 0 {
			if err := c.call("cuOccupancyMaxActiveBlocksPerMultiprocessor "+k, c.cuOccupancyMaxActiveBlocksPerMultiprocessor,
				uintptr(unsafe.Pointer(&per)), f, threads, uintptr(4*mmvNormMaxK)); err != nil {
				per = 1
			}
		}
		d.resident[k] = max(1, int(per)) * max(1, d.sms)
	}
	return nil
}

// KernelResources are what the compiler gave a kernel: registers a
// thread, bytes of local memory a thread (spilled registers among them)
// and bytes of static shared memory a block.
type KernelResources struct{ Registers, LocalBytes, SharedBytes int }

// KernelResources reports the kernel named's resources (cuFuncGetAttribute).
func (d *Device) KernelResources(name string) (KernelResources, error) {
	var r KernelResources
	err := d.do(func() error {
		f, ok := d.fns[name]
		if !ok {
			return fmt.Errorf("cuda: no kernel %q", name)
		}
		c := d.drv
		if c.cuFuncGetAttribute == 0 {
			return fmt.Errorf("cuda: the driver has no cuFuncGetAttribute")
		}
		// CU_FUNC_ATTRIBUTE_NUM_REGS, _LOCAL_SIZE_BYTES, _SHARED_SIZE_BYTES.
		for _, a := range []struct {
			v    *int
			attr uintptr
		}{{&r.Registers, 4}, {&r.LocalBytes, 3}, {&r.SharedBytes, 1}} {
			var v int32
			if err := c.call("cuFuncGetAttribute", c.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), a.attr, f); err != nil {
				return err
			}
			*a.v = int(v)
		}
		return nil
	})
	return r, err
}

// do runs f on the owner thread and waits for it.
func (d *Device) do(f func() error) error {
	var err error
	done := make(chan struct{})
	d.mu.RLock()
	if d.closed {
		d.mu.RUnlock()
		return gpu.ErrClosed
	}
	// The read lock is held across the send so that Close cannot close
	// the channel under it.
	d.work <- func() { err = f(); close(done) }
	d.mu.RUnlock()
	<-done
	return err
}

// Name implements gpu.Device.
func (d *Device) Name() string { return d.name }

// Emulated reports whether the device is omni-pipe's host emulator
// (package cudaemu): kernels run on the CPU, so it checks their results,
// never their speed or the hardware's ordering.
func (d *Device) Emulated() bool { return d.drv.emulated }

// Arch returns the architecture the kernels were compiled for ("sm_90").
func (d *Device) Arch() string { return d.arch }

// KernelSource says whether the kernels were compiled now or read from the
// disk cache.
func (d *Device) KernelSource() string { return d.compiled }

// Info implements gpu.Informer.
func (d *Device) Info() gpu.Info {
	drv := fmt.Sprintf("CUDA driver %d.%d, NVRTC %s", d.drvVer/1000, d.drvVer%1000/10, d.nvVer)
	if g := d.PromptGEMM(); g != "" {
		drv += ", " + g + " (prompts)"
	}
	return gpu.Info{
		Kind:     "cuda",
		Name:     fmt.Sprintf("%s (%s, %d SMs)", d.name, d.arch, d.sms),
		Driver:   drv,
		MemUsed:  d.used.Load(),
		MemTotal: d.totalMem,
	}
}

// Alloc implements gpu.Device: zeroed device memory.
func (d *Device) Alloc(dt gpu.DType, rows, cols int) gpu.Tensor {
	if rows < 0 || cols < 0 || dt.Size() == 0 {
		panic(fmt.Sprintf("cuda: alloc %v[%d,%d]", dt, rows, cols))
	}
	b, err := d.alloc(dt, rows*cols, nil)
	if err != nil {
		// Out of device memory is not a programmer error, but the gpu API
		// has no error here: callers size their memory against budgets.
		panic(fmt.Sprintf("cuda: alloc %v[%d,%d]: %v", dt, rows, cols, err))
	}
	return gpu.Tensor{Buf: b, Rows: rows, Cols: cols, Stride: cols}
}

// alloc allocates n elements of dt and fills them from data (zeroes when
// data is nil), finished before it returns.
func (d *Device) alloc(dt gpu.DType, n int, data []byte) (*buffer, error) {
	bytes := int64(n * dt.Size())
	sz := max(bytes, 256)
	sz = (sz + 255) &^ 255
	b := &buffer{dt: dt, n: n, bytes: sz}
	c := d.drv
	err := d.do(func() error {
		if err := c.call("cuMemAllocAsync", c.cuMemAllocAsync, uintptr(unsafe.Pointer(&b.ptr)), uintptr(sz), d.allocS); err != nil {
			return err
		}
		if data != nil && len(data) > 0 {
			if err := c.call("cuMemcpyHtoDAsync", c.cuMemcpyHtoDAsync, b.ptr, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), d.allocS); err != nil {
				return err
			}
		} else if err := c.call("cuMemsetD32Async", c.cuMemsetD32Async, b.ptr, 0, uintptr(sz/4), d.allocS); err != nil {
			return err
		}
		return c.call("cuStreamSynchronize", c.cuStreamSynchronize, d.allocS)
	})
	runtime.KeepAlive(data)
	if err != nil {
		return nil, err
	}
	d.used.Add(sz)
	return b, nil
}

// Load implements gpu.Device: the bytes are copied to device memory.
func (d *Device) Load(dt gpu.DType, rows, cols int, data []byte) (gpu.Tensor, error) {
	n := rows * cols
	if rows < 0 || cols < 0 || dt.Size() == 0 || len(data) != n*dt.Size() {
		return gpu.Tensor{}, fmt.Errorf("cuda: load %v[%d,%d] from %d bytes", dt, rows, cols, len(data))
	}
	b, err := d.alloc(dt, n, data)
	if err != nil {
		return gpu.Tensor{}, fmt.Errorf("cuda: load %v[%d,%d]: %w", dt, rows, cols, err)
	}
	if dt == gpu.BF16 && d.mmaMatMul && !d.noTiled && tileable(rows, cols) {
		// The few-row products' copy (tiled.go). Without it (no memory
		// left for it) they read the rows: slower, the same bits.
		if tb, err := d.alloc(gpu.BF16, tiledLen(rows, cols), tileBF16(data, rows, cols)); err == nil {
			b.tiled, b.tiledK = tb, cols
		}
	}
	return gpu.Tensor{Buf: b, Rows: rows, Cols: cols, Stride: cols}, nil
}

// Free implements gpu.Device. The release (of the buffer and its tiled
// copy) is stream-ordered: it is queued behind the work already recorded on
// the last queue that used the buffer (a use of the copy counts as one of
// the buffer: Queue.tiled), so memory is not reused before that work ends.
func (d *Device) Free(t gpu.Tensor) {
	b, ok := t.Buf.(*buffer)
	if !ok || b == nil || b.freed.Swap(true) {
		return
	}
	q := b.last.Load()
	for _, fb := range []*buffer{b, b.tiled} {
		if fb == nil {
			continue
		}
		d.used.Add(-fb.bytes)
		if q != nil && q.enqueueFree(fb) {
			continue
		}
		c := d.drv
		d.do(func() error { return c.call("cuMemFreeAsync", c.cuMemFreeAsync, fb.ptr, d.allocS) })
	}
}

// NewQueue implements gpu.Device: a CUDA stream.
func (d *Device) NewQueue(name string) gpu.Queue { return d.newQueue(name, false) }

// NewPriorityQueue implements gpu.PriorityQueuer. With
// OMNIPIPE_CUDA_PRIORITY=on it is a CUDA stream of the device's greatest
// priority, whose blocks the GPU schedules before those of the other
// streams as multiprocessors free up (running blocks are not preempted);
// by default, and where the driver has no stream priorities, a plain
// stream. Not the default because on an H200 (2026-12-02, 17:54 UTC) the
// codec's call fell from 1.73 to 1.34 ms but the backbone's audio step,
// which the next frame waits for, rose from 1.31 to 1.64 ms: 4.1 ms of
// wall time a frame against 3.8, first audio no sooner (25–27 ms).
func (d *Device) NewPriorityQueue(name string) gpu.Queue { return d.newQueue(name, true) }

func (d *Device) newQueue(name string, high bool) gpu.Queue {
	q := &Queue{d: d, name: name}
	c := d.drv
	high = high && c.cuStreamCreateWithPriority != 0 && c.cuCtxGetStreamPriorityRange != 0 && os.Getenv("OMNIPIPE_CUDA_PRIORITY") == "on"
	if err := d.do(func() error {
		if high {
			var least, greatest int32
			if err := c.call("cuCtxGetStreamPriorityRange", c.cuCtxGetStreamPriorityRange, uintptr(unsafe.Pointer(&least)), uintptr(unsafe.Pointer(&greatest))); err != nil {
				return err
			}
			if err := c.call("cuStreamCreateWithPriority", c.cuStreamCreateWithPriority, uintptr(unsafe.Pointer(&q.stream)), streamNoSync, uintptr(greatest)); err != nil {
				return err
			}
			q.priority = int(greatest)
		} else if err := c.call("cuStreamCreate", c.cuStreamCreate, uintptr(unsafe.Pointer(&q.stream)), streamNoSync); err != nil {
			return err
		}
		return c.call("cuEventCreate", c.cuEventCreate, uintptr(unsafe.Pointer(&q.st.ev)), eventNoTime)
	}); err != nil {
		q.err = err
	}
	d.mu.Lock()
	d.queues = append(d.queues, q)
	d.mu.Unlock()
	return q
}

// Close implements gpu.Device: it waits for every queue, then releases the
// context's resources and stops the owner goroutine.
func (d *Device) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.writeStats()
		d.mu.Lock()
		qs := append([]*Queue(nil), d.queues...)
		d.mu.Unlock()
		for _, q := range qs {
			if e := q.Sync(); e != nil && err == nil {
				err = e
			}
		}
		c := d.drv
		d.do(func() error {
			c.call("cuCtxSynchronize", c.cuCtxSynchronize)
			for _, q := range qs {
				for _, e := range q.graphs.entries {
					q.destroyGraph(e)
				}
				q.st.free(c)
				for _, sp := range q.spare {
					sp.free(c)
				}
				q.spare = nil
				if q.pin.host != 0 {
					c.call("cuMemFreeHost", c.cuMemFreeHost, q.pin.host)
				}
				if q.readEv != 0 {
					c.call("cuEventDestroy", c.cuEventDestroy, q.readEv)
				}
				c.call("cuStreamDestroy", c.cuStreamDestroy, q.stream)
			}
			d.closeBLAS()
			c.call("cuModuleUnload", c.cuModuleUnload, d.mod)
			c.call("cuStreamDestroy", c.cuStreamDestroy, d.allocS)
			c.call("cuDevicePrimaryCtxRelease", c.cuDevicePrimaryCtxRelease, uintptr(d.ordinal))
			return nil
		})
		d.mu.Lock()
		d.closed = true
		close(d.work)
		d.mu.Unlock()
		<-d.exited
		d.writeProfileFile()
	})
	return err
}

// MeasureBandwidth implements gpu.BandwidthMeter: the best of five passes
// of four device-to-device copies of 512 MiB (far beyond the L2 cache; four
// so the host's hand-over and wait are a small part of a pass), counting
// bytes read plus bytes written.
func (d *Device) MeasureBandwidth() (float64, error) {
	const n, copies = 512 << 20, 4
	src, err := d.alloc(gpu.BF16, n/2, nil)
	if err != nil {
		return 0, err
	}
	dst, err := d.alloc(gpu.BF16, n/2, nil)
	if err != nil {
		d.Free(gpu.Tensor{Buf: src})
		return 0, err
	}
	defer d.Free(gpu.Tensor{Buf: src})
	defer d.Free(gpu.Tensor{Buf: dst})
	c := d.drv
	best := time.Duration(1 << 62)
	for pass := range 6 {
		start := time.Now()
		if err := d.do(func() error {
			for range copies {
				if err := c.call("cuMemcpyDtoDAsync", c.cuMemcpyDtoDAsync, dst.ptr, src.ptr, n, d.allocS); err != nil {
					return err
				}
			}
			return c.call("cuStreamSynchronize", c.cuStreamSynchronize, d.allocS)
		}); err != nil {
			return 0, err
		}
		if pass > 0 { // the first pass warms up
			best = min(best, time.Since(start))
		}
	}
	return 2 * n * copies / best.Seconds(), nil
}

// census counts launches by kernel name.
type census struct {
	mu sync.Mutex
	n  map[string]int
}

// countLaunches starts counting launches by kernel name (from zero) and
// returns a function that stops counting and returns the counts.
func (d *Device) countLaunches() func() map[string]int {
	c := &census{n: map[string]int{}}
	d.census.Store(c)
	return func() map[string]int {
		d.census.CompareAndSwap(c, nil)
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.n
	}
}
