package cuda

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// result is a CUresult.
type result uintptr

const (
	cudaSuccess  result = 0
	rtldNowGlobl        = purego.RTLD_NOW | purego.RTLD_GLOBAL
)

// Error is a failed CUDA driver, NVRTC or cuBLAS call.
type Error struct {
	Call string
	Code int
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Msg, e.Code)
	}
	return fmt.Sprintf("cuda: %s: error %d", e.Call, e.Code)
}

// ErrNoDriver reports that libcuda.so.1 could not be loaded.
var ErrNoDriver = errors.New("no CUDA driver: libcuda.so.1 not found")

// driver holds the entry points of libcuda this backend calls. Each is a
// raw symbol address called through purego.SyscallN (no reflection on the
// hot path).
type driver struct {
	h        uintptr
	emulated bool // omni-pipe's host emulator (package cudaemu), not a GPU

	// The entry points loadDriver resolves.
	cuInit, cuDriverGetVersion, cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute, cuDeviceTotalMem                          uintptr
	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuCtxSetCurrent, cuCtxSynchronize, cuGetErrorString, cuMemAllocAsync uintptr
	cuMemFreeAsync, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync            uintptr
	cuMemcpyDtoDAsync, cuMemsetD32Async, cuStreamCreate, cuStreamDestroy, cuStreamSynchronize, cuEventCreate                  uintptr
	cuEventDestroy, cuEventRecord, cuEventSynchronize, cuEventQuery, cuModuleLoadData, cuModuleUnload, cuModuleGetFunction    uintptr
	cuLaunchKernel, cuGraphInstantiate, cuGraphLaunch, cuGraphDestroy, cuGraphExecDestroy, cuGraphCreate                      uintptr
	cuGraphAddKernelNode, cuGraphExecKernelNodeSetParams, cuDeviceGetDefaultMemPool, cuMemPoolSetAttribute                    uintptr

	// Optional entry points (0 where the driver lacks them): programmatic
	// dependent launch (launch.go); stream priorities (NewPriorityQueue);
	// a kernel's registers and spills (KernelResources); how many blocks
	// of a kernel a multiprocessor holds (readResidency).
	cuGraphAddDependencies, cuLaunchKernelEx                uintptr
	cuStreamCreateWithPriority, cuCtxGetStreamPriorityRange uintptr
	cuFuncGetAttribute                                      uintptr
	cuOccupancyMaxActiveBlocksPerMultiprocessor             uintptr
}

var (
	drvOnce sync.Once
	drv     *driver
	drvErr  error
)

// DriverEnv names a driver library to load instead of libcuda.so.1 (a
// path), and NVRTCEnv one to load instead of libnvrtc. The host emulator
// (package cudaemu) is loaded through them.
const (
	DriverEnv = "OMNIPIPE_CUDA_DRIVER"
	NVRTCEnv  = "OMNIPIPE_NVRTC"
)

// loadDriver dlopens libcuda.so.1 (or $OMNIPIPE_CUDA_DRIVER) once per
// process.
func loadDriver() (*driver, error) {
	drvOnce.Do(func() {
		lib := "libcuda.so.1"
		if p := os.Getenv(DriverEnv); p != "" {
			lib = p
		}
		h, err := purego.Dlopen(lib, rtldNowGlobl)
		if err != nil {
			drvErr = ErrNoDriver
			if lib != "libcuda.so.1" {
				drvErr = fmt.Errorf("%w (%s=%s: %v)", ErrNoDriver, DriverEnv, lib, err)
			}
			return
		}
		d := &driver{h: h}
		if _, err := purego.Dlsym(h, "omniCudaEmulator"); err == nil {
			d.emulated = true
		}
		syms := []struct {
			p    *uintptr
			name string
		}{
			{&d.cuInit, "cuInit"}, {&d.cuDriverGetVersion, "cuDriverGetVersion"},
			{&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetName, "cuDeviceGetName"},
			{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"}, {&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
			{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
			{&d.cuCtxSetCurrent, "cuCtxSetCurrent"}, {&d.cuCtxSynchronize, "cuCtxSynchronize"},
			{&d.cuGetErrorString, "cuGetErrorString"},
			{&d.cuMemAllocAsync, "cuMemAllocAsync"}, {&d.cuMemFreeAsync, "cuMemFreeAsync"},
			{&d.cuMemHostAlloc, "cuMemHostAlloc"}, {&d.cuMemFreeHost, "cuMemFreeHost"},
			{&d.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"},
			{&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"}, {&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
			{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"}, {&d.cuMemsetD32Async, "cuMemsetD32Async"},
			{&d.cuStreamCreate, "cuStreamCreate"}, {&d.cuStreamDestroy, "cuStreamDestroy_v2"},
			{&d.cuStreamSynchronize, "cuStreamSynchronize"}, {&d.cuEventCreate, "cuEventCreate"}, {&d.cuEventDestroy, "cuEventDestroy_v2"},
			{&d.cuEventRecord, "cuEventRecord"}, {&d.cuEventSynchronize, "cuEventSynchronize"}, {&d.cuEventQuery, "cuEventQuery"},
			{&d.cuModuleLoadData, "cuModuleLoadData"}, {&d.cuModuleUnload, "cuModuleUnload"},
			{&d.cuModuleGetFunction, "cuModuleGetFunction"}, {&d.cuLaunchKernel, "cuLaunchKernel"},
			{&d.cuGraphInstantiate, "cuGraphInstantiateWithFlags"}, {&d.cuGraphLaunch, "cuGraphLaunch"},
			{&d.cuGraphDestroy, "cuGraphDestroy"}, {&d.cuGraphExecDestroy, "cuGraphExecDestroy"},
			{&d.cuGraphCreate, "cuGraphCreate"},
			{&d.cuGraphAddKernelNode, "cuGraphAddKernelNode_v2"},
			{&d.cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2"},
			{&d.cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool"}, {&d.cuMemPoolSetAttribute, "cuMemPoolSetAttribute"},
		}
		for _, s := range syms {
			p, err := purego.Dlsym(h, s.name)
			if err != nil {
				drvErr = fmt.Errorf("cuda: libcuda.so.1 lacks %s (driver too old?)", s.name)
				return
			}
			*s.p = p
		}
		for _, s := range []struct {
			p    *uintptr
			name string
		}{{&d.cuGraphAddDependencies, "cuGraphAddDependencies_v2"}, {&d.cuLaunchKernelEx, "cuLaunchKernelEx"},
			{&d.cuStreamCreateWithPriority, "cuStreamCreateWithPriority"}, {&d.cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"},
			{&d.cuFuncGetAttribute, "cuFuncGetAttribute"},
			{&d.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor"}} {
			if p, err := purego.Dlsym(h, s.name); err == nil {
				*s.p = p
			}
		}
		drv = d
	})
	return drv, drvErr
}

// call invokes a driver entry point and turns a non-zero CUresult into an
// *Error naming the call.
func (d *driver) call(name string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	if result(r) == cudaSuccess {
		return nil
	}
	return d.err(name, result(r))
}

func (d *driver) err(name string, r result) error {
	e := &Error{Call: name, Code: int(r)}
	var s *byte
	if d.cuGetErrorString == 0 { // a host test's fake driver
		return e
	}
	if x, _, _ := purego.SyscallN(d.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&s))); x == 0 && s != nil {
		e.Msg = goString(s)
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cString returns a NUL-terminated copy of s (keep it alive across the call).
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}
