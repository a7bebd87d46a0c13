// lowbit_kernel.cuh -- the native weight-only low-bit matmul y[M, N] = x[M, K] @ dequant(W)[K, N].
//
// Decode kernel (M <= 16, or 2M <= 32 with x split): y^T = W^T x^T on m16n8k16 tensor cores with f32
// accumulation.  A = the dequantized weight tile, built in registers straight from the packed words
// (native/lowbit_layout.py: each thread's words are exactly its A fragments; recipes in
// lowbit_recipes.cuh); B = x^T from shared memory (one 16-byte load per m-row covers two k-blocks).
// The codes reach the tensor cores as exact integers / exact float values (OFFSET recipes: plus a power of two
// per k half, taken out with the zero point, below); the group scale (and the
// zero point: y -= s*z*sum(x), sum(x) from one more mma against a tile of ones) is applied in f32
// when a group ends, so the only rounding is the f32 accumulation and the final cast.
//
// Work: a block = 8 warps x 2 n16 tiles = 256 output channels ("n-block") and one KSTEP-deep stage per
// iteration.  The (n-block, iteration) space is cut into gridDim.x equal contiguous ranges
// (stream-K): a block walks its range; a range piece that covers a whole n-block stores y directly,
// otherwise it adds into an f32 workspace with atomics and the block that completes the n-block's
// count converts it to y and re-zeroes the workspace and the counter (both persist zeroed between
// launches).  Loads: a ring of STAGES shared-memory stages filled by cp.async (weights per warp,
// scales per warp, x per block), one __syncthreads per stage.
#pragma once
#include <cstdint>
#include "instrument.cuh"
#include "lowbit_common.cuh"
#include "lowbit_params.h"

namespace lowbit {

// instrumentation scopes (native/lowbit.py SCOPES): 4 records per stage, 2 per range end
enum { S_WAIT = 0, S_COMPUTE = 1, S_OUTPUT = 2 };

__host__ __device__ constexpr int scale_bytes(bool zero) { return zero ? 128 : 64; }

// a zero point plus the recipe's BIAS (deq() left the magic number in); no instruction where BIAS is 0 (z + 0.f
// is not z for z = -0.f, so the compiler would keep the add)
template <class R>
__device__ __forceinline__ float with_bias(float z) {
  if constexpr (R::BIAS != 0.f) return z + R::BIAS;
  else return z;
}

// OFFSET recipes (R::OFFS, native/lowbit_layout.py _pack_offset; native/NOTES.md section 29): the decode kernels run
// deq_off(), which leaves a power of two in each pair (2^(10 - P) + code, one offset for the pairs of k half jk = 0,
// one for jk = 1), and take it out in the group fold: the mma that sums x for the zero point gets the offsets in its
// A rows 8-15 ({one, OFFA0, one, OFFA1}, the same tile for both k-blocks), so its D rows 8-15 hold sum_k offset(k)
// x[m][k] beside rows 0-7's sum(x), and the fold subtracts s * that from s * acc.  -DLOWBIT_OFFS=0 builds deq()
// (the offset taken out per pair by an fma, as every other recipe does) for an A/B on the same packed weights.
#ifndef LOWBIT_OFFS
#define LOWBIT_OFFS 1
#endif
template <class R>
__host__ __device__ constexpr bool use_offs() {
  if constexpr (R::OFFS) return LOWBIT_OFFS != 0;
  else return false;
}
// the sum-of-x mma's A register for rows 8-15 of k half jk (OFFSET recipes; else the tile of ones' `one`)
template <class R>
__device__ __forceinline__ uint32_t offa(int jk, uint32_t one) {
  if constexpr (use_offs<R>()) return jk == 0 ? R::OFFA0 : R::OFFA1;
  else return one;
}
// sum(offset x) of accumulator column c in the fold (D rows 8-15 of the sum's mma), 0 where there are no offsets
template <bool OFF>
__device__ __forceinline__ float xo(const float (&xs)[4], int c) {
  if constexpr (OFF) return xs[2 + c];
  else return 0.f;
}

// LOWBIT_XT (default 1 since the twenty-sixth session; =0 builds the earlier loop for an A/B; native/NOTES.md sections
// 38-39): at two tiles, the sum of x for the zero point and the offsets
// from one mma per tile and 32-k chunk instead of two: A = the tile's x fragments as loaded (bx[mt][0..3], a register
// quad: A row g holds x row g's k with (k >> 1) & 1 == 0 -- the k of the offsets' half jk = 0 -- and row g + 8 the
// others), B = ones, so D (any column) holds per x row its two half sums S0, S1 over the group's chunks; the fold forms
// sum(x) = S0 + S1 and sum(offset x) = OFF0 S0 + OFF1 S1 in the lanes of row g and gathers each lane's rows 2t, 2t + 1
// with 4 shuffles per tile.
#ifndef LOWBIT_XT
#define LOWBIT_XT 1
#endif
// LOWBIT_XT's pieces, shared by both decode kernels: the offsets as f32 (0 without OFF) ...
template <class R, bool WB, bool OFF>
__device__ __forceinline__ float2 xt_offsets() {
  if constexpr (OFF) return make_float2(lo_f32<WB>(R::OFFA0), lo_f32<WB>(R::OFFA1));
  else return make_float2(0.f, 0.f);
}
// ... and the fold's gather: lane (g, t)'s x rows 2t, 2t + 1 of each tile into xs (sum(x), sum(offset x) of each) from
// the half sums xt of lanes 8t and 8t + 4 (rows g = 2t, 2t + 1); xt re-zeroed for the next group
template <bool OFF, int MT>
__device__ __forceinline__ void xt_gather(float (&xs)[MT][4], float (&xt)[MT][4], float2 off, int t) {
  const int r0 = 8 * t, r1 = 8 * t + 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float sx = xt[mt][0] + xt[mt][2];
    xs[mt][0] = __shfl_sync(0xffffffffu, sx, r0);
    xs[mt][1] = __shfl_sync(0xffffffffu, sx, r1);
    if constexpr (OFF) {
      const float so = fmaf(off.x, xt[mt][0], off.y * xt[mt][2]);
      xs[mt][2] = __shfl_sync(0xffffffffu, so, r0);
      xs[mt][3] = __shfl_sync(0xffffffffu, so, r1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) xt[mt][e] = 0.f;
  }
}

// Decode-kernel variants (GemvParams::variant; native/tune.py times them side by side):
//   0 "base": the kernel measured on the H200 (1 Dec 2026): x staged with MX rows, B-fragment loads
//     guarded per row, the loader's addresses recomputed per stage.
//   1 "lean": the same pipeline and layout with the per-stage overhead cut: x staged with all MT*8
//     rows (rows >= MX zero-filled by cp.async, no global reads) so that B fragments are unconditional
//     loads at immediate offsets; every per-thread copy address (weights, scales, x) computed once and
//     advanced by constants; the shared-memory base and loader state pinned in registers.
//   2 "lean3": variant 1 at 3 blocks (24 warps) per SM: one stage fewer in the ring, <= 80 registers.
//   3 "bulk": variant 1 with a stage's weights (one contiguous run of WARPS*32*VEC*16 bytes in the packed
//     layout, the same order as the ring slot) moved by one bulk copy (TMA unit) from thread 0, completed on
//     an mbarrier per ring slot, instead of VEC 16-byte cp.async per thread (ncu on the H200: those are
//     counted as 2x the ideal L2 sectors with a 51% L2 hit rate, L2 73-85% busy at 62-75% of DRAM, and
//     ~4 loader instructions per warp per vector).  Scales and x stay on cp.async.
constexpr int NVARIANTS = 4;
__host__ __device__ constexpr int variant_blocks(int v) { return v == 2 ? 3 : 2; }
__host__ __device__ constexpr int variant_stages(int bits, int v) { return stages_for(bits) - (v == 2 ? 1 : 0); }
// x rows a stage holds: MX (variant 0) or all rows of the MT tiles
__host__ __device__ constexpr int staged_rows(int MX, int MT, int v) { return v == 0 ? MX : MT * 8; }

__host__ inline int gemv_stage_bytes(int bits, bool zero, int MX, int slots) {
  const int ks = kstep_for(bits);
  return WARPS * 32 * (ks / KG) * bits * 4 + WARPS * slots * scale_bytes(zero) + MX * xrow_bytes(ks);
}

// MX: staged x rows (staged_rows)
__host__ inline int gemv_smem_bytes(int bits, bool zero, int MX, int slots, int iters, int variant = 0) {
  return ((iters * 4 + 15) / 16) * 16 + variant_stages(bits, variant) * gemv_stage_bytes(bits, zero, MX, slots);
}

// R: recipe; MT: m16n8 tiles (8 rows each); OB: output / scale dtype is bf16; XS: x split (rows m and
// m + M of x are the bf16 hi / lo parts of f16 activation row m); PROF: in-kernel instrumentation;
// V: variant (above)
// 0: the base / lean / lean3 / bulk decode launches read their stage's group ends from the stage table at run time (FC = 0,
// the A/B build of native/NOTES.md section 28); 1: f16-out launches without x split whose layout puts them in the same
// chunks of every stage run the build that knows them (decode_fc)
#ifndef LOWBIT_GEMV_FC
#define LOWBIT_GEMV_FC 1
#endif

// The stage's group ends, known at compile time where the layout makes them the same in every stage (decode_fc): FC = 0
// reads them from the stage table at run time (fmask bit kg: a group ends with chunk kg); FC < CHUNKS: a group ends
// with every FC-th chunk of every stage (groups of 32 FC k dividing the stage, K a multiple of the stage); FC = CHUNKS:
// a group can end only with a stage's last chunk (groups a multiple of the stage, or one per channel), read from the table
template <int FC, int CHUNKS>
__device__ __forceinline__ bool group_ends(int kg, uint32_t fmask) {
  if constexpr (FC == 0) return (fmask >> kg) & 1;
  else if constexpr (FC < CHUNKS) return (kg + 1) % FC == 0;
  else return kg == CHUNKS - 1 && ((fmask >> kg) & 1);
}
// the FC a decode launch can use (the instantiations built: 0, 4 and the stage's chunks; native/NOTES.md section 27):
// K whole stages and groups of `group` k (K for one group per channel) that are a multiple of the stage, or 128-k
// groups (in 256-k stages); 0 otherwise
__host__ __device__ constexpr int decode_fc(int kstep, int K, int iters, int group) {
  return iters * kstep != K || group <= 0 || K % group ? 0
         : group % kstep == 0                          ? kstep / KG
         : kstep % group == 0 && group == 4 * KG       ? 4
                                                       : 0;
}

template <class R, int MT, bool OB, bool XS, bool PROF, int V = 0, int PM = INSTR_MODE_STAGED, int FC = 0>
__global__ void __launch_bounds__(THREADS, variant_blocks(V)) lowbit_gemv_kernel(const __grid_constant__ GemvParams p) {
  constexpr int BITS = R::BITS, KSTEP = R::KSTEP, CHUNKS = KSTEP / KG, S = variant_stages(BITS, V);
  static_assert(FC == 0 || (FC <= CHUNKS && CHUNKS % (FC ? FC : 1) == 0), "group ends: run time, or every FC-th chunk");
  auto gend = [](int kg, uint32_t fm) { return group_ends<FC, CHUNKS>(kg, fm); };
  constexpr int VEC = CHUNKS * BITS / 4;            // 16-byte vectors of words per lane per stage
  constexpr int XROW = xrow_bytes(KSTEP), XCH = KSTEP / 8;  // x: bytes per staged row, 16-byte chunks per row
  constexpr int XPT = (MT * 8 * XCH + THREADS - 1) / THREADS;  // x chunks a thread may copy
  constexpr bool WB = R::BF16;
  constexpr bool OFF = use_offs<R>();  // deq_off(), the offsets out in the fold (above)
  constexpr int SB = scale_bytes(R::ZERO);
  constexpr int SCP = (8 * SB / 16 + 31) / 32;  // scale chunks a lane may copy (<= 8 groups per stage)
  static_assert(KSTEP == kstep_for(BITS) && (CHUNKS * BITS) % 4 == 0, "layout");
  extern __shared__ __align__(16) uint8_t smem[];

  instr::FlatProfiler<PROF, PM> prof;
  prof.begin(p.prof, p.prof_cap);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wbytes = WARPS * 32 * VEC * 16;
  const int sbytes = WARPS * p.slots * SB;
  const int stage_bytes = wbytes + sbytes + staged_rows(p.MX, MT, V) * XROW;
  const int ring_bytes = S * stage_bytes;
  const int tab_bytes = ((p.iters * 4 + 15) / 16) * 16;
  uint32_t *tab_sm = reinterpret_cast<uint32_t *>(smem);
  uint8_t *stages = smem + tab_bytes;
  __shared__ int last_flag;

  for (int i = tid; i < p.iters; i += THREADS) tab_sm[i] = p.stab[i];

  // this block's contiguous range of the flattened (n-block, iteration) space
  const int T = p.nblocks * p.iters;
  const int per = T / gridDim.x, rem = T % gridDim.x, b = blockIdx.x;
  const int f_begin = b * per + min(b, rem);
  const int f_end = f_begin + per + (b < rem ? 1 : 0);
  constexpr bool BULK = V == 3;
  __shared__ __align__(8) uint64_t wbar[BULK ? S : 1];  // variant 3: one mbarrier per ring slot
  const uint32_t bar0 = smem_u32(wbar);
  if constexpr (BULK) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < S; ++s) mbar_init(bar0 + 8 * s, 1);
      fence_mbar_init();
    }
  }
  __syncthreads();  // the stage table is read by the loader below (and the barriers are initialised)

  // Loader state (the next stage to copy), advanced incrementally: the weight stream is linear in
  // the flat index f; scales move with the n-block (and the stage's first group); x with the iteration.
  constexpr int WSTRIDE = WARPS * 32 * VEC;  // uint4 per flat stage
  const uint32_t st0 = smem_u32(stages);
  const size_t s_nb = (size_t)WARPS * p.ngroups * (SB / 16);
  int lnb = f_begin / p.iters, lit = f_begin - lnb * p.iters;
  const uint4 *lw = static_cast<const uint4 *>(p.wq) + (size_t)f_begin * WSTRIDE + warp * (32 * VEC) + lane;
  const uint4 *ls = static_cast<const uint4 *>(p.sc) + (size_t)lnb * s_nb + (size_t)warp * p.ngroups * (SB / 16);
  const uint16_t *xbase = reinterpret_cast<const uint16_t *>(p.x);
  int lk = lit * KSTEP;  // first k of the next stage
  uint32_t lso = 0;      // ring offset of the next stage
  const uint4 *lwb = static_cast<const uint4 *>(p.wq) + (size_t)f_begin * WSTRIDE;  // variant 3: the stage's words
  int lslot = 0;         // ring slot of the next stage (variant 3: its mbarrier)
  // variant >= 1: per-thread copy addresses computed once (x chunks of this thread: row, 16-byte column)
  constexpr int XPTV = (MT * 8 * XCH + THREADS - 1) / THREADS;
  const uint16_t *xsrc[XPTV];
  uint32_t xdst[XPTV];
  int xcol[XPTV];
  bool xrow[XPTV], xhas[XPTV];
  const uint32_t wdst = warp * (32 * VEC * 16) + lane * 16;   // ring-relative weight destination of this lane
  const uint32_t sdst = wbytes + warp * p.slots * SB + lane * 16;
  if constexpr (V != 0) {
#pragma unroll
    for (int j = 0; j < XPTV; ++j) {
      const int q = tid + j * THREADS, m = q / XCH, c = q % XCH;
      xhas[j] = m < MT * 8;
      xrow[j] = m < p.MX;
      xcol[j] = c * 8;
      xsrc[j] = xbase + (size_t)(xrow[j] ? m : 0) * p.K + c * 8;
      xdst[j] = wbytes + sbytes + m * XROW + c * 16;
    }
  }
  auto advance = [&]() {  // the loader's position: next stage of words, K, ring slot and scale table entry
    lw += WSTRIDE;
    lk += KSTEP;
    lso = (lso + stage_bytes == (uint32_t)ring_bytes) ? 0u : lso + stage_bytes;
    if constexpr (BULK) {
      lwb += WSTRIDE;
      lslot = lslot + 1 == S ? 0 : lslot + 1;
    }
    if (++lit == p.iters) {
      lit = 0;
      lk = 0;
      ls += s_nb;
    }
  };
  auto issue_lean = [&]() {
    const uint32_t base = st0 + lso;
    if constexpr (BULK) {
      if (tid == 0) {  // every warp finished reading this slot before the barrier this iteration passed
        fence_proxy_async();
        mbar_expect_tx(bar0 + 8 * lslot, WSTRIDE * 16);
        bulk_g2s(base, lwb, WSTRIDE * 16, bar0 + 8 * lslot);
      }
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) cp_async16(base + wdst + v * 512, lw + v * 32, 16);
    }
    const uint32_t tab = tab_sm[lit];
    const int nsc = ((tab >> 16) & 0xF) * (SB / 16);
    const uint4 *ss = ls + (tab & 0xFFFF) * (SB / 16) + lane;
#pragma unroll
    for (int j = 0; j < SCP; ++j)
      if (lane + 32 * j < nsc) cp_async16(base + sdst + j * 512, ss + 32 * j, 16);
#pragma unroll
    for (int j = 0; j < XPTV; ++j) {
      if (xhas[j]) {
        const bool in = xrow[j] && lk + xcol[j] < p.K;  // K % 8 == 0: a chunk is all inside or all outside
        cp_async16(base + xdst[j], in ? xsrc[j] + lk : xbase, in ? 16u : 0u);
      }
    }
    advance();
  };
  auto issue_base = [&]() {
    const uint32_t wd = st0 + lso + warp * (32 * VEC * 16) + lane * 16;
#pragma unroll
    for (int v = 0; v < VEC; ++v) cp_async16(wd + v * 512, lw + v * 32, 16);
    const uint32_t tab = tab_sm[lit];
    const int nsc = ((tab >> 16) & 0xF) * (SB / 16);
    const uint4 *ss = ls + (tab & 0xFFFF) * (SB / 16);
    const uint32_t sd = st0 + lso + wbytes + warp * p.slots * SB;
#pragma unroll
    for (int j = 0; j < SCP; ++j)
      if (lane + 32 * j < nsc) cp_async16(sd + (lane + 32 * j) * 16, ss + lane + 32 * j, 16);
    const uint32_t xd = st0 + lso + wbytes + sbytes;
#pragma unroll
    for (int j = 0; j < XPT; ++j) {
      const int q = tid + j * THREADS, m = q / XCH, c = q % XCH, k = lk + c * 8;
      if (m < p.MX) {
        const bool in = k < p.K;  // K % 8 == 0: a 16-byte chunk is all inside or all outside
        cp_async16(xd + m * XROW + c * 16, xbase + (size_t)m * p.K + (in ? k : 0), in ? 16u : 0u);
      }
    }
    advance();
  };
  auto issue = [&]() {
    if constexpr (V != 0) issue_lean();
    else issue_base();
  };

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (f_begin + s < f_end) issue();
    cp_async_commit();
  }

  float total[NT][MT][4], acc[NT][MT][4], xs[MT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[nt][mt][e] = acc[nt][mt][e] = 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) xs[mt][e] = 0.f;

  constexpr bool TX = LOWBIT_XT != 0 && MT == 2 && (R::ZERO || OFF);   // LOWBIT_XT (above)
  float xt[MT][4] = {};   // TX: the half sums' accumulators
  const float2 xoff = xt_offsets<R, WB, TX && OFF>();

  // group flush: total += s * acc (- s * z * sum(x)), scales of staged group slot `sp`
  auto flush = [&](const uint8_t *sp) {
    if constexpr (TX) xt_gather<OFF>(xs, xt, xoff, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s0, s1, z0 = 0.f, z1 = 0.f;
      if constexpr (R::ZERO) {
        const uint2 v = *reinterpret_cast<const uint2 *>(sp + (nt * 8 + g) * 8);
        // R::BIAS: deq() left the magic number in (lowbit_layout.Recipe.bias); it goes with the zero point
        s0 = lo_f32<OB>(v.x), s1 = hi_f32<OB>(v.x), z0 = with_bias<R>(lo_f32<OB>(v.y)), z1 = with_bias<R>(hi_f32<OB>(v.y));
      } else {
        const uint32_t v = *reinterpret_cast<const uint32_t *>(sp + (nt * 8 + g) * 4);
        s0 = lo_f32<OB>(v), s1 = hi_f32<OB>(v);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float *tt = total[nt][mt], *aa = acc[nt][mt];
        // OFF: acc - sum(offset x) (xo); x - 0.f is x, so the other recipes compile as before
        if constexpr (R::ZERO) {
          const float sz0 = s0 * z0, sz1 = s1 * z1;
          tt[0] = fmaf(s0, aa[0] - xo<OFF>(xs[mt], 0), fmaf(-sz0, xs[mt][0], tt[0]));
          tt[1] = fmaf(s0, aa[1] - xo<OFF>(xs[mt], 1), fmaf(-sz0, xs[mt][1], tt[1]));
          tt[2] = fmaf(s1, aa[2] - xo<OFF>(xs[mt], 0), fmaf(-sz1, xs[mt][0], tt[2]));
          tt[3] = fmaf(s1, aa[3] - xo<OFF>(xs[mt], 1), fmaf(-sz1, xs[mt][1], tt[3]));
        } else {
          tt[0] = fmaf(s0, aa[0] - xo<OFF>(xs[mt], 0), tt[0]);
          tt[1] = fmaf(s0, aa[1] - xo<OFF>(xs[mt], 1), tt[1]);
          tt[2] = fmaf(s1, aa[2] - xo<OFF>(xs[mt], 0), tt[2]);
          tt[3] = fmaf(s1, aa[3] - xo<OFF>(xs[mt], 1), tt[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) aa[e] = 0.f;
      }
    }
    if constexpr (R::ZERO || OFF) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) xs[mt][e] = 0.f;
    }
  };

  uint32_t one = WB ? 0x3F803F80u : 0x3C003C00u;  // A tile of ones: sum(x) per group for the zero point
  uint32_t magic = p.magic;  // R::MAGIC through a register, so that mask | magic is one LOP3
  pin(one);
  pin(magic);
  uint32_t oa[2];  // rows 8-15 of the sum's A tile: the offsets (OFF) or ones
#pragma unroll
  for (int jk = 0; jk < 2; ++jk) {
    oa[jk] = offa<R>(jk, one);
    if constexpr (OFF) pin(oa[jk]);
  }
  uint16_t *yo = reinterpret_cast<uint16_t *>(p.y);
  auto convert = [&](int cnb) {  // every piece of n-block cnb has landed in y32: convert it to y, re-zero
    for (int q = tid; q < p.M * BN; q += THREADS) {
      const int m = q / BN, n = cnb * BN + (q % BN);
      if (n < p.N) {
        float *src = p.y32 + (size_t)m * p.Npad + n;
        yo[(size_t)m * p.N + n] = f32_to_act<OB>(__ldcg(src));
        *src = 0.f;
      }
    }
    if (tid == 0) p.counters[cnb] = 0;
  };
  // DEFER (bulk, 4-bit codes): a partial piece's count is added at the block's end (or when MAXP are pending)
  // instead of right after its atomics.  Measured on the H200 (native/NOTES.md section 13): 5-15% faster for
  // u4 / i4 bulk at 11 of 12 points, but 2-20% slower for base, lean and 8-bit bulk, so only there.
  constexpr bool DEFER = BULK && BITS == 4;
  constexpr int MAXP = DEFER ? 8 : 1;
  __shared__ int2 pieces[MAXP];   // (n-block, stages) of each pending piece (thread 0 writes, all read)
  __shared__ uint32_t last_mask;  // bit i: pending piece i completed its n-block
  int npieces = 0;                // block-uniform
  auto publish = [&]() {
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      uint32_t m = 0;
      for (int i = 0; i < npieces; ++i)
        if (atomicAdd(p.counters + pieces[i].x, pieces[i].y) + pieces[i].y == p.iters) m |= 1u << i;
      last_mask = m;
    }
    __syncthreads();
    const uint32_t m = last_mask;
    if (m) {
      __threadfence();
      for (int i = 0; i < npieces; ++i)
        if ((m >> i) & 1) convert(pieces[i].x);
    }
    npieces = 0;  // (thread 0 rewrites pieces[] only after the loop's next barrier)
  };
  int nb = f_begin / p.iters, it = f_begin - nb * p.iters, seg_start = it;
  int cso = 0;  // ring offset of the stage being computed
  int cslot = 0;
  uint32_t cphase = 0;  // variant 3: the slot's mbarrier phase this use waits for
  // two records per stage in the steady loop: wait -> compute, and compute -> the next stage's wait (or -> output,
  // which ends in -> wait, or in output's exit at the range's end).  Every block has a stage (the launcher's grid is
  // at most the stages), so the first enter needs no test.  (Both records of a stage keep their batch test: the
  // output stages' third record changes the count's parity, so the compiler cannot fold either.)
  prof.enter(S_WAIT);
  for (int f = f_begin; f < f_end; ++f) {
    cp_async_wait<S - 2>();
    if constexpr (BULK) {
      mbar_wait(bar0 + 8 * cslot, cphase);
      if (++cslot == S) {
        cslot = 0;
        cphase ^= 1u;
      }
    }
    __syncthreads();
    prof.next(S_WAIT, S_COMPUTE);  // issue the copies of stage f + S - 1, then dequantize + mma stage f
    pin(lw);
    pin(ls);
    if constexpr (V != 0) {
      uint32_t st0p = st0;  // keep the shared-memory base (and the loader state) in registers
      pin(st0p);
      pin(lso);
      pin(lk);
    }
    if (f + S - 1 < f_end) issue();
    cp_async_commit();

    const uint8_t *st = stages + cso;
#ifndef LOWBIT_SASS_STEADY
    const uint32_t fmask = (tab_sm[it] >> 20) & 0xFF;
#else
    const uint32_t fmask = 1u << (CHUNKS - 1);  // one group flush per stage (group = KSTEP)
#endif
    const uint8_t *ssm = st + wbytes + warp * p.slots * SB;
    const uint8_t *xsm = st + wbytes + sbytes;
    uint32_t w[4 * VEC];
    const uint4 *wsm = reinterpret_cast<const uint4 *>(st + warp * (32 * VEC * 16));
    const uint8_t *wlane = st + wdst;                            // this lane's weights (variant >= 1)
    const uint8_t *xlane = st + wbytes + sbytes + g * XROW + t * 16;  // this lane's B fragments (variant >= 1)
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const uint4 q = V != 0 ? *reinterpret_cast<const uint4 *>(wlane + v * 512) : wsm[v * 32 + lane];
      w[4 * v] = q.x, w[4 * v + 1] = q.y, w[4 * v + 2] = q.z, w[4 * v + 3] = q.w;
    }
    int sidx = 0;
#pragma unroll
    for (int kg = 0; kg < CHUNKS; ++kg) {
      uint32_t bx[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = mt * 8 + g;
        if constexpr (V != 0) {  // every staged row exists (zero beyond MX)
          const uint4 q = *reinterpret_cast<const uint4 *>(xlane + mt * 8 * XROW + kg * 64);
          bx[mt][0] = q.x, bx[mt][1] = q.y, bx[mt][2] = q.z, bx[mt][3] = q.w;
        } else if (row < p.MX) {
          const uint4 q = *reinterpret_cast<const uint4 *>(xsm + row * XROW + kg * 64 + t * 16);
          bx[mt][0] = q.x, bx[mt][1] = q.y, bx[mt][2] = q.z, bx[mt][3] = q.w;
        } else {
          bx[mt][0] = bx[mt][1] = bx[mt][2] = bx[mt][3] = 0u;
        }
      }
      uint32_t a[16];
      if constexpr (OFF) R::deq_off(&w[kg * BITS], a, magic);
      else R::deq(&w[kg * BITS], a, magic);
      if constexpr (TX) {   // the chunk's half sums of x, one mma per tile (A: x's fragments, B: ones)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma16816<WB>(xt[mt], bx[mt][0], bx[mt][1], bx[mt][2], bx[mt][3], one, one);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int i0 = (2 * r + nt) * 4;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            mma16816<WB>(acc[nt][mt], a[i0], a[i0 + 1], a[i0 + 2], a[i0 + 3], bx[mt][2 * r], bx[mt][2 * r + 1]);
        }
        if constexpr (TX) {
          // (summed above, once per chunk)
        } else if constexpr (OFF) {  // (a tile of ones whose rows 8-15 are copies of `one` changes ptxas' allocation)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            mma16816<WB>(xs[mt], one, oa[0], one, oa[1], bx[mt][2 * r], bx[mt][2 * r + 1]);
        } else if constexpr (R::ZERO) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma16816<WB>(xs[mt], one, one, one, one, bx[mt][2 * r], bx[mt][2 * r + 1]);
        }
      }
      if (gend(kg, fmask)) {
        flush(ssm + sidx * SB);
        ++sidx;
      }
    }

#ifndef LOWBIT_SASS_STEADY  // (defined only by native/sass.py to count the steady-state loop)
    const bool piece_end = it == p.iters - 1 || f == f_end - 1;  // end of this block's piece of n-block nb
    prof.record(piece_end ? instr::next_tag(S_COMPUTE, S_OUTPUT) : instr::next_tag(S_COMPUTE, S_WAIT));
    if (piece_end) {
      if (!gend(CHUNKS - 1, fmask)) flush(ssm + sidx * SB);  // the last group is open: its partial sum
      const int n0 = nb * BN + warp * 32 + g;
      if (!XS && seg_start == 0 && it == p.iters - 1) {  // the whole n-block: store y directly
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int n = n0 + nt * 16 + (e >> 1) * 8, m = mt * 8 + 2 * t + (e & 1);
              if (m < p.M && n < p.N) yo[(size_t)m * p.N + n] = f32_to_act<OB>(total[nt][mt][e]);
            }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int n = n0 + nt * 16 + (e >> 1) * 8, m = mt * 8 + 2 * t + (e & 1);
              if (m < p.MX && n < p.N) {
                const int mo = (XS && m >= p.M) ? m - p.M : m;
                atomicAdd(p.y32 + (size_t)mo * p.Npad + n, total[nt][mt][e]);
              }
            }
        if constexpr (DEFER) {
          if (tid == 0) pieces[npieces] = make_int2(nb, it - seg_start + 1);
          if (++npieces == MAXP) publish();  // (a static range has at most 2 partial pieces)
        } else {
          __threadfence();
          __syncthreads();
          if (tid == 0) {
            const int len = it - seg_start + 1;
            last_flag = (atomicAdd(p.counters + nb, len) + len == p.iters);
          }
          __syncthreads();
          if (last_flag) {  // every piece of this n-block has landed: convert, re-zero
            __threadfence();
            convert(nb);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) total[nt][mt][e] = 0.f;
      prof.record(f == f_end - 1 ? instr::exit_tag(S_OUTPUT) : instr::next_tag(S_OUTPUT, S_WAIT));
    }
#else
    prof.next(S_COMPUTE, S_WAIT);
#endif
    if (++it == p.iters) {
      it = 0;
      ++nb;
      seg_start = 0;
    }
    cso = (cso + stage_bytes == ring_bytes) ? 0 : cso + stage_bytes;
  }
  cp_async_wait<0>();
#ifndef LOWBIT_SASS_STEADY
  if constexpr (DEFER) {
    if (npieces) publish();
  }
#endif
#ifdef LOWBIT_SASS_STEADY  // keep the accumulation live without the output code
  {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum += total[nt][mt][e] + acc[nt][mt][e];
    p.y32[tid] = sum;
    (void)yo;
    (void)last_flag;
  }
#endif
  prof.end();
}

// ---------------------------------------------------------------------------------------------
// Dequantize (prefill path): packed words of n-blocks [nb0, nb0 + gridDim.y) -> W^T rows
// [(nb - nb0)*256 + n][K] in the output dtype, w = (value - z) * s rounded once.
// grid = (iters, n-blocks), 256 threads.
template <class R, bool OB>
__global__ void __launch_bounds__(THREADS) lowbit_dequant_kernel(const __grid_constant__ DequantParams p) {
  constexpr int BITS = R::BITS, KSTEP = R::KSTEP, CHUNKS = KSTEP / KG, VEC = CHUNKS * BITS / 4;
  const int it = blockIdx.x, nb = p.nb0 + blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint4 *src = static_cast<const uint4 *>(p.wq) + ((size_t)(nb * p.iters + it) * WARPS + warp) * (32 * VEC);
  uint32_t w[4 * VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const uint4 q = __ldg(src + v * 32 + lane);
    w[4 * v] = q.x, w[4 * v + 1] = q.y, w[4 * v + 2] = q.z, w[4 * v + 3] = q.w;
  }
  const uint16_t *sc = reinterpret_cast<const uint16_t *>(p.scales);
  const uint16_t *zp = reinterpret_cast<const uint16_t *>(p.zeros);
  uint16_t *out = reinterpret_cast<uint16_t *>(p.out);
#pragma unroll
  for (int kg = 0; kg < CHUNKS; ++kg) {
    uint32_t a[16];
    R::deq(&w[kg * BITS], a, p.magic);
    const int k0 = it * KSTEP + kg * KG + 8 * t;
    if (k0 >= p.K) continue;
    const int grp = k0 / p.group;  // group % 8 == 0: the 8 k of this thread share the group
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) {
        const int n = nb * BN + warp * 32 + nt * 16 + jn * 8 + g;
        if (n >= p.N) continue;
        const size_t si = (size_t)grp * p.N + n;
        const float s = lo_f32<OB>(sc[si]);
        const float z = R::ZERO ? with_bias<R>(lo_f32<OB>(zp[si])) : 0.f;
        // k0 + {0,1}: pair (r=0, jk=0), {2,3}: (0,1), {4,5}: (1,0), {6,7}: (1,1); pair i = 8r + 4nt + 2jk + jn
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t v = a[8 * (q >> 1) + 4 * nt + 2 * (q & 1) + jn];
          o[q] = pack2_act<OB>((lo_f32<R::BF16>(v) - z) * s, (hi_f32<R::BF16>(v) - z) * s);
        }
        *reinterpret_cast<uint4 *>(out + (size_t)(n - p.nb0 * BN) * p.K + k0) = make_uint4(o[0], o[1], o[2], o[3]);
      }
  }
}

// f16 x [M][K] -> bf16 [2M][K]: rows 0..M-1 = hi = bf16(x), rows M..2M-1 = lo = bf16(x - hi) (exact)
static __global__ void __launch_bounds__(THREADS) xsplit_kernel(const __half *x, __nv_bfloat16 *out, int n_elem) {
  const int i = blockIdx.x * THREADS + threadIdx.x;
  if (i < n_elem) {
    const float v = __half2float(x[i]);
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    out[i] = hi;
    out[n_elem + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
  }
}

}  // namespace lowbit
