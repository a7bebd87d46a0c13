// wgdec_budget.cu -- the steady loop of a decode kernel (M <= 16) on wgmma, compiled only so that its SASS can be counted
// (python -m native.wg_budget; native/NOTES.md section 40).  Not a kernel that is launched or checked: no output code,
// no stream-K piece ends, placeholder addressing of the scales.  What it settles is the instruction count per weight
// of the design below, against the mma.sync decode loops that native.sass counts.
//
// The design: y^T = W^T x^T as the fused prefill kernel (lowbit_fused.cuh) computes it, at a token tile of 16.  Per
// 32-k chunk a warpgroup issues 2 n16 tiles x 2 k16 blocks of wgmma.m64n16k16 with A = the weights dequantized in
// registers by the recipe's deq_off() (the codes plus a power of two per k half, no per-weight scale) and B = x^T of
// the 16 tokens from the ring slot (the fused kernel's 128-byte-swizzled image of x, 16 rows).  A stage is the
// layout's KSTEP (256 k for 1-2 bits, else 128), copied by the TMA unit as in the fused kernel.  The groups' scale,
// zero point and offsets are applied in f32 once a group's wgmma have retired; MODE says how:
//   PERCH  one group per channel: nothing in the loop (the end applies s and the zero point once);
//   FOLD   128-k groups, the whole fold in the loop: total += s * (acc - (O + z * S)), S = sum of x and O = sum of
//          offset(k) x of the token over the group, carried beside the x image in the slot;
//   SCALE  128-k groups, only total += s * acc in the loop: the zero-point and offset terms, sum over groups of
//          s (O + z S), are a product of [N x groups] and [groups x M] that a final small mma can do.
// DRAIN: a group's last chunk waits for all of its wgmma (wait<0>) and folds at once, with one accumulator set.
// Without it the accumulators alternate between two sets and a group is folded after the next group's first
// chunk (wait<1>), which ptxas serializes (C7514: non-wgmma instructions reading accumulator registers of a wgmma
// in flight), so native.wg_budget counts both.
#include <cstdint>
#include "lowbit_fused.cuh"
#include "lowbit_recipes.cuh"

namespace lowbit {
namespace wgb {

// D[64 x 16] (f32, this thread's 8 values) (+)= A[64 x 16] (registers, 4 x f16x2) * B[16 x 16] (shared memory);
// acc_in = 0: D = A B (the first wgmma of a group)
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], const uint32_t *a, uint64_t desc, int acc_in) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc_in));
}

enum { PERCH = 0, FOLD = 1, SCALE = 2 };
constexpr int TOK = 16, GK = 128;  // tokens of the tile; k per group (FOLD, SCALE)
// a ring slot: the block's words of one stage, the x image (TOK rows), (S, O) of the TOK tokens per group
template <class R>
__host__ __device__ constexpr int xbytes() { return TOK * R::KSTEP * 2; }
template <class R>
__host__ __device__ constexpr int sobytes() { return TOK * 2 * 4 * (R::KSTEP / GK); }
template <class R>
__host__ __device__ constexpr int wbytes() { return THREADS * R::BITS * (R::KSTEP / 8); }
template <class R>
__host__ __device__ constexpr int slot_bytes() { return wbytes<R>() + xbytes<R>() + sobytes<R>(); }

template <class R, int MODE, bool DRAIN>
__global__ void __launch_bounds__(THREADS, 2)
wgdec_budget_kernel(const uint8_t *wq, const uint8_t *xp, const uint32_t *sc, float *out, int fiters) {
  static_assert(R::OFFS && !R::BF16, "the f16 OFFSET recipes (deq_off)");
  constexpr int BITS = R::BITS, S = 4, SB = slot_bytes<R>(), CH = R::KSTEP / KG, GCH = GK / KG;
  constexpr int WOFF = wbytes<R>(), XB = xbytes<R>(), SOB = sobytes<R>();
  constexpr uint32_t WB = wbytes<R>() / WARPS, XS = (XB + SOB) / WARPS;  // a warp's copies per stage
  extern __shared__ uint8_t smem_raw[];
  const uint32_t ring = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  __shared__ __align__(8) uint64_t full[S];
  const uint32_t full0 = smem_u32(full);
  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(full0 + 8 * s, THREADS + WARPS);
    fence_mbar_init();
  }
  __syncthreads();
  auto load = [&](int fs, uint32_t base, uint32_t bar) {  // lane 0 of each warp: its words and an eighth of x
    if (lane != 0) return;
    mbar_expect_tx(bar, WB + XS);
    bulk_g2s(base + warp * WB, wq + ((size_t)fs * WARPS + warp) * WB, WB, bar);
    bulk_g2s(base + WOFF + warp * XS, xp + (size_t)fs * (XB + SOB) + warp * XS, XS, bar);
  };
  auto arrive = [&](uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); };
  const uint32_t *scp = sc + (size_t)blockIdx.x * fiters * WARPS * 8 + warp * 8 + g;

  float acc[2][2][8], total[2][8];  // [set][tile][value]; value 4 j + q: channel g + 8 (q >> 1), token 8 j + 2 t + (q & 1)
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) total[i][e] = 0.f, acc[0][i][e] = acc[1][i][e] = 0.f;
  for (int s = 0; s < S - 2; ++s) load(s, ring + s * SB, full0 + 8 * s);
  arrive(full0);
  uint32_t sz[2] = {0, 0};  // (s, z) f16 pairs of this thread's channels g, g + 8 of tile i, for the group to fold
  float4 so[2];             // (S, O) of tokens 2t, 2t + 1 and 8 + 2t, 9 + 2t of the group to fold
  auto fetch = [&](int fs, int grp, uint32_t base) {  // the group's scales and zero points, and its (S, O)
    const size_t q = ((size_t)fs * (CH / GCH) + grp) * WARPS * 8;
    sz[0] = __ldg(scp + q), sz[1] = __ldg(scp + q + 4);
    if constexpr (MODE == FOLD) {
      const float4 *p = reinterpret_cast<const float4 *>(__cvta_shared_to_generic(base + WOFF + XB + grp * TOK * 8));
      so[0] = p[t], so[1] = p[4 + t];
    }
  };
  auto fold = [&](float (&a)[2][8]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int q = e & 3, j = e >> 2;
        const uint32_t v = sz[i] >> (16 * (q >> 1));
        const float s = lo_f32<false>(v), z = hi_f32<false>(v);
        const float Sx = (q & 1) ? so[j].z : so[j].x, Ox = (q & 1) ? so[j].w : so[j].y;
        if constexpr (MODE == SCALE) total[i][e] = fmaf(s, a[i][e], total[i][e]);
        else total[i][e] = fmaf(s, a[i][e] - fmaf(z, Sx, Ox), total[i][e]);
      }
  };
  uint32_t parity = 0;
  int slot = 0, lslot = S - 2;
  for (int fs = 0; fs < fiters; fs += 2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // stage fs + h
      mbar_wait(full0 + 8 * slot, parity);
      asm volatile("" ::: "memory");
      if (fs + h + S - 2 < fiters) load(fs + h + S - 2, ring + lslot * SB, full0 + 8 * lslot);
      const uint32_t base = ring + slot * SB;
      const uint64_t d0 = fused::sw128_desc(base + WOFF);  // + a k16 block's offset in 16-byte units below
      const int nslot = slot + 1 == S ? 0 : slot + 1;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const int set = MODE == PERCH || DRAIN ? 0 : ((h * CH + c) / GCH) & 1;  // the chunk's group's accumulators
        uint32_t w[BITS], ab[16];
#pragma unroll
        for (int j = 0; j < BITS; ++j) {
          const int i = c * BITS + j;
          asm volatile("ld.shared.u32 %0, [%1];"
                       : "=r"(w[j])
                       : "r"(base + warp * WB + lane * 16 + (i >> 2) * 512 + (i & 3) * 4));
        }
        R::deq_off(w, ab, R::MAGIC);
        uint64_t desc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int kk = 2 * c + r;  // sub-tile kk / 4 of 64 k (TOK rows of 128 bytes), 32 bytes per k16 block in it
          desc[r] = d0 + (uint64_t)(((kk >> 2) * (TOK * 128) + (kk & 3) * 32) >> 4);
        }
        fused::wgmma_fence();
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            wgmma_m64n16k16(acc[set][i], &ab[8 * r + 4 * i], desc[r], MODE == PERCH || c % GCH > 0 || r > 0);
        fused::wgmma_commit();
        if (MODE != PERCH && DRAIN && c % GCH == GCH - 1) {  // the group's last chunk: drain, fold at once
          fused::wgmma_wait<0>();
          fetch(fs + h, c / GCH, base);
          fold(acc[0]);
        } else {
          fused::wgmma_wait<1>();
          if (MODE != PERCH && !DRAIN && c % GCH == 0) {  // the previous group has retired: fold it
            fold(acc[set ^ 1]);
            fetch(fs + h, c / GCH, base);
          }
        }
        if (c == 1 && fs + h + 1 < fiters) arrive(full0 + 8 * nslot);
      }
      slot = nslot;
      lslot = lslot + 1 == S ? 0 : lslot + 1;
      parity ^= slot == 0;
    }
  }
  fused::wgmma_wait<0>();
  if constexpr (MODE == PERCH) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) total[i][e] = acc[0][i][e];
  } else if constexpr (!DRAIN) {
    fold(acc[1]);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) out[((size_t)blockIdx.x * THREADS + tid) * 16 + i * 8 + e] = total[i][e];
}

}  // namespace wgb
}  // namespace lowbit

#define WGB_ONE(R, M, D)                                                                                          \
  template __global__ void lowbit::wgb::wgdec_budget_kernel<lowbit::R, lowbit::wgb::M, D>(                        \
      const uint8_t *, const uint8_t *, const uint32_t *, float *, int);
#define WGB(R) \
  WGB_ONE(R, PERCH, false) WGB_ONE(R, FOLD, false) WGB_ONE(R, FOLD, true) WGB_ONE(R, SCALE, false) WGB_ONE(R, SCALE, true)
WGB(rec_f16_u1)
WGB(rec_f16_u2)
WGB(rec_f16_u4)
