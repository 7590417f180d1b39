package cpu

import (
	"os"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
)

//go:generate go run gen_kernels.go

// KernelsEnv names the environment variable that selects the CPU kernels:
// "go" forces the portable pure-Go kernels even where the AVX2+FMA assembly
// could run (for comparison and debugging); anything else, or nothing,
// picks the fastest kernels the CPU supports.
const KernelsEnv = "OMNIPIPE_CPU_KERNELS"

// tileArgs is the argument block of the assembly tile kernels. The field
// order and offsets are fixed by gen_kernels.go: change both together.
type tileArgs struct {
	x    unsafe.Pointer // x[m0, k0] (F32)
	xs   uintptr        // x row stride in bytes
	w    unsafe.Pointer // w[n0, k0] (dot) or w[k0, n0] (axpy), of the kernel's dtype
	ws   uintptr        // w row stride in bytes
	k    uintptr        // dot: steps of 8 along K; axpy: steps of 1
	acc  unsafe.Pointer // dot: spilled accumulators, mr·nr·8 floats
	out  unsafe.Pointer // dst[m0, n0] (F32)
	os   uintptr        // dst row stride in bytes
	mode uintptr        // modeLoad | modeStore
}

// Kernel modes.
const (
	// modeLoad starts from the accumulators in acc (dot) or the values in
	// out (axpy) instead of zero.
	modeLoad = 1
	// modeStore makes a dot kernel store its raw accumulators to acc
	// instead of reducing them into out (a K block that is not the last).
	modeStore = 2
)

// dtIndex maps a weight dtype to the first index of the kernel tables.
func dtIndex(dt gpu.DType) int {
	switch dt {
	case gpu.F32:
		return 0
	case gpu.BF16:
		return 1
	case gpu.F16:
		return 2
	}
	return -1
}

// defaultAsm reports whether new devices use the assembly kernels.
func defaultAsm() bool {
	return haveAsm && os.Getenv(KernelsEnv) != "go"
}

// kernelName describes the kernels a device runs.
func kernelName(asm bool) string {
	if asm {
		return "avx2+fma"
	}
	return "pure Go"
}
