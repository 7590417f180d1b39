// Host-compiler stand-ins for CUDA builtins: enough for g++ -fsyntax-only.
#include <cmath>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct uint3s { unsigned x, y, z; };
extern uint3s threadIdx, blockIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
float __uint_as_float(unsigned); unsigned __float_as_uint(float); float __int_as_float(int);
float __shfl_xor_sync(unsigned, float, int); bool __any_sync(unsigned, bool); unsigned __reduce_or_sync(unsigned, unsigned);
bool __all_sync(unsigned, bool);
void __syncthreads();
template <class T> T __ldg(const T*);
float expf(float); float expm1f(float); float fmaf(float, float, float); float fmaxf(float, float);
using std::erf; using std::cos; using std::sin; using std::sqrt;
template <class T> T min(T a, T b); template <class T> T max(T a, T b);
// Sampling (sample_f32).
double __shfl_xor_sync(unsigned, double, int); int __shfl_xor_sync(unsigned, int, int);
long long __double_as_longlong(double); double __longlong_as_double(long long);
int __syncthreads_or(int); unsigned __ballot_sync(unsigned, int); int __popc(unsigned);
unsigned atomicOr(unsigned*, unsigned); unsigned atomicAdd(unsigned*, unsigned);
unsigned long long atomicAdd(unsigned long long*, unsigned long long);
void __threadfence();
using std::rint; using std::ldexp; using std::fmax;
int __shfl_up_sync(unsigned, int, int); int __shfl_sync(unsigned, int, int); int __ffs(int);
