// Native LayerNorm forward (affine), fp16 in/out, fp32 statistics: one 256-thread block per row,
// row kept in registers (cols <= 8192). Scopes: 0 load, 1 stats (mean, variance), 2 normalize_store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "instrument.cuh"
#include "launchers.h"

namespace {
constexpr int THREADS = 256, ITEMS = 32;
// Registers of the instrumented builds: the plain kernel takes 79 (80 allocated x 256 threads: 3 blocks per
// SM); unbounded, the staged build took 82 and warp0 85 (2 blocks per SM: 1.59x / 1.71x the plain time on the
// H200, 1 Dec 2026). __launch_bounds__(THREADS, 3) held them to 3 blocks but made ptxas re-load every
// kernel parameter from the constant bank at each use (70-74 registers, +30% instructions; the plain
// kernel under the same bound: 1200 instructions against 912) and cost as much as it saved (staged
// 1.29x, direct 1.30 -> 1.46x). __maxnreg__ caps the registers without that rematerialisation (staged:
// 71 registers, 1376 instructions against 1352 unbounded). The plain kernel keeps the compiler's choice.
constexpr int PROF_MAX_REGS = 80;
enum { S_LOAD = 0, S_STATS = 1, S_NORM_STORE = 2 };

__device__ __forceinline__ float block_sum(float v, float *smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = 0.f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) v += smem[w];
  return v;
}

template <bool PROF, int MODE>
__device__ __forceinline__ void layer_norm_body(const half *__restrict__ x, const half *__restrict__ w,
                                                const half *__restrict__ b, half *__restrict__ y, int cols, float eps,
                                                uint32_t *prof_buf, uint32_t cap) {
  __shared__ float red[THREADS / 32];
  instr::FlatProfiler<PROF, MODE, 8, true> prof;  // batch in shared memory: at 80 registers the held stamp spilled
  prof.begin(prof_buf, cap);
  const size_t base = (size_t)blockIdx.x * cols;
  float v[ITEMS];
  prof.enter(S_LOAD);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    v[i] = c < cols ? __half2float(x[base + c]) : 0.f;
  }
  prof.next(S_LOAD, S_STATS);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) s += v[i];
  const float mean = block_sum(s, red) / cols;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    const float d = c < cols ? v[i] - mean : 0.f;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q, red) / cols + eps);
  prof.next(S_STATS, S_NORM_STORE);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    if (c < cols) y[base + c] = __float2half((v[i] - mean) * rstd * __half2float(w[c]) + __half2float(b[c]));
  }
  prof.exit(S_NORM_STORE);
  prof.end();
}

__global__ void __launch_bounds__(THREADS) layer_norm_plain(const half *__restrict__ x, const half *__restrict__ w,
                                                            const half *__restrict__ b, half *__restrict__ y,
                                                            int cols, float eps) {
  layer_norm_body<false, INSTR_MODE_STAGED>(x, w, b, y, cols, eps, nullptr, 0);
}

template <int MODE>
__global__ void __maxnreg__(PROF_MAX_REGS)  // (not combinable with __launch_bounds__)
    layer_norm_prof(const half *__restrict__ x, const half *__restrict__ w, const half *__restrict__ b,
                    half *__restrict__ y, int cols, float eps, uint32_t *prof_buf, uint32_t cap) {
  layer_norm_body<true, MODE>(x, w, b, y, cols, eps, prof_buf, cap);
}
}  // namespace

int native_layer_norm_f16(const void *x, const void *w, const void *b, void *y, int rows, int cols, float eps,
                          uint32_t *prof, uint32_t capacity, int mode, void *stream) {
  if (cols > THREADS * ITEMS || cols <= 0) return (int)cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const half *xx = (const half *)x, *ww = (const half *)w, *bb = (const half *)b;
  if (!prof) {
    layer_norm_plain<<<rows, THREADS, 0, s>>>(xx, ww, bb, (half *)y, cols, eps);
  } else if (capacity < INSTR_MIN_CAPACITY || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               layer_norm_prof<decltype(m)::value><<<rows, THREADS, 0, s>>>(xx, ww, bb, (half *)y, cols, eps, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
