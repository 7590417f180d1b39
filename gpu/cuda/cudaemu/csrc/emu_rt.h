// emu_rt.h: the CUDA device built-ins on the host CPU, for omni-pipe's CUDA
// emulator (package cudaemu). The emulator's NVRTC compiles kernels.cu with
// the host's C++ compiler and this header; each CUDA thread of a block runs
// on its own fiber, and a fiber gives way at __syncthreads and at every warp
// collective (shuffles, votes, mma.sync), so blocks run with CUDA's
// semantics of those points, one block at a time.
//
// What it checks: a kernel's arithmetic, indexing, masking, barriers and
// warp exchanges, against the same float64 replays as the GPU. What it
// cannot: timing, races between blocks, memory ordering beyond the barriers
// (every copy lands at once, cp.async groups are complete when issued) and
// the tensor cores' own summation order (mma.sync here sums the exact
// products in double and rounds once). It reports a barrier that not every
// thread of a block (or lane of a warp) reaches as a failed launch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#ifndef __x86_64__
#include <ucontext.h>
#endif

#define OMNI_EMU 1

#ifdef OMNI_EMU_SCAN
// The scanning pass only finds the kernels' names.
#define __global__ __emu_global__
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

struct uint3 {
  unsigned x, y, z;
};
typedef uint3 dim3;
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned x, y;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};

using std::ceil;
using std::cos;
using std::erf;
using std::exp;
using std::fabs;
using std::floor;
using std::fmax;
using std::fmin;
using std::ldexp;
using std::log;
using std::pow;
using std::rint;
using std::sin;
using std::sqrt;
using std::tanh;

template <class T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// The bit reinterpretations, through one memcpy.
template <class To, class From>
inline To emu_bits(From v) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast between sizes");
  To r;
  memcpy(&r, &v, sizeof r);
  return r;
}
inline float __uint_as_float(unsigned u) { return emu_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline float __int_as_float(int u) { return emu_bits<float>(u); }
inline int __float_as_int(float f) { return emu_bits<int>(f); }
inline long long __double_as_longlong(double d) { return emu_bits<long long>(d); }
inline double __longlong_as_double(long long u) { return emu_bits<double>(u); }

// Cache-hinted loads and stores, and fences: one fiber runs at a time and
// every store lands at once.
#define __ldcg __ldg
#define __ldca __ldg
#define __ldcs __ldg
template <class T>
inline void __stcg(T* p, T v) {
  *p = v;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }

// The emulator's state for the block being run (one block at a time per
// module; the driver serialises launches).
namespace emu {

extern "C" void emu_switch(void** save, void* load);

enum State { kRun, kBar, kWarp, kDone };

struct Fiber {
  void* sp;
#ifndef __x86_64__
  ucontext_t uc;
#endif
  unsigned tid;
  int state;
};

struct Warp {
  int arrived, live;
  unsigned gen;
  unsigned deposited;
  uint32_t slot[2][32][12];
  float out[2][32][4];  // results a collective computes once for the warp
  unsigned took[2];     // the lanes that took part in each generation
};

struct Block {
  int n;  // threads
  Fiber* f;
  char* stacks;
  size_t stack;
  int cur;
  void* main_sp;
#ifndef __x86_64__
  ucontext_t main_uc;
#endif
  int live;
  int bar_arrived, bar_or, bar_result;
  Warp* w;
  int nwarps;
  void (*body)(void**);
  void** params;
  const char* fail;
};

inline Block blk;
inline unsigned sms = 132;
inline char* dyn_smem;
inline size_t dyn_smem_size;

}  // namespace emu

inline uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

#ifdef __x86_64__
// emu_switch saves the callee-saved registers and the FP control words on
// the current stack, stores its pointer in *save and resumes the stack at
// load (System V AMD64).
asm(R"(
.text
.p2align 4
.globl emu_switch
.hidden emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch,.-emu_switch
.p2align 4
.globl emu_trampoline
.hidden emu_trampoline
.type emu_trampoline,@function
emu_trampoline:
  call emu_fiber_main
  ud2
.size emu_trampoline,.-emu_trampoline
)");
extern "C" void emu_trampoline();
#endif

inline void set_thread(int i) {
  unsigned t = blk.f[i].tid;
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

// yield returns to the scheduler; the fiber resumes when it is runnable.
inline void yield() {
  int i = blk.cur;
#ifdef __x86_64__
  emu_switch(&blk.f[i].sp, blk.main_sp);
#else
  swapcontext(&blk.f[i].uc, &blk.main_uc);
#endif
  set_thread(i);
}

inline void release_bar() {
  blk.bar_result = blk.bar_or;
  blk.bar_or = 0;
  blk.bar_arrived = 0;
  for (int i = 0; i < blk.n; i++)
    if (blk.f[i].state == kBar) blk.f[i].state = kRun;
}

inline void release_warp(int w) {
  Warp& wp = blk.w[w];
  wp.took[wp.gen & 1] = wp.deposited;
  // Lanes that did not take part (exited) read as NaN.
  for (int l = 0; l < 32; l++)
    if (!(wp.deposited >> l & 1))
      for (int j = 0; j < 12; j++) wp.slot[wp.gen & 1][l][j] = 0x7fc0dead;
  wp.arrived = 0;
  wp.deposited = 0;
  wp.gen++;
  int lo = 32 * w, hi = std::min(blk.n, lo + 32);
  for (int i = lo; i < hi; i++)
    if (blk.f[i].state == kWarp) blk.f[i].state = kRun;
}

inline void sync_block(int pred) {
  if (pred) blk.bar_or = 1;
  if (++blk.bar_arrived == blk.live) {
    release_bar();
    return;
  }
  blk.f[blk.cur].state = kBar;
  yield();
}

// exchange deposits nw words of this lane and returns the warp's slots
// once every live lane of the warp has deposited; combine, when given, runs
// once for the warp (in the lane that arrives last) on the full slots and
// fills out of the same generation.
inline uint32_t (*exchange(const void* v, int nw, void (*combine)(uint32_t (*)[12], float (*)[4]) = nullptr))[12] {
  int t = blk.cur;
  Warp& wp = blk.w[t / 32];
  unsigned g = wp.gen;
  memcpy(wp.slot[g & 1][t % 32], v, 4 * nw);
  wp.deposited |= 1u << (t % 32);
  if (++wp.arrived == wp.live) {
    if (combine) combine(wp.slot[g & 1], wp.out[g & 1]);
    release_warp(t / 32);
  } else {
    blk.f[t].state = kWarp;
    yield();
  }
  return wp.slot[g & 1];
}

inline int lane() { return blk.cur % 32; }

}  // namespace emu

extern "C" __attribute__((used, visibility("hidden"), noinline)) void emu_fiber_main() {
  int i = emu::blk.cur;
  emu::set_thread(i);
  emu::blk.body(emu::blk.params);
  i = emu::blk.cur;
  emu::blk.f[i].state = emu::kDone;
  emu::blk.live--;
  emu::Warp& wp = emu::blk.w[i / 32];
  wp.live--;
  if (emu::blk.bar_arrived > 0 && emu::blk.bar_arrived == emu::blk.live) emu::release_bar();
  if (wp.arrived > 0 && wp.arrived == wp.live) emu::release_warp(i / 32);
#ifdef __x86_64__
  void* dead;
  emu::emu_switch(&dead, emu::blk.main_sp);
#else
  setcontext(&emu::blk.main_uc);
#endif
  abort();
}

inline void __syncthreads() { emu::sync_block(0); }
inline int __syncthreads_or(int p) {
  emu::sync_block(p != 0);
  return emu::blk.bar_result;
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  int z = 0;
  emu::exchange(&z, 1);
}

template <class T>
inline T emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 48, "shuffle of a large type");
  auto s = emu::exchange(&v, (sizeof(T) + 3) / 4);
  T r;
  memcpy(&r, s[src], sizeof(T));
  return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  int l = emu::lane(), s = l ^ m;
#ifdef EMU_FAULT_SHFL_XOR  // a control of the self-test: the wrong lane
  s = l ^ (m >> 1);
#endif
  if (s / width != l / width || s >= 32) s = l;
  return emu_shfl(v, s);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  int l = emu::lane(), s = l - (int)d;
  if (s < (l & ~(width - 1))) s = l;
  return emu_shfl(v, s);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  int l = emu::lane(), s = l + (int)d;
  if (s >= (l & ~(width - 1)) + width) s = l;
  return emu_shfl(v, s);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int l = emu::lane();
  return emu_shfl(v, (l & ~(width - 1)) + (src & (width - 1)));
}
// emu_gather exchanges one word of each lane and returns the slots with,
// in *took, the lanes that took part (those that have not returned).
inline uint32_t (*emu_gather(uint32_t v, unsigned* took))[12] {
  emu::Warp& wp = emu::blk.w[emu::blk.cur / 32];
  unsigned g = wp.gen;
  auto s = emu::exchange(&v, 1);
  *took = wp.took[g & 1];
  return s;
}
inline unsigned __ballot_sync(unsigned, int p) {
  unsigned took, r = 0;
  auto s = emu_gather(p != 0, &took);
  for (int l = 0; l < 32; l++)
    if ((took >> l & 1) && s[l][0]) r |= 1u << l;
  return r;
}
inline unsigned __reduce_or_sync(unsigned, unsigned v) {
  unsigned took, r = 0;
  auto s = emu_gather(v, &took);
  for (int l = 0; l < 32; l++)
    if (took >> l & 1) r |= s[l][0];
  return r;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __all_sync(unsigned, int p) {
  unsigned took;
  auto s = emu_gather(p != 0, &took);
  for (int l = 0; l < 32; l++)
    if ((took >> l & 1) && !s[l][0]) return 0;
  return 1;
}

// Atomics: one fiber runs at a time.
template <class T>
inline T atomicAdd(T* p, T v) {
  T o = *p;
  *p = o + v;
  return o;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  unsigned o = *p;
  *p = o | v;
  return o;
}

// emu_f16f converts an IEEE half to float (exact).
inline float emu_f16f(unsigned short h) {
  unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0)
    v = std::ldexp((float)m, -24);
  else if (e == 31)
    v = m ? __uint_as_float(0x7fc00000u) : INFINITY;
  else
    v = std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}

inline void emu_cp_async16(void* sm, const void* gm, int bytes) {
  unsigned char* d = (unsigned char*)sm;
  int b = bytes < 0 ? 0 : bytes > 16 ? 16 : bytes;
  if (b) memcpy(d, gm, b);
  memset(d + b, 0, 16 - b);
}

inline float emu_bf16(uint32_t pair, int hi) { return __uint_as_float(hi ? pair & 0xffff0000u : pair << 16); }

// emu_mma16816 is mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for
// the warp: lane l (group g = l / 4, t = l % 4) holds A's rows g and g + 8
// at columns 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3), B's column g
// at rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1), and C's and D's rows g,
// g + 8 at columns 2t, 2t + 1. The products are exact; their sum with C is
// taken in double and rounded once. The warp's product is computed once,
// by the lane that completes the exchange.
inline void emu_mma_combine(uint32_t (*s)[12], float (*out)[4]) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; h++) {
      A[g][2 * t + h] = emu_bf16(s[l][0], h);
      A[g + 8][2 * t + h] = emu_bf16(s[l][1], h);
      A[g][2 * t + 8 + h] = emu_bf16(s[l][2], h);
      A[g + 8][2 * t + 8 + h] = emu_bf16(s[l][3], h);
      B[2 * t + h][g] = emu_bf16(s[l][4], h);
      B[2 * t + 8 + h][g] = emu_bf16(s[l][5], h);
    }
  }
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; e++) {
      int r = g + 8 * (e / 2), col = 2 * t + (e & 1);
      double acc = __uint_as_float(s[l][6 + e]);
      for (int k = 0; k < 16; k++) acc += (double)A[r][k] * (double)B[k][col];
      out[l][e] = (float)acc;
    }
  }
}

inline void emu_mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                         uint32_t b1) {
  uint32_t mine[10] = {a0, a1, a2, a3, b0, b1, __float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]),
                       __float_as_uint(c[3])};
  int t = emu::blk.cur;
  emu::Warp& wp = emu::blk.w[t / 32];
  unsigned g = wp.gen;
  emu::exchange(mine, 10, emu_mma_combine);
  for (int e = 0; e < 4; e++) c[e] = wp.out[g & 1][t % 32][e];
}

namespace emu {

// The order in which runnable threads are resumed between barriers
// (OMNIPIPE_CUDA_EMU_SCHEDULE): "forward" (thread 0 first, the default),
// "reverse", or "random[:SEED]" (a fresh permutation each round). A
// kernel whose results change with it reads shared or global memory that
// another thread of its block writes without a barrier between them: a
// race a GPU's warp schedule may or may not expose.
inline int order[1024];
inline int sched_mode = -1;  // 0 forward, 1 reverse, 2 random
inline uint64_t sched_rng = 1;

inline void sched_init() {
  const char* e = getenv("OMNIPIPE_CUDA_EMU_SCHEDULE");
  sched_mode = 0;
  if (!e || !*e || strcmp(e, "forward") == 0) return;
  if (strcmp(e, "reverse") == 0) {
    sched_mode = 1;
  } else if (strncmp(e, "random", 6) == 0) {
    sched_mode = 2;
    if (e[6] == ':') sched_rng = strtoull(e + 7, nullptr, 10) | 1;
  } else {
    fprintf(stderr, "cuda emulator: OMNIPIPE_CUDA_EMU_SCHEDULE=%s: want forward, reverse or random[:SEED]\n", e);
  }
}

inline void sched_order(int n) {
  for (int i = 0; i < n; i++) order[i] = sched_mode == 1 ? n - 1 - i : i;
  if (sched_mode != 2) return;
  for (int i = n - 1; i > 0; i--) {
    sched_rng ^= sched_rng << 13;
    sched_rng ^= sched_rng >> 7;
    sched_rng ^= sched_rng << 17;
    int j = (int)(sched_rng % (uint64_t)(i + 1));
    std::swap(order[i], order[j]);
  }
}

// run executes a grid of body's blocks; it returns null or the failure.
inline const char* run(void (*body)(void**), void** params, dim3 grid, dim3 block, size_t shm) {
  static Fiber* fibers;
  static char* stacks;
  static Warp* warps;
  static int cap;
  const size_t stack = 128 << 10;
  int n = (int)(block.x * block.y * block.z);
  if (n <= 0 || n > 1024) return "block of more than 1024 threads";
  if (sched_mode < 0) sched_init();
  if (n > cap) {
    free(fibers);
    free(stacks);
    free(warps);
    fibers = (Fiber*)calloc(n, sizeof(Fiber));
    stacks = (char*)aligned_alloc(64, stack * n);
    warps = (Warp*)calloc((n + 31) / 32, sizeof(Warp));
    if (!fibers || !stacks || !warps) return "out of host memory for fibers";
    cap = n;
  }
  static char* dyn;
  static size_t dcap;
  if (shm > dcap) {
    free(dyn);
    dyn = (char*)aligned_alloc(128, (shm + 127) & ~(size_t)127);
    dcap = shm;
  }
  dyn_smem = dyn;
  dyn_smem_size = shm;
  blockDim = block;
  gridDim = grid;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx = uint3{bx, by, bz};
        if (shm) memset(dyn, 0xff, shm);  // poison: unwritten shared memory reads as NaN
        blk.n = n;
        blk.f = fibers;
        blk.live = n;
        blk.bar_arrived = blk.bar_or = blk.bar_result = 0;
        blk.w = warps;
        blk.nwarps = (n + 31) / 32;
        blk.body = body;
        blk.params = params;
        for (int w = 0; w < blk.nwarps; w++) {
          warps[w].arrived = 0;
          warps[w].gen = 0;
          warps[w].deposited = 0;
          warps[w].live = std::min(32, n - 32 * w);
        }
        for (int i = 0; i < n; i++) {
          Fiber& f = fibers[i];
          f.tid = i;
          f.state = kRun;
          char* top = stacks + stack * (i + 1);
#ifdef __x86_64__
          // emu_switch's frame: FP control words, r15 … rbp, then the
          // return address (emu_trampoline), leaving rsp 16-aligned there.
          uint64_t* sp = (uint64_t*)(top - 72);
          uint32_t mx;
          uint16_t cw;
          asm volatile("stmxcsr %0" : "=m"(mx));
          asm volatile("fnstcw %0" : "=m"(cw));
          sp[0] = cw;
          sp[1] = mx;
          for (int r = 2; r < 8; r++) sp[r] = 0;
          sp[8] = (uint64_t)(void*)emu_trampoline;
          f.sp = sp;
          // After ret pops sp[8], rsp = top: 16-aligned, as before a call.
#else
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = top - stack;
          f.uc.uc_stack.ss_size = stack;
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, (void (*)())emu_fiber_main, 0);
#endif
        }
        while (blk.live > 0) {
          bool ran = false;
          sched_order(n);
          for (int j = 0; j < n; j++) {
            int i = order[j];
            if (fibers[i].state != kRun) continue;
            ran = true;
            blk.cur = i;
#ifdef __x86_64__
            emu_switch(&blk.main_sp, fibers[i].sp);
#else
            swapcontext(&blk.main_uc, &fibers[i].uc);
#endif
          }
          if (!ran) return "deadlock: a barrier or warp collective that not every thread reaches";
        }
      }
  return nullptr;
}

struct Kernel {
  const char* name;
  void (*body)(void**);
  int nparams;
  const size_t* sizes;
};

inline Kernel kernels[512];
inline int nkernels;

template <class... A, size_t... I>
inline void invoke(void (*f)(A...), void** p, std::index_sequence<I...>) {
  f(*static_cast<std::remove_reference_t<A>*>(p[I])...);
}

template <auto F>
struct Thunk;
template <class... A, void (*F)(A...)>
struct Thunk<F> {
  static constexpr size_t sizes[sizeof...(A) + 1] = {sizeof(A)..., 0};
  static void call(void** p) { invoke(F, p, std::index_sequence_for<A...>{}); }
  static constexpr int n = sizeof...(A);
};

struct Reg {
  template <auto F>
  static int add(const char* name) {
    Kernel& k = kernels[nkernels++];
    k.name = name;
    k.body = &Thunk<F>::call;
    k.nparams = Thunk<F>::n;
    k.sizes = Thunk<F>::sizes;
    return 0;
  }
};

}  // namespace emu

#define EMU_REGISTER(name) static int emu_reg_##name = emu::Reg::add<&name>(#name);

// The module's entry points (the driver finds them with dlsym).
#define EMU_MODULE_ENTRY_POINTS                                                                                 \
  extern "C" __attribute__((visibility("default"))) int emu_kernel(const char* name, void** body, int* nparams, \
                                                                   const size_t** sizes) {                      \
    for (int i = 0; i < emu::nkernels; i++)                                                                     \
      if (strcmp(emu::kernels[i].name, name) == 0) {                                                            \
        *body = (void*)emu::kernels[i].body;                                                                    \
        *nparams = emu::kernels[i].nparams;                                                                     \
        *sizes = emu::kernels[i].sizes;                                                                         \
        return 0;                                                                                               \
      }                                                                                                         \
    return -1;                                                                                                  \
  }                                                                                                             \
  extern "C" __attribute__((visibility("default"))) const char* emu_launch(                                     \
      void* body, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,   \
      void** params, unsigned sms) {                                                                            \
    emu::sms = sms;                                                                                             \
    return emu::run((void (*)(void**))body, params, dim3{gx, gy, gz}, dim3{bx, by, bz}, shm);                   \
  }
