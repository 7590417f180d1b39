// The emulator's driver and NVRTC entry points, called as package cuda
// calls them (cudaemu_test.go builds this and runs it with the library's
// path): compile a source, load it, launch directly and through a graph
// whose node is updated, and check that the failures a GPU reports are
// reported — a compile error, a write past an allocation, a deadlock.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static const char* kSource = R"(
extern "C" {
__global__ void fill(float* d, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = v + (float)i;
}
// Each block reverses its part through dynamic shared memory.
__global__ void reverse(float* d, int n) {
  extern __shared__ float buf[];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  buf[t] = i < n ? d[i] : 0.0f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - t);
  if (j < n) d[j] = buf[t];
}
__global__ void stuck(float* d) {
  if (threadIdx.x < 16) __syncthreads();
  else d[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
}
)";

#include "expect.h"

struct KernelNodeParams {
  void* fn;
  unsigned gx, gy, gz, bx, by, bz, shm, pad;
  void** params;
  void** extra;
  void* kern;
  void* ctx;
};

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
#define SYM(name, type) auto name = (type)dlsym(h, #name)
  SYM(cuInit, int (*)(unsigned));
  SYM(cuMemAllocAsync, int (*)(uintptr_t*, size_t, void*));
  SYM(cuMemFreeAsync, int (*)(uintptr_t, void*));
  SYM(cuMemcpyDtoHAsync_v2, int (*)(void*, uintptr_t, size_t, void*));
  SYM(cuModuleLoadData, int (*)(void**, const void*));
  SYM(cuModuleGetFunction, int (*)(void**, void*, const char*));
  SYM(cuLaunchKernel, int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**));
  SYM(cuGraphCreate, int (*)(void**, unsigned));
  SYM(cuGraphAddKernelNode_v2, int (*)(void**, void*, void* const*, size_t, const KernelNodeParams*));
  SYM(cuGraphInstantiateWithFlags, int (*)(void**, void*, unsigned long long));
  SYM(cuGraphExecKernelNodeSetParams_v2, int (*)(void*, void*, const KernelNodeParams*));
  SYM(cuGraphLaunch, int (*)(void*, void*));
  SYM(nvrtcCreateProgram, int (*)(void**, const char*, const char*, int, const char* const*, const char* const*));
  SYM(nvrtcCompileProgram, int (*)(void*, int, const char* const*));
  SYM(nvrtcGetProgramLogSize, int (*)(void*, size_t*));
  SYM(nvrtcGetProgramLog, int (*)(void*, char*));
  SYM(nvrtcGetCUBINSize, int (*)(void*, size_t*));
  SYM(nvrtcGetCUBIN, int (*)(void*, char*));
  SYM(omniCudaEmulatorLastError, const char* (*)());
  if (!cuInit || !nvrtcCompileProgram || !cuGraphExecKernelNodeSetParams_v2 || !omniCudaEmulatorLastError) {
    fprintf(stderr, "missing entry points\n");
    return 2;
  }
  int checks = 0;
  EXPECT(cuInit(0) == 0, "cuInit");
  const char* opts[] = {"--gpu-architecture=sm_90", "--std=c++17", "--fmad=false", "-default-device"};

  // A compile error comes back as NVRTC_ERROR_COMPILATION with the
  // compiler's message in the log.
  {
    void* p;
    nvrtcCreateProgram(&p, "extern \"C\" __global__ void bad(float* d) { d[0] = undefined_name; }", "bad.cu", 0, nullptr,
                       nullptr);
    int r = nvrtcCompileProgram(p, 4, opts);
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    std::string log(n, 0);
    nvrtcGetProgramLog(p, &log[0]);
    EXPECT(r == 6 && log.find("undefined_name") != std::string::npos, "compile error: %d, log %s", r, log.c_str());
    checks++;
  }

  // An option NVRTC would refuse comes back as NVRTC_ERROR_INVALID_OPTION
  // (5), as the backend's fallback for --split-compile expects; that
  // option itself is taken.
  {
    void* p;
    nvrtcCreateProgram(&p, "extern \"C\" __global__ void k(float* d) { d[0] = 1.0f; }", "o.cu", 0, nullptr, nullptr);
    const char* bogus[] = {"--gpu-architecture=sm_90", "--no-such-option"};
    int r = nvrtcCompileProgram(p, 2, bogus);
    EXPECT(r == 5, "an unknown option: %d, want 5", r);
    const char* split[] = {"--gpu-architecture=sm_90", "--std=c++17", "--split-compile=0"};
    r = nvrtcCompileProgram(p, 3, split);
    EXPECT(r == 0, "--split-compile=0: %d, want 0", r);
    checks += 2;
  }

  void* prog;
  nvrtcCreateProgram(&prog, kSource, "t.cu", 0, nullptr, nullptr);
  int r = nvrtcCompileProgram(prog, 4, opts);
  if (r != 0) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, 0);
    nvrtcGetProgramLog(prog, &log[0]);
    fprintf(stderr, "compile: %d\n%s\n", r, log.c_str());
    return 1;
  }
  size_t size;
  nvrtcGetCUBINSize(prog, &size);
  std::vector<char> cubin(size);
  nvrtcGetCUBIN(prog, cubin.data());
  void* mod;
  EXPECT(cuModuleLoadData(&mod, cubin.data()) == 0, "module load");
  void *fill, *rev, *stuck, *none;
  EXPECT(cuModuleGetFunction(&fill, mod, "fill") == 0 && cuModuleGetFunction(&rev, mod, "reverse") == 0 &&
             cuModuleGetFunction(&stuck, mod, "stuck") == 0,
         "get functions");
  EXPECT(cuModuleGetFunction(&none, mod, "absent") == 500, "a missing kernel is not CUDA_ERROR_NOT_FOUND");
  checks += 2;

  int n = 1000;
  uintptr_t d;
  EXPECT(cuMemAllocAsync(&d, n * sizeof(float), nullptr) == 0, "alloc");
  std::vector<float> host(n);

  // A direct launch, then dynamic shared memory.
  float v = 0.5f;
  void* fp[] = {&d, &n, &v};
  EXPECT(cuLaunchKernel(fill, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, fp, nullptr) == 0, "fill");
  void* rp[] = {&d, &n};
  EXPECT(cuLaunchKernel(rev, (n + 255) / 256, 1, 1, 256, 1, 1, 256 * sizeof(float), nullptr, rp, nullptr) == 0,
         "reverse");
  cuMemcpyDtoHAsync_v2(host.data(), d, n * sizeof(float), nullptr);
  for (int i = 0; i < n; i++) {
    int b = i / 256, t = i % 256, src = b * 256 + (255 - t);  // the element reverse moved here
    float want = src < n ? 0.5f + (float)src : 0.0f;
    EXPECT(host[i] == want, "fill + reverse [%d] = %g, want %g", i, host[i], want);
    checks++;
  }

  // A graph whose node's arguments change between replays: the node
  // keeps its arguments by value (the caller's memory changes under it).
  void *g, *node, *x;
  cuGraphCreate(&g, 0);
  float v1 = 10;
  void* gp[] = {&d, &n, &v1};
  KernelNodeParams np = {fill, (unsigned)(n + 127) / 128, 1, 1, 128, 1, 1, 0, 0, gp, nullptr, nullptr, nullptr};
  EXPECT(cuGraphAddKernelNode_v2(&node, g, nullptr, 0, &np) == 0, "add node");
  v1 = -1;  // must not be what the node runs with
  EXPECT(cuGraphInstantiateWithFlags(&x, g, 0) == 0, "instantiate");
  EXPECT(cuGraphLaunch(x, nullptr) == 0, "graph launch");
  cuMemcpyDtoHAsync_v2(host.data(), d, n * sizeof(float), nullptr);
  EXPECT(host[3] == 13, "graph replay: %g, want 13", host[3]);
  float v2 = 100;
  void* gp2[] = {&d, &n, &v2};
  np.params = gp2;
  EXPECT(cuGraphExecKernelNodeSetParams_v2(x, node, &np) == 0, "set params");
  EXPECT(cuGraphLaunch(x, nullptr) == 0, "graph launch 2");
  cuMemcpyDtoHAsync_v2(host.data(), d, n * sizeof(float), nullptr);
  EXPECT(host[3] == 103, "updated replay: %g, want 103", host[3]);
  checks += 2;

  // A write one element past the allocation fails the launch and names
  // the kernel.
  int over = n + 1;
  void* op[] = {&d, &over, &v};
  r = cuLaunchKernel(fill, (over + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, op, nullptr);
  std::string e = omniCudaEmulatorLastError();
  EXPECT(r == 719 && e.find("fill") != std::string::npos && e.find("past the end") != std::string::npos,
         "a write past the allocation: %d (%s)", r, e.c_str());
  EXPECT(cuLaunchKernel(fill, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, fp, nullptr) == 0,
         "the next launch after a guard fault");
  checks += 2;

  // A block that cannot finish fails its launch.
  r = cuLaunchKernel(stuck, 1, 1, 1, 32, 1, 1, 0, nullptr, rp, nullptr);
  EXPECT(r == 719, "a deadlocked block: %d", r);
  checks++;
  EXPECT(cuMemFreeAsync(d, nullptr) == 0 && cuMemFreeAsync(d, nullptr) == 1, "free, then a double free");
  checks++;
  if (failures) return 1;
  printf("ok %d\n", checks);
  return 0;
}
