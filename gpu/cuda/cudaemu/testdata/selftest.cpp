// The emulator's own checks (cudaemu_test.go compiles this with emu_rt.h
// and runs it): each kernel below exercises one built-in, and main compares
// its result with a plain host computation. It prints "ok N" or the first
// failure and exits non-zero.
#include <cstdio>
#include <vector>

typedef unsigned int u32;

#include "expect.h"

// A block-wide sum through shared memory and __syncthreads (a tree), one
// output per block.
__global__ void block_sum(float* out, const float* in, int n) {
  __shared__ float s[256];
  int t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0.0f;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h /= 2) {
    if (t < h) s[t] += s[t + h];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Warp shuffles and votes: lane l of warp w writes its butterfly sum, its
// shuffle-up neighbour, the ballot of odd lanes and the OR reduction.
__global__ void warp_ops(float* sum, int* up, unsigned* ballot, unsigned* orr, int* any) {
  int t = threadIdx.x, l = t % 32;
  float v = (float)(t + 1);
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  sum[t] = v;
  up[t] = __shfl_up_sync(0xffffffffu, t, 1);
  ballot[t] = __ballot_sync(0xffffffffu, l & 1);
  orr[t] = __reduce_or_sync(0xffffffffu, 1u << (l % 7));
  any[t] = __any_sync(0xffffffffu, t == 40);
}

// __syncthreads_or and dynamic shared memory ("extern __shared__ float
// dyn[];" as the emulator's NVRTC rewrites it).
__global__ void dyn_or(int* out, int flagThread) {
  float* dyn = (float*)emu::dyn_smem;
  dyn[threadIdx.x] = (float)threadIdx.x;
  int r = __syncthreads_or(threadIdx.x == (unsigned)flagThread);
  out[blockIdx.x * blockDim.x + threadIdx.x] = r + (dyn[(threadIdx.x + 1) % blockDim.x] == (float)((threadIdx.x + 1) % blockDim.x) ? 10 : 0);
}

// Half a warp waits at the block's barrier, the other half in a shuffle
// that needs the whole warp: neither completes (on a GPU, undefined), and
// the emulator must report it. (Threads that have returned do not hold a
// barrier up, as on a GPU: early_exit below.)
__global__ void half_barrier(int* out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    out[threadIdx.x] = (int)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// One m16n8k16 bf16 product on the warp's fragments: A[16][16] and
// B[16][8] from memory, D = A·B + C.
__global__ void mma_one(float* d, const unsigned short* a, const unsigned short* b, const float* c) {
  int l = threadIdx.x, g = l / 4, t = l % 4;
  auto A = [&](int r, int k) { return (u32)a[r * 16 + k]; };
  auto B = [&](int k, int n) { return (u32)b[k * 8 + n]; };
  u32 a0 = A(g, 2 * t) | A(g, 2 * t + 1) << 16, a1 = A(g + 8, 2 * t) | A(g + 8, 2 * t + 1) << 16;
  u32 a2 = A(g, 2 * t + 8) | A(g, 2 * t + 9) << 16, a3 = A(g + 8, 2 * t + 8) | A(g + 8, 2 * t + 9) << 16;
  u32 b0 = B(2 * t, g) | B(2 * t + 1, g) << 16, b1 = B(2 * t + 8, g) | B(2 * t + 9, g) << 16;
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  emu_mma16816(acc, a0, a1, a2, a3, b0, b1);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Lanes that return before a shuffle: the rest still exchange.
__global__ void early_exit(float* out, unsigned* ballot) {
  if (threadIdx.x >= 20) return;
  float v = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
  out[threadIdx.x] = v;
  ballot[threadIdx.x] = __ballot_sync(0xfffffu, 1) | __reduce_or_sync(0xfffffu, threadIdx.x == 19 ? 1u << 31 : 0u);
}

// Each thread reads its neighbour's shared slot, with (shift) or without
// (racy) a barrier after the writes: the racy kernel's result depends on
// the order threads run in, which the emulator's schedules expose.
__global__ void shift(float* out, int step) {
  __shared__ float s[64];
  s[threadIdx.x] = (float)(threadIdx.x + step);
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}
__global__ void racy(float* out, int step) {
  __shared__ float s[64];
  s[threadIdx.x] = (float)(threadIdx.x + step);
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

// launch runs kernel F on a grid through the emulator's own thunk (the
// one its NVRTC registers kernels with); the arguments' types must be the
// kernel's.
template <auto F, class... A>
static const char* launch(dim3 g, dim3 b, size_t shm, A... args) {
  static_assert(std::is_same_v<decltype(F), void (*)(A...)>, "arguments of other types than the kernel's");
  void* p[] = {&args...};
  return emu::run(&emu::Thunk<F>::call, p, g, b, shm);
}

static unsigned short bf(float f) { return (unsigned short)(__float_as_uint(f) >> 16); }

int main() {
  int checks = 0;
  {
    int n = 1000;
    std::vector<float> in(n), out(4, -1);
    for (int i = 0; i < n; i++) in[i] = (float)(i % 17) - 8;
    const char* err = launch<block_sum>(dim3{4, 1, 1}, dim3{256, 1, 1}, 0, out.data(), (const float*)in.data(), n);
    EXPECT(!err, "block_sum: %s", err);
    for (int b = 0; b < 4; b++) {
      float s = 0;
      for (int i = 256 * b; i < 256 * (b + 1) && i < n; i++) s += in[i];
      EXPECT(out[b] == s, "block_sum block %d: %g, want %g", b, out[b], s);
      checks++;
    }
  }
  {
    int n = 64;
    std::vector<float> sum(n);
    std::vector<int> up(n), any(n);
    std::vector<unsigned> bal(n), orr(n);
    const char* err = launch<warp_ops>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, sum.data(), up.data(), bal.data(), orr.data(), any.data());
    EXPECT(!err, "warp_ops: %s", err);
    for (int t = 0; t < n; t++) {
      int w = t / 32, l = t % 32;
      float s = 0;
      for (int j = 0; j < 32; j++) s += (float)(32 * w + j + 1);
      EXPECT(sum[t] == s, "butterfly lane %d: %g, want %g", t, sum[t], s);
      EXPECT(up[t] == (l == 0 ? t : t - 1), "shfl_up lane %d: %d", t, up[t]);
      EXPECT(bal[t] == 0xaaaaaaaau, "ballot lane %d: %x", t, bal[t]);
      EXPECT(orr[t] == 0x7fu, "reduce_or lane %d: %x", t, orr[t]);
      EXPECT(any[t] == (w == 1), "any lane %d: %d", t, any[t]);
      checks += 5;
    }
  }
  {
    std::vector<int> out(2 * 96);
    const char* err = launch<dyn_or>(dim3{2, 1, 1}, dim3{96, 1, 1}, 96 * sizeof(float), out.data(), 70);
    EXPECT(!err, "dyn_or: %s", err);
    for (int i = 0; i < 2 * 96; i++) {
      EXPECT(out[i] == 11, "syncthreads_or/dynamic smem thread %d: %d", i, out[i]);
      checks++;
    }
    err = launch<dyn_or>(dim3{1, 1, 1}, dim3{96, 1, 1}, 96 * sizeof(float), out.data(), 200);
    EXPECT(!err && out[5] == 10, "syncthreads_or with no thread set: %d", out[5]);
    checks++;
  }
  {
    std::vector<int> out(32);
    const char* err = launch<half_barrier>(dim3{1, 1, 1}, dim3{32, 1, 1}, 0, out.data());
    EXPECT(err != nullptr, "a barrier half the block reaches was not reported");
    checks++;
  }
  {
    std::vector<unsigned short> a(256), b(128);
    std::vector<float> af(256), bfv(128), c(128), d(128);
    for (int i = 0; i < 256; i++) {
      af[i] = (float)((i * 37) % 19 - 9) / 8;
      a[i] = bf(af[i]);
    }
    for (int i = 0; i < 128; i++) {
      bfv[i] = (float)((i * 11) % 13 - 6) / 4;
      b[i] = bf(bfv[i]);
      c[i] = (float)i / 3;
    }
    const char* err = launch<mma_one>(dim3{1, 1, 1}, dim3{32, 1, 1}, 0, d.data(), (const unsigned short*)a.data(),
                             (const unsigned short*)b.data(), (const float*)c.data());
    EXPECT(!err, "mma: %s", err);
    for (int r = 0; r < 16; r++)
      for (int n = 0; n < 8; n++) {
        double s = c[r * 8 + n];
        for (int k = 0; k < 16; k++) s += (double)af[r * 16 + k] * bfv[k * 8 + n];
        EXPECT(d[r * 8 + n] == (float)s, "mma D[%d][%d] = %g, want %g", r, n, d[r * 8 + n], (float)s);
        checks++;
      }
  }
  {
    std::vector<float> out(32, -1);
    std::vector<unsigned> bal(32);
    const char* err = launch<early_exit>(dim3{1, 1, 1}, dim3{32, 1, 1}, 0, out.data(), bal.data());
    EXPECT(!err, "early exit: %s", err);
    for (int t = 0; t < 20; t++) {
      EXPECT(out[t] == (float)(t ^ 1), "early exit lane %d: %g", t, out[t]);
      EXPECT(bal[t] == (0xfffffu | 1u << 31), "ballot and reduce over the 20 lanes left, lane %d: %x", t, bal[t]);
      checks += 2;
    }
  }
  {
    // The same launches under each schedule: the barrier's kernel gives
    // one result, the racy one differs between forward and reverse.
    std::vector<float> a(64), b(64), c(64), d(64);
    int mode = emu::sched_mode;
    emu::sched_mode = 0;
    launch<shift>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, a.data(), 1);
    launch<racy>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, c.data(), 2);
    emu::sched_mode = 1;
    launch<shift>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, b.data(), 1);
    launch<racy>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, d.data(), 3);
    emu::sched_mode = 2;
    std::vector<float> e(64);
    launch<shift>(dim3{1, 1, 1}, dim3{64, 1, 1}, 0, e.data(), 1);
    emu::sched_mode = mode;
    EXPECT(a == b && a == e, "a kernel with its barrier differs between schedules");
    int same = 0;
    for (int t = 0; t < 64; t++) same += (c[t] - 2) == (d[t] - 3);
    EXPECT(same < 64, "the racy kernel gave the same result under forward and reverse schedules");
    checks += 2;
  }
  if (failures) return 1;
  printf("ok %d\n", checks);
  return 0;
}
