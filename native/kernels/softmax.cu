// Native row softmax, fp16 in/out, fp32 math: one 256-thread block per row, row kept in registers
// (cols <= 256 * 32 = 8192), read and written 16 bytes per access where cols % 8 == 0 and the rows are
// 16-byte aligned, 2 bytes otherwise (row_io.cuh). Scopes: 0 load, 1 reduce (max, exp, sum), 2 store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cmath>
#include "instrument.cuh"
#include "launchers.h"
#include "row_io.cuh"

namespace {
constexpr int THREADS = 256, ITEMS = 32;
constexpr float LOG2E = 1.4426950408889634f;
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

template <bool PROF, int MODE, int VEC>
__global__ void __launch_bounds__(THREADS) softmax_kernel(const half *__restrict__ x, half *__restrict__ y, int cols,
                                                          uint32_t *prof_buf, uint32_t cap) {
  constexpr int CHUNKS = ITEMS / VEC;
  __shared__ float red[THREADS / 32];
  instr::FlatProfiler<PROF, MODE> prof;
  prof.begin(prof_buf, cap);
  const size_t base = (size_t)blockIdx.x * cols;
  float v[ITEMS];
  prof.enter(S_LOAD);
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {  // past the row's end: -inf, whose exp below is 0
    const int c = row_io::chunk_col<VEC, THREADS>(j);
    row_io::Chunk<VEC> in;
    in.load_or(x + base + c, c < cols, row_io::F16_NEG_INF);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[j * VEC + e] = in.get(e);
  }
  prof.next(S_LOAD, S_REDUCE);
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) m = fmaxf(m, v[i]);
  m = block_reduce<true>(m, red);  // finite unless the row is: cols > 0
  const float ml = m * LOG2E;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    v[i] = row_io::exp2_ftz(fmaf(v[i], LOG2E, -ml));
    s += v[i];
  }
  s = block_reduce<false>(s, red);
  const float inv = 1.f / s;
  prof.next(S_REDUCE, S_STORE);
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c = row_io::chunk_col<VEC, THREADS>(j);
    float o[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) o[e] = v[j * VEC + e] * inv;
    if (c < cols) row_io::store<VEC>(y + base + c, o);
  }
  prof.exit(S_STORE);
  prof.end();
}

template <int VEC>
int launch(const half *x, half *y, int rows, int cols, uint32_t *prof, uint32_t capacity, int mode, cudaStream_t s) {
  if (!prof) {
    softmax_kernel<false, INSTR_MODE_STAGED, VEC><<<rows, THREADS, 0, s>>>(x, y, cols, nullptr, 0);
  } else if (!instr::capacity_ok(capacity) || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               softmax_kernel<true, decltype(m)::value, VEC><<<rows, THREADS, 0, s>>>(x, y, cols, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
}  // namespace

int native_softmax_f16(const void *x, void *y, int rows, int cols, uint32_t *prof, uint32_t capacity, int mode,
                       void *stream) {
  if (cols > THREADS * ITEMS || cols <= 0) return (int)cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const half *xx = (const half *)x;
  half *yy = (half *)y;
  return row_io::vec_ok(cols, {x, y}) ? launch<8>(xx, yy, rows, cols, prof, capacity, mode, s)
                                      : launch<1>(xx, yy, rows, cols, prof, capacity, mode, s);
}
