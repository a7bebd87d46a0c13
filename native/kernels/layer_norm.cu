// Native LayerNorm forward (affine), fp16 in/out, fp32 statistics: one 256-thread block per row, row kept in
// registers as loaded (fp16, converted at each use: half the registers of fp32), cols <= 8192; 16 bytes per access
// where cols % 8 == 0 and the rows, weight and bias are 16-byte aligned, 2 bytes otherwise (row_io.cuh).
// Scopes: 0 load, 1 stats (mean, variance), 2 normalize_store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "instrument.cuh"
#include "launchers.h"
#include "row_io.cuh"

namespace {
constexpr int THREADS = 256, ITEMS = 32;
// Registers of the instrumented builds: capped at the plain kernel's count (__maxnreg__), so that both run as many
// blocks per SM (sm_90, 256 threads: 6 blocks per SM at <= 40 registers, 4 at <= 64). Unbounded, the header's registers
// cost occupancy (1 Dec 2026, the fp32-row kernel: staged 82 and warp0 85 registers against the plain 79, 2 blocks per
// SM instead of 3: 1.59x / 1.71x the plain time), and __launch_bounds__(THREADS, blocks) made ptxas re-load every
// kernel parameter from the constant bank at each use (+30% instructions); __maxnreg__ caps them without that.
// The plain kernel keeps the compiler's choice: 40 registers with 16-byte chunks, 56 with 2-byte ones (fp16 row).
template <int VEC>
constexpr int PROF_MAX_REGS = VEC == 8 ? 40 : 64;
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

template <bool PROF, int MODE, int VEC>
__device__ __forceinline__ void layer_norm_body(const half *__restrict__ x, const half *__restrict__ w,
                                                const half *__restrict__ b, half *__restrict__ y, int cols, float eps,
                                                uint32_t *prof_buf, uint32_t cap) {
  constexpr int CHUNKS = ITEMS / VEC;
  __shared__ float red[THREADS / 32];
  // the batch in shared memory (SHARED_BATCH): the fp32-row kernel at 80 registers spilled the held stamp; at 40
  // registers both batch designs compile to 832 instructions
  instr::FlatProfiler<PROF, MODE, 8, true> prof;
  prof.begin(prof_buf, cap);
  const size_t base = (size_t)blockIdx.x * cols;
  row_io::Chunk<VEC> v[CHUNKS];
  prof.enter(S_LOAD);
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {  // past the row's end: zeros (the sum needs no test)
    const int c = row_io::chunk_col<VEC, THREADS>(j);
    v[j].load_or(x + base + c, c < cols, row_io::F16_ZERO);
  }
  prof.next(S_LOAD, S_STATS);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) s += v[j].get(e);
  }
  const float mean = block_sum(s, red) / cols;
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c = row_io::chunk_col<VEC, THREADS>(j);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float d = c < cols ? v[j].get(e) - mean : 0.f;
      q += d * d;
    }
  }
  const float rstd = rsqrtf(block_sum(q, red) / cols + eps);
  prof.next(S_STATS, S_NORM_STORE);
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c = row_io::chunk_col<VEC, THREADS>(j);
    if (c < cols) {
      row_io::Chunk<VEC> wc, bc;
      wc.load(w + c);
      bc.load(b + c);
      float o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = (v[j].get(e) - mean) * rstd * wc.get(e) + bc.get(e);
      row_io::store<VEC>(y + base + c, o);
    }
  }
  prof.exit(S_NORM_STORE);
  prof.end();
}

template <int VEC>
__global__ void __launch_bounds__(THREADS) layer_norm_plain(const half *__restrict__ x, const half *__restrict__ w,
                                                            const half *__restrict__ b, half *__restrict__ y,
                                                            int cols, float eps) {
  layer_norm_body<false, INSTR_MODE_STAGED, VEC>(x, w, b, y, cols, eps, nullptr, 0);
}

template <int MODE, int VEC>
__global__ void __maxnreg__(PROF_MAX_REGS<VEC>)  // (not combinable with __launch_bounds__)
    layer_norm_prof(const half *__restrict__ x, const half *__restrict__ w, const half *__restrict__ b,
                    half *__restrict__ y, int cols, float eps, uint32_t *prof_buf, uint32_t cap) {
  layer_norm_body<true, MODE, VEC>(x, w, b, y, cols, eps, prof_buf, cap);
}

template <int VEC>
int launch(const half *x, const half *w, const half *b, half *y, int rows, int cols, float eps, uint32_t *prof,
           uint32_t capacity, int mode, cudaStream_t s) {
  if (!prof) {
    layer_norm_plain<VEC><<<rows, THREADS, 0, s>>>(x, w, b, y, cols, eps);
  } else if (!instr::capacity_ok(capacity) || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               layer_norm_prof<decltype(m)::value, VEC><<<rows, THREADS, 0, s>>>(x, w, b, y, cols, eps, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
}  // namespace

int native_layer_norm_f16(const void *x, const void *w, const void *b, void *y, int rows, int cols, float eps,
                          uint32_t *prof, uint32_t capacity, int mode, void *stream) {
  if (cols > THREADS * ITEMS || cols <= 0) return (int)cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const half *xx = (const half *)x, *ww = (const half *)w, *bb = (const half *)b;
  half *yy = (half *)y;
  return row_io::vec_ok(cols, {x, w, b, y}) ? launch<8>(xx, ww, bb, yy, rows, cols, eps, prof, capacity, mode, s)
                                            : launch<1>(xx, ww, bb, yy, rows, cols, eps, prof, capacity, mode, s);
}
