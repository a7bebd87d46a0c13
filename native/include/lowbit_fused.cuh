// lowbit_fused.cuh -- the native fused prefill kernel (issue 13: M >= 2048): y[M, N] = x[M, K] @ dequant(W)[K, N] in
// one launch on Hopper's warpgroup tensor cores, the weights dequantized in registers in the main loop (wgmma with
// A from registers), nothing written back to memory but y.
//
// y^T = W^T x^T: A = the weight tile, B = x^T.  A block = the layout's n-block (256 output channels: 8 warps x 2 n16
// tiles, native/lowbit_layout.py) x BM = 128 tokens, two warpgroups of 4 warps.  Each warp dequantizes its own
// packed words, exactly as the decode kernel does (recipes of lowbit_recipes.cuh: a thread's words are its A
// fragments), applies its channels' scale (and zero point) in the activation dtype (w = v * s - z * s, one packed
// fma per pair), and warpgroup w / 4 issues, per n16 tile and k16 block, one wgmma.m64n128k16 with those 4 registers
// as A: a warpgroup's 4 warps hold A rows 16 * (w % 4) .. +15 of tile nt = channels w * 32 + nt * 16 + 0..15.
// B = x^T from shared memory in the 128-byte-swizzled K-major layout: x is first permuted within every 32 k
// (lowbit_xperm_kernel) into the mma's logical k order (the decode layout gives thread t the physical k 8t .. 8t + 7
// of each 32: logical 16r + 8jk + 2t + e = physical 8t + 4r + 2jk + e), zero-padded to the layout's Kpad.
//
// x is written as the exact images of the ring slots (one contiguous XBYTES run per m-tile and stage).
// Pipeline: a ring of S stages of FK = 128 k in shared memory (the block's packed words; the x tile, 128 rows x 256
// bytes as two swizzled 64-k halves), filled S - 2 stages ahead by cp.async.bulk (the TMA unit): lane 0 of each
// warp copies its warp's words and an eighth of the x tile, one mbarrier per slot instead of a block-wide barrier
// (below).  Per group of G 32-k chunks: each thread reads its words from the slot, dequantizes into fresh
// registers, fence, 4 G wgmma, commit, wait until at most one group is pending -- so the dequantize of the next
// group runs under the wgmma of this one (ptxas keeps no more than that in flight), and a ring slot is refilled only
// after the wgmma that read it (two stages back) completed.
// Numerics: the same as the dequantize + cuBLAS path up to one rounding: each weight is rounded once to the
// activation dtype after its scale (fma(v, s, -round(z * s))), products summed in f32 by the tensor cores; with one
// group over all of K and no zero point, the exact values instead and y = s * sum in f32 (no rounding of weights).
#pragma once
#include <cstdint>
#include "lowbit_common.cuh"
#include "lowbit_params.h"

namespace lowbit {
namespace fused {

constexpr int BM = 128;                    // tokens per block (the wgmma's N)
constexpr int FK = 128;                    // k per pipeline stage: 4 recipe chunks of 32
constexpr int FCH = FK / KG;
constexpr int XBYTES = BM * FK * 2;        // x per stage: two swizzled sub-tiles of BM rows x 64 k (128 bytes)
// the wide build (FUSED_OPT_WIDE): half an n-block (128 channels) x WBM = 256 tokens, stages of WFK = 64 k (one
// swizzled sub-tile of x, also XBYTES), m64n256k16: each dequantized weight serves twice the tokens
constexpr int WBM = 256, WFK = 64;
constexpr int SMEM_LIMIT = 227 * 1024;     // opt-in dynamic shared memory per block on sm_90

// the packed words of one stage: all 8 warps' runs of FK k (bits 16-byte vectors per thread), or (wide) the 4 runs
// of the block's half n-block, WFK k each
__host__ __device__ constexpr int code_bytes(int bits, bool wide = false) {
  return wide ? WARPS / 2 * 32 * bits * 8 : THREADS * bits * 16;
}
__host__ __device__ constexpr int stage_bytes(int bits, bool wide = false) { return code_bytes(bits, wide) + XBYTES; }
__host__ __device__ constexpr int ring_stages(int bits, bool wide = false) {
  return (SMEM_LIMIT - 1024) / stage_bytes(bits, wide) > 6 ? 6 : (SMEM_LIMIT - 1024) / stage_bytes(bits, wide);
}
// + 1024: the ring starts at the first 1024-byte boundary (the swizzle atom) of the dynamic shared memory
__host__ __device__ constexpr int smem_bytes(int bits, bool wide = false) {
  return ring_stages(bits, wide) * stage_bytes(bits, wide) + 1024;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (the leading offset is
// unused for this layout), start address in 16-byte units
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return (uint64_t)((saddr >> 4) & 0x3FFF) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

// D[64 x 128] (f32, this thread's 64 values) += A[64 x 16] (registers, 4 x f16x2 / bf16x2) * B[16 x 128] (shared
// memory, descriptor), one warpgroup.  BF16: bf16 operands.
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t desc) {
  // TY: the operand type; scale-d is the predicate p (always accumulate), A and B not negated, B not transposed
#define LOWBIT_WGMMA_M64N128K16_RS(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1))
  if constexpr (BF16) LOWBIT_WGMMA_M64N128K16_RS("bf16");
  else LOWBIT_WGMMA_M64N128K16_RS("f16");
#undef LOWBIT_WGMMA_M64N128K16_RS
}

// D[64 x 256] (f32, this thread's 128 values) += A[64 x 16] (registers) * B[16 x 256] (shared memory): the wide build
#define LOWBIT_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define LOWBIT_D16(i) LOWBIT_D4(i), LOWBIT_D4(i + 4), LOWBIT_D4(i + 8), LOWBIT_D4(i + 12)
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t desc) {
#define LOWBIT_WGMMA_M64N256K16_RS(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n" \
      : LOWBIT_D16(0), LOWBIT_D16(16), LOWBIT_D16(32), LOWBIT_D16(48), LOWBIT_D16(64), LOWBIT_D16(80), LOWBIT_D16(96), \
        LOWBIT_D16(112) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1))
  if constexpr (BF16) LOWBIT_WGMMA_M64N256K16_RS("bf16");
  else LOWBIT_WGMMA_M64N256K16_RS("f16");
#undef LOWBIT_WGMMA_M64N256K16_RS
}
#undef LOWBIT_D16
#undef LOWBIT_D4

// packed a * b (+ c) in the activation dtype
template <bool BF>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  if constexpr (BF) return hfma2_bf16(a, b, c);
  else return hfma2_f16(a, b, c);
}

}  // namespace fused

// grid = n-blocks x ceil(M / BM) (the m-tiles of one n-block adjacent, so that its words are read from L2 after the
// first), THREADS threads, fused::smem_bytes(R::BITS) bytes of dynamic shared memory, one block per SM.
// G: chunks per wgmma commit group (the dequantize of the next G chunks runs under the G * 4 wgmma of the last).
// DIAG (native.fused_diag only, the tuning extension; the results are wrong on purpose): bit 0 no dequantize (the
// words themselves as A), bit 1 no copies (the ring holds what it held), so that what is left is timed.
// OPT (the tuning extension; results right): bit 0 (FUSED_OPT_HOIST) every word of the stage read from shared
// memory into registers right after the stage's wait (4 BITS registers), instead of each chunk's before its dequantize.
// Bit 1 (FUSED_OPT_WIDE, even widths): a block is half an n-block (layout warps 4 h .. 4 h + 3, h = block's half) x
// WBM = 256 tokens, stages of WFK = 64 k; warp w holds the words of layout warp 4 h + w % 4 and dequantizes only its
// tile nt = w / 4 (its warpgroup), so warpgroup nt issues per k16 block one m64n256k16 on tile nt: half the
// dequantize per tensor-core cycle.  grid = 2 n-blocks x ceil(M / WBM); x as fused_xperm's WBM x WFK images.
enum { FUSED_DIAG_NODEQ = 1, FUSED_DIAG_NOLOAD = 2 };
enum { FUSED_OPT_HOIST = 1, FUSED_OPT_WIDE = 2 };
template <class R, int G, int DIAG = 0, int OPT = 0>
__global__ void __launch_bounds__(THREADS, 1) lowbit_fused_kernel(const __grid_constant__ FusedParams p) {
  using namespace fused;
  constexpr bool WIDE = (OPT & FUSED_OPT_WIDE) != 0;
  constexpr int BITS = R::BITS, S = ring_stages(BITS, WIDE), VEC = (R::KSTEP / KG) * BITS / 4;
  constexpr int TBM = WIDE ? WBM : BM, TFK = WIDE ? WFK : FK, TCH = TFK / KG, SUBS = R::KSTEP / TFK;
  constexpr int TILES = WIDE ? 1 : 2;  // n16 tiles of a warp (its A fragments) that it dequantizes and issues
  constexpr int AR = 8 * TILES;        // A registers per chunk
  constexpr bool BF = R::BF16;
  constexpr int SW = R::ZERO ? 4 : 2;  // act-dtype values per (group, warp, nt, g): s_g, s_g+8 (, z_g, z_g+8)
  static_assert(R::BIAS == 0.f, "the fused kernel takes recipes whose deq() gives the exact value");
  static_assert(S >= 3 && R::KSTEP % TFK == 0, "ring");
  static_assert(G == 1 || G == 2, "chunks per group");
  static_assert(!WIDE || BITS % 2 == 0, "wide: a stage's words (half a run) are whole 16-byte vectors");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t ring = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mtiles = (p.M + TBM - 1) / TBM;
  const int bn = blockIdx.x / mtiles, m0 = (blockIdx.x % mtiles) * TBM;
  const int nb = WIDE ? bn >> 1 : bn;
  const int lw = WIDE ? (bn & 1) * 4 + (warp & 3) : warp;  // the layout warp whose words and channels this warp takes
  const int wg = warp >> 2;
  const int fiters = p.Kpad / TFK;
  const uint32_t magic = p.magic;
  auto tile = [&](int i) { return WIDE ? wg : i; };  // the i-th tile of this warp: its n16 tile in the layout warp

  // loader: lane 0 of every warp moves, per stage, its warp's run of the packed words (BITS x 512 bytes: the warp's
  // region of the ring slot, lane l's vectors at l * 16 + v * 512; wide: warpgroup 0 only, half runs) and one eighth
  // of the stage's x tile, which lowbit_xperm_kernel wrote as the slot's exact image (XBYTES contiguous bytes per
  // (m-tile, stage)), with two cp.async.bulk onto the slot's mbarrier: no per-thread copies, address arithmetic or
  // copy waits in the main loop
  constexpr uint32_t WBYTES = BITS * 512 * TFK / FK, XSLICE = XBYTES / WARPS;
  const bool copies_words = !WIDE || wg == 0;
  const uint8_t *wsrc = static_cast<const uint8_t *>(p.wq) + ((size_t)nb * p.iters * WARPS + lw) * (32 * VEC) * 16;
  const uint32_t cdst = (WIDE ? warp & 3 : warp) * WBYTES, crd = cdst + lane * 16;
  const uint32_t xdst = code_bytes(BITS, WIDE) + warp * XSLICE;
  const uint8_t *xsrc = static_cast<const uint8_t *>(p.xp) + (size_t)(m0 / TBM) * fiters * XBYTES + warp * XSLICE;
  auto load = [&](int fs, uint32_t base, uint32_t bar) {
    if (lane != 0) return;
    if constexpr ((DIAG & FUSED_DIAG_NOLOAD) != 0) {
      mbar_expect_tx(bar, 0);  // the arrival only: the ring holds what it held
    } else {
      mbar_expect_tx(bar, (copies_words ? WBYTES : 0) + XSLICE);
      if (copies_words)
        bulk_g2s(base + cdst,
                 wsrc + ((size_t)(fs / SUBS) * (WARPS * 32 * VEC) + (fs % SUBS) * (BITS * 32 * TFK / FK)) * 16,
                 WBYTES, bar);
      bulk_g2s(base + xdst, xsrc + (size_t)fs * XBYTES, XSLICE, bar);
    }
  };

  // scales: group G, tile nt of this thread's row pair (g, g + 8) at scb + (G * 16 + nt * 8) * SW
  const uint16_t *scb = static_cast<const uint16_t *>(p.sc) + ((size_t)nb * WARPS + lw) * p.ngroups * (16 * SW) + g * SW;
  auto load_sc = [&](int grp, uint32_t (&r)[TILES][2]) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
      const uint16_t *q = scb + ((size_t)grp * 16 + tile(i) * 8) * SW;
      if constexpr (SW == 4) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(q));
        r[i][0] = v.x, r[i][1] = v.y;
      } else {
        r[i][0] = __ldg(reinterpret_cast<const uint32_t *>(q)), r[i][1] = 0;
      }
    }
  };
  uint32_t s2[TILES][2], o2[TILES][2];  // [i][jn]: (s, s) and (-z s, -z s) of channel tile(i) * 16 + jn * 8 + g
  auto set_sc = [&](const uint32_t (&r)[TILES][2]) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
      const uint32_t nzs = R::ZERO ? (fma2<BF>(r[i][1], r[i][0], 0x80008000u) ^ 0x80008000u) : 0x80008000u;
      s2[i][0] = __byte_perm(r[i][0], 0, 0x1010), s2[i][1] = __byte_perm(r[i][0], 0, 0x3232);
      o2[i][0] = __byte_perm(nzs, 0, 0x1010), o2[i][1] = __byte_perm(nzs, 0, 0x3232);
    }
  };
  // groups of whole stages (group % TFK == 0, per channel included): the next stage's scales loaded a stage ahead,
  // counting stages; other groups: looked up per chunk (a division)
  const bool stage_groups = p.group % TFK == 0;
  const int spg = stage_groups ? p.group / TFK : 1;
  // one group over all of K and no zero point: the tensor cores see the exact values, y = s * (x . v) in f32 at the
  // end (no scale fma per weight; one rounding, of y)
  const bool post_scale = !R::ZERO && p.group >= p.Kpad;
  int cur = -1;

  constexpr int ACC = TBM / 2;  // f32 values per thread of one m64 x TBM tile
  float acc[TILES][ACC];
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int j = 0; j < ACC; ++j) acc[i][j] = 0.f;

  // full[s]: one phase per use of ring slot s, completed when all THREADS threads and the WARPS copying lanes
  // arrived and the copies' bytes landed -- lane 0 of each warp arrives (with the bytes it expects) as it issues
  // the copies of stage f, two stages ahead; every thread arrives for stage f once its warpgroup's wgmma of stage
  // f - 2 completed, in the middle of stage f - 1 (ARRIVE_AT: the chunk after whose wait it arrives).  So waiting
  // on stage f's phase says both that f's words and x tile are whole and that f - 2's slot may be refilled, and the
  // two warpgroups never meet at a block-wide barrier (each may run up to half a stage ahead of the other).
  __shared__ __align__(8) uint64_t full[S];
  const uint32_t full0 = smem_u32(full);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) mbar_init(full0 + 8 * s, THREADS + WARPS);
    fence_mbar_init();
  }
  __syncthreads();
  // with one stage of look-ahead, as late as possible
  constexpr int ARRIVE_AT = S == 3 ? TCH - 1 : (2 * G - 1 < TCH - 1 ? 2 * G - 1 : TCH - 1);
  auto arrive = [&](uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); };

#pragma unroll
  for (int s = 0; s < S - 2; ++s)
    if (s < fiters) load(s, ring + s * stage_bytes(BITS, WIDE), full0 + 8 * s);
  arrive(full0);
  uint32_t nraw[TILES][2];
  bool pending = stage_groups;  // nraw holds the scales of the next stage's group, not yet applied
  if (stage_groups) load_sc(0, nraw);
  int left = spg, gnext = 0;
  int slot = 0, lslot = S - 2;  // ring slots of this stage and of the stage loaded in it
  uint32_t parity = 0;
  for (int fs = 0; fs < fiters; ++fs) {
    mbar_wait(full0 + 8 * slot, parity);
    asm volatile("" ::: "memory");  // the loads and copies below stay after the wait
    if (fs + S - 2 < fiters) load(fs + S - 2, ring + lslot * stage_bytes(BITS, WIDE), full0 + 8 * lslot);
    if (stage_groups) {
      if (pending) set_sc(nraw), pending = false;
      if (--left == 0 && fs + 1 < fiters) left = spg, load_sc(++gnext, nraw), pending = true;
    }
    const uint32_t base = ring + slot * stage_bytes(BITS, WIDE);
    constexpr bool HOIST = (OPT & FUSED_OPT_HOIST) != 0;
    uint32_t ws[HOIST ? TCH * BITS : 1];  // HOIST: the stage's words, word i at vector i / 4
    if constexpr (HOIST) {
#pragma unroll
      for (int v = 0; v < TCH * BITS / 4; ++v)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(ws[4 * v]), "=r"(ws[4 * v + 1]), "=r"(ws[4 * v + 2]), "=r"(ws[4 * v + 3])
                     : "r"(base + crd + v * 512));
    }
    const int nslot = slot + 1 == S ? 0 : slot + 1;
#pragma unroll
    for (int c0 = 0; c0 < TCH; c0 += G) {
      uint32_t ab[G][AR];  // fresh registers per group: ptxas keeps those of the group in flight
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const int c = c0 + h;
        if (!stage_groups) {
          const int grp = (fs * TFK + c * KG + 8 * t) / p.group;
          if (grp != cur) {
            uint32_t r[TILES][2];
            load_sc(grp, r);
            set_sc(r);
            cur = grp;
          }
        }
        uint32_t w[BITS];  // this chunk's words: word c * BITS + j of the stage at vector (c * BITS + j) / 4
        if constexpr (HOIST) {
#pragma unroll
          for (int j = 0; j < BITS; ++j) w[j] = ws[c * BITS + j];
        } else if constexpr (BITS % 4 == 0) {
#pragma unroll
          for (int v = 0; v < BITS / 4; ++v)
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[4 * v]), "=r"(w[4 * v + 1]), "=r"(w[4 * v + 2]), "=r"(w[4 * v + 3])
                         : "r"(base + crd + (c * BITS / 4 + v) * 512));
        } else {
#pragma unroll
          for (int j = 0; j < BITS; ++j) {
            const int i = c * BITS + j;
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w[j]) : "r"(base + crd + (i >> 2) * 512 + (i & 3) * 4));
          }
        }
        // A fragment registers 8 r + 4 nt + 0..3 of the recipe: k16 block r of the chunk, n16 tile nt; wide: only
        // tile wg's, as ab 4 r + 0..3 (a branch per warpgroup, so that each dequantizes only its half)
        if constexpr ((DIAG & FUSED_DIAG_NODEQ) != 0) {
#pragma unroll
          for (int i = 0; i < AR; ++i) ab[h][i] = w[i % BITS];
        } else {
          if constexpr (WIDE) {
            uint32_t f[16];
            if (wg == 0) {
              R::deq(w, f, magic);
#pragma unroll
              for (int i = 0; i < 8; ++i) ab[h][i] = f[(i >> 2) * 8 + (i & 3)];
            } else {
              R::deq(w, f, magic);
#pragma unroll
              for (int i = 0; i < 8; ++i) ab[h][i] = f[(i >> 2) * 8 + 4 + (i & 3)];
            }
          } else {
            R::deq(w, ab[h], magic);
          }
          if (!post_scale) {
#pragma unroll
            for (int i = 0; i < AR; ++i) {
              const int ti = WIDE ? 0 : (i >> 2) & 1;  // the register's tile, its index in s2 / o2
              ab[h][i] = fma2<BF>(ab[h][i], s2[ti][i & 1], o2[ti][i & 1]);
            }
          }
        }
      }
      // the descriptors are defined before the fence (ptxas serializes a pipeline into which a non-wgmma
      // instruction writes one of its inputs; asm volatile keeps them where they are written)
      uint64_t desc[2 * G];
#pragma unroll
      for (int kk0 = 0; kk0 < 2 * G; ++kk0) {
        const int kk = 2 * c0 + kk0;  // k16 block of the stage: sub-tile kk / 4, 32 bytes per k16 block inside it
        const uint64_t d = sw128_desc(base + code_bytes(BITS, WIDE) + (kk >> 2) * (TBM * 128) + (kk & 3) * 32);
        asm volatile("mov.b64 %0, %1;" : "=l"(desc[kk0]) : "l"(d));
      }
      wgmma_fence();
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < TILES; ++i) {
            const uint32_t *a = &ab[h][WIDE ? 4 * r : 8 * r + 4 * i];
            if constexpr (WIDE) wgmma_m64n256k16_rs<BF>(acc[i], a[0], a[1], a[2], a[3], desc[2 * h + r]);
            else wgmma_m64n128k16_rs<BF>(acc[i], a[0], a[1], a[2], a[3], desc[2 * h + r]);
          }
      wgmma_commit();
      wgmma_wait<1>();  // the previous group retired: its registers are free
      if (c0 + G - 1 == ARRIVE_AT && fs + 1 < fiters) arrive(full0 + 8 * nslot);  // stage fs - 1's wgmma retired
    }
    slot = nslot;
    lslot = lslot + 1 == S ? 0 : lslot + 1;
    parity ^= slot == 0;
  }
  wgmma_wait<0>();

  // D fragment of a tile: value 4 j + q = (row g + 8 (q >> 1), token 8 j + 2 t + (q & 1)) -> y[m][n] row-major
  uint16_t *y = static_cast<uint16_t *>(p.y);
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = nb * BN + lw * 32 + tile(i) * 16 + (q >> 1) * 8 + g;
      if (n >= p.N) continue;
      const float sc = post_scale ? lo_f32<BF>(s2[i][q >> 1]) : 1.f;
#pragma unroll
      for (int j = 0; j < TBM / 8; ++j) {
        const int m = m0 + 8 * j + 2 * t + (q & 1);
        if (m < p.M) y[(size_t)m * p.N + n] = f32_to_act<BF>(post_scale ? sc * acc[i][4 * j + q] : acc[i][4 * j + q]);
      }
    }
}

// x [M][K] -> xp: the fused kernel's x tiles as the exact images of its ring slots, bm * fk * 2 bytes per (m-tile of
// bm rows, stage of fk k), the m-tile's stages in order: bm = BM, fk = FK, or (the wide build) bm = WBM, fk = WFK.
// Within every 32 k, logical position 16 r + 8 jk + 2 t + e holds physical k 8 t + 4 r + 2 jk + e (the decode
// layout's fragment order); a stage is fk / 64 sub-tiles of bm rows x 64 logical k (128 bytes a row), its 16-byte
// chunk c of row rr at ((c ^ (rr & 7)) << 4): wgmma's 128-byte-swizzled K-major layout.  k >= K and rows >= M zero.
// One thread per 32 k of a row; Mp % bm == 0, Kpad % fk == 0.
static __global__ void __launch_bounds__(THREADS) lowbit_xperm_kernel(const uint32_t *x, uint32_t *xp, int M, int Mp,
                                                                       int K, int Kpad, int bm, int fk) {
  const int G = Kpad / KG, subs = fk / 64;
  const long long q = (long long)blockIdx.x * THREADS + threadIdx.x;
  if (q >= (long long)Mp * G) return;
  const int m = (int)(q / G), grp = (int)(q % G);
  const uint4 *src = reinterpret_cast<const uint4 *>(x + (size_t)m * (K / 2)) + grp * 4;
  uint32_t w[16];
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint4 u = m < M && grp * KG + 8 * v < K ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
    w[4 * v] = u.x, w[4 * v + 1] = u.y, w[4 * v + 2] = u.z, w[4 * v + 3] = u.w;
  }
  // this 32 k: stage grp / (fk / 32), sub-tile (grp / 2) % subs, chunks 4 (grp % 2) .. + 3 of row rr of m-tile m / bm
  const int rr = m % bm, c0 = (grp & 1) * 4;
  uint4 *row = reinterpret_cast<uint4 *>(xp) +
               (((size_t)(m / bm) * (Kpad / fk) + grp / (fk / KG)) * subs + (grp >> 1) % subs) * ((size_t)bm * 8) +
               rr * 8;
  // output pair 8 r + 4 jk + t (chunk 2 r + jk of the 32 k) <- input pair 4 t + 2 r + jk
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int jk = 0; jk < 2; ++jk)
      row[(c0 + 2 * r + jk) ^ (rr & 7)] = make_uint4(w[2 * r + jk], w[4 + 2 * r + jk], w[8 + 2 * r + jk], w[12 + 2 * r + jk]);
}

template <class R, int G, int DIAG = 0, int OPT = 0>
int fused_launch_g(const FusedParams &p, void *stream) {
  auto k = lowbit_fused_kernel<R, G, DIAG, OPT>;
  constexpr bool WIDE = (OPT & FUSED_OPT_WIDE) != 0;
  constexpr int smem = fused::smem_bytes(R::BITS, WIDE);
  static bool attr = false;  // per instantiation (one device per process)
  if (!attr) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    attr = true;
  }
  FusedParams q = p;
  q.magic = R::MAGIC;
  constexpr int bm = WIDE ? fused::WBM : fused::BM;
  const int blocks = p.nblocks * (WIDE ? 2 : 1) * ((p.M + bm - 1) / bm);
  k<<<blocks, THREADS, smem, static_cast<cudaStream_t>(stream)>>>(q);
  return (int)cudaGetLastError();
}

// FusedParams::build = G | DIAG << 4 | OPT << 8; 0: the default, G = FUSED_G with OPT = FUSED_OPT (G = 1 with the
// stage's words hoisted into registers; within ~5% of G = 1 without, either way: native/NOTES.md section 21).
// Built: the full extension the default only; the tuning extension (LOWBIT_FUSED_BOTH_G) G = 1 and 2, the
// diagnostic builds of G = 1, G = 1 with OPT = FUSED_OPT_HOIST, and (even widths) G = 1 with OPT = FUSED_OPT_WIDE
// and its diagnostic builds.  Else -1.
#ifndef LOWBIT_FUSED_G
#define LOWBIT_FUSED_G 1
#endif
#ifndef LOWBIT_FUSED_OPT
#define LOWBIT_FUSED_OPT 1
#endif
constexpr int FUSED_G = LOWBIT_FUSED_G, FUSED_OPT = LOWBIT_FUSED_OPT;
static_assert((FUSED_OPT & FUSED_OPT_WIDE) == 0, "the default build serves every width; the wide one even widths");
template <class R>
int fused_launch(const FusedParams &p, void *stream) {
  const int b = p.build ? p.build : FUSED_G | FUSED_OPT << 8;
#ifdef LOWBIT_FUSED_BOTH_G
  if (b == 1) return fused_launch_g<R, 1>(p, stream);
  if (b == 2) return fused_launch_g<R, 2>(p, stream);
  if (b == (1 | FUSED_DIAG_NODEQ << 4)) return fused_launch_g<R, 1, FUSED_DIAG_NODEQ>(p, stream);
  if (b == (1 | FUSED_DIAG_NOLOAD << 4)) return fused_launch_g<R, 1, FUSED_DIAG_NOLOAD>(p, stream);
  if (b == (1 | (FUSED_DIAG_NODEQ | FUSED_DIAG_NOLOAD) << 4))
    return fused_launch_g<R, 1, FUSED_DIAG_NODEQ | FUSED_DIAG_NOLOAD>(p, stream);
  if (b == (1 | FUSED_OPT_HOIST << 8)) return fused_launch_g<R, 1, 0, FUSED_OPT_HOIST>(p, stream);
  if constexpr (R::BITS % 2 == 0) {  // the wide build and its diagnostic builds: even widths
    constexpr int W = FUSED_OPT_WIDE;
    if (b == (1 | W << 8)) return fused_launch_g<R, 1, 0, W>(p, stream);
    if (b == (1 | FUSED_DIAG_NODEQ << 4 | W << 8)) return fused_launch_g<R, 1, FUSED_DIAG_NODEQ, W>(p, stream);
    if (b == (1 | FUSED_DIAG_NOLOAD << 4 | W << 8)) return fused_launch_g<R, 1, FUSED_DIAG_NOLOAD, W>(p, stream);
    if (b == (1 | (FUSED_DIAG_NODEQ | FUSED_DIAG_NOLOAD) << 4 | W << 8))
      return fused_launch_g<R, 1, FUSED_DIAG_NODEQ | FUSED_DIAG_NOLOAD, W>(p, stream);
  }
  return -1;
#else
  return b == (FUSED_G | FUSED_OPT << 8) ? fused_launch_g<R, FUSED_G, 0, FUSED_OPT>(p, stream) : -1;
#endif
}

}  // namespace lowbit

#define LOWBIT_FUSED_DEFINE(R) \
  int lowbit_fused_##R(const lowbit::FusedParams &p, void *s) { return lowbit::fused_launch<lowbit::R>(p, s); }
