// Package cuda is the NVIDIA backend of package gpu.
//
// # Loading
//
// libcuda.so.1 and libnvrtc are opened at run time through purego, so the
// binary stays CGO_ENABLED=0 and runs unchanged where there is no GPU: New
// then fails with ErrNoDriver ("no CUDA driver: libcuda.so.1 not found").
// The kernels (kernels.cu, embedded) are compiled by NVRTC for the device's
// own architecture (sm_90 machine code on an H200, not PTX left to the
// driver) with contraction off (--fmad=false: every rounding point is the
// one written; explicit fmaf stays fused), and the cubin is cached on disk
// under os.UserCacheDir()/omni-pipe/cuda, keyed by the source, the options,
// the architecture, the driver and the NVRTC version (at most 1 GiB: the
// least recently used modules are pruned first). A first compile takes
// about a minute on an H200's host; Options.Log is told before and after.
// OMNIPIPE_CUDA_DRIVER and OMNIPIPE_NVRTC name other libraries to load
// in their place: package cudaemu builds one, a host-CPU emulator of both
// that runs this backend's tests where there is no GPU (Device.Emulated).
// OMNIPIPE_CUDA_KERNELS=FILE compiles FILE in place of the embedded
// kernels (the same kernels and parameters, changed bodies): an A/B of a
// kernel change in one session on a machine without a Go toolchain.
// libcublas (.so.13 or .12) is opened at the first prompt product
// (gpu.PromptMatMuler, cublas.go) and is optional: without it, or with
// OMNIPIPE_CUDA_CUBLAS=off, a prompt's products run on the own kernels.
//
// # Threads, streams, memory
//
// CUDA contexts are per OS thread: one goroutine locked to its thread owns
// the primary context and makes every driver call. A gpu.Queue is a CUDA
// stream. Its ops are recorded by the calling goroutine (kernel, grid,
// arguments; host data such as token ids and positions copied into the
// batch) and handed to the owner thread at Read, Sync and every 128 ops, so
// that the GPU runs one chunk of a stage while the host records the next;
// the host waits only in Read and Sync (and for upload memory an earlier
// launch still reads), and never on the owner thread: the owner records an
// event behind the work, the waiting goroutine blocks on a channel, and
// the owner polls its waiting events between the closures it runs
// (wait.go), so one queue's wait does not stop the others' launches. Reads
// land in pinned memory. Memory comes from the
// driver's stream-ordered pool: Alloc and Load finish before they return;
// Free is queued behind the work already recorded on the last queue that
// used the buffer, so memory is never reused under queued work. Stages hand
// data to each other through the host, so streams need no events between
// them; the codec's queue runs beside the backbone's.
//
// # Graphs and folding
//
// A chunk that recurs (of a backbone step, a depthformer frame, a codec
// call) is replayed as a CUDA graph, one per launch shape (and so per
// batch-size bucket), built the second time the shape is seen, with its own
// pinned upload staging (so chunks in flight never wait for each other's);
// nodes whose arguments changed (positions, cache lengths) are updated in
// place before the launch, at about 15 µs of host time each. A RoundBF16, an activation, a norm's row weight or an
// Add/Mul with another buffer that follows an op on exactly its output is
// folded into that op's kernel: the same float operations in the same
// order, one kernel fewer. The batched ops of package gpu (CopyRows,
// CopyMany, AttentionSeqs, ShortConvSeqs; seqs.go) and PrepHeads carry
// their per-sequence pointers, positions and counts in the launch's
// uploaded bytes, so as the sessions of a step advance a replayed graph
// sees new data, not node updates, and a step's launches do not grow with
// its sessions. On compute capability 9.0 and later every kernel is
// launched programmatically (launch.go): it may be scheduled while the one
// before it runs and waits in griddepcontrol.wait, after at most an L2
// prefetch of its weights, so launch latency overlaps work.
//
// # Numerics
//
// Activations are fp32 and every op rounds only where the network asks
// (RoundBF16), as on the CPU. Matrix products sum each output in an order
// that depends only on K (for BF16 weights the tensor cores' by default,
// the FMA kernels' with Options.MatMul "fma" or on a gpu.FP32Products
// queue; every other weight type the FMA kernels'), so a row's bits never
// depend on the batch it is computed in. The FMA order has two kernels with
// the same bits: 8 × 4 warp tiles and, where 64 × 64 tiles fill the
// multiprocessors (half of them), matmul_t64_*, one thread per output replaying the warp
// butterfly's tree. Attention reproduces the reference flash kernels' rounding of
// exp(s − m) to bf16 when AttnParams.ProbBF16 is set. Sample equals
// gpu.SampleHost bit for bit (float64 in the specified order, exp written
// out in plain operations). Every kernel is checked
// against a float64 host replay (package gputest) with a planted fault the
// check must catch (faults.go); see TestKernelContract.
package cuda

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Options configures New.
type Options struct {
	// Ordinal selects the GPU (0: the first).
	Ordinal int
	// CacheDir holds compiled kernels ("": the user's cache directory,
	// os.UserCacheDir()/omni-pipe/cuda; "-": no disk cache).
	CacheDir string
	// Log, when set, is told when the kernels must be compiled (the first
	// use on a machine, about a minute) and how long that took, so that a
	// first start does not look hung.
	Log *slog.Logger
	// Fault compiles the kernels with a planted fault (the kernel contract's
	// controls; see faults.go). Empty for the real kernels.
	Fault string
	// NoGraphs launches every batch kernel by kernel instead of replaying
	// recurring batches as CUDA graphs (for measurements and debugging;
	// env OMNIPIPE_CUDA_GRAPHS=off does the same).
	NoGraphs bool
	// NoPDL launches kernels without programmatic dependent launch (each
	// kernel then starts only after the one before it has ended; env
	// OMNIPIPE_CUDA_PDL=off does the same). See launch.go.
	NoPDL bool
	// FusedBlock runs each one-row gpu.Block through std_block_f32, its
	// five phases a launch each (env OMNIPIPE_CUDA_BLOCK=phased), instead
	// of as its op sequence (the default; =off). The floats are the same;
	// on the H200 the op sequence measured faster since its kernels got
	// their fused norms and exact-bf16 paths (a one-session frame 1.77–1.80
	// against 1.88–1.92 ms, 2026-12-02, docs/performance.md). See block.go.
	FusedBlock bool
	// GridBlock launches std_block_f32 as one grid whose phases are
	// separated by grid-wide barriers (env OMNIPIPE_CUDA_BLOCK=grid;
	// implies FusedBlock). A phase a launch measured faster on the H200
	// with the tiled weights (a one-session frame 2.14 against 2.29 ms).
	GridBlock bool
	// OneKernelBlock launches std_block_f32 a phase at a time as
	// FusedBlock does, but each launch the kernel that holds all five
	// phases instead of the kernel of that phase alone (std_block_f32_p<n>;
	// for A/B measurements; env OMNIPIPE_CUDA_BLOCK=onekernel; implies
	// FusedBlock). See block.go.
	OneKernelBlock bool
	// NoTiledWeights keeps no tiled copy of the bf16 weights (tiled.go):
	// the few-row tensor-core products then read their rows (for A/B
	// measurements and on a GPU short of memory: the copies take as much
	// again as the matrices they copy; env OMNIPIPE_CUDA_TILED=off).
	NoTiledWeights bool
	// HostUploads leaves each batch's uploaded bytes (kernels' tables,
	// positions, ids, sampling arguments) in pinned host memory, where the
	// kernels read them across the host link (env
	// OMNIPIPE_CUDA_UPLOADS=host). By default one asynchronous copy ahead
	// of the batch's kernels puts them in device memory: on the H200 a
	// one-row backbone step took 1.39–1.41 ms that way against 1.52–1.57
	// with them in host memory (docs/performance.md).
	HostUploads bool
	// MatMul selects the kernels of BF16-weight products: "mma" (the
	// default: tensor cores, x split into three bf16 parts, the sums in
	// one K-only order from one row to thousands) or "fma" (CUDA cores,
	// fp32 FMA: faster one-row steps on small weights, 2× slower prefill,
	// 3–4× slower products of many rows); env OMNIPIPE_CUDA_MATMUL. A
	// queue of an fp32 network (gpu.FP32Products) runs FMA products either
	// way.
	MatMul string
	// FMATiles is the fewest 64 × 64 tiles an FMA product takes the tile
	// kernel at (matmul_t64_*, the warp tiles' bits); 0: half the device's
	// multiprocessors. For A/B measurements; env OMNIPIPE_CUDA_FMA_TILES.
	FMATiles int
	// NoCuBLAS keeps the prompt products (gpu.PromptMatMuler) on the
	// backend's own kernels: a prompt's rows then equal its steps' bit for
	// bit (cublas.go). Env OMNIPIPE_CUDA_CUBLAS=off.
	NoCuBLAS bool
	// TilePerBlock launches the one-row fused-norm products (NormMatMul,
	// NormGLU on the tensor cores) as a block a 16-row tile, each block
	// normalising the row again, instead of at most as many blocks as the
	// GPU holds at once, each normalising it once and taking its tiles in
	// turn (MMV_NORM_TILES). The same bits either way; for A/B
	// measurements (env OMNIPIPE_CUDA_NORMGRID=tiles).
	TilePerBlock bool
	// Profile times every kernel (see Device.Profile): batches then launch
	// kernel by kernel with events around each, graphs off. Env
	// OMNIPIPE_CUDA_PROFILE=FILE turns it on and writes the table to FILE
	// ("-": standard error) when the device closes.
	Profile     bool
	profilePath string
}

// New opens the GPU.
func New(o Options) (*Device, error) {
	if _, err := loadDriver(); err != nil {
		return nil, err
	}
	if os.Getenv("OMNIPIPE_CUDA_GRAPHS") == "off" {
		o.NoGraphs = true
	}
	if os.Getenv("OMNIPIPE_CUDA_PDL") == "off" {
		o.NoPDL = true
	}
	if os.Getenv("OMNIPIPE_CUDA_TILED") == "off" {
		o.NoTiledWeights = true
	}
	if os.Getenv("OMNIPIPE_CUDA_CUBLAS") == "off" {
		o.NoCuBLAS = true
	}
	if os.Getenv("OMNIPIPE_CUDA_NORMGRID") == "tiles" {
		o.TilePerBlock = true
	}
	if os.Getenv("OMNIPIPE_CUDA_UPLOADS") == "host" {
		o.HostUploads = true
	}
	switch os.Getenv("OMNIPIPE_CUDA_BLOCK") {
	case "phased":
		o.FusedBlock = true
	case "grid":
		o.GridBlock = true
	case "onekernel":
		o.OneKernelBlock = true
	}
	if v := os.Getenv("OMNIPIPE_CUDA_PROFILE"); v != "" {
		o.Profile, o.profilePath = true, v
	}
	if v, err := strconv.Atoi(os.Getenv("OMNIPIPE_CUDA_FMA_TILES")); err == nil && v > 0 && o.FMATiles == 0 {
		o.FMATiles = v
	}
	if v := os.Getenv("OMNIPIPE_CUDA_MATMUL"); v != "" && o.MatMul == "" {
		o.MatMul = v
	}
	switch o.MatMul {
	case "", "fma", "mma":
	default:
		return nil, fmt.Errorf("cuda: matmul kernels %q (want fma or mma)", o.MatMul)
	}
	return openDevice(o)
}

var _ gpu.Device = (*Device)(nil)
