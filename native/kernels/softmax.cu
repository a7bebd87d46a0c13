// Native row softmax, fp16 in/out, fp32 math: one 256-thread block per row, row kept in registers
// (cols <= 256 * 32 = 8192). Scopes: 0 load, 1 reduce (max, exp, sum), 2 store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cfloat>
#include "instrument.cuh"
#include "launchers.h"

namespace {
constexpr int THREADS = 256, ITEMS = 32;
enum { S_LOAD = 0, S_REDUCE = 1, S_STORE = 2 };

template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = smem[0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) v = MAX ? fmaxf(v, smem[w]) : v + smem[w];
  return v;
}

template <bool PROF, int MODE = INSTR_MODE_STAGED>
__global__ void __launch_bounds__(THREADS) softmax_kernel(const half *__restrict__ x, half *__restrict__ y, int cols,
                                                          uint32_t *prof_buf, uint32_t cap) {
  __shared__ float red[THREADS / 32];
  instr::FlatProfiler<PROF, MODE> prof;
  prof.begin(prof_buf, cap);
  const size_t base = (size_t)blockIdx.x * cols;
  float v[ITEMS];
  prof.enter(S_LOAD);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    v[i] = c < cols ? __half2float(x[base + c]) : -FLT_MAX;
  }
  prof.next(S_LOAD, S_REDUCE);
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) m = fmaxf(m, v[i]);
  m = block_reduce<true>(m, red);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    v[i] = c < cols ? __expf(v[i] - m) : 0.f;
    s += v[i];
  }
  s = block_reduce<false>(s, red);
  const float inv = 1.f / s;
  prof.next(S_REDUCE, S_STORE);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    if (c < cols) y[base + c] = __float2half(v[i] * inv);
  }
  prof.exit(S_STORE);
  prof.end();
}
}  // namespace

int native_softmax_f16(const void *x, void *y, int rows, int cols, uint32_t *prof, uint32_t capacity, int mode,
                       void *stream) {
  if (cols > THREADS * ITEMS || cols <= 0) return (int)cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  if (!prof) {
    softmax_kernel<false><<<rows, THREADS, 0, s>>>((const half *)x, (half *)y, cols, nullptr, 0);
  } else if (capacity < INSTR_MIN_CAPACITY || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               softmax_kernel<true, decltype(m)::value><<<rows, THREADS, 0, s>>>((const half *)x, (half *)y, cols, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
