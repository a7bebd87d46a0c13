// row_io.cuh -- the row access of the one-block-per-row fp16 kernels (softmax.cu, layer_norm.cu).
//
// Thread t of a THREADS-thread block holds ITEMS elements of its row as ITEMS / VEC chunks of VEC consecutive
// columns: chunk j starts at column (j * THREADS + t) * VEC, so a warp's accesses are contiguous either way.
//   VEC = 8: one 16-byte load / store per chunk.  Needs cols % 8 == 0 and 16-byte aligned rows (row_io::vec_ok).
//   VEC = 1: one 2-byte access per element: any cols, any alignment (the fallback).
// A chunk is in the row or not as a whole (cols % VEC == 0), so every bounds test is one per chunk.
#pragma once
#include <cuda_fp16.h>
#include <cstdint>
#include <initializer_list>

namespace row_io {

// fp16 bit patterns to fill the chunks past the row's end with (load_or)
constexpr unsigned short F16_ZERO = 0x0000, F16_NEG_INF = 0xFC00;

template <int VEC>
struct Chunk;  // VEC raw fp16 values of the row, as loaded

template <>
struct Chunk<1> {
  half h;
  __device__ __forceinline__ void load(const half *p) { h = *p; }
  __device__ __forceinline__ void load_or(const half *p, bool in_row, unsigned short fill) {
    h = in_row ? *p : __ushort_as_half(fill);
  }
  __device__ __forceinline__ float get(int) const { return __half2float(h); }
};

template <>
struct Chunk<8> {
  uint4 u;
  __device__ __forceinline__ void load(const half *p) { u = *reinterpret_cast<const uint4 *>(p); }
  __device__ __forceinline__ void load_or(const half *p, bool in_row, unsigned short fill) {
    const uint32_t f = fill * 0x10001u;
    u = in_row ? *reinterpret_cast<const uint4 *>(p) : make_uint4(f, f, f, f);
  }
  __device__ __forceinline__ float get(int e) const {  // e is a constant after unrolling
    const uint32_t w = e < 2 ? u.x : e < 4 ? u.y : e < 6 ? u.z : u.w;
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> (16 * (e & 1)))));
  }
};

// f[0 .. VEC) as fp16 to p (round to nearest)
template <int VEC>
__device__ __forceinline__ void store(half *p, const float *f) {
  if constexpr (VEC == 1) {
    *p = __float2half(f[0]);
  } else {
    static_assert(VEC == 8, "VEC is 1 or 8");
    uint4 u;
    __half2 *h = reinterpret_cast<__half2 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
  }
}

template <int VEC, int THREADS>
__device__ __forceinline__ int chunk_col(int j) {
  return (j * THREADS + static_cast<int>(threadIdx.x)) * VEC;
}

// Whether rows of `cols` fp16 values at these base pointers can take the 16-byte path.
// 2^x, flushing subnormal results to zero (one MUFU.EX2; exp2f / __expf also scale around subnormals)
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__host__ __forceinline__ bool vec_ok(int cols, std::initializer_list<const void *> ptrs) {
  if (cols % 8) return false;
  for (const void *p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}

}  // namespace row_io
