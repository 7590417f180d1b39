// omni-pipe's CUDA kernels: one per gpu.Queue op. Compiled at run time by
// NVRTC for the device's own architecture (see nvrtc.go). Every kernel has
// a float64 host replay in contract_test.go; each FAULT_* block is a planted
// fault that the replay must catch (compiled only in the contract's
// controls).
//
// Conventions: tensors are 2-D row-major views (element (r, c) at
// base[r*ld + c]); activations are float; weights are float, bf16 or f16
// (dtype codes below). Indices are 64-bit where a product can pass 2^31.

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)
#define NEG_INF_D __longlong_as_double((long long)0xfff0000000000000ull)

// OUT applies an op's fused output rounding (the backend folds a
// RoundBF16 of exactly the op's output into the op: rnd = 1).
#define OUT(v) (rnd ? rbf16(v) : (v))

#define DT_F32 1
#define DT_BF16 2
#define DT_F16 3

__device__ __forceinline__ float bf16f(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ float f16f(u16 h) {
#ifdef OMNI_EMU
  return emu_f16f(h);
#else
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
  return f;
#endif
}

// load returns element i of a float/bf16/f16 array as float.
__device__ __forceinline__ float load(const void* p, int dt, i64 i) {
  if (dt == DT_F32) return ((const float*)p)[i];
  u16 h = ((const u16*)p)[i];
  return dt == DT_BF16 ? bf16f(h) : f16f(h);
}

// rbf16 rounds to the nearest bfloat16, ties to even, NaN kept quiet (the
// same bit recipe as gpu.RoundBF16).
__device__ __forceinline__ float rbf16(float v) {
  u32 b = __float_as_uint(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((b | 0x00400000u) & 0xffff0000u);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return __uint_as_float(b);
}

// Grid-stride loop over n elements of a rows×cols view.
#define EACH(n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Programmatic dependent launch (sm_90 and later; launch.go). Every kernel
// begins with PDL_ENTER: griddepcontrol.wait, which returns once the
// kernel it depends on has completed and its writes are visible, so
// nothing an earlier kernel writes is read or overwritten before that;
// then griddepcontrol.launch_dependents, which lets the next kernel of the
// stream be scheduled (to wait in turn) while this one runs. The next
// kernel's launch latency and its weights' first trip from memory
// (pdl_prefetch_rows, before its PDL_ENTER) then overlap this kernel's
// work. A few kernels (cuda_host_test.go: preWaitKernels) first read
// what no kernel writes — their tables in the launch's uploaded bytes
// (copied to device memory ahead of the batch's first kernel, or, with
// Options.HostUploads, pinned host memory, each read a trip across the
// host link) — and wait only before touching what the kernel before may
// write.
// Launched without the attribute (or on an older GPU) both are no-ops.
// The dependents are released only after the wait, so at most one
// kernel ahead is resident and warming L2. FAULT_PDL (a control of
// TestProgrammaticLaunchOrders) drops the wait.
// The host emulator (gpu/cuda/cudaemu, OMNI_EMU) runs kernels one after
// another: both are no-ops there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(OMNI_EMU)
#ifdef FAULT_PDL
#define PDL_WAIT()
#else
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#endif
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_LAUNCH()
#endif
#define PDL_ENTER() \
  do {              \
    PDL_WAIT();     \
    PDL_LAUNCH();   \
  } while (0)

// pdl_prefetch_rows asks L2 for rows [r0, r1) of a weight matrix (row
// stride ld elements of es bytes, the first cols of each row), one row a
// thread, with sm_90's bulk prefetch of each row's 16-byte-aligned
// interior. Called before PDL_ENTER: the weights then stream in while the
// kernel before still runs. A prefetch only warms the cache (a later load
// still sees every write before it), so it is safe whatever wrote the
// matrix. Only a first wave prefetches (one block per multiprocessor, at
// most 64 KiB each, ≈ 8 MiB on an H200): later blocks start after the
// kernel before has ended, and a product of thousands of small blocks
// prefetching all at once evicted its own lines from L2 before reading
// them (the 256 MiB head's tile kernel fell from 3.38 to 2.79 TB/s). A
// no-op before sm_90.
__device__ __forceinline__ void pdl_prefetch_rows(const void* w, i64 ld, int es, int cols, int r0, int r1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(OMNI_EMU)
  u32 nsm;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  if (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) >= nsm) return;
  i64 rb = (i64)cols * es;
  if (rb <= 0) return;
  r1 = (int)min((i64)r1, (i64)r0 + max((i64)1, (i64)65536 / rb));
  unsigned long long base;
  asm("cvta.to.global.u64 %0, %1;" : "=l"(base) : "l"(w));
  for (int r = r0 + (int)threadIdx.x; r < r1; r += (int)blockDim.x) {
    unsigned long long a = base + (unsigned long long)((i64)r * ld * es);
    unsigned long long lo = (a + 15) & ~15ull, hi = (a + (unsigned long long)cols * es) & ~15ull;
    if (hi > lo) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"((u32)(hi - lo)) : "memory");
  }
#endif
}

extern "C" {

// ---- data movement ---------------------------------------------------------

__global__ void fill_f32(float* d, i64 ldd, int rows, int cols, float v) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    d[r * ldd + c] = v;
  }
}

__global__ void copy_u32(u32* d, i64 ldd, const u32* s, i64 lds, int rows, int cols) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    d[r * ldd + c] = s[r * lds + c];
  }
}

__global__ void copy_u16(u16* d, i64 ldd, const u16* s, i64 lds, int rows, int cols) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    d[r * ldd + c] = s[r * lds + c];
  }
}

__global__ void transpose_f32(float* d, i64 ldd, const float* s, i64 lds, int rows, int cols) {
  PDL_ENTER();
  // d[c, r] = s[r, c]; s is rows×cols.
  __shared__ float tile[32][33];
  int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    int r = r0 + y, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[y][threadIdx.x] = s[(i64)r * lds + c];
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    int c = c0 + y, r = r0 + threadIdx.x;
#ifdef FAULT_TRANSPOSE
    if (c < cols && r < rows) d[(i64)c * ldd + r] = tile[threadIdx.x][(y + 1) % 32];
#else
    if (c < cols && r < rows) d[(i64)c * ldd + r] = tile[threadIdx.x][y];
#endif
  }
}

// ---- elementwise -----------------------------------------------------------

#define OP_ADD 1
#define OP_MUL 2

__global__ void binary_f32(int op, float* d, i64 ldd, const float* a, i64 lda, const float* b, i64 ldb,
                           int rows, int cols, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    float x = a[r * lda + c], y = b[r * ldb + c];
#ifdef FAULT_BINARY
    if (c == cols - 1) y = 0.5f * y;
#endif
    d[r * ldd + c] = OUT(op == OP_ADD ? x + y : x * y);
  }
}

__global__ void rowop_f32(int op, float* d, i64 ldd, const float* a, i64 lda, const void* v, int vdt, int rows,
                          int cols, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
#ifdef FAULT_ROWOP
    float y = load(v, vdt, c == 0 ? 0 : c - 1);
#else
    float y = load(v, vdt, c);
#endif
    float x = a[r * lda + c];
    d[r * ldd + c] = OUT(op == OP_ADD ? x + y : x * y);
  }
}

__global__ void scale_f32(float* d, i64 ldd, const float* a, i64 lda, float s, int rows, int cols, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    d[r * ldd + c] = OUT(a[r * lda + c] * s);
  }
}

__global__ void round_bf16(float* d, i64 ldd, int rows, int cols) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
#ifdef FAULT_ROUND
    d[r * ldd + c] = __uint_as_float(__float_as_uint(d[r * ldd + c]) & 0xffff0000u);  // truncates
#else
    d[r * ldd + c] = rbf16(d[r * ldd + c]);
#endif
  }
}

#define ACT_SILU 1
#define ACT_GELU 2
#define ACT_RELU 3
#define ACT_ELU 4
#define ACT_SIGMOID 5

// act_apply is act_f32's function f, shared with the matrix products'
// fused epilogue.
__device__ __forceinline__ float act_apply(int f, float x) {
  switch (f) {
    case ACT_SILU:
#ifdef FAULT_ACT
      return x / (1.0f + expf(x));
#else
      return x / (1.0f + expf(-x));
#endif
    case ACT_GELU: return (float)(0.5 * (double)x * (1.0 + erf((double)x * 0.70710678118654752440)));
    case ACT_RELU: return fmaxf(x, 0.0f);
    case ACT_ELU: return x > 0.0f ? x : expm1f(x);
    default: return 1.0f / (1.0f + expf(-x));
  }
}

__global__ void act_f32(int f, float* d, i64 ldd, const float* a, i64 lda, int rows, int cols, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    d[r * ldd + c] = OUT(act_apply(f, a[r * lda + c]));
  }
}

// epi is the matrix products' fused epilogue, the ops the backend folds
// into them when they follow the product on its output: v (the sum plus
// bias) → [round] → [act] → [round] → [v ⊕ e[m, n], ⊕ = + or ×] → [round].
// The fused-epilogue arguments every product-like kernel takes last.
#define EPI_PARAMS int rnd, int act, int rnd1, const float* ep, i64 lde, int eop, int rnd2
#define EPI_ARGS rnd, act, rnd1, ep, lde, eop, rnd2

__device__ __forceinline__ float epi(float v, int rnd, int act, int rnd1, const float* ep, i64 lde, int eop,
                                     int rnd2, i64 m, i64 n) {
  if (rnd) v = rbf16(v);
  if (act) {
    v = act_apply(act, v);
    if (rnd1) v = rbf16(v);
  }
  if (eop) {
    float o = ep[m * lde + n];
#ifdef FAULT_EPILOGUE
    v = eop == OP_ADD ? v + o : v + o;
#else
    v = eop == OP_ADD ? v + o : v * o;
#endif
    if (rnd2) v = rbf16(v);
  }
  return v;
}

__global__ void glu_f32(float* d, i64 ldd, const float* a, i64 lda, int rows, int n, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * n) {
    i64 r = i / n, c = i % n;
    float x = a[r * lda + c], g = a[r * lda + n + c];
    d[r * ldd + c] = OUT(x * (1.0f / (1.0f + expf(-g))));
  }
}

// ---- row reductions (one block of 256 threads per row) ---------------------

// blockSum returns the sum of v over the block in a fixed order: each warp's
// butterfly, then warp 0 over the warps' sums. Every thread gets the result.
__device__ float blockSum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  float s = l < nw ? sh[l] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ float blockMax(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  float s = l < nw ? sh[l] : NEG_INF;
  for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

// rmsnorm_f32 optionally multiplies by a row vector w afterwards (the
// folded MulRow of Lfm2RMSNorm / RMSNorm), with its own rounding rnd1.
__global__ void rmsnorm_f32(float* d, i64 ldd, const float* a, i64 lda, int cols, float eps, int rnd, const void* w,
                            int wdt, int rnd1) {
  PDL_ENTER();
  __shared__ float sh[32];
  const float* x = a + (i64)blockIdx.x * lda;
  float* y = d + (i64)blockIdx.x * ldd;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss = fmaf(x[c], x[c], ss);
  ss = blockSum(ss, sh);
#ifdef FAULT_RMSNORM
  float inv = (float)(1.0 / sqrt((double)(ss / (float)cols)));
#else
  float inv = (float)(1.0 / sqrt((double)(ss / (float)cols + eps)));
#endif
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = OUT(x[c] * inv);
    if (w) {
      v *= load(w, wdt, c);
      if (rnd1) v = rbf16(v);
    }
    y[c] = v;
  }
}

__global__ void layernorm_f32(float* d, i64 ldd, const float* a, i64 lda, const void* w, int wdt, const void* b,
                              int bdt, int cols, float eps, int rnd) {
  PDL_ENTER();
  __shared__ float sh[32];
  const float* x = a + (i64)blockIdx.x * lda;
  float* y = d + (i64)blockIdx.x * ldd;
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += x[c];
  float mean = blockSum(s, sh) / (float)cols;
  float v = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float t = x[c] - mean;
    v = fmaf(t, t, v);
  }
  float var = blockSum(v, sh) / (float)cols;
  float inv = (float)(1.0 / sqrt((double)(var + eps)));
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float o = (x[c] - mean) * inv * load(w, wdt, c);
#ifndef FAULT_LAYERNORM
    if (b) o += load(b, bdt, c);
#endif
    y[c] = OUT(o);
  }
}

__global__ void softmax_f32(float* d, i64 ldd, int cols) {
  PDL_ENTER();
  __shared__ float sh[32];
  float* x = d + (i64)blockIdx.x * ldd;
  float m = NEG_INF;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[c]);
  m = blockMax(m, sh);
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float e = expf(x[c] - m);
    x[c] = e;
    s += e;
  }
  s = blockSum(s, sh);
#ifdef FAULT_SOFTMAX
  s = s * 1.0001f;
#endif
  for (int c = threadIdx.x; c < cols; c += blockDim.x) x[c] = x[c] / s;
}

// ---- RoPE ------------------------------------------------------------------

// rope rotates rows in place: row r is at position pos[r]; pair j of each
// head rotates by pos·invf[j] (fp32 product, cos/sin in double rounded to
// float as the CPU backend does). interleaved pairs (2j, 2j+1), else (j,
// j+hd/2). bf16 rounds cos, sin, each product and each sum.
// rope_store writes the pair (x0, x1) rotated by (c, s) to row[i0] and
// row[i1]: in bf16 every product and each sum rounded, else in fp32 with
// the op's output rounding rnd (rope_f32's and prep_head's arithmetic).
__device__ __forceinline__ void rope_store(float* row, int i0, int i1, float x0, float x1, float c, float s, int bf16,
                                           int rnd) {
  if (bf16) {
    row[i0] = rbf16(rbf16(x0 * c) - rbf16(x1 * s));
    row[i1] = rbf16(rbf16(x1 * c) + rbf16(x0 * s));
  } else {
    row[i0] = OUT(x0 * c - x1 * s);
    row[i1] = OUT(x1 * c + x0 * s);
  }
}

// rope_f32: one thread per rotated pair (row, head, j); the angle's cos
// and sin are computed in double from the fp32 angle and rounded to fp32
// (as the host's float64 replay), per thread.
__global__ void rope_f32(float* d, i64 ldd, int rows, int cols, int hd, int interleaved, const float* invf,
                         const int* pos, int bf16, int rnd) {
  PDL_ENTER();
  int half = hd / 2, pairs = cols / 2;
  i64 n = (i64)rows * pairs;
  EACH(n) {
    int r = (int)(i / pairs), p = (int)(i % pairs);
    int h = (p / half) * hd, j = p % half;
#ifdef FAULT_ROPE
    float ang = (float)(pos[r] + 1) * invf[j];
#else
    float ang = (float)pos[r] * invf[j];
#endif
    float c = (float)cos((double)ang), s = (float)sin((double)ang);
    if (bf16) { c = rbf16(c); s = rbf16(s); }
    float* row = d + (i64)r * ldd;
    int i0 = interleaved ? h + 2 * j : h + j;
    int i1 = interleaved ? h + 2 * j + 1 : h + j + half;
    float x0 = row[i0], x1 = row[i1];
    rope_store(row, i0, i1, x0, x1, c, s, bf16, rnd);
  }
}

// ---- embedding -------------------------------------------------------------

// embed: d[r] = Σ_{i<n} table[ids[r·n+i]] (summed in i order).
// embed_f32: ids[r*ldi + k] for k < n; an id outside the table's trows
// rows makes the output element NaN (the host validates host ids; device
// ids, EmbedIDs, are checked here).
__global__ void embed_f32(float* d, i64 ldd, const void* table, int tdt, i64 ldt, const int* ids, i64 ldi, int n,
                          int trows, int rows, int cols, int rnd) {
  PDL_ENTER();
  EACH((i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    float s = 0.0f;
    for (int k = 0; k < n; k++) {
#ifdef FAULT_EMBED
      int id = ids[r * ldi + (k == 0 && n > 1 ? 1 : k)];
#else
      int id = ids[r * ldi + k];
#endif
      if (id < 0 || id >= trows) {
        s = __int_as_float(0x7fc00000);
        break;
      }
      s += load(table, tdt, (i64)id * ldt + c);
    }
    d[r * ldd + c] = OUT(s);
  }
}

// ---- sampling (gpu.SampleHost, step by step) --------------------------------

}  // extern "C": the sampling helpers below include a template

// sample_arg mirrors the host's packing (queue.go: sampleArgBytes).
struct sample_arg {
  double temp, top_p, penalty, u;
  int top_k, h_off, h_len, s_off, s_len, pad;
};

// sample_exp is gpu.SampleExp: the same IEEE operations in the same order
// (--fmad=false keeps every product rounded on its own).
__device__ double sample_exp(double x) {
  const double c[14] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22,
                        0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10,
                        0x1.1111111111111p-07, 0x1.5555555555555p-05, 0x1.5555555555555p-03, 0x1p-01,
                        0x1p+00,               0x1p+00};
  if (x != x) return x;
  if (x < -708.0) return 0.0;
  double k = rint(x * 0x1.71547652b82fep+00);
  double r = x - k * 0x1.62e42feep-01;
#ifndef FAULT_SAMPLE_EXP
  r = r - k * 0x1.a39ef35793c76p-33;
#endif
  double y = c[0];
  for (int j = 1; j < 14; j++) y = y * r + c[j];
  return ldexp(y, (int)k);
}

// okey maps a double (no NaN) to an unsigned key of the same order; −0
// and +0 get one key.
__device__ __forceinline__ unsigned long long okey(double v) {
  if (v == 0.0) v = 0.0;
  unsigned long long b = (unsigned long long)__double_as_longlong(v);
  return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

__device__ __forceinline__ double okey_value(unsigned long long k) {
  unsigned long long b = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
  return __longlong_as_double((long long)b);
}

// better reports whether (v, i) precedes (w, j) in an argmax: a larger
// value, or the same value at a lower index; i < 0 is no candidate.
__device__ __forceinline__ bool better(double v, int i, double w, int j) {
  return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

// block_argmax returns, to every thread, the first index of the largest
// val(i) over i < n (NaN never wins; 0 when all are NaN).
template <typename F>
__device__ int block_argmax(int n, F val, double* shd, int* shi) {
  double bv = 0.0;
  int bi = -1;
  // Eight entries a thread are loaded before they are compared, in index
  // order: the loop with one load a step waited out each load's latency
  // (a 65,536-token head took 58 µs in one block on an H200).
  const int nt = blockDim.x;
  int i = threadIdx.x;
  for (; i + 7 * nt < n; i += 8 * nt) {
    double v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = val(i + u * nt);
#pragma unroll
    for (int u = 0; u < 8; u++)
#ifdef FAULT_SAMPLE_ARGMAX
      if (v[u] == v[u] && (bi < 0 || v[u] >= bv)) bv = v[u], bi = i + u * nt;  // the last of equal values wins
#else
      if (v[u] == v[u] && (bi < 0 || v[u] > bv)) bv = v[u], bi = i + u * nt;
#endif
  }
  for (; i < n; i += nt) {
    double v = val(i);
    if (v == v && (bi < 0 || v > bv)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    double w = __shfl_xor_sync(0xffffffffu, bv, o);
    int j = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(w, j, bv, bi)) bv = w, bi = j;
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shd[wid] = bv, shi[wid] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < nw; k++)
      if (better(shd[k], shi[k], shd[0], shi[0])) shd[0] = shd[k], shi[0] = shi[k];
  }
  __syncthreads();
  int r = shi[0];
  __syncthreads();
  return r < 0 ? 0 : r;
}

// block_max returns max(v) over the block to every thread, with one
// barrier: each warp's maximum goes to shd[wid] and every thread folds
// shd[0], shd[1], … in that order itself (one fold, the same for all,
// instead of thread 0's and a broadcast). The caller keeps shd untouched
// from its last barrier before the call to its next barrier after it.
__device__ double block_max(double v, double* shd) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) shd[wid] = v;
  __syncthreads();
  double r = shd[0];
  for (int k = 1; k < nw; k++) r = fmax(r, shd[k]);
  return r;
}

// shc_bin, run by warp 0, finds the radix digit of the k-th largest key:
// the largest b whose bins from 255 down to b hold ≥ k entries (0 if none
// do), sets shc[0] = b and shc[1] = k − (the entries above b) — the serial
// scan's answer, from a warp's prefix sums (lane l holds bins 255−8l …
// 248−8l).
__device__ void shc_bin(const u32* bins, int k, int* shc) {
  int lane = threadIdx.x & 31;
  int c[8], own = 0;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    c[e] = (int)bins[255 - 8 * lane - e];
    own += c[e];
  }
  int incl = own;  // inclusive prefix over lanes 0..lane
  for (int o = 1; o < 32; o <<= 1) {
    int t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  int before = incl - own;
  // The first lane whose inclusive count reaches k holds the digit.
  u32 hit = __ballot_sync(0xffffffffu, incl >= k);
  int src = hit ? __ffs(hit) - 1 : 31;
  if (lane == src) {
    int cum = before, b = 255 - 8 * lane, e = 0;
    for (; e < 8; e++, b--) {
      if (b == 0 || cum + c[e] >= k) break;
      cum += c[e];
    }
    shc[0] = b;
    shc[1] = k - cum;
  }
}

// SAMPLE_TOPK_FAST is the largest top-k whose threshold sample_f32 finds
// with topk_value instead of radix selection.
#define SAMPLE_TOPK_FAST 8

// topk_value returns the k-th largest of qval(i) over i < V, duplicates
// counted (k ≤ SAMPLE_TOPK_FAST ≤ V, no NaN) — the value radix selection
// finds, a zero as +0 as okey_value gives it — for a block of at most 16
// warps: each thread keeps the k largest of its entries in a descending
// list, each warp takes k times the largest head among its lanes (the
// lowest such lane pops it), and warp 0 does the same over the warps'
// lists (tk: 16·SAMPLE_TOPK_FAST doubles of shared memory). Two barriers
// and 2k warp reductions where the radix passes took eight rounds of
// atomics and two barriers each (sample_f32 took 20 µs a codebook on an
// H200). Empty places hold −∞, which only the k-th of a row with fewer
// than k finite entries can be, and then is.
template <class Q>
__device__ double topk_value(int k, int V, Q qval, double* tk) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
  double l[SAMPLE_TOPK_FAST];
#pragma unroll
  for (int j = 0; j < SAMPLE_TOPK_FAST; j++) l[j] = NEG_INF_D;
  for (int i = tid; i < V; i += nt) {
    double v = qval(i);
#pragma unroll
    for (int j = 0; j < SAMPLE_TOPK_FAST; j++)
      if (j < k && v > l[j]) {
        double t = l[j];
        l[j] = v;
        v = t;
      }
  }
  // The k largest heads of a warp's lists, in order, on every lane.
  auto merge = [&](double* out) {
#pragma unroll
    for (int r = 0; r < SAMPLE_TOPK_FAST; r++) {
      if (r >= k) break;
      double h = l[0], m = h;
      for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
      int win = __ffs(__ballot_sync(0xffffffffu, h == m)) - 1;
      if (lane == win) {
#pragma unroll
        for (int j = 0; j + 1 < SAMPLE_TOPK_FAST; j++) l[j] = l[j + 1];
        l[SAMPLE_TOPK_FAST - 1] = NEG_INF_D;
      }
      out[r] = m;
    }
  };
  double top[SAMPLE_TOPK_FAST];
  merge(top);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < SAMPLE_TOPK_FAST; r++)
      if (r < k) tk[wid * SAMPLE_TOPK_FAST + r] = top[r];
  __syncthreads();
  if (wid == 0) {
#pragma unroll
    for (int j = 0; j < SAMPLE_TOPK_FAST; j++) l[j] = lane < nw && j < k ? tk[lane * SAMPLE_TOPK_FAST + j] : NEG_INF_D;
    merge(top);
    double th = NEG_INF_D;
#pragma unroll
    for (int r = 0; r < SAMPLE_TOPK_FAST; r++)
      if (r == k - 1) th = top[r];
    // Only lane 0 read tk[0 … 7] (the others, their own warps' places).
    if (lane == 0) tk[0] = th == 0.0 ? 0.0 : th;
  }
  __syncthreads();
  return tk[0];
}

extern "C" {

// sample_f32: one block per row r of logits [B, V]; ids[r*ldi] gets the
// pick of gpu.SampleHost with args[r] (histories in hist). Scratch, per
// row: ew (V doubles, by token id), cand (V ints), skey/sidx (P = the
// power of two ≥ V). Dynamic shared memory: the penalty's bitmap of V bits,
// then the suppressed ids' bitmap, then, when sh is set (the host's
// choice where they fit: sample.go's sampleShared), the row's ew and cand
// in place of the global ones: ew is read back in every radix pass and in
// the compaction, cand in the serial sums, and shared memory answers those
// reads in a fraction of a global load's latency.
__global__ void __launch_bounds__(512) sample_f32(int* ids, i64 ldi, const float* logits, i64 ldl, int V,
                                                  const sample_arg* args, const int* hist, double* ew, int* cand,
                                                  double* skey, int* sidx, int P, int sh) {
  extern __shared__ double dsm[];  // declared double for ew's alignment
  u32* bm = (u32*)dsm;
  __shared__ double shd[32];
  __shared__ int shi[32];
  __shared__ int wcount[2][32];
  __shared__ u32 bins[2][256];
  __shared__ int shc[2];
  __shared__ double tk[16 * SAMPLE_TOPK_FAST];  // topk_value's lists
  const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
  const sample_arg a = args[row];
  const float* L = logits + (i64)row * ldl;
  const int nwords = (V + 31) >> 5;
  u32* sup = bm + nwords;
  if (sh) {
    // After the two bitmaps (8·nwords bytes: ew stays 8-byte aligned).
    ew = (double*)(bm + 2 * nwords);
    cand = (int*)(ew + V);
  } else {
    ew += (i64)row * V;
    cand += (i64)row * V;
  }
  skey += (i64)row * P;
  sidx += (i64)row * P;
  int* out = ids + (i64)row * ldi;
  const bool greedy = a.temp <= 0.0 || a.top_k == 1;
  const bool pen = a.penalty > 0.0 && a.penalty != 1.0 && a.h_len > 0;
  // The arguments and the histories are the launch's uploaded bytes (never
  // written by a kernel): both bitmaps are built from them before
  // PDL_ENTER, while the kernel before (the logits) still runs, and the
  // first radix pass's bins are zeroed; shared memory only, nothing global
  // is written before the wait.
  for (int w = tid; w < nwords; w += nt) {
    sup[w] = 0u;
    bm[w] = 0u;
  }
  for (int b = tid; b < 256; b += nt) bins[0][b] = 0u;
  __syncthreads();
  for (int j = tid; j < a.s_len; j += nt) {
    int id = hist[a.s_off + j];
    if (id >= 0 && id < V) atomicOr(&sup[id >> 5], 1u << (id & 31));
  }
  if (pen)
    for (int j = tid; j < a.h_len; j += nt) {
      int id = hist[a.h_off + j];
      if (id >= 0 && id < V) atomicOr(&bm[id >> 5], 1u << (id & 31));
    }
  __syncthreads();
  PDL_ENTER();
#ifdef FAULT_SAMPLE_SUPPRESS
  auto logit = [&](int i) { return (double)L[i]; };
#else
  auto logit = [&](int i) { return ((sup[i >> 5] >> (i & 31)) & 1u) ? NEG_INF_D : (double)L[i]; };
#endif
  if (greedy && !pen) {
    int b = block_argmax(V, logit, shd, shi);
    if (tid == 0) *out = b;
    return;
  }
  auto pval = [&](int i) {
    double p = logit(i);
#ifdef FAULT_SAMPLE_PENALTY
    if (pen && ((bm[i >> 5] >> (i & 31)) & 1u)) p = p / a.penalty;
#else
    if (pen && ((bm[i >> 5] >> (i & 31)) & 1u)) p = p > 0.0 ? p / a.penalty : p * a.penalty;
#endif
    return p;
  };
  if (greedy) {
    int b = block_argmax(V, pval, shd, shi);
    if (tid == 0) *out = b;
    return;
  }
  // q = p / temp once per entry, kept in ew[i] (by token id) for the
  // passes below: each thread reads back only the entries it wrote (every
  // pass strides i = tid + j·nt), and a candidate's ew[i] becomes its
  // exponential in the compaction pass, by the same thread.
  bool nan = false;
  for (int i = tid; i < V; i += nt) {
    double q = pval(i) / a.temp;
    ew[i] = q;
    nan |= q != q;
  }
  auto qval = [&](int i) { return ew[i]; };
  if (__syncthreads_or(nan)) {
    int b = block_argmax(V, logit, shd, shi);
    if (tid == 0) *out = b;
    return;
  }
  // Step 5: the top_k-th largest q by radix selection on 8-bit digits.
  // Pass n counts into bins[n & 1] (bins[0] was zeroed in the prologue)
  // and zeroes bins[(n + 1) & 1] for the next pass: that buffer was last
  // read by warp 0 in pass n − 1, before a barrier every thread passed.
  // So a pass needs two barriers: the counts complete before warp 0 scans
  // them, and shc written before everyone reads it (warp 0 writes shc
  // again only after the next pass's first barrier, which every thread
  // reaches after its read).
  double th = NEG_INF_D;
  if (a.top_k > 0 && a.top_k < V) {
    unsigned long long prefix = 0ull, mask = 0ull;
#ifdef FAULT_SAMPLE_TOPK
    int k = a.top_k + 1;
#else
    int k = a.top_k;
#endif
    if (k <= SAMPLE_TOPK_FAST && k <= V) {
      th = topk_value(k, V, qval, tk);
    } else {
    for (int shift = 56, n = 0; shift >= 0; shift -= 8, n++) {
      u32* cur = bins[n & 1];
      if (shift > 0)
        for (int b = tid; b < 256; b += nt) bins[(n + 1) & 1][b] = 0u;
      for (int i = tid; i < V; i += nt) {
        unsigned long long key = okey(qval(i));
        if ((key & mask) == prefix) atomicAdd(&cur[(key >> shift) & 255ull], 1u);
      }
      __syncthreads();
      if (tid < 32) shc_bin(cur, k, shc);
      __syncthreads();
      prefix |= (unsigned long long)shc[0] << shift;
      mask |= 255ull << shift;
      k = shc[1];
    }
    th = okey_value(prefix);
    }
  }
  // Step 6: m over the kept entries (shd is first used here).
  double m = th;
  for (int i = tid; i < V; i += nt) {
    double q = qval(i);
    if (q >= th) m = fmax(m, q);
  }
  m = block_max(m, shd);
  if (m == NEG_INF_D) {
    int b = block_argmax(V, logit, shd, shi);
    if (tid == 0) *out = b;
    return;
  }
  // The candidates (q ≥ th and q > −∞) in index order, nt ids a chunk:
  // each warp counts its flags by ballot into wcount, and every warp scans
  // the chunk's counts itself (no serial scan, no broadcast), so a chunk
  // needs one barrier. Chunk c uses wcount[c & 1]: its last readers, in
  // chunk c − 2, read it before chunk c − 1's barrier, which the writers
  // of chunk c have passed.
  int C = 0;
  for (int b0 = 0, c = 0; b0 < V; b0 += nt, c++) {
    int i = b0 + tid;
    double q = i < V ? qval(i) : 0.0;
    bool f = i < V && q >= th && q > NEG_INF_D;
    u32 bal = __ballot_sync(0xffffffffu, f);
    int* cnt = wcount[c & 1];
    if (lane == 0) cnt[wid] = __popc(bal);
    __syncthreads();
    int own = lane < nw ? cnt[lane] : 0, incl = own;  // lane w: warp w's count
    for (int o = 1; o < 32; o <<= 1) {
      int t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    int before = __shfl_sync(0xffffffffu, incl - own, wid);  // the warps before this one
    int total = __shfl_sync(0xffffffffu, incl, 31);
    if (f) {
      cand[C + before + __popc(bal & ((1u << lane) - 1u))] = i;
      ew[i] = sample_exp(q - m);
    }
    C += total;
  }
  __syncthreads();  // every candidate's cand and e written
  // Step 9 (below): the inverse CDF in index order over p = ew[i] / sum
  // when div is set, else over ew[i] as it stands.
  auto inverse_cdf = [&](bool div, double sum) {
    double acc = 0.0;
    int last = -1, pick = -1;
    for (int j = 0; j < C; j++) {
      int i = cand[j];
      double v = div ? ew[i] / sum : ew[i];
      if (v <= 0.0) continue;
      acc += v;
      last = i;
      if (a.u < acc) {
        pick = i;
        break;
      }
    }
    return pick >= 0 ? pick : last;
  };
  // Step 7: the sum in index order, then p = e / sum. Without top-p only
  // step 9 reads p: thread 0 divides as it goes there (the same e / sum),
  // with no pass over the candidates and no barrier between.
  const bool topp = a.top_p > 0.0 && a.top_p < 1.0;
  if (tid == 0) {
    double sum = 0.0;
    for (int j = 0; j < C; j++) sum += ew[cand[j]];
    if (topp)
      shd[0] = sum;
    else
      *out = inverse_cdf(true, sum);
  }
  if (!topp) return;
  __syncthreads();
  double sum = shd[0];
  for (int j = tid; j < C; j += nt) ew[cand[j]] = ew[cand[j]] / sum;
  __syncthreads();
  // Step 8: top-p over the candidates sorted by (p descending, index).
  {
    int Pc = 1;
    while (Pc < C) Pc <<= 1;
    for (int j = tid; j < Pc; j += nt) {
      skey[j] = j < C ? ew[cand[j]] : -1.0;
      sidx[j] = j < C ? cand[j] : 0x7fffffff;
    }
    __syncthreads();
    for (int k = 2; k <= Pc; k <<= 1)
      for (int jj = k >> 1; jj > 0; jj >>= 1) {
        for (int t = tid; t < Pc; t += nt) {
          int l = t ^ jj;
          if (l > t) {
            double kt = skey[t], kl = skey[l];
            int it = sidx[t], il = sidx[l];
            bool lFirst = kl > kt || (kl == kt && il < it);
            bool tFirst = kt > kl || (kt == kl && it < il);
            if ((t & k) == 0 ? lFirst : tFirst) {
              skey[t] = kl, skey[l] = kt;
              sidx[t] = il, sidx[l] = it;
            }
          }
        }
        __syncthreads();
      }
    if (tid == 0) {
      double acc = 0.0;
      int cut = C;
      for (int n = 0; n < C; n++) {
        acc += skey[n];
        if (acc >= a.top_p) {
          cut = n + 1;
          break;
        }
      }
      double kept = 0.0;
      for (int n = 0; n < cut; n++) kept += skey[n];
      shd[0] = kept;
      shc[0] = cut;
    }
    __syncthreads();
    double kept = shd[0];
    int cut = shc[0];
    for (int n = cut + tid; n < C; n += nt) ew[sidx[n]] = 0.0;
    __syncthreads();
    for (int j = tid; j < C; j += nt) ew[cand[j]] = ew[cand[j]] / kept;
    __syncthreads();
  }
  // Step 9: the inverse CDF in index order.
  if (tid == 0) *out = inverse_cdf(false, 0.0);
}

// ---- LFM2 short convolution ------------------------------------------------

// shortconv: one thread per channel and chunk of rows; x' = [state; x];
// d[t,c] = Σ_k w[c,k]·x'[t+k,c] (k ascending); afterwards state holds the
// last L−1 rows of x'. The sequence's rows are rows r0 … r0+T−1 of x and d
// (shortconv_seqs_f32: one sequence of a batch; the epilogue sees the
// batch's row index). No output depends on another, so the rows are cut
// into chunks of `chunk` rows (blockIdx.z), each a thread's window of its
// own: a prefill's rows no longer run one after another. Only chunk 0
// reads the old state (chunk ≥ L − 1, so the later chunks' windows lie in
// x), and chunk 0 writes the new one, from x and what it read: no chunk
// reads what another writes. (d may be x only with one chunk: the host
// passes chunk ≥ T then.)
//
// With gate b not null the convolution's input is x ⊙ b instead of x (the
// LFM2 conv operator's B·x, rounded to bf16 when grnd): each value as
// binary_f32's product computes it and its folded rounding, the state
// taking those values too — the two ops' floats in one pass.
__device__ __forceinline__ void shortconv_rows(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt,
                                               float* state, i64 lds, int r0, int T, int chunk, int C, int L,
                                               EPI_PARAMS, const float* gb = nullptr, i64 ldb = 0, int grnd = 0) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int t0 = (int)blockIdx.z * chunk;
  if (c >= C || t0 >= T) return;
  int t1 = min(T, t0 + chunk);
  // xr(r): row r's input at channel c.
  auto xr = [&](int r) {
    float v = x[(i64)r * ldx + c];
    if (gb) {
      // (The planted fault drops the gate's b: x convolved as it is.)
#ifndef FAULT_SHORTCONV_GATE
      v = gb[(i64)r * ldb + c] * v;
#endif
      if (grnd) v = rbf16(v);
    }
    return v;
  };
  float win[16];  // L ≤ 16 (checked on the host)
  float old[16];  // chunk 0: the state it read
  for (int j = 0; j < L - 1; j++) {
    int s = t0 + j;  // row s of x'
    win[j] = s < L - 1 ? state[(i64)s * lds + c] : xr(r0 + s - (L - 1));
    old[j] = win[j];
  }
  for (int t = t0; t < t1; t++) {
    win[L - 1] = xr(r0 + t);
    float acc = 0.0f;
    for (int k = 0; k < L; k++) acc += load(w, wdt, (i64)c * L + k) * win[k];
#ifdef FAULT_SHORTCONV
    if (t == 0) acc = 0.0f;
#endif
    d[(i64)(r0 + t) * ldd + c] = epi(acc, EPI_ARGS, r0 + t, c);
    for (int j = 0; j < L - 1; j++) win[j] = win[j + 1];
  }
  if (t0 != 0) return;
  for (int j = 0; j < L - 1; j++) {
    int s = T + j;  // row s of x'
    state[(i64)j * lds + c] = s < L - 1 ? old[s] : xr(r0 + s - (L - 1));
  }
}

__global__ void shortconv_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt, float* state,
                              i64 lds, int T, int chunk, int C, int L, EPI_PARAMS) {
  PDL_ENTER();
  shortconv_rows(d, ldd, x, ldx, w, wdt, state, lds, 0, T, chunk, C, L, EPI_ARGS);
}

// conv_seq is one sequence of shortconv_seqs_f32 (24 bytes; cuda's
// convSeqBytes): its state and its rows of the batch.
struct conv_seq {
  float* state;
  i64 lds;
  int r0, rows;
};

// shortconv_seqs_f32: shortconv_f32 for every sequence of a batch, sequence
// blockIdx.y with its own state, chunk blockIdx.z of its rows.
__global__ void shortconv_seqs_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt,
                                   const conv_seq* seqs, int chunk, int C, int L, EPI_PARAMS) {
  // The sequence list is uploaded (never written by a kernel): read before the wait.
#ifdef FAULT_SHORTCONV_SEQS
  conv_seq cs = seqs[blockIdx.y];
  cs.state = seqs[0].state;  // every sequence convolves with the first one's state
#else
  conv_seq cs = seqs[blockIdx.y];
#endif
  PDL_ENTER();
  shortconv_rows(d, ldd, x, ldx, w, wdt, cs.state, cs.lds, cs.r0, cs.rows, chunk, C, L, EPI_ARGS);
}

// shortconv_seqs_gated_f32: shortconv_seqs_f32 of x ⊙ b (rounded when
// grnd): gpu.ShortConvSeqsGated, the gate's product folded in.
__global__ void shortconv_seqs_gated_f32(float* d, i64 ldd, const float* x, i64 ldx, const float* b, i64 ldb, int grnd,
                                         const void* w, int wdt, const conv_seq* seqs, int chunk, int C, int L,
                                         EPI_PARAMS) {
  conv_seq cs = seqs[blockIdx.y];
  PDL_ENTER();
  shortconv_rows(d, ldd, x, ldx, w, wdt, cs.state, cs.lds, cs.r0, cs.rows, chunk, C, L, EPI_ARGS, b, ldb, grnd);
}

// copy_many: pair blockIdx.x of the uploaded copy_pair list, d = s (its
// rows × cols elements; blocks along y and threads share them).
struct copy_pair {
  char* d;
  const char* s;
  i64 ldd, lds;  // in elements
  int rows, cols;
};

}  // extern "C": the copies' bodies are templates over the element

// copy_rows: row pairs[2i] of d = row pairs[2i + 1] of s, block i (blocks
// along y and threads share the columns). T is u32 (4-byte elements) or
// u16 (bf16, f16).
// The pairs (and copy_many's list) are the launch's uploaded bytes, never
// written by a kernel: they are read before PDL_ENTER, while the kernel
// before still runs, and only the copy itself waits for it.
template <class T>
__device__ __forceinline__ void copy_rows(T* d, i64 ldd, const T* s, i64 lds, const int* pairs, int cols) {
  int i = blockIdx.x;
#ifdef FAULT_COPY_ROWS
  i64 dr = pairs[2 * i], sr = pairs[1];  // every row copies the first pair's source row
#else
  i64 dr = pairs[2 * i], sr = pairs[2 * i + 1];
#endif
  PDL_ENTER();
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += gridDim.y * blockDim.x) d[dr * ldd + c] = s[sr * lds + c];
}

template <class T>
__device__ __forceinline__ void copy_many(const copy_pair* pairs) {
  copy_pair cp = pairs[blockIdx.x];
#ifdef FAULT_COPY_MANY
  cp.rows = max(cp.rows - 1, 1);  // drops the last row of every copy of several rows
#endif
  PDL_ENTER();
  T* d = (T*)cp.d;
  const T* s = (const T*)cp.s;
  i64 n = (i64)cp.rows * cp.cols;
  for (i64 e = (i64)blockIdx.y * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.y * blockDim.x) {
    i64 r = e / cp.cols, c = e % cp.cols;
    d[r * cp.ldd + c] = s[r * cp.lds + c];
  }
}

extern "C" {

__global__ void copy_rows_u32(u32* d, i64 ldd, const u32* s, i64 lds, const int* pairs, int cols) {
  copy_rows(d, ldd, s, lds, pairs, cols);
}

__global__ void copy_rows_u16(u16* d, i64 ldd, const u16* s, i64 lds, const int* pairs, int cols) {
  copy_rows(d, ldd, s, lds, pairs, cols);
}

__global__ void copy_many_u32(const copy_pair* pairs) {
  copy_many<u32>(pairs);
}

__global__ void copy_many_u16(const copy_pair* pairs) {
  copy_many<u16>(pairs);
}

}  // extern "C"

// ---- matrix product --------------------------------------------------------

// matmul: d[m, n] = Σ_k x[m, k]·w[n, k] (+ bias[n]).
//
// The summation order of an output element depends only on K: lane l of a
// warp owns k = 256·s + 8·l + e (e < 8) and accumulates its products with
// FMA in (s, e) order; the 32 lane sums are then added by a xor butterfly.
// A warp computes an R×C tile of outputs (R rows of x, C rows of w), so
// every row's value is the same whatever M, the tile and the grid: a decode
// row stepped alone equals the same row in any batch, bit for bit.
// mm_load fills xs and ws with elements k0 … k0+7 of the tile's rows
// (zeros past K).
template <int R, int C, int WDT>
__device__ __forceinline__ void mm_load(float (&xs)[R][8], float (&ws)[C][8], const float* const (&xr)[R],
                                        const void* w, const i64 (&wo)[C], int K, int k0, bool xv, bool wv) {
  if (k0 + 8 <= K && xv) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      float4 a = *(const float4*)(xr[r] + k0), b = *(const float4*)(xr[r] + k0 + 4);
      xs[r][0] = a.x; xs[r][1] = a.y; xs[r][2] = a.z; xs[r][3] = a.w;
      xs[r][4] = b.x; xs[r][5] = b.y; xs[r][6] = b.z; xs[r][7] = b.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int e = 0; e < 8; e++) xs[r][e] = k0 + e < K ? xr[r][k0 + e] : 0.0f;
  }
  if (k0 + 8 <= K && wv) {
#pragma unroll
    for (int c = 0; c < C; c++) {
      if (WDT == DT_F32) {
        const float* p = (const float*)w + wo[c] + k0;
        float4 a = __ldg((const float4*)p), b = __ldg((const float4*)(p + 4));
        ws[c][0] = a.x; ws[c][1] = a.y; ws[c][2] = a.z; ws[c][3] = a.w;
        ws[c][4] = b.x; ws[c][5] = b.y; ws[c][6] = b.z; ws[c][7] = b.w;
      } else {
        uint4 v = __ldg((const uint4*)((const u16*)w + wo[c] + k0));
        u32 q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
          if (WDT == DT_BF16) {
            ws[c][2 * e] = __uint_as_float(q[e] << 16);
            ws[c][2 * e + 1] = __uint_as_float(q[e] & 0xffff0000u);
          } else {
            ws[c][2 * e] = f16f((u16)(q[e] & 0xffffu));
            ws[c][2 * e + 1] = f16f((u16)(q[e] >> 16));
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
      for (int e = 0; e < 8; e++) ws[c][e] = k0 + e < K ? load(w, WDT, wo[c] + k0 + e) : 0.0f;
  }
}

// mm_fma accumulates one chunk's products in e order.
template <int R, int C>
__device__ __forceinline__ void mm_fma(float (&acc)[R][C], const float (&xs)[R][8], const float (&ws)[C][8], int K,
                                       int k0) {
#pragma unroll
  for (int e = 0; e < 8; e++) {
    if (k0 + e < K) {
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < C; c++) acc[r][c] = fmaf(xs[r][e], ws[c][e], acc[r][c]);
    }
  }
}

template <int R, int C, int WDT>

__device__ __forceinline__ void mm_tile(float* d, i64 ldd, const float* x, i64 ldx, const void* w, i64 ldw,
                                        const void* bias, int bdt, int M, int N, int K, int m0, int n0, EPI_PARAMS) {
  int lane = threadIdx.x & 31;
  float acc[R][C];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < C; c++) acc[r][c] = 0.0f;
  const float* xr[R];
#pragma unroll
  for (int r = 0; r < R; r++) xr[r] = x + (i64)min(m0 + r, M - 1) * ldx;
  i64 wo[C];
#pragma unroll
  for (int c = 0; c < C; c++) wo[c] = (i64)min(n0 + c, N - 1) * ldw;
  // Vector loads need 16-byte alignment of every row start and of ld.
  bool xv = ((((unsigned long long)x) & 15) == 0) && (ldx % 4 == 0);
  bool wv = WDT == DT_F32 ? ((((unsigned long long)w) & 15) == 0) && (ldw % 4 == 0)
                          : ((((unsigned long long)w) & 15) == 0) && (ldw % 8 == 0);
  int k0 = 8 * lane;
  if (R <= 2) {
    // Two chunks' loads in flight before their products (the decode
    // case is bound by how many weight bytes are in flight); the products
    // are still accumulated chunk by chunk, so the order is unchanged.
    for (; k0 + 256 < K; k0 += 512) {
      float xa[R][8], wa[C][8], xb[R][8], wb[C][8];
      mm_load<R, C, WDT>(xa, wa, xr, w, wo, K, k0, xv, wv);
      mm_load<R, C, WDT>(xb, wb, xr, w, wo, K, k0 + 256, xv, wv);
      mm_fma<R, C>(acc, xa, wa, K, k0);
      mm_fma<R, C>(acc, xb, wb, K, k0 + 256);
    }
  }
  for (; k0 < K; k0 += 256) {
    float xs[R][8], ws[C][8];
    mm_load<R, C, WDT>(xs, ws, xr, w, wo, K, k0, xv, wv);
    mm_fma<R, C>(acc, xs, ws, K, k0);
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], o);
  // Lane r·C + c writes element (r, c).
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < C; c++) {
      int m = m0 + r, n = n0 + c;
      if (lane == ((r * C + c) & 31) && m < M && n < N) {
        float v = acc[r][c];
#ifdef FAULT_MATMUL
        if (bias && n != 0) v += load(bias, bdt, n - 1);
#else
        if (bias) v += load(bias, bdt, n);
#endif
        d[(i64)m * ldd + n] = epi(v, EPI_ARGS, m, n);
      }
    }
}

// gemv_bf16 is matmul_r1_bf16 for one row of x with four chunks of
// weights in flight per lane (the decode step streams every weight once;
// how many bytes are in flight sets its speed). The products are
// accumulated in exactly mm_tile's order, so it gives the same bits.
// GEMV(name, C, U): each warp sums C rows, U 256-element chunks of each
// row's weights loaded ahead of their products. C and U change how many
// bytes are in flight and how many warps share the rows, never the order
// of a sum: lane l adds x[k]·w[k] for its k = 8l + 256j + e in ascending
// order, then the warp's butterfly — the FMA kernels' order, so a row's
// bits do not depend on the variant (queue.go: gemvVariant picks one).
__device__ __forceinline__ float gemv_bias(float v, const void* bias, int bdt, int n) {
#ifdef FAULT_GEMV
  if (bias && n > 0) v += load(bias, bdt, n - 1);
#else
  if (bias) v += load(bias, bdt, n);
#endif
  return v;
}

// gemv_row is the body of the one-row kernels: d[n] = x·w[n] (+ bias) for
// the C weight rows of each warp. pro() runs once, by every thread of the
// block, after the warp's first weight chunks are requested and before x
// is read: a fused prologue (GEMV_NORM's norm into shared memory) then
// overlaps the first loads' latency instead of preceding it.
struct no_prologue {
  __device__ void operator()() const {}
};

template <int C, int U, class Pro>
__device__ __forceinline__ void gemv_row(float* d, const float* x, const u16* w, i64 ldw, const void* bias, int bdt,
                                         int N, int K, Pro pro, EPI_PARAMS) {
  int lane = threadIdx.x & 31;
  int n0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * C;
  bool active = n0 < N;
  const u16* wr[C];
#pragma unroll
  for (int c = 0; c < C; c++) wr[c] = w + (i64)min(n0 + c, N - 1) * ldw;
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; c++) acc[c] = 0.0f;
  int k0 = 8 * lane;
  uint4 wv[U][C];
  bool full = active && k0 + 256 * (U - 1) + 8 <= K;
  if (full) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int c = 0; c < C; c++) wv[u][c] = __ldg((const uint4*)(wr[c] + k0 + 256 * u));
  }
  pro();
  if (!active) return;
  while (full) {
    float4 xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      xa[u] = *(const float4*)(x + k0 + 256 * u);
      xb[u] = *(const float4*)(x + k0 + 256 * u + 4);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float xs[8] = {xa[u].x, xa[u].y, xa[u].z, xa[u].w, xb[u].x, xb[u].y, xb[u].z, xb[u].w};
#pragma unroll
      for (int e = 0; e < 8; e++) {
#pragma unroll
        for (int c = 0; c < C; c++) {
          u32 q = e < 2 ? wv[u][c].x : e < 4 ? wv[u][c].y : e < 6 ? wv[u][c].z : wv[u][c].w;
          float wf = (e & 1) ? __uint_as_float(q & 0xffff0000u) : __uint_as_float(q << 16);
          acc[c] = fmaf(xs[e], wf, acc[c]);
        }
      }
    }
    k0 += 256 * U;
    full = k0 + 256 * (U - 1) + 8 <= K;
    if (full) {
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int c = 0; c < C; c++) wv[u][c] = __ldg((const uint4*)(wr[c] + k0 + 256 * u));
    }
  }
  for (; k0 < K; k0 += 256) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
      if (k0 + e < K) {
        float xv = x[k0 + e];
#pragma unroll
        for (int c = 0; c < C; c++) acc[c] = fmaf(xv, bf16f(wr[c][k0 + e]), acc[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; c++)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
#pragma unroll
  for (int c = 0; c < C; c++) {
    int n = n0 + c;
    if (lane == c && n < N) d[n] = epi(gemv_bias(acc[c], bias, bdt, n), EPI_ARGS, 0, n);
  }
}

#define GEMV(name, C, U)                                                                                        \
  __global__ void __launch_bounds__(128) name(float* d, const float* x, const u16* w, i64 ldw, const void* bias, \
                                              int bdt, int N, int K, EPI_PARAMS) {                              \
    pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * 4 * C, min(N, (int)(blockIdx.x + 1) * 4 * C));                 \
    PDL_ENTER();                                                                                                \
    gemv_row<C, U>(d, x, w, ldw, bias, bdt, N, K, no_prologue{}, EPI_ARGS);                                     \
  }

// ---- a row norm fused into what follows it ---------------------------------

// rms_inv returns rmsnorm_f32's 1/sqrt(mean(x²) + eps) of the cols values
// at x from a block of 128 threads, in rmsnorm_f32's own order (a block of
// 256): thread j plays threads j and j+128 of it (each summing its strided
// elements in c order), the 8 warps' butterflies are taken as there, and
// their sums combined as blockSum's last butterfly combines 8 lanes
// (zeros added elsewhere are exact): ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)).
// The same floats, so the norm fused into a product or a rotation gives
// the bits of the separate kernels. Every thread gets the result.
__device__ float rms_inv(const float* x, int cols, float eps, float* sh) {
  float lo = 0.0f, hi = 0.0f;
  // Unrolled so that a thread's loads are in flight together; each chain
  // still adds its elements in c order. Threads past the first 128 (a
  // larger block) add nothing and only wait.
  if (threadIdx.x < 128) {
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += 256) lo = fmaf(x[c], x[c], lo);
#pragma unroll 4
    for (int c = threadIdx.x + 128; c < cols; c += 256) hi = fmaf(x[c], x[c], hi);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo += __shfl_xor_sync(0xffffffffu, lo, o);
    hi += __shfl_xor_sync(0xffffffffu, hi, o);
  }
  int w = threadIdx.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0 && w < 4) {
    sh[w] = lo;
    sh[w + 4] = hi;
  }
  __syncthreads();
  float ss = ((sh[0] + sh[4]) + (sh[2] + sh[6])) + ((sh[1] + sh[5]) + (sh[3] + sh[7]));
#ifdef FAULT_NORMFUSE
  return (float)(1.0 / sqrt((double)(ss / (float)cols)));
#else
  return (float)(1.0 / sqrt((double)(ss / (float)cols + eps)));
#endif
}

// rms_scale is rmsnorm_f32's output step for one element: x·inv (rounded
// when rnd), times its weight wv when hasw (rounded again when rnd1).
__device__ __forceinline__ float rms_scale(float x, float inv, int rnd, bool hasw, float wv, int rnd1) {
  float v = OUT(x * inv);
  if (hasw) {
    v *= wv;
    if (rnd1) v = rbf16(v);
  }
  return v;
}

// rms_apply is rms_scale for element c of weights w (none when null).
__device__ __forceinline__ float rms_apply(float x, float inv, int rnd, const void* w, int wdt, int rnd1, int c) {
  return rms_scale(x, inv, rnd, w != nullptr, w ? load(w, wdt, c) : 0.0f, rnd1);
}

// gemv_norm(name, C, U): one row h = rmsnorm(x) (rmsnorm_f32's floats,
// written by block 0 for the ops that read h later) and d = h·wᵀ (+ bias),
// GEMV's sums: every block normalises x into shared memory itself (K ≤
// 12288 floats), then runs the one-row product from there. One kernel
// instead of two dependent ones.
#define GEMV_NORM(name, C, U)                                                                                  \
  __global__ void __launch_bounds__(128) name(float* d, float* h, const float* x, int K, float eps, int nrnd,    \
                                              const void* nw, int nwdt, int nrnd1, const u16* w, i64 ldw,       \
                                              const void* bias, int bdt, int N, EPI_PARAMS) {                   \
    pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * 4 * C, min(N, (int)(blockIdx.x + 1) * 4 * C));                 \
    PDL_ENTER();                                                                                                \
    extern __shared__ float4 xs4[];                                                                             \
    __shared__ float sh[8];                                                                                     \
    float* xs = (float*)xs4;                                                                                    \
    auto norm = [&]() {                                                                                         \
      float inv = rms_inv(x, K, eps, sh);                                                                       \
      _Pragma("unroll 4") for (int c = threadIdx.x; c < K; c += 128) {                                          \
        float v = rms_apply(x[c], inv, nrnd, nw, nwdt, nrnd1, c);                                               \
        xs[c] = v;                                                                                              \
        if (blockIdx.x == 0) h[c] = v;                                                                          \
      }                                                                                                         \
      __syncthreads();                                                                                          \
    };                                                                                                          \
    gemv_row<C, U>(d, xs, w, ldw, bias, bdt, N, K, norm, EPI_ARGS);                                             \
  }

extern "C" {

GEMV(gemv_bf16, 4, 4)
GEMV(gemv_bf16_c1u4, 1, 4)
GEMV(gemv_bf16_c1u8, 1, 8)
GEMV(gemv_bf16_c2u4, 2, 4)
GEMV(gemv_bf16_c2u8, 2, 8)
GEMV(gemv_bf16_c4u8, 4, 8)
GEMV_NORM(gemvn_bf16_c1u4, 1, 4)
GEMV_NORM(gemvn_bf16_c2u4, 2, 4)
GEMV_NORM(gemvn_bf16_c4u4, 4, 4)

// head_item mirrors the host's packing (fused.go: headItemBytes): one
// tensor of an attention's inputs for prep_heads_f32.
struct head_item {
  float* d;
  i64 ldd;
  const float* s;
  i64 lds;
  const void* nw;
  int heads, hd, nwdt, nrnd, nrnd1, copy, first;
  float eps;
};

// rope_cs is rope_f32's cosine and sine of pair j at position p (bf16
// mode rounds them).
__device__ __forceinline__ void rope_cs(int p, const float* invf, int j, int half, int bf16, float& c, float& s) {
#ifdef FAULT_HEADROPE
  float ang = (float)p * invf[half - 1 - j];
#else
  float ang = (float)p * invf[j];
#endif
  c = (float)cos((double)ang);
  s = (float)sin((double)ang);
  if (bf16) {
    c = rbf16(c);
    s = rbf16(s);
  }
}

// prep_head_pre reads what prep_head's thread needs first, from tables no
// kernel writes (so before the PDL wait): its first norm weight w0 and its
// first pair's cosine c0 and sine s0 (for a head to normalise and rotate).
__device__ __forceinline__ void prep_head_pre(int copy, const void* nw, int nwdt, int hd, int p, const float* invf,
                                              int bf16, float& w0, float& c0, float& s0) {
  int j0 = threadIdx.x;
  w0 = 1.0f, c0 = 0.0f, s0 = 0.0f;
  if (!copy) {
    if (nw && j0 < hd) w0 = load(nw, nwdt, j0);
    if (j0 < hd / 2) rope_cs(p, invf, j0, hd / 2, bf16, c0, s0);
  }
}

// prep_head is one head's work for prep_heads_f32 and std_block_f32: row =
// x (hd floats) for a copy; otherwise x normalised as rmsnorm_f32 does one
// row of hd (rms_inv, rms_scale with weights nw), then rotated as rope_f32
// does at position p (a thread a pair; interleaved or half pairs; bf16
// mode), rnd rounding the rotated fp32 values (a folded RoundBF16). The
// head goes through shared y (hd floats) before it is written, so row may
// be x itself; sh holds rms_inv's 8 partial sums. Any block of at least
// 128 threads gives the same floats. w0, c0, s0: prep_head_pre's.
__device__ __forceinline__ void prep_head(float* row, const float* x, int hd, int copy, const void* nw, int nwdt,
                                          int nrnd, int nrnd1, float eps, int interleaved, int p, const float* invf,
                                          int bf16, int rnd, float w0, float c0, float s0, float* y, float* sh) {
  int nt = blockDim.x, j0 = threadIdx.x, half = hd / 2;
  if (copy) {
    for (int c = threadIdx.x; c < hd; c += nt) row[c] = x[c];
    return;
  }
  float inv = rms_inv(x, hd, eps, sh);
  for (int c = threadIdx.x; c < hd; c += nt) {
    // rms_apply, with the weight read beforehand where c = j0.
    float wv = c == j0 ? w0 : nw ? load(nw, nwdt, c) : 0.0f;
    y[c] = rms_scale(x[c], inv, nrnd, nw != nullptr, wv, nrnd1);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < half; j += nt) {
    float c = c0, s = s0;
    if (j != j0) rope_cs(p, invf, j, half, bf16, c, s);
    int i0 = interleaved ? 2 * j : j;
    int i1 = interleaved ? 2 * j + 1 : j + half;
    float x0 = y[i0], x1 = y[i1];
    rope_store(row, i0, i1, x0, x1, c, s, bf16, rnd);
  }
}

// prep_heads_f32: one block of 128 threads per (item, row r, head h), the
// items' blocks one after another (item i's from items[i].first). A copy
// item copies the head; the others normalise it as rmsnorm_f32 does one
// row of hd (rms_inv, rms_apply), then rotate it as rope_f32 does (one
// thread per pair; interleaved or half pairs; bf16 mode), rnd rounding the
// rotated fp32 values (a folded RoundBF16). A head is read into shared
// memory before it is written, so d may be s itself. Replaces, per
// attention, the copies, norms and rotations of q, k and v: one launch.
//
// Only the heads (x) come from the kernel before; the items and positions
// are the launch's uploaded bytes and the frequencies and norm weights
// constants, none of them written by a kernel. So the items, a thread's
// first norm weight and its first pair's cosine and sine are read and
// computed before PDL_ENTER, while the kernel before still runs (the
// same floats as computing them after).
__global__ void __launch_bounds__(128) prep_heads_f32(const head_item* items, int nitems, int interleaved,
                                                      const float* invf, const int* pos, int bf16, int rnd) {
  extern __shared__ float4 ys4[];
  __shared__ float sh[8];
  int it = 0;
  while (it + 1 < nitems && (int)blockIdx.x >= items[it + 1].first) it++;
  const head_item a = items[it];
  int b = blockIdx.x - a.first;
  int r = b / a.heads, hh = b % a.heads;
  float w0, c0, s0;
  prep_head_pre(a.copy, a.nw, a.nwdt, a.hd, a.copy ? 0 : pos[r], invf, bf16, w0, c0, s0);
  PDL_ENTER();
  prep_head(a.d + (i64)r * a.ldd + (i64)hh * a.hd, a.s + (i64)r * a.lds + (i64)hh * a.hd, a.hd, a.copy, a.nw, a.nwdt,
            a.nrnd, a.nrnd1, a.eps, interleaved, a.copy ? 0 : pos[r], invf, bf16, rnd, w0, c0, s0, (float*)ys4, sh);
}

// GEMVR(name, R, C, U): the one-row kernel's scheme for R rows of x at
// once (a few sessions' decode rows): each warp sums C weight rows against
// R rows of x, U chunks of each weight row in flight, so the weights stream
// once for the R rows at the one-row rate while every loaded value of x
// serves C weight rows. The order of every sum is GEMV's (lane l adds
// x[m,k]·w[n,k] for its k = 8l + 256j + e ascending, then the butterfly),
// so a row's bits equal the tile kernels' and the one-row kernel's: a
// session's row does not depend on the batch it is stepped in. grid.x
// runs over the row tiles (so the tiles sharing a weight slice run side by
// side and the slice comes from L2 after its first read), grid.y over
// weight rows by 4·C.
#define GEMVR(name, R, C, U)                                                                                   \
  __global__ void __launch_bounds__(128) name(float* d, i64 ldd, const float* x, i64 ldx, const u16* w, i64 ldw,  \
                                              const void* bias, int bdt, int M, int N, int K, EPI_PARAMS) {          \
    if (blockIdx.x == 0) pdl_prefetch_rows(w, ldw, 2, K, blockIdx.y * 4 * C, min(N, (int)(blockIdx.y + 1) * 4 * C)); \
    PDL_ENTER();                                                                                                \
    int lane = threadIdx.x & 31;                                                                                \
    int n0 = (blockIdx.y * 4 + (threadIdx.x >> 5)) * C, m0 = blockIdx.x * R;                                    \
    if (n0 >= N) return;                                                                                        \
    const u16* wr[C];                                                                                           \
    _Pragma("unroll") for (int c = 0; c < C; c++) wr[c] = w + (i64)min(n0 + c, N - 1) * ldw;                    \
    const float* xr[R];                                                                                         \
    _Pragma("unroll") for (int r = 0; r < R; r++) xr[r] = x + (i64)min(m0 + r, M - 1) * ldx;                    \
    float acc[R][C];                                                                                            \
    _Pragma("unroll") for (int r = 0; r < R; r++) _Pragma("unroll") for (int c = 0; c < C; c++) acc[r][c] = 0.0f; \
    int k0 = 8 * lane;                                                                                          \
    for (; k0 + 256 * (U - 1) + 8 <= K; k0 += 256 * U) {                                                        \
      uint4 wv[U][C];                                                                                           \
      _Pragma("unroll") for (int u = 0; u < U; u++) _Pragma("unroll") for (int c = 0; c < C; c++) wv[u][c] =    \
          __ldg((const uint4*)(wr[c] + k0 + 256 * u));                                                          \
      _Pragma("unroll") for (int u = 0; u < U; u++) {                                                           \
        _Pragma("unroll") for (int hf = 0; hf < 2; hf++) {                                                      \
          float4 xv[R];                                                                                         \
          _Pragma("unroll") for (int r = 0; r < R; r++) xv[r] = *(const float4*)(xr[r] + k0 + 256 * u + 4 * hf); \
          _Pragma("unroll") for (int e = 0; e < 4; e++) {                                                       \
            _Pragma("unroll") for (int c = 0; c < C; c++) {                                                     \
              u32 q = hf == 0 ? (e < 2 ? wv[u][c].x : wv[u][c].y) : (e < 2 ? wv[u][c].z : wv[u][c].w);          \
              float wf = (e & 1) ? __uint_as_float(q & 0xffff0000u) : __uint_as_float(q << 16);                 \
              _Pragma("unroll") for (int r = 0; r < R; r++) {                                                   \
                float xe = e == 0 ? xv[r].x : e == 1 ? xv[r].y : e == 2 ? xv[r].z : xv[r].w;                    \
                acc[r][c] = fmaf(xe, wf, acc[r][c]);                                                            \
              }                                                                                                 \
            }                                                                                                   \
          }                                                                                                     \
        }                                                                                                       \
      }                                                                                                         \
    }                                                                                                           \
    for (; k0 < K; k0 += 256) {                                                                                 \
      _Pragma("unroll") for (int e = 0; e < 8; e++) {                                                           \
        if (k0 + e < K) {                                                                                       \
          _Pragma("unroll") for (int c = 0; c < C; c++) {                                                       \
            float wf = bf16f(wr[c][k0 + e]);                                                                    \
            _Pragma("unroll") for (int r = 0; r < R; r++) acc[r][c] = fmaf(xr[r][k0 + e], wf, acc[r][c]);      \
          }                                                                                                     \
        }                                                                                                       \
      }                                                                                                         \
    }                                                                                                           \
    _Pragma("unroll") for (int r = 0; r < R; r++) _Pragma("unroll") for (int c = 0; c < C; c++)                 \
        _Pragma("unroll") for (int o = 16; o > 0; o >>= 1) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], o); \
    _Pragma("unroll") for (int r = 0; r < R; r++) _Pragma("unroll") for (int c = 0; c < C; c++) {               \
      int m = m0 + r, n = n0 + c;                                                                               \
      if (lane == ((r * C + c) & 31) && m < M && n < N)                                                         \
        d[(i64)m * ldd + n] = epi(gemv_bias(acc[r][c], bias, bdt, n), EPI_ARGS, m, n);                          \
    }                                                                                                           \
  }

GEMVR(gemvr_bf16_r2c4u4, 2, 4, 4)
GEMVR(gemvr_bf16_r2c2u8, 2, 2, 8)
GEMVR(gemvr_bf16_r3c4u4, 3, 4, 4)
GEMVR(gemvr_bf16_r4c4u4, 4, 4, 4)
GEMVR(gemvr_bf16_r4c4u2, 4, 4, 2)
GEMVR(gemvr_bf16_r4c8u2, 4, 8, 2)
GEMVR(gemvr_bf16_r4c8u1, 4, 8, 1)
GEMVR(gemvr_bf16_r8c4u2, 8, 4, 2)

// One warp per tile; blockDim.x = 128 (4 warps); grid.x covers N/C tiles
// by 4, grid.y covers M/R.
#define MATMUL_KERNEL(name, R, C, WDT)                                                                        \
  __global__ void __launch_bounds__(128) name(float* d, i64 ldd, const float* x, i64 ldx, const void* w,     \
                                              i64 ldw, const void* bias, int bdt, int M, int N, int K,       \
                                              EPI_PARAMS) {                                                  \
    if (blockIdx.y == 0) pdl_prefetch_rows(w, ldw, WDT == DT_F32 ? 4 : 2, K, blockIdx.x * 4 * C, min(N, (int)(blockIdx.x + 1) * 4 * C)); \
    PDL_ENTER();                                                                                             \
    int tile = blockIdx.x * 4 + (threadIdx.x >> 5);                                                          \
    int n0 = tile * C, m0 = blockIdx.y * R;                                                                  \
    if (n0 >= N) return;                                                                                     \
    mm_tile<R, C, WDT>(d, ldd, x, ldx, w, ldw, bias, bdt, M, N, K, m0, n0, EPI_ARGS);                                  \
  }

MATMUL_KERNEL(matmul_r1_f32, 1, 4, DT_F32)
MATMUL_KERNEL(matmul_r2_f32, 2, 4, DT_F32)
MATMUL_KERNEL(matmul_r4_f32, 4, 4, DT_F32)
MATMUL_KERNEL(matmul_r8_f32, 8, 4, DT_F32)
MATMUL_KERNEL(matmul_r1_bf16, 1, 4, DT_BF16)
MATMUL_KERNEL(matmul_r2_bf16, 2, 4, DT_BF16)
MATMUL_KERNEL(matmul_r4_bf16, 4, 4, DT_BF16)
MATMUL_KERNEL(matmul_r8_bf16, 8, 4, DT_BF16)
MATMUL_KERNEL(matmul_r1_f16, 1, 4, DT_F16)
MATMUL_KERNEL(matmul_r2_f16, 2, 4, DT_F16)
MATMUL_KERNEL(matmul_r4_f16, 4, 4, DT_F16)
MATMUL_KERNEL(matmul_r8_f16, 8, 4, DT_F16)

}  // extern "C": the tiled FMA product's helpers are templates

// ---- the FMA product on 64 × 64 tiles, in mm_tile's order ------------------
//
// mm_tile gives every output d[m, n] this value: lane l of a warp sums its
// terms k = 8l + 256j + e (j, then e ascending, e < 8) with fmaf from 0
// into the partial p_l, then a butterfly adds the 32 partials: p_l +
// p_(l^16), then pairs at distance 8, 4, 2, 1. That is a balanced tree
// over the partials in bit-reversed order (leaf i of the tree is p_br(i)),
// so one thread can compute the same value alone: the partials one after
// another (p_br(0), p_br(1), …), each merged into a stack of at most five
// subtotals as a binary counter merges carries. mm_tile's warp computes
// only 8 × 4 outputs and pays a 32-lane reduction per output, and with the
// short K of a codec's convolutions (32–1536) most lanes idle; here a
// block of 256 threads computes 64 × 64 outputs (4 × 4 a thread) from
// shared memory, reading each 8-column chunk of x and w once per tile. The
// bits are mm_tile's (TestMatMulTiledBitIdentical).

// mmt_br5 reverses the five low bits of i.
__device__ __forceinline__ constexpr int mmt_br5(int i) {
  return ((i & 1) << 4) | ((i & 2) << 2) | (i & 4) | ((i & 8) >> 2) | ((i & 16) >> 4);
}

// mmt_chunks is how many 8-column chunks lane l's partial has for K terms.
__device__ __forceinline__ int mmt_chunks(int l, int K) { return 8 * l < K ? (K - 8 * l + 255) / 256 : 0; }

// mmt_next advances (i, j), a chunk of the partial at tree position i, to
// the next chunk in the order the tiles consume them; i = 32 past the end.
__device__ __forceinline__ void mmt_next(int& i, int& j, int K) {
  if (++j < mmt_chunks(mmt_br5(i), K)) return;
  j = 0;
  for (i++; i < 32 && mmt_chunks(mmt_br5(i), K) == 0; i++) {
  }
}

#define MMT_PAD 68 // row length of a staged chunk: 64 + 4 keeps stores off one bank

template <int WDT>
__device__ __forceinline__ void mmt_fetch(float (&xr)[2], float (&wr)[2], const float* x, i64 ldx, const void* w, i64 ldw,
                                          int M, int N, int K, int m0, int n0, int k0) {
  int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 2;
  const float* xp = x + (i64)min(m0 + r, M - 1) * ldx;
  i64 wo = (i64)min(n0 + r, N - 1) * ldw;
#pragma unroll
  for (int e = 0; e < 2; e++) {
    int k = k0 + c + e;
    xr[e] = k < K ? xp[k] : 0.0f;
    wr[e] = k < K ? load(w, WDT, wo + k) : 0.0f;
  }
}

__device__ __forceinline__ void mmt_stage(float* xs, float* ws, const float (&xr)[2], const float (&wr)[2]) {
  int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 2;
#pragma unroll
  for (int e = 0; e < 2; e++) {
    xs[(c + e) * MMT_PAD + r] = xr[e];
    ws[(c + e) * MMT_PAD + r] = wr[e];
  }
}

// mmt_push merges the partial at tree position I into the stack: level LV
// holds a subtotal while bit LV of I is set (a carry of the counter).
template <int I, int LV = 0>
__device__ __forceinline__ void mmt_push(float (&st)[5][4][4], float (&v)[4][4]) {
  if constexpr (LV < 5 && ((I >> LV) & 1)) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
      for (int b = 0; b < 4; b++) v[a][b] = st[LV][a][b] + v[a][b];
    mmt_push<I, LV + 1>(st, v);
  } else if constexpr (LV < 5) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
      for (int b = 0; b < 4; b++) st[LV][a][b] = v[a][b];
  }
}

template <int WDT, int I>
__device__ __forceinline__ void mmt_leaf(float (&st)[5][4][4], float (&v)[4][4], float* xs, float* ws, int& buf, int& fi,
                                         int& fj, const float* x, i64 ldx, const void* w, i64 ldw, int M, int N, int K, int m0,
                                         int n0) {
  constexpr int l = mmt_br5(I);
#ifdef FAULT_MATMUL_TILED
  constexpr bool drop = I == 1;  // the planted fault: lane 16's partial is lost
#else
  constexpr bool drop = false;
#endif
  int tm = (threadIdx.x >> 4) * 4, tn = (threadIdx.x & 15) * 4;
#pragma unroll
  for (int a = 0; a < 4; a++)
#pragma unroll
    for (int b = 0; b < 4; b++) v[a][b] = 0.0f;
  int J = mmt_chunks(l, K);
  for (int j = 0; j < J; j++) {
    bool more = fi < 32;
    float xr[2], wr[2];
    if (more) mmt_fetch<WDT>(xr, wr, x, ldx, w, ldw, M, N, K, m0, n0, 8 * mmt_br5(fi) + 256 * fj);
    const float* xb = xs + buf * 8 * MMT_PAD;
    const float* wb = ws + buf * 8 * MMT_PAD;
    int k0 = 8 * l + 256 * j;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      if (k0 + e < K && !drop) {
        float4 xa = *(const float4*)(xb + e * MMT_PAD + tm);
        float4 wa = *(const float4*)(wb + e * MMT_PAD + tn);
        float xv[4] = {xa.x, xa.y, xa.z, xa.w}, wv[4] = {wa.x, wa.y, wa.z, wa.w};
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
          for (int b = 0; b < 4; b++) v[a][b] = fmaf(xv[a], wv[b], v[a][b]);
      }
    }
    if (more) {
      mmt_stage(xs + (buf ^ 1) * 8 * MMT_PAD, ws + (buf ^ 1) * 8 * MMT_PAD, xr, wr);
      mmt_next(fi, fj, K);
    }
    __syncthreads();
    buf ^= 1;
  }
  mmt_push<I>(st, v);
}

template <int WDT, int... Is>
__device__ __forceinline__ void mmt_leaves(float (&st)[5][4][4], float (&v)[4][4], float* xs, float* ws, int& buf, int& fi,
                                           int& fj, const float* x, i64 ldx, const void* w, i64 ldw, int M, int N, int K,
                                           int m0, int n0) {
  (mmt_leaf<WDT, Is>(st, v, xs, ws, buf, fi, fj, x, ldx, w, ldw, M, N, K, m0, n0), ...);
}

extern "C" {

// grid (ceil(N/64), ceil(M/64)), 256 threads; thread t computes rows
// m0 + 4(t/16) … +3 and columns n0 + 4(t%16) … +3.
#define MATMUL_TILED(name, WDT)                                                                                        \
  __global__ void __launch_bounds__(256) name(float* d, i64 ldd, const float* x, i64 ldx, const void* w, i64 ldw,       \
                                              const void* bias, int bdt, int M, int N, int K, EPI_PARAMS) {            \
    if (blockIdx.y == 0) pdl_prefetch_rows(w, ldw, WDT == DT_F32 ? 4 : 2, K, blockIdx.x * 64, min(N, (int)(blockIdx.x + 1) * 64)); \
    PDL_ENTER();                                                                                                       \
    __shared__ __align__(16) float xs[2 * 8 * MMT_PAD];                                                                \
    __shared__ __align__(16) float ws[2 * 8 * MMT_PAD];                                                                \
    int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;                                                                    \
    int fi = 0, fj = 0, buf = 0;                                                                                       \
    while (fi < 32 && mmt_chunks(mmt_br5(fi), K) == 0) fi++;                                                           \
    if (fi < 32) {                                                                                                     \
      float xr[2], wr[2];                                                                                              \
      mmt_fetch<WDT>(xr, wr, x, ldx, w, ldw, M, N, K, m0, n0, 8 * mmt_br5(fi) + 256 * fj);                             \
      mmt_stage(xs, ws, xr, wr);                                                                                       \
      mmt_next(fi, fj, K);                                                                                             \
    }                                                                                                                  \
    __syncthreads();                                                                                                   \
    float st[5][4][4], v[4][4];                                                                                        \
    mmt_leaves<WDT, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,  \
               27, 28, 29, 30, 31>(st, v, xs, ws, buf, fi, fj, x, ldx, w, ldw, M, N, K, m0, n0);                       \
    int tm = (threadIdx.x >> 4) * 4, tn = (threadIdx.x & 15) * 4;                                                      \
    _Pragma("unroll") for (int a = 0; a < 4; a++) _Pragma("unroll") for (int b = 0; b < 4; b++) {                      \
      int m = m0 + tm + a, n = n0 + tn + b;                                                                            \
      if (m < M && n < N) {                                                                                            \
        float o = v[a][b];                                                                                             \
        if (bias) o += load(bias, bdt, n);                                                                             \
        d[(i64)m * ldd + n] = epi(o, EPI_ARGS, m, n);                                                                  \
      }                                                                                                                \
    }                                                                                                                  \
  }

MATMUL_TILED(matmul_t64_f32, DT_F32)
MATMUL_TILED(matmul_t64_bf16, DT_BF16)
MATMUL_TILED(matmul_t64_f16, DT_F16)

}  // extern "C"

// ---- matrix product on the tensor cores (bf16 weights) --------------------

// mma_bf16: d[m, n] = Σ_k x[m, k]·w[n, k] (+ bias[n]) for bf16 weights,
// with mma.sync.m16n8k16 (weights as A: 16 rows of w; x as B: 8 rows).
// x is fp32: split_bf16 first splits each value exactly into bf16 parts
// hi + mid + lo (|x − hi − mid − lo| ≤ 2^-24·|x|), and each part is
// multiplied, so the products keep fp32 accuracy; a part that is zero in
// all 8 rows of an MMA tile (x already bf16, as in bf16 mode) is skipped,
// which leaves out exact zeros.
//
// The summation order of an output depends only on K: K is cut into
// superblocks of 64; superblock s goes to class s mod 16, which
// accumulates its superblocks in s order (4 MMAs of k16 each, parts in
// hi, mid, lo order); the 16 class sums are then added in class order
// (p0 + p1, + p2, …, + p15). Class c is warp c mod 4's accumulator set
// c / 4 here, and warp c of the block in mmv_tile: the classes give the
// few-row kernels 16 warps of parallel loads per weight tile. Within a superblock, thread t of a quad holds the 16 k = 64s + 8t
// … +7 and 64s + 32 + 8t … +7 (a permutation of the MMA's k index, the
// same for A and B, so the dot product is unchanged; each 16-byte load of
// a quad covers 64 contiguous bytes of a row, whole sectors). How
// many rows of x one block covers (MT·8) does not enter: a row computed
// alone equals the same row in any batch, bit for bit.
__device__ __forceinline__ u32 pack2(float a, float b) {
  return (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
}

__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#ifdef OMNI_EMU
  emu_mma16816(c, a0, a1, a2, a3, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// mma_wload loads a thread's 16 bf16 weights of a row, k … k+7 and k+32 …
// k+39 (zeros past K), as 8 pairs.
__device__ __forceinline__ void mma_wload(u32 (&p)[8], const u16* row, int k, int K, bool vec) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int kk = k + 32 * h;
    if (vec && kk + 8 <= K) {
      uint4 a = __ldg((const uint4*)(row + kk));
      p[4 * h] = a.x; p[4 * h + 1] = a.y; p[4 * h + 2] = a.z; p[4 * h + 3] = a.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        u32 lo = kk + 2 * e < K ? row[kk + 2 * e] : 0u, hi = kk + 2 * e + 1 < K ? row[kk + 2 * e + 1] : 0u;
        p[4 * h + e] = lo | (hi << 16);
      }
    }
  }
}

// mma_xload loads a thread's 16 bf16 values of a split row, k … k+7 and
// k+32 … k+39 (rows are padded to a multiple of 64 with zeros).
__device__ __forceinline__ void mma_xload(u32 (&p)[8], const u16* row, int k) {
  uint4 a = *(const uint4*)(row + k), b = *(const uint4*)(row + k + 32);
  p[0] = a.x; p[1] = a.y; p[2] = a.z; p[3] = a.w;
  p[4] = b.x; p[5] = b.y; p[6] = b.z; p[7] = b.w;
}

template <int MT>
__device__ __forceinline__ void mma_tile(float* d, i64 ldd, const u16* xs, const u32* flags, int Kp,
                                         const u16* w, i64 ldw, const void* bias, int bdt, int M, int N, int K,
                                         EPI_PARAMS) {
  __shared__ float part[16][MT][32][4];  // the class sums
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t = lane & 3;
  int n0 = blockIdx.x * 16, m0 = blockIdx.y * 8 * MT;
  float acc[4][MT][4];  // classes warp, warp + 4, warp + 8, warp + 12
#pragma unroll
  for (int c = 0; c < 4; c++)
#pragma unroll
    for (int i = 0; i < MT; i++) acc[c][i][0] = acc[c][i][1] = acc[c][i][2] = acc[c][i][3] = 0.0f;
  const u16* wr0 = w + (i64)min(n0 + g, N - 1) * ldw;
  const u16* wr1 = w + (i64)min(n0 + g + 8, N - 1) * ldw;
  bool wv = ((((unsigned long long)w) & 15) == 0) && (ldw % 8 == 0);
  // Which parts (hi always; mid, lo where some row of the tile needs them).
  u32 need[MT];
  const u16* xr[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    int m = min(m0 + 8 * mt + g, M - 1);
    xr[mt] = xs + (i64)m * Kp;
    u32 f = flags[m];
    need[mt] = __reduce_or_sync(0xffffffffu, f);
  }
  i64 pstride = (i64)M * Kp;  // from one part to the next
  int nsb = (K + 63) / 64;
  for (int s0 = warp; s0 < nsb; s0 += 16) {
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int s = s0 + 4 * c;
      if (s >= nsb) break;
      int k = s * 64 + 8 * t;
      u32 wa[8], wb[8];
      mma_wload(wa, wr0, k, K, wv);
      mma_wload(wb, wr1, k, K, wv);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int part_ = 0; part_ < 3; part_++) {
          if (part_ > 0 && !(need[mt] & (1u << (part_ - 1)))) continue;
          u32 px[8];
          mma_xload(px, xr[mt] + part_ * pstride, k);
#pragma unroll
          for (int j = 0; j < 4; j++) {
#ifdef FAULT_MMA
            mma16816(acc[c][mt], wa[2 * j], wb[2 * j], wa[2 * j + 1], wb[2 * j + 1], px[2 * j + 1], px[2 * j]);
#else
            mma16816(acc[c][mt], wa[2 * j], wb[2 * j], wa[2 * j + 1], wb[2 * j + 1], px[2 * j], px[2 * j + 1]);
#endif
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < 4; c++)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int e = 0; e < 4; e++) part[4 * c + warp][mt][lane][e] = acc[c][mt][e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float v = part[0][mt][lane][q];
#pragma unroll
      for (int c = 1; c < 16; c++) v += part[c][mt][lane][q];
      // c0, c1: weight row g, x rows 2t, 2t+1; c2, c3: weight row g+8.
      int n = n0 + g + (q >> 1) * 8, m = m0 + 8 * mt + 2 * t + (q & 1);
      if (n < N && m < M) {
        if (bias) v += load(bias, bdt, n);
        d[(i64)m * ldd + n] = epi(v, EPI_ARGS, m, n);
      }
    }
  }
}

// mmv_parts splits lane (g, t)'s 16 values of x row xr in the superblock
// at k (k … k+7 and k+32 … k+39, zeros past K; xv: 16-byte loads) into
// bf16 parts (split_bf16's arithmetic) and calls mma(px) with the hi
// part, then with the mid and lo parts where some lane of the warp has
// them: the MMAs of one superblock and one 8-row tile of x, in mma_tile's
// part order (mmv_tile).
template <class F>
__device__ __forceinline__ void mmv_parts(const float* xr, bool xv, int k, int K, F mma) {
  float v[16];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int kk = k + 32 * h;
    if (xv && kk + 8 <= K) {
      float4 a = *(const float4*)(xr + kk), b = *(const float4*)(xr + kk + 4);
      v[8 * h] = a.x; v[8 * h + 1] = a.y; v[8 * h + 2] = a.z; v[8 * h + 3] = a.w;
      v[8 * h + 4] = b.x; v[8 * h + 5] = b.y; v[8 * h + 6] = b.z; v[8 * h + 7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) v[8 * h + e] = kk + e < K ? xr[kk + e] : 0.0f;
    }
  }
  u32 px[8];
  // Values that are bf16 already (what bf16 networks multiply) are their
  // own hi parts and leave no remainder: where all the warp's are, the
  // hi part is their top halves and no mid or lo part follows — the
  // split below gives the same words and skips both.
  u32 low = 0, nan = 0;
#pragma unroll
  for (int e = 0; e < 16; e++) {
    u32 b = __float_as_uint(v[e]);
    low |= b & 0xffffu;
    nan |= (b & 0x7fffffffu) > 0x7f800000u;  // rbf16 quiets a NaN: take the split
  }
#ifndef FAULT_MMV_EXACT
  if (__all_sync(0xffffffffu, (low | nan) == 0)) {
#else
  if (__all_sync(0xffffffffu, nan == 0)) {  // takes rows with low bits as exact
#endif
#pragma unroll
    for (int e = 0; e < 8; e++) px[e] = pack2(v[2 * e], v[2 * e + 1]);
    mma(px);
    return;
  }
  bool any = false;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    float h0 = rbf16(v[2 * e]), h1 = rbf16(v[2 * e + 1]);
    px[e] = pack2(h0, h1);
    v[2 * e] -= h0;  // the remainders, exact
    v[2 * e + 1] -= h1;
    any |= v[2 * e] != 0.0f || v[2 * e + 1] != 0.0f;
  }
  mma(px);
  // mid (and lo) where the tile has them: bf16 activations have none.
  if (__any_sync(0xffffffffu, any)) {
    bool anymid = false, anylo = false;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      float m0v = rbf16(v[2 * e]), m1v = rbf16(v[2 * e + 1]);
      px[e] = pack2(m0v, m1v);
      anymid |= m0v != 0.0f || m1v != 0.0f;
      v[2 * e] = rbf16(v[2 * e] - m0v);
      v[2 * e + 1] = rbf16(v[2 * e + 1] - m1v);
      anylo |= v[2 * e] != 0.0f || v[2 * e + 1] != 0.0f;
    }
    if (__any_sync(0xffffffffu, anymid)) mma(px);
    if (__any_sync(0xffffffffu, anylo)) {
#pragma unroll
      for (int e = 0; e < 8; e++) px[e] = pack2(v[2 * e], v[2 * e + 1]);
      mma(px);
    }
  }
}

// mmv_tile: mma_tile's products for up to 8·MT rows of x, bit for bit —
// its k permutation, its 16 interleaved superblock classes added in class
// order, the same MMAs in the same order (hi, mid, lo; k16 steps in
// order), the bias and the epilogue — with x read as fp32 and split into
// its bf16 parts in registers (split_bf16's arithmetic) instead of by a
// separate kernel, and NT tiles of 16 weight rows a warp. A block has W
// warps (4 or 16); warp w holds classes w, w + W, … (16/W of them), whose
// superblocks it loads together. A part is skipped where it is zero in
// the 8-row tile within one superblock (mma_tile: within the whole row);
// an included all-zero part adds exact zeros to a sum that starts at +0,
// which changes no bit, so every output equals mma_tile's. pro() runs
// once, by every thread, after the warp's first weights are requested and
// before x is read (MMV_NORM's norm into shared memory).
//
// (bx, by) is the tile: weight rows from 16·NT·bx, rows of x from 8·MT·by
// (a kernel's blockIdx, or a persistent kernel's work item). A caller
// that runs several tiles in one block puts a __syncthreads between them
// (the class sums' shared memory is reused).
//
// DUAL (NT = 2) is a SwiGLU's two products at once: tile 0 the rows of w
// from 16·bx, tile 1 the same rows of wb, and one output each, d = b with
// a = epi(v_w) (rnd, act, rnd1) and b = epi(v_wb) (rnd, then ⊕ a by eop,
// rnd2): the floats of the two products and their folded epilogues.
//
// TL: w (and wb) are in the tiled layout (tiled.go) instead of rows of
// ldw: a warp's weights of one superblock are 2 KiB in one place, each of
// its four 16-byte loads a thread 512 contiguous bytes of the warp, where
// the rows put them in 16 pieces of 128 bytes a row apart. The same values
// reach the same registers, so the same MMAs give the same bits.
//
// mmv_tile_carry is mmv_tile on weight registers wa of the caller's:
// preloaded says wa already holds this tile's first superblock (the tile
// before asked for it), and with tiled weights a nextbx ≥ 0 has the
// tile's last act ask for tile nextbx's first superblock into wa, after
// every MMA of this one (MMV_NORM_TILES). The loads move; no value does.
template <int W, int NT, int MT, class Pro, int DUAL = 0, int TL = 0>
__device__ __forceinline__ void mmv_tile_carry(float* d, i64 ldd, const float* x, i64 ldx, const u16* w, i64 ldw,
                                               const void* bias, int bdt, int M, int N, int K, Pro pro, int bx,
                                               int by, EPI_PARAMS, const u16* wb, i64 ldwb,
                                               u32 (&wa)[16 / W][NT][2][8], bool preloaded, int nextbx) {
  static_assert(!DUAL || NT == 2, "a dual tile is two tiles");
  constexpr int CW = 16 / W;                  // classes a warp
  __shared__ float part[16][NT][MT][32][4];  // the class sums
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t = lane & 3;
  int n0 = bx * 16 * (DUAL ? 1 : NT), m0 = by * 8 * MT;
  float acc[CW][NT][MT][4];
#pragma unroll
  for (int c = 0; c < CW; c++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int mt = 0; mt < MT; mt++) acc[c][nt][mt][0] = acc[c][nt][mt][1] = acc[c][nt][mt][2] = acc[c][nt][mt][3] = 0.0f;
  const u16* wr[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const u16* base = DUAL && nt == 1 ? wb : w;
    i64 ld = DUAL && nt == 1 ? ldwb : ldw;
    int r = n0 + (DUAL ? 0 : 16 * nt) + g;
    wr[nt][0] = base + (i64)min(r, N - 1) * ld;
    wr[nt][1] = base + (i64)min(r + 8, N - 1) * ld;
  }
  bool wv = ((((unsigned long long)w) & 15) == 0) && (ldw % 8 == 0) &&
            (!DUAL || (((((unsigned long long)wb) & 15) == 0) && (ldwb % 8 == 0)));
  int nsb = (K + 63) / 64;
  const u16* wt[NT];  // TL: where the lane's pieces of tile nt start (superblock 0)
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const u16* base = DUAL && nt == 1 ? wb : w;
    int tt = min(n0 / 16 + (DUAL ? 0 : nt), (N - 1) / 16);  // a tile past N: its outputs are not stored
    wt[nt] = base + (i64)tt * nsb * 1024 + 8 * lane;
  }
#ifdef FAULT_MMV
  const int sfirst = warp + 16;  // drops the first superblock of each of the warp's first classes
#else
  const int sfirst = warp;
#endif
  int s0 = sfirst;
  auto loadw = [&](int sb) {
#pragma unroll
    for (int c = 0; c < CW; c++) {
      int s = sb + W * c;
      if (s < nsb) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          if (TL) {
#pragma unroll
            for (int p = 0; p < 4; p++) {  // piece p: rows g + 8·(p >> 1), k half p & 1
              uint4 v = __ldg((const uint4*)(wt[nt] + (i64)s * 1024 + 256 * p));
              u32* o = &wa[c][nt][p >> 1][4 * (p & 1)];
              o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
            }
          } else {
            mma_wload(wa[c][nt][0], wr[nt][0], 64 * s + 8 * t, K, wv);
            mma_wload(wa[c][nt][1], wr[nt][1], 64 * s + 8 * t, K, wv);
          }
        }
      }
    }
  };
  if (!preloaded) loadw(s0);
  pro();
  const float* xr[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) xr[mt] = x + (i64)min(m0 + 8 * mt + g, M - 1) * ldx;
  bool xv = ((((unsigned long long)x) & 15) == 0) && (ldx % 4 == 0);
  for (; s0 < nsb; s0 += 16) {
#pragma unroll
    for (int c = 0; c < CW; c++) {
      int s = s0 + W * c;
      if (s >= nsb) break;
      int k = 64 * s + 8 * t;
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        mmv_parts(xr[mt], xv, k, K, [&](const u32(&px)[8]) {
#pragma unroll
          for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++)
              mma16816(acc[c][nt][mt], wa[c][nt][0][2 * j], wa[c][nt][1][2 * j], wa[c][nt][0][2 * j + 1],
                       wa[c][nt][1][2 * j + 1], px[2 * j], px[2 * j + 1]);
        });
    }
    if (s0 + 16 < nsb) loadw(s0 + 16);
  }
  // Every weight of this tile is multiplied: with a next tile (tiled
  // weights), its first superblock's loads go out now, into wa, while the
  // class sums are folded below and the caller's barrier waits.
  if (TL && nextbx >= 0) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      const u16* base = DUAL && nt == 1 ? wb : w;
#ifdef FAULT_MMV_CARRY
      int tt = min(nextbx * (DUAL ? 1 : NT) + (DUAL ? 0 : nt) + 1, (N - 1) / 16);  // the tile after the next
#else
      int tt = min(nextbx * (DUAL ? 1 : NT) + (DUAL ? 0 : nt), (N - 1) / 16);
#endif
      wt[nt] = base + (i64)tt * nsb * 1024 + 8 * lane;
    }
    loadw(sfirst);
  }
#pragma unroll
  for (int c = 0; c < CW; c++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[warp + W * c][nt][mt][lane][e] = acc[c][nt][mt][e];
  __syncthreads();
  if (warp != 0) return;
  if (DUAL) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float v0 = part[0][0][mt][lane][q], v1 = part[0][NT - 1][mt][lane][q];
#pragma unroll
        for (int c = 1; c < 16; c++) {
          v0 += part[c][0][mt][lane][q];
          v1 += part[c][NT - 1][mt][lane][q];
        }
        int n = n0 + g + (q >> 1) * 8, m = m0 + 8 * mt + 2 * t + (q & 1);
        if (n < N && m < M) {
          float a = epi(v0, rnd, act, rnd1, nullptr, 0, 0, 0, m, n);
          d[(i64)m * ldd + n] = epi(v1, rnd, 0, 0, &a, 0, eop, rnd2, 0, 0);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float v = part[0][nt][mt][lane][q];
#pragma unroll
        for (int c = 1; c < 16; c++) v += part[c][nt][mt][lane][q];
        int n = n0 + 16 * nt + g + (q >> 1) * 8, m = m0 + 8 * mt + 2 * t + (q & 1);
        if (n < N && m < M) {
          if (bias) v += load(bias, bdt, n);
          d[(i64)m * ldd + n] = epi(v, EPI_ARGS, m, n);
        }
      }
    }
  }
}

// mmv_tile is mmv_tile_carry with its weight registers its own: the
// tile's first superblock loaded at its start, no next tile asked for.
template <int W, int NT, int MT, class Pro, int DUAL = 0, int TL = 0>
__device__ __forceinline__ void mmv_tile(float* d, i64 ldd, const float* x, i64 ldx, const u16* w, i64 ldw,
                                         const void* bias, int bdt, int M, int N, int K, Pro pro, int bx, int by,
                                         EPI_PARAMS, const u16* wb = nullptr, i64 ldwb = 0) {
  u32 wa[16 / W][NT][2][8];
  mmv_tile_carry<W, NT, MT, Pro, DUAL, TL>(d, ldd, x, ldx, w, ldw, bias, bdt, M, N, K, pro, bx, by, EPI_ARGS, wb, ldwb,
                                           wa, false, -1);
}

extern "C" {

// split_bf16 writes x [M, K] as three bf16 parts (hi, mid, lo: exact,
// |x − hi − mid − lo| ≤ 2^-24·|x|) into out [3][M][Kp], rows zero-padded to
// Kp, and flags[m] = (mid of row m nonzero) | (lo nonzero) << 1.
// split_part splits v into its three bf16 parts (hi, mid, lo) and ORs
// into f which of mid and lo are nonzero.
__device__ __forceinline__ void split_part(float v, u32& h16, u32& m16, u32& l16, u32& f) {
  float h = rbf16(v), r = v - h, md = rbf16(r), lo = rbf16(r - md);
  h16 = __float_as_uint(h) >> 16;
  m16 = __float_as_uint(md) >> 16;
  l16 = __float_as_uint(lo) >> 16;
  f |= (md != 0.0f ? 1u : 0u) | (lo != 0.0f ? 2u : 0u);
}

// split_bf16 writes x's rows as three bf16 parts (rows of hi, then of mid,
// then of lo; each row Kp wide, zeros past K) and each row's flags (1: a
// mid part, 2: a lo part). A row whose K is a multiple of 4 and whose
// start is 16-byte aligned is read four floats a load, the loads of a
// thread's four groups issued together (a row of 2048 is four rounds of a
// 128-thread block where the scalar loop took sixteen, each waiting for
// its load); the parts are the scalar loop's.
#ifdef FAULT_SPLIT
#define SPLIT_LANE(c) ((c) ^ 1)  // the vector path's components swapped in pairs
#else
#define SPLIT_LANE(c) (c)
#endif
__global__ void split_bf16(u16* out, u32* flags, const float* x, i64 ldx, int M, int K, int Kp) {
  PDL_ENTER();
  int m = blockIdx.x;
  const float* xr = x + (i64)m * ldx;
  u32 f = 0;
  if ((K & 3) == 0 && ((unsigned long long)xr & 15) == 0) {
    u16* oh = out + (i64)m * Kp;
    u16* om = out + ((i64)M + m) * Kp;
    u16* ol = out + ((i64)2 * M + m) * Kp;
#pragma unroll 4
    for (int k = threadIdx.x * 4; k < Kp; k += blockDim.x * 4) {
      float4 v4 = {0.0f, 0.0f, 0.0f, 0.0f};
      if (k < K) v4 = *(const float4*)(xr + k);
      float v[4] = {v4.x, v4.y, v4.z, v4.w};
      u32 h[4], md[4], lo[4];
#pragma unroll
      for (int c = 0; c < 4; c++) split_part(v[SPLIT_LANE(c)], h[c], md[c], lo[c], f);
      uint2 ph = {h[0] | (h[1] << 16), h[2] | (h[3] << 16)};
      uint2 pm = {md[0] | (md[1] << 16), md[2] | (md[3] << 16)};
      uint2 pl = {lo[0] | (lo[1] << 16), lo[2] | (lo[3] << 16)};
      *(uint2*)(oh + k) = ph;
      *(uint2*)(om + k) = pm;
      *(uint2*)(ol + k) = pl;
    }
  } else {
    for (int k = threadIdx.x; k < Kp; k += blockDim.x) {
      u32 h, md, lo;
      split_part(k < K ? xr[k] : 0.0f, h, md, lo, f);
      out[(i64)m * Kp + k] = (u16)h;
      out[((i64)M + m) * Kp + k] = (u16)md;
      out[((i64)2 * M + m) * Kp + k] = (u16)lo;
    }
  }
  f = __reduce_or_sync(0xffffffffu, f);
  __shared__ u32 sf[32];
  if ((threadIdx.x & 31) == 0) sf[threadIdx.x >> 5] = f;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 a = 0;
    for (int i = 0; i < (int)blockDim.x / 32; i++) a |= sf[i];
    flags[m] = a;
  }
}

#define MMA_KERNEL(name, MT)                                                                                 \
  __global__ void __launch_bounds__(128) name(float* d, i64 ldd, const u16* xs, const u32* flags, int Kp,   \
                                              const u16* w, i64 ldw, const void* bias, int bdt, int M, int N, \
                                              int K, EPI_PARAMS) {                                             \
    if (blockIdx.y == 0) pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * 16, min(N, (int)(blockIdx.x + 1) * 16)); \
    PDL_ENTER();                                                                                            \
    mma_tile<MT>(d, ldd, xs, flags, Kp, w, ldw, bias, bdt, M, N, K, EPI_ARGS);                              \
  }

MMA_KERNEL(mma_bf16_m8, 1)
MMA_KERNEL(mma_bf16_m16, 2)
MMA_KERNEL(mma_bf16_m32, 4)

}  // extern "C"

// mma_big: mma_tile's products, bit for bit, for a 64 × 64 tile of outputs a
// block (64 weight rows × 64 rows of x; 4 warps of 32 × 32 each). K is
// walked class by class — class c's superblocks c, c + 16, … into one set
// of accumulators, which is then added to the sum of the classes before it
// (p0 + p1 + … + p15, mma_tile's final order; an empty class adds +0 as
// mma_tile's untouched one does) — so a thread holds two sets where
// mma_tile's holds four, and a whole tile of weights and x is shared by
// the block's warps. A superblock's weights and x (hi part) stream through
// shared memory with cp.async, three stages deep, when no row of the tile
// has a mid or lo part (x already bf16, as in bf16 networks); other tiles
// load every operand from global memory as mma_tile does. Either way each
// output receives the same MMAs in the same order as in mma_tile (a part
// that is zero in an 8-row tile adds exact zeros, as there).
#define BIG_T 64  // rows of weights, and of x, a block
#ifdef FAULT_MMA_BIG
#define BIG_XP(p) (((p) + 2) & 7)  // x's k pair p + 2 against the weights' pair p
#else
#define BIG_XP(p) (p)
#endif

#ifdef OMNI_EMU
// The emulator copies at once (zeros past bytes); a group is complete when
// it is issued.
__device__ __forceinline__ void cp_async16(void* sm, const void* gm, int bytes) { emu_cp_async16(sm, gm, bytes); }
__device__ __forceinline__ void cp_async_commit() {}
__device__ __forceinline__ void cp_async_wait1() {}
#else
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned long long a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (unsigned)a;
}

__device__ __forceinline__ void cp_async16(void* sm, const void* gm, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(sm)), "l"(gm), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
#endif

// big_next steps (c, s) to the next superblock in class order.
__device__ __forceinline__ void big_next(int& c, int& s, int nsb) {
  s += 16;
  if (s >= nsb) {
    c++;
    s = c;
  }
}

// big_mmas runs one superblock's MMAs of one part for a warp's 2 × 4 tiles
// from its fragments (wf[i]: weight tile i's rows g and g + 8, 8 pairs
// each; xf[j]: x tile j's row g).
__device__ __forceinline__ void big_mmas(float (&acc)[2][4][4], const u32 (&wf)[2][2][8], const u32 (&xf)[4][8]) {
#pragma unroll
  for (int jj = 0; jj < 4; jj++)
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
        mma16816(acc[i][j], wf[i][0][2 * jj], wf[i][1][2 * jj], wf[i][0][2 * jj + 1], wf[i][1][2 * jj + 1],
                 xf[j][BIG_XP(2 * jj)], xf[j][BIG_XP(2 * jj + 1)]);
}

// big_fold ends class c: sum = acc (class 0) or sum + acc, and acc = 0.
__device__ __forceinline__ void big_fold(float (&sum)[2][4][4], float (&acc)[2][4][4], int c) {
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        sum[i][j][q] = c == 0 ? acc[i][j][q] : sum[i][j][q] + acc[i][j][q];
        acc[i][j][q] = 0.0f;
      }
}

extern "C" {

// mma_big_run is mma_bf16_big's body. With parts nil it walks every class
// and ends in the epilogue; with parts set (mma_bf16_bigp) block z of the
// grid's gridDim.z walks only classes [z·ncls/S, (z+1)·ncls/S) of the ncls =
// min(16, ⌈K/64⌉) that have superblocks (S = gridDim.z ≤ ncls) and stores
// each class's sum — its own accumulators from +0, the same MMAs in the
// same order — to parts [ncls][M][N], for mma_fold_f32 to add in class
// order. The classes are independent until that fold, so splitting them
// over blocks changes no bit, and a product whose 64 × 64 tiles are fewer
// than the multiprocessors gets S times the blocks.
__device__ __forceinline__ void mma_big_run(float* d, i64 ldd, const u16* xs, const u32* flags, int Kp, const u16* w,
                                            i64 ldw, const void* bias, int bdt, int M, int N, int K, float* parts,
                                            EPI_PARAMS) {
  // Three stages of one superblock: 64 weight rows and 64 x rows of 64
  // bf16 (128 bytes) each, 16-byte chunk h of row r at chunk h ^ 4·(r & 1)
  // (a quarter warp's loads of rows r and r + 1 then hit all 32 banks).
  __shared__ __align__(16) u32 sw[3][BIG_T][32], sx[3][BIG_T][32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t = lane & 3;
  int n0 = blockIdx.x * BIG_T, m0 = blockIdx.y * BIG_T;
  int wn = (warp & 1) * 32, wm = (warp >> 1) * 32;  // the warp's 32 × 32
  // Whether some row of the tile has a mid or lo part.
  int need = __syncthreads_or(threadIdx.x < BIG_T && flags[min(m0 + (int)threadIdx.x, M - 1)] != 0);
  float acc[2][4][4], sum[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[i][j][q] = sum[i][j][q] = 0.0f;
  int nsb = (K + 63) / 64;
  int ncls = min(16, nsb);
  int c0 = 0, c1 = ncls;  // the classes this block walks
  if (parts) {
    c0 = (int)blockIdx.z * ncls / (int)gridDim.z;
    c1 = ((int)blockIdx.z + 1) * ncls / (int)gridDim.z;
  }
  int iters = 0;  // their superblocks
  for (int c = c0; c < c1; c++) iters += (nsb - c + 15) / 16;
  // A class's end: its sum into parts (split) or onto the classes before
  // it.
  auto endClass = [&](int c) {
    if (!parts) {
      big_fold(sum, acc, c);
      return;
    }
    float* pc = parts + (i64)c * M * N;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
          int n = n0 + wn + 16 * i + g + (q >> 1) * 8, m = m0 + wm + 8 * j + 2 * t + (q & 1);
          if (n < N && m < M) pc[(i64)m * N + n] = acc[i][j][q];
          acc[i][j][q] = 0.0f;
        }
  };
  if (need == 0 && ((((unsigned long long)w) & 15) == 0) && ldw % 8 == 0) {
    // Stage loads: 512 16-byte chunks of weights and 512 of x, 4 + 4 a
    // thread.
    auto load = [&](int st, int s) {
      int k0 = 64 * s;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int id = threadIdx.x + 128 * e, r = id >> 3, h = id & 7;
        int kk = k0 + 8 * h;
        const u16* src = w + (i64)min(n0 + r, N - 1) * ldw;
        int bytes = max(0, min(16, 2 * (K - kk)));
        cp_async16(&sw[st][r][4 * (h ^ ((r & 1) << 2))], src + (bytes > 0 ? kk : 0), bytes);
        const u16* xsrc = xs + (i64)min(m0 + r, M - 1) * Kp + kk;
        cp_async16(&sx[st][r][4 * (h ^ ((r & 1) << 2))], xsrc, 16);
      }
    };
    int lc = c0, ls = c0;  // the next superblock to load
    for (int p = 0; p < 2; p++) {
      if (p < iters) {
        load(p, ls);
        big_next(lc, ls, nsb);
      }
      cp_async_commit();
    }
    int c = c0, s = c0;
    for (int it = 0; it < iters; it++) {
      cp_async_wait1();
      __syncthreads();
      if (it + 2 < iters) {
        load((it + 2) % 3, ls);
        big_next(lc, ls, nsb);
      }
      cp_async_commit();
      int st = it % 3;
      u32 wf[2][2][8], xf[4][8];
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          int r = wn + 16 * i + g + 8 * hh;
#pragma unroll
          for (int half = 0; half < 2; half++) {
            uint4 a = *(const uint4*)&sw[st][r][4 * ((t + 4 * half) ^ ((r & 1) << 2))];
            wf[i][hh][4 * half] = a.x; wf[i][hh][4 * half + 1] = a.y;
            wf[i][hh][4 * half + 2] = a.z; wf[i][hh][4 * half + 3] = a.w;
          }
        }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        int r = wm + 8 * j + g;
#pragma unroll
        for (int half = 0; half < 2; half++) {
          uint4 a = *(const uint4*)&sx[st][r][4 * ((t + 4 * half) ^ ((r & 1) << 2))];
          xf[j][4 * half] = a.x; xf[j][4 * half + 1] = a.y; xf[j][4 * half + 2] = a.z; xf[j][4 * half + 3] = a.w;
        }
      }
      big_mmas(acc, wf, xf);
      if (s + 16 >= nsb) endClass(c);
      big_next(c, s, nsb);
    }
  } else {
    // Every operand from global memory (mma_tile's loads), parts where the
    // 8-row tile has them.
    bool wv = ((((unsigned long long)w) & 15) == 0) && (ldw % 8 == 0);
    const u16* wr[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) wr[i][hh] = w + (i64)min(n0 + wn + 16 * i + g + 8 * hh, N - 1) * ldw;
    u32 tneed[4];
    const u16* xr[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int m = min(m0 + wm + 8 * j + g, M - 1);
      xr[j] = xs + (i64)m * Kp;
      tneed[j] = __reduce_or_sync(0xffffffffu, flags[m]);
    }
    i64 pstride = (i64)M * Kp;
    int c = c0, s = c0;
    for (int it = 0; it < iters; it++) {
      int k = 64 * s + 8 * t;
      u32 wf[2][2][8];
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) mma_wload(wf[i][hh], wr[i][hh], k, K, wv);
      // Part by part (hi, mid, lo) for each x tile, as mma_tile orders
      // them for an output: a tile's parts go into its own accumulators.
#pragma unroll
      for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int part_ = 0; part_ < 3; part_++) {
          if (part_ > 0 && !(tneed[j] & (1u << (part_ - 1)))) continue;
          u32 px[8];
          mma_xload(px, xr[j] + part_ * pstride, k);
#pragma unroll
          for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int i = 0; i < 2; i++)
              mma16816(acc[i][j], wf[i][0][2 * jj], wf[i][1][2 * jj], wf[i][0][2 * jj + 1], wf[i][1][2 * jj + 1],
                       px[BIG_XP(2 * jj)], px[BIG_XP(2 * jj + 1)]);
        }
      }
      if (s + 16 >= nsb) endClass(c);
      big_next(c, s, nsb);
    }
  }
  if (parts) return;
  // Classes without superblocks (K < 1024) add +0, as in mma_tile.
  for (int c = ncls; c < 16; c++)
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) sum[i][j][q] = sum[i][j][q] + 0.0f;
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        int n = n0 + wn + 16 * i + g + (q >> 1) * 8, m = m0 + wm + 8 * j + 2 * t + (q & 1);
        if (n < N && m < M) {
          float v = sum[i][j][q];
          if (bias) v += load(bias, bdt, n);
          d[(i64)m * ldd + n] = epi(v, EPI_ARGS, m, n);
        }
      }
}

__global__ void __launch_bounds__(128) mma_bf16_big(float* d, i64 ldd, const u16* xs, const u32* flags, int Kp,
                                                    const u16* w, i64 ldw, const void* bias, int bdt, int M, int N,
                                                    int K, EPI_PARAMS) {
  if (blockIdx.y == 0) pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * BIG_T, min(N, (int)(blockIdx.x + 1) * BIG_T));
  PDL_ENTER();
  mma_big_run(d, ldd, xs, flags, Kp, w, ldw, bias, bdt, M, N, K, nullptr, EPI_ARGS);
}

// mma_bf16_bigp: mma_bf16_big's class sums, split over gridDim.z blocks a
// tile (mma_big_run), into parts; mma_fold_f32 ends the product.
__global__ void __launch_bounds__(128) mma_bf16_bigp(float* parts, const u16* xs, const u32* flags, int Kp,
                                                     const u16* w, i64 ldw, int M, int N, int K) {
  if (blockIdx.y == 0 && blockIdx.z == 0) pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * BIG_T, min(N, (int)(blockIdx.x + 1) * BIG_T));
  PDL_ENTER();
  mma_big_run(nullptr, 0, xs, flags, Kp, w, ldw, nullptr, 0, M, N, K, parts, 0, 0, 0, nullptr, 0, 0, 0);
}

// mma_fold_f32 ends a split product: d = epi(p0 + p1 + … + p15 + bias), the
// ncls class sums of parts [ncls][M][N] added in class order onto class
// 0's, then +0 for each class without superblocks — mma_bf16_big's fold,
// bias and epilogue, a thread an output.
__global__ void __launch_bounds__(256) mma_fold_f32(float* d, i64 ldd, const float* parts, int ncls, const void* bias,
                                                    int bdt, int M, int N, EPI_PARAMS) {
  PDL_ENTER();
  i64 plane = (i64)M * N;
  for (i64 id = (i64)blockIdx.x * 256 + threadIdx.x; id < plane; id += (i64)gridDim.x * 256) {
    int m = (int)(id / N), n = (int)(id % N);
    float v = parts[id];
#ifdef FAULT_MMA_FOLD
    for (int c = 1; c < ncls - 1; c++) v = v + parts[c * plane + id];  // drops the last class
#else
    for (int c = 1; c < ncls; c++) v = v + parts[c * plane + id];
#endif
    for (int c = ncls; c < 16; c++) v = v + 0.0f;
    if (bias) v += load(bias, bdt, n);
    d[(i64)m * ldd + n] = epi(v, EPI_ARGS, m, n);
  }
}

// MMV(name, W, NT, MT): mmv_tile as a kernel (blocks of W warps; grid.x
// over weight rows by 16·NT, grid.y over rows of x by 8·MT).
#define MMV(name, W, NT, MT)                                                                                  \
  __global__ void __launch_bounds__(32 * W) name(float* d, i64 ldd, const float* x, i64 ldx, const u16* w,      \
                                                 i64 ldw, const void* bias, int bdt, int M, int N, int K,       \
                                                 EPI_PARAMS) {                                                           \
    if (blockIdx.y == 0) pdl_prefetch_rows(w, ldw, 2, K, blockIdx.x * 16 * NT, min(N, (int)(blockIdx.x + 1) * 16 * NT)); \
    PDL_ENTER();                                                                                               \
    mmv_tile<W, NT, MT>(d, ldd, x, ldx, w, ldw, bias, bdt, M, N, K, no_prologue{}, blockIdx.x, blockIdx.y,       \
                        EPI_ARGS);                                                                         \
  }

MMV(mmv_bf16_w4n1m1, 4, 1, 1)
MMV(mmv_bf16_w16n1m1, 16, 1, 1)
MMV(mmv_bf16_w16n2m1, 16, 2, 1)
MMV(mmv_bf16_w16n4m1, 16, 4, 1)
MMV(mmv_bf16_w16n1m2, 16, 1, 2)

// MMVT(name, W, NT, MT): MMV on weights in the tiled layout (w from
// tiled.go; ldw unused). The first wave asks L2 for its tiles' bytes, as
// MMV's rows (one contiguous run a block here).
#define MMVT(name, W, NT, MT)                                                                                 \
  __global__ void __launch_bounds__(32 * W) name(float* d, i64 ldd, const float* x, i64 ldx, const u16* w,      \
                                                 i64 ldw, const void* bias, int bdt, int M, int N, int K,       \
                                                 EPI_PARAMS) {                                                  \
    if (blockIdx.y == 0) pdl_prefetch_rows(w, (K + 63) / 64 * 1024LL, 2, (K + 63) / 64 * 1024, blockIdx.x * NT, min((N + 15) / 16, (int)(blockIdx.x + 1) * NT)); \
    PDL_ENTER();                                                                                                \
    mmv_tile<W, NT, MT, no_prologue, 0, 1>(d, ldd, x, ldx, w, ldw, bias, bdt, M, N, K, no_prologue{}, blockIdx.x, \
                                           blockIdx.y, EPI_ARGS);                                               \
  }

MMVT(mmvt_bf16_w4n1m1, 4, 1, 1)
MMVT(mmvt_bf16_w16n1m1, 16, 1, 1)
MMVT(mmvt_bf16_w16n2m1, 16, 2, 1)
MMVT(mmvt_bf16_w16n4m1, 16, 4, 1)
MMVT(mmvt_bf16_w16n1m2, 16, 1, 2)

// MMV_NORM_ROW(W): the fused-norm kernels' row (MMV_NORM, MMV_NORM_GLU):
// declares xs, K floats of dynamic shared memory, and norm, which
// normalises x into it with rmsnorm_f32's floats (block 0 also writes h)
// — mmv_tile's prologue, run after the block's first weights are asked for.
#define MMV_NORM_ROW(W)                                                                                         \
  extern __shared__ float4 xs4[];                                                                               \
  __shared__ float sh[8];                                                                                       \
  float* xs = (float*)xs4;                                                                                      \
  auto norm = [&]() {                                                                                           \
    float inv = rms_inv(x, K, eps, sh);                                                                         \
    _Pragma("unroll 4") for (int c = threadIdx.x; c < K; c += 32 * W) {                                         \
      float v = rms_apply(x[c], inv, nrnd, nw, nwdt, nrnd1, c);                                                 \
      xs[c] = v;                                                                                                \
      if (blockIdx.x == 0) h[c] = v;                                                                            \
    }                                                                                                           \
    __syncthreads();                                                                                            \
  }

// MMV_NORM_TILES(N, W, NT, body…): the fused-norm kernels' 16-row tiles
// (mmv_tile_carry with W warps and NT tiles a pass), tile blockIdx.x,
// then blockIdx.x + gridDim.x, … (fused.go launches at most as many
// blocks as the GPU holds at once, normGrid): the row is normalised once
// a block, by the first tile's prologue (pro), and every tile after it
// reads the same shared floats — where a grid of a block a tile
// normalised it again in every wave. On tiled weights a tile's last
// superblock done, its warps ask for the next tile's first (next, into
// carry) before the class sums are folded, so the next tile starts with
// its weights on the way. Each tile's sums and epilogue are mmv_tile's,
// whichever block takes it, so the grid changes no bit; the barrier keeps
// a tile's class sums (shared memory) from the next tile's until warp 0
// has folded them. FAULT_MMV_PERSIST skips a block's second tile.
#ifdef FAULT_MMV_PERSIST
#define MMV_PERSIST_STEP(g) ((g) + ((tile == (int)blockIdx.x) ? (int)gridDim.x : 0))
#else
#define MMV_PERSIST_STEP(g) (g)
#endif
#define MMV_NORM_TILES(N, W, NT, ...)                                                                           \
  {                                                                                                             \
    bool first = true;                                                                                          \
    auto pro = [&]() {                                                                                          \
      if (first) norm();                                                                                        \
    };                                                                                                          \
    u32 carry[16 / (W)][NT][2][8];                                                                              \
    for (int tile = blockIdx.x; tile < ((N) + 15) / 16; tile += MMV_PERSIST_STEP((int)gridDim.x)) {          \
      if (!first) __syncthreads();                                                                              \
      int next = tile + MMV_PERSIST_STEP((int)gridDim.x) < ((N) + 15) / 16 ? tile + MMV_PERSIST_STEP((int)gridDim.x) : -1; \
      __VA_ARGS__                                                                                               \
      first = false;                                                                                            \
    }                                                                                                           \
  }

// MMV_NORM(name, W, TL): one row h = rmsnorm(x) (rmsnorm_f32's floats,
// block 0 writes h) and d = h·wᵀ (+ bias) with mmv_tile's sums (so
// mma_tile's): GEMV_NORM for the tensor-core order. Every block normalises
// x into shared memory itself (K ≤ 8192 floats beside the class sums). TL:
// w in the tiled layout (tiled.go; ldw unused).
#define MMV_NORM(name, W, TL)                                                                                   \
  __global__ void __launch_bounds__(32 * W) name(float* d, float* h, const float* x, int K, float eps, int nrnd, \
                                                 const void* nw, int nwdt, int nrnd1, const u16* w, i64 ldw,    \
                                                 const void* bias, int bdt, int N, EPI_PARAMS) {                \
    pdl_prefetch_rows(w, TL ? (K + 63) / 64 * 1024LL : ldw, 2, TL ? (K + 63) / 64 * 1024 : K, TL ? (int)blockIdx.x : (int)blockIdx.x * 16, TL ? (int)blockIdx.x + 1 : min(N, (int)(blockIdx.x + 1) * 16)); \
    PDL_ENTER();                                                                                                \
    MMV_NORM_ROW(W);                                                                                            \
    MMV_NORM_TILES(N, W, 1, {                                                                                   \
      mmv_tile_carry<W, 1, 1, decltype(pro), 0, TL>(d, 0, xs, 0, w, ldw, bias, bdt, 1, N, K, pro, tile, 0, EPI_ARGS, \
                                                    nullptr, 0, carry, !first && TL, next);                      \
    });                                                                                                         \
  }

MMV_NORM(mmvn_bf16_w4, 4, 0)
MMV_NORM(mmvn_bf16_w16, 16, 0)
MMV_NORM(mmvnt_bf16_w16, 16, 1)  // on tiled weights (tiled.go)

// MMV_NORM_GLU(name, W, TL): a SwiGLU's gate and up products of one row
// with the norm before them (gpu.NormGLU): h = rmsnorm(x) as MMV_NORM
// computes it (block 0 writes h), then mmv_tile's dual tile — 16 rows of
// w1 and the same 16 of w3 a block, both in flight — with the sequence's
// rounding points: a = epi(h·w1ᵀ) (rnd, silu, rnd1), d = epi(h·w3ᵀ) (rnd,
// ⊙ a, rnd2). The floats of NormMatMul(w1), Act, MatMul(w3), Mul and their
// roundings, in one launch where there were two. FAULT_MMV_GLU swaps the
// gate and the up product (silu on h·w3ᵀ).
#define MMV_NORM_GLU(name, W, TL)                                                                               \
  __global__ void __launch_bounds__(32 * W) name(float* d, float* h, const float* x, int K, float eps, int nrnd, \
                                                 const void* nw, int nwdt, int nrnd1, const u16* w1, i64 ld1,   \
                                                 const u16* w3, i64 ld3, int N, int rnd, int rnd1, int rnd2) {  \
    pdl_prefetch_rows(w1, TL ? (K + 63) / 64 * 1024LL : ld1, 2, TL ? (K + 63) / 64 * 1024 : K, TL ? (int)blockIdx.x : (int)blockIdx.x * 16, TL ? (int)blockIdx.x + 1 : min(N, (int)(blockIdx.x + 1) * 16)); \
    pdl_prefetch_rows(w3, TL ? (K + 63) / 64 * 1024LL : ld3, 2, TL ? (K + 63) / 64 * 1024 : K, TL ? (int)blockIdx.x : (int)blockIdx.x * 16, TL ? (int)blockIdx.x + 1 : min(N, (int)(blockIdx.x + 1) * 16)); \
    PDL_ENTER();                                                                                                \
    MMV_NORM_ROW(W);                                                                                            \
    const u16 *wg = w1, *wu = w3;                                                                               \
    i64 ldg = ld1, ldu = ld3;                                                                                   \
    MMV_GLU_FAULT();                                                                                            \
    MMV_NORM_TILES(N, W, 2, {                                                                                   \
      mmv_tile_carry<W, 2, 1, decltype(pro), 1, TL>(d, 0, xs, 0, wg, ldg, nullptr, 0, 1, N, K, pro, tile, 0, rnd, \
                                                    ACT_SILU, rnd1, nullptr, 0, OP_MUL, rnd2, wu, ldu, carry,    \
                                                    !first && TL, next);                                         \
    });                                                                                                         \
  }

#ifdef FAULT_MMV_GLU
#define MMV_GLU_FAULT() (wg = w3, wu = w1, ldg = ld3, ldu = ld1)
#else
#define MMV_GLU_FAULT() ((void)0)
#endif

MMV_NORM_GLU(mmvng_bf16_w16, 16, 0)
MMV_NORM_GLU(mmvngt_bf16_w16, 16, 1)  // on tiled weights (tiled.go)

// ---- attention -------------------------------------------------------------

// attention: one block per (query row i, query head h). Phase 1 writes the
// scaled scores of the visible keys into scratch sc (one row of maxL per
// (i, h)) and takes their maximum m; phase 2 replaces them by p = exp(s − m)
// (rounded to bf16 when probBF16) and sums the unrounded p into l; phase 3
// computes out[d] = Σ_j p_j·v[j, d] / l (j ascending per thread group,
// groups added in order). With a block table (blocks not null) k and v are
// pools of brows-row blocks and key row j is pool row
// blocks[j/brows]·brows + j%brows (attn_row); the arithmetic is the same.
__device__ __forceinline__ i64 attn_row(const int* blocks, int brows, int j) {
#ifdef FAULT_PAGED
  return j;  // ignores the table: pool rows read as if contiguous
#else
  return blocks ? (i64)blocks[j / brows] * brows + j % brows : (i64)j;
#endif
}

}  // extern "C": attn_pv is a template

// attn_pv adds NB keys' p·v to attn_rows' four chains: the values of keys
// j + t·groups (t < NB, row vrow(key)) and their p from s are loaded
// first, then key t goes to chain t mod 4, in t order.
template <int NB, class Row>
__device__ __forceinline__ void attn_pv(float& a0, float& a1, float& a2, float& a3, const float* s, int j, int groups,
                                        Row vrow) {
  float vv[NB], ss[NB];
#pragma unroll
  for (int t = 0; t < NB; t++) {
    vv[t] = vrow(j + t * groups);
    ss[t] = s[j + t * groups];
  }
#pragma unroll
  for (int t = 0; t < NB; t += 4) {
    a0 = fmaf(ss[t], vv[t], a0);
    a1 = fmaf(ss[t + 1], vv[t + 1], a1);
    a2 = fmaf(ss[t + 2], vv[t + 2], a2);
    a3 = fmaf(ss[t + 3], vv[t + 3], a3);
  }
}

extern "C" {

// attn_rows: query row i (at position pos) of head h over the keys of k
// and v (nkeys of them, paged through blocks when not null), computed by
// the block's first nthr threads as a block of nthr would (the others
// only take part in the block's barriers and reductions, adding
// identities: the same floats). With shs the scores and the keys' rows
// (attn_row, looked up once in phase 1) stay in shared memory, after the
// partials (attnShm: maxL floats and maxL ints), instead of in sc and the
// table: the same floats, without phase 2's and 3's trips to memory.
__device__ __forceinline__ void attn_rows(float* dst, i64 ldd, const float* q, i64 ldq, const float* k, i64 ldk,
                                          const float* v, i64 ldv, float* sc, i64 maxL, int heads, int kvheads, int hd,
                                          float scale, int i, int pos, int causal, int window, int nkeys, int probBF16,
                                          const int* blocks, int brows, int rnd, int h, int nthr, int shs) {
  // hd floats of q, then 32 for reductions, then hd*groups partials (at
  // most max(nthr, hd)), then with shs maxL scores and maxL key rows.
  extern __shared__ float shm[];
  float* qs = shm;
  float* red = shm + hd;
  float* part = red + 32;
  int* rows = nullptr;
  int kh = h / (heads / kvheads);
  int first = 0, last = causal ? min(nkeys - 1, pos) : nkeys - 1;
#ifdef FAULT_ATTN_MASK
  if (window > 0) first = max(first, pos - window);
#else
  if (window > 0) first = max(first, pos - window + 1);
#endif
  float* out = dst + (i64)i * ldd + (i64)h * hd;
  const float* qr = q + (i64)i * ldq + (i64)h * hd;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) qs[e] = qr[e];
  __syncthreads();
  if (last < first) {
    for (int e = threadIdx.x; e < hd; e += blockDim.x) out[e] = 0.0f;
    return;
  }
  int L = last - first + 1;
  // The scores: in shared memory after the parts with shs (sc unused,
  // may be null), else row (i, h) of the scratch sc.
  float* s = shs ? part + max(nthr, hd) : sc + ((i64)i * heads + h) * maxL;
  if (shs) rows = (int*)(s + maxL);
  float m = NEG_INF;
  int jt = (int)threadIdx.x < nthr ? (int)threadIdx.x : L;  // this thread's first key
  for (int j = jt; j < L; j += nthr) {
    i64 row = attn_row(blocks, brows, first + j);
    if (rows) rows[j] = (int)row;
    const float* kr = k + row * ldk + (i64)kh * hd;
    float a = 0.0f;
    // Four independent chains (dims e ≡ 0..3 mod 4), added in order: the
    // loads of a key row are in flight together.
    float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int e = 0;
    if (hd == 64 && (((unsigned long long)kr | (unsigned long long)qs) & 15) == 0) {
      // A 16-byte-aligned key row (and q in shared memory) in 16 vector
      // loads in flight at once: the same four chains in the same order
      // as the scalar loop below, so the same floats; each load of a
      // warp's rows uses half of a 32-byte sector where a scalar load
      // used an eighth. FAULT_ATTN_VEC pairs each q component with the
      // key's next one.
      const float4* k4 = (const float4*)kr;
      const float4* q4 = (const float4*)qs;
#pragma unroll
      for (int e4 = 0; e4 < 16; e4++) {
        float4 kv = k4[e4], qv = q4[e4];
#ifdef FAULT_ATTN_VEC
        kv = float4{kv.y, kv.z, kv.w, kv.x};
#endif
        a = fmaf(qv.x, kv.x, a);
        a1 = fmaf(qv.y, kv.y, a1);
        a2 = fmaf(qv.z, kv.z, a2);
        a3 = fmaf(qv.w, kv.w, a3);
      }
      e = 64;
    } else if (hd == 64) {
      // The models' head size on an unaligned row, unrolled so that the
      // row's 64 loads are in flight at once (the same four chains in the
      // same order).
#pragma unroll
      for (int e4 = 0; e4 < 64; e4 += 4) {
        a = fmaf(qs[e4], kr[e4], a);
        a1 = fmaf(qs[e4 + 1], kr[e4 + 1], a1);
        a2 = fmaf(qs[e4 + 2], kr[e4 + 2], a2);
        a3 = fmaf(qs[e4 + 3], kr[e4 + 3], a3);
      }
      e = 64;
    }
    for (; e + 4 <= hd; e += 4) {
      a = fmaf(qs[e], kr[e], a);
      a1 = fmaf(qs[e + 1], kr[e + 1], a1);
      a2 = fmaf(qs[e + 2], kr[e + 2], a2);
      a3 = fmaf(qs[e + 3], kr[e + 3], a3);
    }
    for (; e < hd; e++) a = fmaf(qs[e], kr[e], a);
    a = (a + a1) + (a2 + a3);
    a *= scale;
    s[j] = a;
    m = fmaxf(m, a);
  }
  m = blockMax(m, red);
  float l = 0.0f;
  for (int j = jt; j < L; j += nthr) {
    float p = expf(s[j] - m);
    l += p;
#ifdef FAULT_ATTN_ROUND
    s[j] = p;
#else
    s[j] = probBF16 ? rbf16(p) : p;
#endif
  }
  l = blockSum(l, red);
  __syncthreads();  // every p is in s
  // Phase 3: groups of hd threads split the keys.
  int groups = max(1, nthr / hd);
  int g = threadIdx.x / hd, e = threadIdx.x % hd;
  if (g < groups && e < hd) {
    float a = 0.0f;
    // Four independent chains over the group's keys, added in order.
    const float* vb = v + (i64)kh * hd + e;
#define VROW(jj) vb[(rows ? (i64)rows[jj] : attn_row(blocks, brows, first + (jj))) * ldv]
    float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int j = g;
    // 32, then 16 keys' values loaded before their products (rounds of the
    // four chains below, in their order: key j + t·groups goes to chain t
    // mod 4 whichever loop takes it), so the reads overlap.
    auto vrow = [&](int jj) { return VROW(jj); };
    for (; j + 31 * groups < L; j += 32 * groups) attn_pv<32>(a, a1, a2, a3, s, j, groups, vrow);
    for (; j + 15 * groups < L; j += 16 * groups) attn_pv<16>(a, a1, a2, a3, s, j, groups, vrow);
    for (; j + 3 * groups < L; j += 4 * groups) {
      a = fmaf(s[j], VROW(j), a);
      a1 = fmaf(s[j + groups], VROW(j + groups), a1);
      a2 = fmaf(s[j + 2 * groups], VROW(j + 2 * groups), a2);
      a3 = fmaf(s[j + 3 * groups], VROW(j + 3 * groups), a3);
    }
    for (; j < L; j += groups) a = fmaf(s[j], VROW(j), a);
#undef VROW
    a = (a + a1) + (a2 + a3);
    part[g * hd + e] = a;
  }
  if (hd > nthr) {  // large heads: each thread loops over dims
    for (int e2 = threadIdx.x; e2 < hd; e2 += blockDim.x) {
      float a = 0.0f;
      for (int j = 0; j < L; j++) a = fmaf(s[j], v[attn_row(blocks, brows, first + j) * ldv + (i64)kh * hd + e2], a);
      out[e2] = OUT(a / l);
    }
    return;
  }
  __syncthreads();
  for (int e2 = threadIdx.x; e2 < hd; e2 += blockDim.x) {
    float a = 0.0f;
    for (int g2 = 0; g2 < groups; g2++) a += part[g2 * hd + e2];
    out[e2] = OUT(a / l);
  }
}

__global__ void attention_f32(float* dst, i64 ldd, const float* q, i64 ldq, const float* k, i64 ldk, const float* v,
                              i64 ldv, float* sc, i64 maxL, int heads, int kvheads, int hd, float scale, int qpos0,
                              int causal, int window, int nkeys, int probBF16, const int* blocks, int brows,
                              int shs, int rnd) {
  PDL_ENTER();
  attn_rows(dst, ldd, q, ldq, k, ldk, v, ldv, sc, maxL, heads, kvheads, hd, scale, blockIdx.x, qpos0 + blockIdx.x,
            causal, window, nkeys, probBF16, blocks, brows, rnd, blockIdx.y, blockDim.x, shs);
}

// attn_seq is one query row of attention_seqs_f32 (48 bytes; cuda's
// attnRowBytes): its sequence's keys and values (pools when blocks is not
// null), their row strides, the row's position and its sequence's key
// count.
struct attn_seq {
  const float* k;
  const float* v;
  const int* blocks;
  i64 ldk, ldv;
  int pos, nkeys;
};

// attention_seqs_f32: attention_f32 for the rows of many sequences, row
// blockIdx.x reading its own sequence's keys through rows[blockIdx.x].
__global__ void attention_seqs_f32(float* dst, i64 ldd, const float* q, i64 ldq, const attn_seq* rows, float* sc,
                                   i64 maxL, int heads, int kvheads, int hd, float scale, int causal, int window,
                                   int probBF16, int brows, int shs, int rnd) {
  // The row list is uploaded (never written by a kernel): read before the wait.
#ifdef FAULT_ATTN_SEQS
  attn_seq r = rows[0];  // every row attends as the first row does
#else
  attn_seq r = rows[blockIdx.x];
#endif
  PDL_ENTER();
  attn_rows(dst, ldd, q, ldq, r.k, r.ldk, r.v, r.ldv, sc, maxL, heads, kvheads, hd, scale, blockIdx.x, r.pos, causal,
            window, r.nkeys, probBF16, r.blocks, brows, rnd, blockIdx.y, blockDim.x, shs);
}

// ---- one transformer block a launch ---------------------------------------

// grid_sync: no block of the grid leaves before every block has arrived,
// and what the blocks wrote before it is visible to all of them after it.
// bar[0] counts the arrivals, bar[1] the barriers passed: a block reads
// the generation before it arrives, the last to arrive resets the count
// and moves the generation on, the others wait for it to move. Only these
// barriers touch bar (zeroed once; the count is 0 between barriers, so
// grids of any size may use it one after another). The grid must be
// resident all at once.
__device__ __forceinline__ void grid_sync(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* vb = bar;
    unsigned gen = vb[1];
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      vb[0] = 0;
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (vb[1] == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

#define SB_PHASES 5

// std_block_f32: one pre-norm transformer block (liquid-audio's
// StandardBlock: GQA attention with per-head q/k norms and RoPE, then a
// SwiGLU feed-forward, bf16 rounding points) on one row x [1, D], in place,
// at position pos of its KV caches kc and vc (row stride ldk, ldv), in one
// launch of at most one block per multiprocessor:
//   0: h = n1(x), every block into shared memory; qkv = round(h·Wqkvᵀ)
//      a unit at a time (the fewest whole heads of hd rows that fill whole
//      16-row tiles), each head prepared at once (prep_head: q into qs; k
//      to kc row pos; v copied to vc row pos);
//   1: o = attention of qs over the cache rows 0 … pos (attn_rows as
//      attention_f32's 128 threads compute it, the scores in shared
//      memory), rounded, a head at a time;
//   2: a = round(round(o·Woᵀ) + x), 16 rows at a time;
//   3: h = n2(a), every block; g3 = round(round(h·W3ᵀ)·g1) with g1 =
//      round(silu(round(h·W1ᵀ))), both products of 16 rows in one pass
//      (mmv_tile's dual tile; g1 stays in registers);
//   4: x = round(round(g3·W2ᵀ) + a).
// The phases' items go round the grid's blocks, grid_sync between phases
// (a block waits there with its first weights of the next phase already
// requested: pro below).
// A launch runs phases p0 … p1 − 1: one grid all of them; a phase a launch
// (how the fused block runs by default, and always on the emulator, whose
// blocks run one after another) one, in the kernel of that phase alone. Every value is the one the
// op sequence of the block computes (NormMatMul, PrepHeads, Attention and
// the products with their folded epilogues), through the same device
// functions in the same order (mmv_tile's sums depend on K alone), so the
// two agree bit for bit (TestStdBlockEqualsSeq). qkv, qs, o, a and g3 are
// scratch (the attention's scores stay in shared memory, where a block's
// head reads them back after a barrier instead of from L2); bar is
// grid_sync's.
}  // extern "C"

// STD_BLOCK_PARAMS are std_block's parameters (and its kernels'),
// STD_BLOCK_ARGS the same names as arguments.
#define STD_BLOCK_PARAMS                                                                                          \
  float *x, int D, const void *n1w, int n1dt, float n1eps, int n1rnd, int n1rnd1, const u16 *wqkv, i64 ldqkv, int H, \
      int KVH, int hd, const void *qnw, int qndt, float qneps, int qnrnd, int qnrnd1, const void *knw, int kndt,      \
      float kneps, int knrnd, int knrnd1, const float *invf, int interleaved, int ropeBF16, int pos, float *kc,      \
      i64 ldk, float *vc, i64 ldv, float scale, int probBF16, const u16 *wo, i64 ldo, const void *n2w, int n2dt,     \
      float n2eps, int n2rnd, int n2rnd1, const u16 *w1, i64 ld1, const u16 *w3, i64 ld3, int F, const u16 *w2,      \
      i64 ld2, float *qkv, float *qs, float *o, float *a, float *g3, unsigned *bar, int p0, int p1
#define STD_BLOCK_ARGS                                                                                            \
  x, D, n1w, n1dt, n1eps, n1rnd, n1rnd1, wqkv, ldqkv, H, KVH, hd, qnw, qndt, qneps, qnrnd, qnrnd1, knw, kndt, kneps,   \
      knrnd, knrnd1, invf, interleaved, ropeBF16, pos, kc, ldk, vc, ldv, scale, probBF16, wo, ldo, n2w, n2dt, n2eps,  \
      n2rnd, n2rnd1, w1, ld1, w3, ld3, F, w2, ld2, qkv, qs, o, a, g3, bar, p0, p1

// PH ≥ 0 compiles phase PH alone (a kernel a phase: STD_BLOCK below), p0
// and p1 then unread; PH < 0 runs the launch's p0 … p1 − 1.
template <int TL, int PH = -1>
__device__ __forceinline__ void std_block(STD_BLOCK_PARAMS) {
  extern __shared__ float4 sb4[];
  __shared__ float sh[8];
  float* xs = (float*)sb4;  // a normalised row (D floats), then one head (hd)
  float* y = xs + D;
  int Hq = H * hd, kvd = KVH * hd, Nqkv = Hq + 2 * kvd;
  int G = gridDim.x;
  // The products' prologue, run after the block's first weights of a phase
  // are requested (mmv_tile loads them before calling it): first the grid
  // barrier the phase owes (owe), so that the weights' trip from memory,
  // which no phase's writes can change, overlaps the wait for the other
  // blocks; then, the first time (pmode 1 or 2), row nx (n1 or n2)
  // normalised into xs. A block without a tile in a phase pays its barrier
  // after the phase's loop.
  int pmode = 0;
  bool owe = false;
  auto pro = [&]() {
    if (owe) {
      grid_sync(bar);
      owe = false;
    }
    if (pmode == 0) return;
    const float* nx = pmode == 1 ? x : a;
    const void* nw = pmode == 1 ? n1w : n2w;
    int ndt = pmode == 1 ? n1dt : n2dt, nr = pmode == 1 ? n1rnd : n2rnd, nr1 = pmode == 1 ? n1rnd1 : n2rnd1;
    float inv = rms_inv(nx, D, pmode == 1 ? n1eps : n2eps, sh);
    for (int c = threadIdx.x; c < D; c += blockDim.x) xs[c] = rms_apply(nx[c], inv, nr, nw, ndt, nr1, c);
    __syncthreads();
    pmode = 0;
  };
  int q0 = PH >= 0 ? PH : p0, q1 = PH >= 0 ? PH + 1 : p1;
  for (int ph = q0; ph < q1; ph++) {
    owe = ph > q0;
    pmode = ph == 0 ? 1 : ph == 3 ? 2 : 0;  // a block without items skips the norm
    if (ph == 1 && owe) {  // the attention loads no weights first
      grid_sync(bar);
      owe = false;
    }
    if (ph == 0) {
      // A unit is the fewest whole heads that fill whole 16-row tiles.
      int ur = hd;
      while (ur % 16) ur += hd;
      int hpu = ur / hd, nh = H + 2 * KVH;
      for (int u = blockIdx.x; u * hpu < nh; u += G) {
        for (int r = 0; r < ur && u * ur + r < Nqkv; r += 16) {
          if (r + 32 <= ur && (u * ur + r) % 32 == 0) {  // two tiles at once
            mmv_tile<16, 2, 1, decltype(pro), 0, TL>(qkv, 0, xs, 0, wqkv, ldqkv, nullptr, 0, 1, Nqkv, D, pro, (u * ur + r) / 32, 0, 1, 0, 0,
                               nullptr, 0, 0, 0);
            r += 16;
          } else {
            mmv_tile<16, 1, 1, decltype(pro), 0, TL>(qkv, 0, xs, 0, wqkv, ldqkv, nullptr, 0, 1, Nqkv, D, pro, (u * ur + r) / 16, 0, 1, 0,
                               0, nullptr, 0, 0, 0);
          }
          __syncthreads();
        }
        for (int hh = u * hpu; hh < min(nh, (u + 1) * hpu); hh++) {
          int copy = hh >= H + KVH;
          float* dst;
          const void* nw = nullptr;
          int ndt = 0, nr = 0, nr1 = 0;
          float eps = 0.0f;
          if (hh < H) {
            dst = qs + (i64)hh * hd, nw = qnw, ndt = qndt, nr = qnrnd, nr1 = qnrnd1, eps = qneps;
          } else if (hh < H + KVH) {
            dst = kc + (i64)pos * ldk + (i64)(hh - H) * hd, nw = knw, ndt = kndt, nr = knrnd, nr1 = knrnd1, eps = kneps;
          } else {
            dst = vc + (i64)pos * ldv + (i64)(hh - H - KVH) * hd;
          }
          float w0, c0, s0;
          prep_head_pre(copy, nw, ndt, hd, pos, invf, ropeBF16, w0, c0, s0);
          prep_head(dst, qkv + (i64)hh * hd, hd, copy, nw, ndt, nr, nr1, eps, interleaved, pos, invf, ropeBF16, 1, w0,
                    c0, s0, y, sh);
          __syncthreads();
        }
      }
    } else if (ph == 1) {
      for (int u = blockIdx.x; u < H; u += G) {
#ifdef FAULT_STDBLOCK
        int np = pos;  // the current position's key and value unseen
#else
        int np = pos + 1;
#endif
        attn_rows(o, 0, qs, 0, kc, ldk, vc, ldv, nullptr, pos + 1, H, KVH, hd, scale, 0, pos, 1, 0, np, probBF16, nullptr,
                  1, 1, u, 128, 1);
        __syncthreads();
      }
    } else if (ph == 2) {
      for (int u = blockIdx.x; u < (D + 15) / 16; u += G) {
        mmv_tile<16, 1, 1, decltype(pro), 0, TL>(a, 0, o, 0, wo, ldo, nullptr, 0, 1, D, Hq, pro, u, 0, 1, 0, 0, x, 0, OP_ADD, 1);
        __syncthreads();
      }
    } else if (ph == 3) {
      // 16 rows of w1 and the same of w3 a unit, in one pass (a dual tile).
      for (int u = blockIdx.x; u < (F + 15) / 16; u += G) {
        mmv_tile<16, 2, 1, decltype(pro), 1, TL>(g3, 0, xs, 0, w1, ld1, nullptr, 0, 1, F, D, pro, u, 0, 1, ACT_SILU, 1,
                                             nullptr, 0, OP_MUL, 1, w3, ld3);
        __syncthreads();
      }
    } else if (ph == 4) {
      for (int u = blockIdx.x; u < (D + 15) / 16; u += G) {
        mmv_tile<16, 1, 1, decltype(pro), 0, TL>(x, 0, g3, 0, w2, ld2, nullptr, 0, 1, D, F, pro, u, 0, 1, 0, 0, a, 0, OP_ADD, 1);
        __syncthreads();
      }
    }
    if (owe) {  // no tile of this phase came to this block
      grid_sync(bar);
      owe = false;
    }
  }
}

// STD_BLOCK(name, TL, PH): std_block on weights in rows (TL 0) or on
// their tiled copies (TL 1, tiled.go), phase PH alone or (PH < 0) the
// launch's phases; a launch that begins with phase 0 first asks L2 for its
// block's qkv tiles. std_block_f32 and std_blockt_f32 hold every phase (a
// grid that runs them all with its barriers, or the one-kernel A/B of
// Options.OneKernelBlock); the _p<n> kernels one phase each, which a phase
// a launch takes: a kernel holds only its phase's code and registers,
// where the five-phase kernel kept 128 registers (8 spilled) and ≈ 40 % of
// its warps' stalls were instruction fetches (docs/performance.md). The
// same floats: the same device functions in the same order
// (TestStdBlockEqualsSeq).
#define STD_BLOCK_NQ ((H + 2 * KVH) * hd)
#define STD_BLOCK(name, TL, PH)                                                                                   \
  __global__ void __launch_bounds__(512) name(STD_BLOCK_PARAMS) {                                                 \
    if ((PH >= 0 ? PH : p0) == 0) pdl_prefetch_rows(wqkv, TL ? (D + 63) / 64 * 1024LL : ldqkv, 2, TL ? (D + 63) / 64 * 1024 : D, TL ? (int)blockIdx.x * 2 : (int)blockIdx.x * 32, TL ? min((STD_BLOCK_NQ + 15) / 16, (int)blockIdx.x * 2 + 2) : min(STD_BLOCK_NQ, (int)blockIdx.x * 32 + 32)); \
    PDL_ENTER();                                                                                                  \
    std_block<TL, PH>(STD_BLOCK_ARGS);                                                                            \
  }

extern "C" {

STD_BLOCK(std_block_f32, 0, -1)
STD_BLOCK(std_blockt_f32, 1, -1)
STD_BLOCK(std_block_f32_p0, 0, 0)
STD_BLOCK(std_block_f32_p1, 0, 1)
STD_BLOCK(std_block_f32_p2, 0, 2)
STD_BLOCK(std_block_f32_p3, 0, 3)
STD_BLOCK(std_block_f32_p4, 0, 4)
STD_BLOCK(std_blockt_f32_p0, 1, 0)
STD_BLOCK(std_blockt_f32_p1, 1, 1)
STD_BLOCK(std_blockt_f32_p2, 1, 2)
STD_BLOCK(std_blockt_f32_p3, 1, 3)
STD_BLOCK(std_blockt_f32_p4, 1, 4)

// ---- convolutions ----------------------------------------------------------

// conv1d: d[t, o] = b[o] + Σ_{c<cg, k<K} w[o, c, k]·x[t·stride + k·dil − pad, grp(o)·cg + c].
__global__ void conv1d_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt, const void* b,
                           int bdt, int Tin, int Cin, int Tout, int Cout, int K, int stride, int dil, int pad,
                           int groups, int rnd) {
  PDL_ENTER();
  int cg = Cin / groups, og = Cout / groups;
  EACH((i64)Tout * Cout) {
    int t = (int)(i / Cout), o = (int)(i % Cout);
    int g = o / og;
    float acc = 0.0f;
    for (int c = 0; c < cg; c++) {
      const float* xc = x + g * cg + c;
      i64 wb = ((i64)o * cg + c) * K;
      for (int kk = 0; kk < K; kk++) {
#ifdef FAULT_CONV1D
        int ti = t * stride + kk * dil - pad + 1;
#else
        int ti = t * stride + kk * dil - pad;
#endif
        if (ti >= 0 && ti < Tin) acc = fmaf(load(w, wdt, wb + kk), xc[(i64)ti * ldx], acc);
      }
    }
    if (b) acc += load(b, bdt, o);
    d[(i64)t * ldd + o] = OUT(acc);
  }
}

// convtr1d: full[u, o] = b[o] + Σ_{t·stride + k = u} Σ_{c<cg} x[t, grp(o)·cg + c]·w[grp·cg + c, o mod og, k];
// d receives rows [skip, skip + Tout) of full.
__global__ void convtr1d_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt, const void* b,
                             int bdt, int Tin, int Cin, int Tout, int Cout, int K, int stride, int skip, int groups, int rnd) {
  PDL_ENTER();
  int cg = Cin / groups, og = Cout / groups;
  EACH((i64)Tout * Cout) {
    int ur = (int)(i / Cout), o = (int)(i % Cout);
    int u = ur + skip;
    int g = o / og, oo = o % og;
    float acc = 0.0f;
    for (int kk = 0; kk < K; kk++) {
      int num = u - kk;
      if (num < 0 || num % stride) continue;
      int t = num / stride;
      if (t >= Tin) continue;
      for (int c = 0; c < cg; c++) {
        int ci = g * cg + c;
#ifdef FAULT_CONVTR
        float wv = load(w, wdt, ((i64)ci * og + oo) * K + (K - 1 - kk));
#else
        float wv = load(w, wdt, ((i64)ci * og + oo) * K + kk);
#endif
        acc = fmaf(x[(i64)t * ldx + ci], wv, acc);
      }
    }
    if (b) acc += load(b, bdt, o);
    d[(i64)ur * ldd + o] = OUT(acc);
  }
}

}  // extern "C": conv2d_taps is a template

// conv2d_taps adds to acc one input channel's terms of output (ho, wo) in
// conv2d's order — kernel rows, then columns, fmaf, the taps outside the
// input skipped: xrow(a) is the input row kernel row a reads, wt(a, bb) the
// tap's weight. Both convolution kernels sum through it, so they give the
// same bits.
template <class XRow, class Wt>
__device__ __forceinline__ float conv2d_taps(float acc, int ho, int wo, int H, int W, int KH, int KW, int sH, int sW,
                                             int pH, int pW, XRow xrow, Wt wt) {
  for (int a = 0; a < KH; a++) {
    int hi = ho * sH + a - pH;
    if (hi < 0 || hi >= H) continue;
    const float* xr = xrow(a);
    for (int bb = 0; bb < KW; bb++) {
#ifdef FAULT_CONV2D
      int wi = wo * sW + bb - pW + (a == 0 ? 1 : 0);
#else
      int wi = wo * sW + bb - pW;
#endif
      if (wi >= 0 && wi < W) acc = fmaf(wt(a, bb), xr[wi], acc);
    }
  }
  return acc;
}

extern "C" {

// conv2d over x [H, Cin·W] (channel c's W values at c·W of a row) with w
// [Cout, cg·KH·KW]; d is [Hout, Cout·Wout].
__global__ void conv2d_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt, const void* b,
                           int bdt, int H, int Cin, int W, int Hout, int Cout, int Wout, int KH, int KW, int sH,
                           int sW, int pH, int pW, int groups, int rnd) {
  PDL_ENTER();
  int cg = Cin / groups, og = Cout / groups;
  EACH((i64)Hout * Cout * Wout) {
    int ho = (int)(i / ((i64)Cout * Wout));
    int rem = (int)(i % ((i64)Cout * Wout));
    int o = rem / Wout, wo = rem % Wout;
    int g = o / og;
    float acc = 0.0f;
    for (int c = 0; c < cg; c++) {
      int ci = g * cg + c;
      acc = conv2d_taps(
          acc, ho, wo, H, W, KH, KW, sH, sW, pH, pW,
          [&](int a) { return x + (i64)(ho * sH + a - pH) * ldx + (i64)ci * W; },
          [&](int a, int bb) { return load(w, wdt, (((i64)o * cg + c) * KH + a) * KW + bb); });
    }
    if (b) acc += load(b, bdt, o);
    d[(i64)ho * ldd + (i64)o * Wout + wo] = OUT(acc);
  }
}

// conv2d_rows_f32: conv2d_f32's outputs, each the same sum in the same
// order (channels, then kernel rows, then columns, fmaf from 0, the bias
// after), from shared memory: block (bx, ho) computes output row ho for
// output channels [ob·bx, ob·bx + ob), having staged the input rows its
// kernel rows reach, for the channels of those outputs' groups (in-range
// rows only; the sums skip the others as conv2d_f32 does), and the
// channels' weights as floats. conv2d_f32 has every thread read its
// operands from global memory, the weights through a dtype switch; the
// conformer's subsampling (a 3 × 3 stem, depthwise 3 × 3 and pointwise
// 1 × 1 convolutions over 256 channels) took 2.2 ms of a 5 s clip's
// encoder that way on an H200. Dynamic shared memory: KH·nch·W + ob·cg·KH·KW
// floats (the host's conv2dRowsShm).
__global__ void __launch_bounds__(256) conv2d_rows_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt,
                                                       const void* b, int bdt, int H, int Cin, int W, int Hout, int Cout,
                                                       int Wout, int KH, int KW, int sH, int sW, int pH, int pW, int groups,
                                                       int ob, int rnd) {
  extern __shared__ float4 cs4[];
  float* xs = (float*)cs4;
  int cg = Cin / groups, og = Cout / groups;
  int ho = blockIdx.y, o0 = blockIdx.x * ob, o1 = min(Cout, o0 + ob);
  int c0 = (o0 / og) * cg, c1 = ((o1 - 1) / og + 1) * cg, nch = c1 - c0;  // the groups' input channels
  float* ws = xs + (i64)KH * nch * W;
  int kk = cg * KH * KW;
  // The weights are constants: staged before the wait.
  for (int e = threadIdx.x; e < (o1 - o0) * kk; e += blockDim.x) ws[e] = load(w, wdt, (i64)o0 * kk + e);
  PDL_ENTER();
  for (int e = threadIdx.x; e < KH * nch * W; e += blockDim.x) {
    int a = e / (nch * W), r = e % (nch * W);
    int hi = ho * sH + a - pH;
    if (hi >= 0 && hi < H) xs[e] = x[(i64)hi * ldx + (i64)c0 * W + r];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < (o1 - o0) * Wout; e += blockDim.x) {
    int ol = e / Wout, wo = e % Wout, o = o0 + ol;
    int g = o / og;
    float acc = 0.0f;
    for (int c = 0; c < cg; c++) {
      int lc = g * cg + c - c0;
      const float* wc = ws + ((i64)ol * cg + c) * KH * KW;
      acc = conv2d_taps(
          acc, ho, wo, H, W, KH, KW, sH, sW, pH, pW, [&](int a) { return xs + ((i64)a * nch + lc) * W; },
          [&](int a, int bb) { return wc[a * KW + bb]; });
    }
    if (b) acc += load(b, bdt, o);
    d[(i64)ho * ldd + (i64)o * Wout + wo] = OUT(acc);
  }
}


// conv2d_pw_f32: a dense pointwise convolution (1 × 1 kernel, strides 1, no
// padding, one group) as conv2d_f32 computes it — each output the fmaf
// chain over the input channels in order from 0, the bias after — with the
// operands tiled through shared memory: block (bx, ho, bz) computes output
// channels [64·bx, 64·bx + 64) × positions [32·bz, 32·bz + 32) of output
// row ho, walking the channels 32 at a time; thread (tx, ty) of 16 × 16
// holds positions tx, tx + 16 and channels ty + 16j (j < 4). conv2d_rows_f32
// stages a whole input row for 256 outputs, which made the conformer's
// pointwise convolutions (a [256, 256] weight over 123 × 32 positions)
// 0.9 ms of a 5 s clip's encoder on an H200.
#define PW_TO 64
#define PW_TW 32
#define PW_CK 32
__global__ void __launch_bounds__(256) conv2d_pw_f32(float* d, i64 ldd, const float* x, i64 ldx, const void* w, int wdt,
                                                     const void* b, int bdt, int Cin, int W, int Cout, int rnd) {
  PDL_ENTER();
  __shared__ float xs[PW_CK][PW_TW];
  __shared__ float ws[PW_TO][PW_CK + 1];
  int o0 = blockIdx.x * PW_TO, ho = blockIdx.y, w0 = blockIdx.z * PW_TW;
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][2];
#pragma unroll
  for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = 0.0f;
  PDL_ENTER();
  const float* xr = x + (i64)ho * ldx;
  for (int c0 = 0; c0 < Cin; c0 += PW_CK) {
    int nc = min(PW_CK, Cin - c0);
    for (int e = threadIdx.x; e < PW_CK * PW_TW; e += blockDim.x) {
      int c = e / PW_TW, wi = e % PW_TW;
      xs[c][wi] = (c < nc && w0 + wi < W) ? xr[(i64)(c0 + c) * W + w0 + wi] : 0.0f;
    }
    for (int e = threadIdx.x; e < PW_TO * PW_CK; e += blockDim.x) {
      int ol = e / PW_CK, c = e % PW_CK;
      ws[ol][c] = (c < nc && o0 + ol < Cout) ? load(w, wdt, (i64)(o0 + ol) * Cin + c0 + c) : 0.0f;
    }
    __syncthreads();
#ifdef FAULT_CONV2D_PW
    if (c0 + PW_CK >= Cin) nc--;  // drops the last input channel
#endif
    for (int c = 0; c < nc; c++) {
      float x0 = xs[c][tx], x1 = xs[c][tx + 16];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float wv = ws[ty + 16 * j][c];
        acc[j][0] = fmaf(wv, x0, acc[j][0]);
        acc[j][1] = fmaf(wv, x1, acc[j][1]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    int o = o0 + ty + 16 * j;
    if (o >= Cout) continue;
    float bo = b ? load(b, bdt, o) : 0.0f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      int wo = w0 + tx + 16 * k;
      if (wo >= W) continue;
      float a = acc[j][k];
      if (b) a += bo;
      d[(i64)ho * ldd + (i64)o * W + wo] = OUT(a);
    }
  }
}

}  // extern "C"

// ---- the relative-position attention core (gpu.RelPosScores, gpu.HeadsMatMul) ----
//
// A conformer clip's attention of T rows for all heads in one launch each
// (relpos.go), where the op sequence takes three products per head and
// their elementwise ops. Every dot product is summed exactly as the FMA
// product kernels sum it — with mm_load and mm_fma themselves: lane l of
// a warp accumulates its terms k = 8l + 256j + e with fmaf from +0 in that
// order, then the warp's xor butterfly (offsets 16, 8, 4, 2, 1) — and is
// rounded where the sequence rounds it, so the bits are the sequence's
// (TestRelPosFusedEqualsSeq).

#define RP_C 8  // the scores of one row a warp computes

extern "C" {

// relpos_scores_f32: s[h·T+i, j] = R(R(R(qu_h[i]·k_h[j]) + R(qv_h[i]·p_h[T−1−i+j]))·scale)
// for head h's hd columns x_h = x[:, h·hd … h·hd+hd−1], R = rbf16 when
// rnd: the sequence's matrix_ac product, its matrix_bd product (p's rows
// 0 … 2T−2) read through rel_shift, their sum and the scaled scores,
// each rounded. grid (ceil(ceil(T/RP_C)/4), T, heads), 128 threads: warp
// w of block x computes columns j0 = RP_C·(4x + w) … j0+RP_C−1 of row i =
// blockIdx.y of head h = blockIdx.z.
__global__ void __launch_bounds__(128) relpos_scores_f32(float* s, i64 lds, const float* qu, i64 ldqu, const float* qv,
                                                         i64 ldqv, const float* k, i64 ldk, const float* p, i64 ldp, int T,
                                                         int hd, float scale, int rnd) {
  PDL_ENTER();
  int lane = threadIdx.x & 31;
  int j0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * RP_C;
  int i = blockIdx.y, h = blockIdx.z;
  if (j0 >= T) return;
  const float* xu[1] = {qu + (i64)i * ldqu + (i64)h * hd};
  const float* xq[1] = {qv + (i64)i * ldqv + (i64)h * hd};
  const float* kh = k + (i64)h * hd;
  const float* ph = p + (i64)h * hd;
  // Key row j and position row T−1−i+j of each column (columns past T
  // repeat the last one's rows, as mm_tile clamps its tile).
  i64 ko[RP_C], po[RP_C];
#pragma unroll
  for (int c = 0; c < RP_C; c++) {
    int j = min(j0 + c, T - 1);
    ko[c] = (i64)j * ldk;
#ifdef FAULT_RELPOS_SCORES
    po[c] = (i64)(T - 1 - i + j + (i > 0 ? 1 : 0)) * ldp;  // rows after the first: rel_shift one column on
#else
    po[c] = (i64)(T - 1 - i + j) * ldp;
#endif
  }
  // Vector loads need 16-byte alignment of every row start (mm_tile's test).
  bool uvec = (((unsigned long long)xu[0]) & 15) == 0, qvec = (((unsigned long long)xq[0]) & 15) == 0;
  bool kvec = ((((unsigned long long)kh) & 15) == 0) && (ldk % 4 == 0);
  bool pvec = ((((unsigned long long)ph) & 15) == 0) && (ldp % 4 == 0);
  float ac[1][RP_C], bd[1][RP_C];
#pragma unroll
  for (int c = 0; c < RP_C; c++) {
    ac[0][c] = 0.0f;
    bd[0][c] = 0.0f;
  }
  for (int k0 = 8 * lane; k0 < hd; k0 += 256) {
    float xs[1][8], ws[RP_C][8];
    mm_load<1, RP_C, DT_F32>(xs, ws, xu, kh, ko, hd, k0, uvec, kvec);
    mm_fma<1, RP_C>(ac, xs, ws, hd, k0);
    mm_load<1, RP_C, DT_F32>(xs, ws, xq, ph, po, hd, k0, qvec, pvec);
    mm_fma<1, RP_C>(bd, xs, ws, hd, k0);
  }
#pragma unroll
  for (int c = 0; c < RP_C; c++)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ac[0][c] += __shfl_xor_sync(0xffffffffu, ac[0][c], o);
      bd[0][c] += __shfl_xor_sync(0xffffffffu, bd[0][c], o);
    }
  // Every lane holds every sum (the butterfly adds the same pairs in each
  // lane); lane c writes column j0 + c.
  float* row = s + (i64)(h * T + i) * lds;
#pragma unroll
  for (int c = 0; c < RP_C; c++) {
    if (lane == c && j0 + c < T) {
      float a = ac[0][c], b = bd[0][c];
      if (rnd) {
        a = rbf16(a);
        b = rbf16(b);
      }
      float v = a + b;
      if (rnd) v = rbf16(v);
      v = v * scale;
      if (rnd) v = rbf16(v);
      row[j0 + c] = v;
    }
  }
}

// heads_matmul_f32: o[:, h·hd … h·hd+hd−1] = probs_h · vt_hᵀ for every
// head h = blockIdx.z (probs_h: rows h·T … of pr [heads·T, L]; vt_h: rows
// h·hd … of vt [heads·hd, L]), each head's product on mm_tile's 8 × 4
// warp tiles exactly as matmul_r8_f32 runs it. grid (ceil(ceil(hd/4)/4),
// ceil(T/8), heads), 128 threads.
__global__ void __launch_bounds__(128) heads_matmul_f32(float* o, i64 ldo, const float* pr, i64 ldp, const float* vt, i64 ldv,
                                                        int T, int L, int hd) {
  PDL_ENTER();
  int h = blockIdx.z;
  int tile = blockIdx.x * 4 + (threadIdx.x >> 5);
  int n0 = tile * 4, m0 = blockIdx.y * 8;
  if (n0 >= hd) return;
#ifdef FAULT_HEADS_MATMUL
  i64 vrow = (i64)h * hd - (h > 0 ? 1 : 0);  // every head after the first reads vt one row early
#else
  i64 vrow = (i64)h * hd;
#endif
  mm_tile<8, 4, DT_F32>(o + (i64)h * hd, ldo, pr + (i64)h * T * ldp, ldp, vt + vrow * ldv, ldv, nullptr, 0, T, hd, L, m0,
                        n0, 0, 0, 0, nullptr, 0, 0, 0);
}

}  // extern "C"

// ---- The log-mel front end (gpu.LogMeler; package audio's LogMel.Compute
// on the device, the same floats) ----
//
// logmel_frames_f32: one block per pair of STFT frames (t0 = 2·blockIdx.x,
// t0+1). Frame t covers x from t·hop − nfft/2 (centred, zero padding); its
// samples times the window (a float product, as torch) go into one complex
// FFT as re (frame t0) + i·im (frame t0+1), in double. The FFT is the host
// plan's (audio/fft64.go): the bit-reversal swaps, the fused sizes 2 and 4,
// then two stages a pass, then an odd last stage, every butterfly the same
// double operations on the same twiddles (uploaded as the host computed
// them), so the spectra are the host's bit for bit. Each frame's |X|² is
// NeMo's (float magnitudes, squared), its mel energies the filterbank's
// nonzero span summed in double in bin order, then log(v + guard) in double
// rounded to float (where the host and the device's log differ in the last
// bit of a double, the float can differ by one ulp: about one value in 10⁸).
// Dynamic shared memory: nfft doubles² (z) and 2·bins floats (the powers).
extern "C" {

#ifdef FAULT_LOGMEL
#define LOGMEL_SECOND(p) 0  // the second frame of a pair gets the first one's spectrum
#else
#define LOGMEL_SECOND(p) (p)
#endif
__global__ void logmel_frames_f32(float* out, int ldo, const float* x, int n, int frames, int nfft, int hop, int winLo,
                                  int winHi, const float* window, const double* tw, const int* swaps, int nswaps,
                                  const int* fbLo, const int* fbHi, const float* fb, int nmels, float guard,
                                  int dolog) {
  PDL_ENTER();
  extern __shared__ double zsm[];
  double* zr = zsm;          // real parts
  double* zi = zsm + nfft;   // imaginary parts
  float* pw = (float*)(zsm + 2 * nfft);
  const int bins = nfft / 2 + 1;
  const int t0 = 2 * blockIdx.x;
  const int pair = min(2, frames - t0);
  for (int k = threadIdx.x; k < nfft; k += blockDim.x) {
    double re = 0.0, im = 0.0;
    if (k >= winLo && k < winHi) {
      int s0 = t0 * hop - nfft / 2 + k;
      if (s0 >= 0 && s0 < n) re = (double)(x[s0] * window[k]);
      int s1 = s0 + hop;
      if (pair == 2 && s1 >= 0 && s1 < n) im = (double)(x[s1] * window[k]);
    }
    zr[k] = re;
    zi[k] = im;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < nswaps; p += blockDim.x) {
    int a = swaps[2 * p], b = swaps[2 * p + 1];
    double r = zr[a], i = zi[a];
    zr[a] = zr[b];
    zi[a] = zi[b];
    zr[b] = r;
    zi[b] = i;
  }
  __syncthreads();
  int s;
  if (nfft >= 4) {
    for (int g = threadIdx.x; g < nfft / 4; g += blockDim.x) {
      int i = 4 * g;
      double a0r = zr[i] + zr[i + 1], a0i = zi[i] + zi[i + 1];
      double a1r = zr[i] - zr[i + 1], a1i = zi[i] - zi[i + 1];
      double a2r = zr[i + 2] + zr[i + 3], a2i = zi[i + 2] + zi[i + 3];
      double a3r = zr[i + 2] - zr[i + 3], a3i = zi[i + 2] - zi[i + 3];
      double t = a3r;  // a3 · (−i)
      a3r = a3i;
      a3i = -t;
      zr[i] = a0r + a2r, zi[i] = a0i + a2i;
      zr[i + 2] = a0r - a2r, zi[i + 2] = a0i - a2i;
      zr[i + 1] = a1r + a3r, zi[i + 1] = a1i + a3i;
      zr[i + 3] = a1r - a3r, zi[i + 3] = a1i - a3i;
    }
    s = 8;
  } else {
    if (threadIdx.x == 0) {
      double r0 = zr[0], i0 = zi[0];
      zr[0] = r0 + zr[1], zi[0] = i0 + zi[1];
      zr[1] = r0 - zr[1], zi[1] = i0 - zi[1];
    }
    s = 2 * nfft;  // no more stages
  }
  __syncthreads();
  // Complex products as Go computes them: (ac − bd) + (ad + bc)i.
#define CMUL(ar, ai, br, bi, outr, outi) \
  do {                                   \
    double _r = ar * br - ai * bi;       \
    double _i = ar * bi + ai * br;       \
    outr = _r;                           \
    outi = _i;                           \
  } while (0)
  for (; 2 * s <= nfft; s <<= 2) {
    int h = s / 2;
    const double* w1 = tw + 2 * h;
    const double* w2a = tw + 2 * s;
    const double* w2b = tw + 2 * (s + h);
    for (int idx = threadIdx.x; idx < nfft / 4; idx += blockDim.x) {
      int grp = idx / h, j = idx % h;
      int i = grp * 2 * s;
      int o0 = i + j, o1 = i + h + j, o2 = i + 2 * h + j, o3 = i + 3 * h + j;
      double war = w1[2 * j], wai = w1[2 * j + 1];
      double u0r = zr[o0], u0i = zi[o0], u1r, u1i, u2r = zr[o2], u2i = zi[o2], u3r, u3i;
      CMUL(zr[o1], zi[o1], war, wai, u1r, u1i);
      CMUL(zr[o3], zi[o3], war, wai, u3r, u3i);
      double b0r = u0r + u1r, b0i = u0i + u1i, b1r = u0r - u1r, b1i = u0i - u1i;
      double b2r = u2r + u3r, b2i = u2i + u3i, b3r = u2r - u3r, b3i = u2i - u3i;
      CMUL(b2r, b2i, w2a[2 * j], w2a[2 * j + 1], b2r, b2i);
      CMUL(b3r, b3i, w2b[2 * j], w2b[2 * j + 1], b3r, b3i);
      zr[o0] = b0r + b2r, zi[o0] = b0i + b2i;
      zr[o2] = b0r - b2r, zi[o2] = b0i - b2i;
      zr[o1] = b1r + b3r, zi[o1] = b1i + b3i;
      zr[o3] = b1r - b3r, zi[o3] = b1i - b3i;
    }
    __syncthreads();
  }
  if (s <= nfft) {  // an odd number of stages left one
    int h = s / 2;
    const double* w = tw + 2 * h;
    for (int idx = threadIdx.x; idx < nfft / 2; idx += blockDim.x) {
      int grp = idx / h, j = idx % h;
      int lo = grp * s + j, hi = lo + h;
      double tr, ti;
      CMUL(zr[hi], zi[hi], w[2 * j], w[2 * j + 1], tr, ti);
      zr[hi] = zr[lo] - tr, zi[hi] = zi[lo] - ti;
      zr[lo] = zr[lo] + tr, zi[lo] = zi[lo] + ti;
    }
    __syncthreads();
  }
#undef CMUL
  // The two frames' spectra, then NeMo's power: float magnitudes squared.
  for (int k = threadIdx.x; k < bins; k += blockDim.x) {
    int c = k > 0 ? nfft - k : 0;
    double zkr = zr[k], zki = zi[k], zcr = zr[c], zci = zi[c];
    for (int p = 0; p < pair; p++) {
      double re = LOGMEL_SECOND(p) == 0 ? (zkr + zcr) * 0.5 : (zki + zci) * 0.5;
      double im = LOGMEL_SECOND(p) == 0 ? (zki - zci) * 0.5 : (zcr - zkr) * 0.5;
      float fr = (float)re, fi = (float)im;
      float mag = (float)sqrt((double)(fr * fr + fi * fi));
      pw[p * bins + k] = mag * mag;
    }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < pair * nmels; q += blockDim.x) {
    int p = q / nmels, j = q % nmels;
    const float* row = fb + (i64)j * bins;
    double acc = 0.0;
    for (int k = fbLo[j]; k < fbHi[j]; k++) acc += (double)row[k] * (double)pw[p * bins + k];
    float v = (float)acc;
    if (dolog) v = (float)log((double)(v + guard));
    out[(i64)(t0 + p) * ldo + j] = v;
  }
}

// logmel_norm_f32: NeMo's per_feature normalisation of the frames
// logmel_frames_f32 wrote, one thread per mel bin: the mean and the
// unbiased std over the first valid frames (double sums in frame order,
// as the host's column loop), applied to all computed frames; then the
// rows from valid to rows (the terminal frame, pad_to padding) hold pad.
__global__ void logmel_norm_f32(float* out, int ldo, int frames, int valid, int rows, int nmels, float stdGuard,
                                float pad) {
  PDL_ENTER();
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= nmels) return;
  double acc = 0.0;
  for (int t = 0; t < valid; t++) acc += (double)out[(i64)t * ldo + j];
  float mean = (float)acc / (float)valid;
  acc = 0.0;
  for (int t = 0; t < valid; t++) {
    float d = out[(i64)t * ldo + j] - mean;
    acc += (double)(d * d);
  }
  float sd = (float)sqrt((double)((float)acc / (float)(valid - 1))) + stdGuard;
  for (int t = 0; t < frames; t++) {
    i64 o = (i64)t * ldo + j;
    out[o] = (out[o] - mean) / sd;
  }
  for (int t = valid; t < rows; t++) out[(i64)t * ldo + j] = pad;
}

}  // extern "C"
