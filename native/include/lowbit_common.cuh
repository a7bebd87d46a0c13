// lowbit_common.cuh -- device helpers of the native low-bit kernels (native/kernels/lowbit*.cu).
// Packed f16x2 / bf16x2 fma (no flush of subnormals: the recipes rely on exact subnormal inputs),
// m16n8k16 mma.sync with f32 accumulators, cp.async, conversions.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lowbit {

constexpr int WARPS = 8, THREADS = 256, NT = 2, BN = 256, KG = 32;

// k per pipeline stage (must match native/lowbit_layout.py kstep_for)
__host__ __device__ constexpr int kstep_for(int bits) { return bits <= 2 ? 256 : 128; }
// bytes per staged x row: 64 bytes of padding put the 16-byte B-fragment loads of rows g, g+1 in other banks
__host__ __device__ constexpr int xrow_bytes(int kstep) { return kstep * 2 + 64; }
// ring depth: 2 blocks of 8 warps per SM must fit (<= ~113 KB each at M = 16) with enough bytes in flight
__host__ __device__ constexpr int stages_for(int bits) {
  return bits == 1 ? 5 : bits == 2 ? 4 : bits == 3 ? 5 : bits == 4 ? 4 : 3;
}

// keep a value in a register (ptxas would otherwise rematerialize cheap address arithmetic every stage)
template <class T>
__device__ __forceinline__ void pin(T &v) {
  if constexpr (sizeof(T) == 8) asm volatile("" : "+l"(v));
  else asm volatile("" : "+r"(v));
}

// (a | b) & c in one LOP3; inline PTX so that the compiler does not move a shift of `a` behind the mask (it turns
// (w << s) & m into (w & (m >> s)) << s, one shift per use instead of one per shifted word)
__device__ __forceinline__ uint32_t or_and(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xA8;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t hfma2_f16(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t hfma2_bf16(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// D(16x8, f32) += A(16x16, row) * B(16x8, col); A = 4 x 32-bit registers (a0a1, a2a3, a4a5, a6a7).
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Bulk copies (sm_90): one thread moves a contiguous run of bytes global -> shared through the TMA unit;
// completion is counted in bytes on an mbarrier (expect_tx), and every reader waits on its phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// order this thread's earlier generic-proxy accesses of shared memory before its later async-proxy ones
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(bar), "r"(parity));  // no memory clobber: the kernel's __syncthreads right after orders the reads
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// low / high half of a packed pair of the activation dtype, as f32
template <bool BF16>
__device__ __forceinline__ float lo_f32(uint32_t v) {
  if constexpr (BF16) return __uint_as_float(v << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xFFFFu)));
}
template <bool BF16>
__device__ __forceinline__ float hi_f32(uint32_t v) {
  if constexpr (BF16) return __uint_as_float(v & 0xFFFF0000u);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16)));
}

template <bool BF16>
__device__ __forceinline__ unsigned short f32_to_act(float v) {
  if constexpr (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

template <bool BF16>
__device__ __forceinline__ uint32_t pack2_act(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_act<BF16>(lo)) | (static_cast<uint32_t>(f32_to_act<BF16>(hi)) << 16);
}

}  // namespace lowbit
