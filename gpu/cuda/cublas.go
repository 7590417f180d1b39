package cuda

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/omni-pipe/omni-pipe/gpu"
)

// The prompt products (gpu.PromptMatMuler) on cuBLAS.
//
// The backend's own products sum every output in one order that depends
// on K only (16 classes of 64-wide superblocks), so a row is the same
// floats in any batch — what decode steps need. That order keeps the
// many-row tile kernel (mma_bf16_big) at 60–150 TFLOP/s, a fifth of what
// the H200's tensor cores do through wgmma. A prompt's rows need only
// agree with their steps within the stated tolerance, so MatMulPrompt
// hands their products to cuBLAS (cublasGemmEx: bf16 × bf16, fp32
// accumulation and output), whose order depends on the shape. x is split
// as for the tile kernels (split_bf16) and only its hi part (x rounded to
// bf16: x itself, for the bf16 activations the op takes) is multiplied; a
// bias is added after (AddRow: the sum, then + bias, as the own kernels).
//
// libcublas is opened the first time a prompt product runs (on the owner
// thread: cuBLAS binds the current context); where it is missing, or with
// OMNIPIPE_CUDA_CUBLAS=off (Options.NoCuBLAS), MatMulPrompt is MatMul.
// The host emulator (package cudaemu) exports the few entry points used,
// with a plain fp32 loop for the GEMM, so CI runs this path and its
// planted fault too. A batch holding a GEMM is launched directly, never
// as a graph (a library call is not a kernel node): prefill batches
// rarely recur anyway.

// cuBLAS constants (cublas_api.h, library_types.h).
const (
	cublasOpN       = 0
	cublasOpT       = 1
	cudaR32F        = 0
	cudaR16BF       = 14
	cublasCompute32 = 68
	cublasGemmDflt  = -1
)

// promptMinRows is the fewest rows a prompt product hands to cuBLAS. On
// the H200 (BenchmarkPromptProducts, docs/performance.md) 32 rows took
// 17–26 µs on cuBLAS against 27–35 µs on the own kernels for the
// backbone's [8192, 2048], [6144, 2048] and [2048, 8192] weights, and 15
// against 11 µs for [2048, 2048]; fewer rows were not measured on it.
const promptMinRows = 32

// promptWorkspace is each queue's cuBLAS workspace: NVIDIA advises 32 MiB
// on Hopper; a handle shared by several streams must not share one.
const promptWorkspace = 32 << 20

// blas is libcublas's entry points and the device's handle (owner thread).
type blas struct {
	h                                              uintptr
	create, destroy, setStream, setWorkspace, gemm uintptr
	handle                                         uintptr
	version                                        int
}

// gemmCmd is one recorded GEMM in cuBLAS's column-major terms: C[m×n] =
// op(A)·B, A = the weights (transposed), B = x's bf16 rows, C = dst.
type gemmCmd struct {
	m, n, k       int
	a, b, c       uintptr
	lda, ldb, ldc int
	ws            uintptr
}

// loadBLAS opens libcublas (or the emulator's entry points) on the owner
// thread and creates the device's handle; nil with the reason where it
// cannot.
func (d *Device) loadBLAS() (*blas, error) {
	var h uintptr
	var err error
	if d.drv.emulated {
		h = d.drv.h
	} else {
		for _, lib := range []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"} {
			if h, err = purego.Dlopen(lib, rtldNowGlobl); err == nil {
				break
			}
		}
		if h == 0 {
			return nil, fmt.Errorf("cuda: no cuBLAS (libcublas.so.13/12): %v", err)
		}
	}
	b := &blas{h: h}
	for _, s := range []struct {
		p    *uintptr
		name string
	}{{&b.create, "cublasCreate_v2"}, {&b.destroy, "cublasDestroy_v2"}, {&b.setStream, "cublasSetStream_v2"},
		{&b.setWorkspace, "cublasSetWorkspace_v2"}, {&b.gemm, "cublasGemmEx"}} {
		if *s.p, err = purego.Dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("cuda: cuBLAS lacks %s", s.name)
		}
	}
	if r, _, _ := purego.SyscallN(b.create, uintptr(unsafe.Pointer(&b.handle))); r != 0 {
		return nil, &Error{Call: "cublasCreate_v2", Code: int(r)}
	}
	if v, err := purego.Dlsym(h, "cublasGetVersion_v2"); err == nil {
		var ver int32
		purego.SyscallN(v, b.handle, uintptr(unsafe.Pointer(&ver)))
		b.version = int(ver)
	}
	return b, nil
}

// runGemm runs a recorded GEMM on q's stream (owner thread).
func (q *Queue) runGemm(g *gemmCmd) error {
	b := q.d.blas // set by haveBLAS before any GEMM was recorded
	if b == nil {
		return fmt.Errorf("cuda: a prompt product was recorded but cuBLAS is gone")
	}
	// cublasSetStream resets the workspace to the handle's default: set
	// the stream first, then this queue's own workspace.
	if r, _, _ := purego.SyscallN(b.setStream, b.handle, q.stream); r != 0 {
		return &Error{Call: "cublasSetStream_v2", Code: int(r)}
	}
	if r, _, _ := purego.SyscallN(b.setWorkspace, b.handle, g.ws, promptWorkspace); r != 0 {
		return &Error{Call: "cublasSetWorkspace_v2", Code: int(r)}
	}
	alpha, beta := float32(1), float32(0)
	r, _, _ := purego.SyscallN(b.gemm, b.handle, cublasOpT, cublasOpN, uintptr(g.m), uintptr(g.n), uintptr(g.k),
		uintptr(unsafe.Pointer(&alpha)), g.a, cudaR16BF, uintptr(g.lda), g.b, cudaR16BF, uintptr(g.ldb),
		uintptr(unsafe.Pointer(&beta)), g.c, cudaR32F, uintptr(g.ldc), cublasCompute32, uintptr(cublasGemmDflt&0xffffffff))
	if r != 0 {
		return &Error{Call: fmt.Sprintf("cublasGemmEx %d×%d×%d", g.m, g.n, g.k), Code: int(r)}
	}
	return nil
}

// promptOK reports whether MatMulPrompt hands dst = x·wᵀ to cuBLAS: 32
// rows or more of bf16 weights on the tensor-core products, every
// operand row 16-byte aligned.
func (q *Queue) promptOK(dst, x, w gpu.Tensor) bool {
	M, K := x.Rows, x.Cols
	return !q.d.noBLAS && M >= promptMinRows && K > 0 && w.Rows > 0 && w.DType() == gpu.BF16 &&
		!q.fp32 && q.tensorCores() && w.Stride >= K && dst.Stride >= w.Rows &&
		// Every operand row 16-byte aligned (x's bf16 copy always is):
		// cuBLAS picks its kernel by the shape and by the operands'
		// alignment, so unaligned rows would make a row's floats depend
		// on where the batch's buffers happen to lie.
		w.Stride%8 == 0 && q.ptr(w)%16 == 0 && dst.Stride%4 == 0 && q.ptr(dst)%16 == 0
}

// MatMulPrompt implements gpu.PromptMatMuler.
func (q *Queue) MatMulPrompt(dst, x, w, bias gpu.Tensor) {
	M, K, N := x.Rows, x.Cols, w.Rows
	if w.Cols != K || dst.Rows != M || dst.Cols != N || (!bias.IsNil() && bias.Len() < N) {
		panic(fmt.Sprintf("cuda: prompt matmul %v · %vᵀ -> %v (bias %v)", x, w, dst, bias))
	}
	wantF32("matmul", dst, x)
	if !q.promptOK(dst, x, w) || !q.d.haveBLAS() {
		q.MatMul(dst, x, w, bias)
		return
	}
	if q.blasWS == nil {
		q.grow(&q.blasWS, gpu.I32, promptWorkspace/4)
	}
	xs, _, Kp := q.splitRows(x)
	g := &gemmCmd{m: N, n: M, k: K, a: uintptr(q.ptr(w)), lda: w.Stride, b: uintptr(q.ptr(xs)), ldb: Kp,
		c: uintptr(q.ptr(dst)), ldc: dst.Stride, ws: uintptr(q.ptr(gpu.Tensor{Buf: q.blasWS, Rows: 1, Cols: 1, Stride: 1}))}
	if q.d.fault == "PROMPT" {
		g.b += uintptr(2 * Kp) // planted fault: x read one row late
	}
	q.recordGemm(g)
	if !bias.IsNil() {
		q.AddRow(dst, dst, bias)
	}
}

// haveBLAS reports whether the device has cuBLAS, opening it on the owner
// thread the first time (MatMulPrompt asks before it records a GEMM, so
// d.blas is set before runGemm reads it there).
func (d *Device) haveBLAS() bool {
	if d.noBLAS {
		return false
	}
	d.blasOnce.Do(func() {
		d.do(func() error {
			b, err := d.loadBLAS()
			if err != nil {
				fmt.Fprintf(os.Stderr, "cuda: prompt products on the backend's own kernels: %v\n", err)
				return nil
			}
			d.blas = b
			return nil
		})
	})
	return d.blas != nil
}

// PromptGEMM names what the prompt products run on: "cuBLAS <version>",
// "cuBLAS (emulated)" on the host emulator, or "" where they are MatMul
// (no cuBLAS, or Options.NoCuBLAS).
func (d *Device) PromptGEMM() string {
	switch {
	case !d.haveBLAS():
		return ""
	case d.drv.emulated:
		return "cuBLAS (emulated)"
	}
	v := d.blas.version
	return fmt.Sprintf("cuBLAS %d.%d.%d", v/10000, v/100%100, v%100)
}

// closeBLAS destroys the handle (owner thread, before the context goes).
func (d *Device) closeBLAS() {
	if d.blas != nil {
		purego.SyscallN(d.blas.destroy, d.blas.handle)
		d.blas = nil
	}
}

// recordGemm appends a GEMM to the batch being recorded (like launch).
func (q *Queue) recordGemm(g *gemmCmd) {
	q.mu.Lock()
	q.fuse = fused{}
	r := &q.rec
	if len(r.cmds) == 0 {
		q.stats.recStart = time.Now()
	}
	r.cmds = append(r.cmds, cmd{gemm: g})
	n := len(r.cmds)
	q.mu.Unlock()
	if n >= maxBatch {
		q.flush()
	}
}
