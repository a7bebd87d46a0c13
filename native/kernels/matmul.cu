// Native fp16 GEMM C(f32) = A(f16, MxK row-major) @ B(f16, KxN row-major) on tensor cores (WMMA),
// 128x128x32 block tile, 8 warps (2 x 4), each warp 64x32. Needs M, N % 128 == 0 and K % 32 == 0.
// Scopes: 0 loop (whole K loop), 1 load (global -> shared), 2 mma, 3 store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include "instrument.cuh"
#include "launchers.h"

using namespace nvcuda;

namespace {
constexpr int BM = 128, BN = 128, BK = 32, THREADS = 256;
constexpr int LDA = BK + 8, LDB = BN + 8;
enum { S_LOOP = 0, S_LOAD = 1, S_MMA = 2, S_STORE = 3 };

template <bool PROF, int MODE = INSTR_MODE_STAGED>
__global__ void __launch_bounds__(THREADS) matmul_kernel(const half *__restrict__ A, const half *__restrict__ B,
                                                         float *__restrict__ C, int M, int N, int K,
                                                         uint32_t *prof_buf, uint32_t cap) {
  __shared__ __align__(32) half As[BM * LDA];
  __shared__ __align__(32) half Bs[BK * LDB];
  instr::FlatProfiler<PROF, MODE> prof;  // 2-D grid, 1-D blocks
  prof.begin(prof_buf, cap);

  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile: rows wm*64, cols wn*32
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  // two records per k-step: load -> mma, and mma -> the next step's load (or, at the last step, mma's exit)
  prof.enter(S_LOOP);
  if (K > 0) prof.enter(S_LOAD);
  for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // A tile: 128 rows x 4 uint4
      const int idx = tid + i * THREADS, r = idx / 4, c = (idx % 4) * 8;
      *reinterpret_cast<uint4 *>(&As[r * LDA + c]) =
          *reinterpret_cast<const uint4 *>(&A[(size_t)(row0 + r) * K + k0 + c]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // B tile: 32 rows x 16 uint4
      const int idx = tid + i * THREADS, r = idx / 16, c = (idx % 16) * 8;
      *reinterpret_cast<uint4 *>(&Bs[r * LDB + c]) =
          *reinterpret_cast<const uint4 *>(&B[(size_t)(k0 + r) * N + col0 + c]);
    }
    __syncthreads();
    prof.next(S_LOAD, S_MMA);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) wmma::load_matrix_sync(fa[i], &As[(wm * 64 + i * 16) * LDA + kk], LDA);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[kk * LDB + wn * 32 + j * 16], LDB);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
    prof.record(k0 + BK < K ? instr::next_tag(S_MMA, S_LOAD) : instr::exit_tag(S_MMA));
  }
  prof.next(S_LOOP, S_STORE);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&C[(size_t)(row0 + wm * 64 + i * 16) * N + col0 + wn * 32 + j * 16], acc[i][j], N,
                              wmma::mem_row_major);
  prof.exit(S_STORE);
  prof.end();
}
}  // namespace

int native_matmul_f16(const void *a, const void *b, float *c, int M, int N, int K, uint32_t *prof,
                      uint32_t capacity, int mode, void *stream) {
  if (M % BM || N % BN || K % BK) return (int)cudaErrorInvalidValue;
  dim3 grid(N / BN, M / BM);
  auto s = static_cast<cudaStream_t>(stream);
  if (!prof) {
    matmul_kernel<false><<<grid, THREADS, 0, s>>>((const half *)a, (const half *)b, c, M, N, K, nullptr, 0);
  } else if (!instr::capacity_ok(capacity) || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               matmul_kernel<true, decltype(m)::value><<<grid, THREADS, 0, s>>>((const half *)a, (const half *)b, c, M, N, K, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
