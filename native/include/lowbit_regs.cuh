// lowbit_regs.cuh -- decode variant 4, "regs" (native/NOTES.md sections 22 and 23): the weights go straight
// from global memory into registers, with no shared-memory stage and no per-stage __syncthreads.
//
// The same layout, work split (stream-K over (n-block, iteration)), m16n8k16 mma and group fold as
// lowbit_gemv_kernel (lowbit_kernel.cuh), for the BULK f16 recipes (lowbit_layout.BULK: every f16 recipe) at
// MT = 1 or 2 m16n8 tiles (M <= 8, <= 16), f16 out:
//   - each lane loads its own VEC 16-byte vectors of a stage (ld.global.nc, no L1 allocation; a warp's load
//     is 512 contiguous bytes) into a ring of D register stages (regs_depth); the loop is unrolled by D so
//     that every ring entry is a fixed set of registers, and stage f + D - 1 is issued as stage f starts;
//   - MT = 1: x is copied whole (MX rows of the padded K) into shared memory once, with cp.async, while the
//     first D - 1 weight stages are in flight: one __syncthreads before the loop, none inside it except at a
//     piece's end (the stream-K output, as lowbit_gemv_kernel's);
//   - MT = 2 (16 rows of x whole do not fit beside the rings): x goes through a block-wide ring of XSLOTS stage
//     slots instead, each thread copying its chunk of stage f + D - 1's x with its weights (cp.async, arriving on
//     the slot's "full" mbarrier when the copy lands: cp.async.mbarrier.arrive.noinc); a warp waits on the full
//     barrier of the stage it computes and, once done with it, arrives on the slot's "empty" barrier, which the
//     copies into that slot wait on XSLOTS stages later. No block barrier either: warps drift up to
//     XSLOTS - D stages apart before a copy waits;
//   - scales (per warp, as the layout stores them) through a per-warp ring of D shared-memory slots filled by
//     cp.async with the weights of their stage: a warp waits on its own copies and __syncwarp()s;
//   - B-fragment rows >= MX read row MX - 1 instead of zeros: column m of the mma's D depends on column m of B
//     only, and columns >= M are never stored, so the loads need no guard and x no zero rows.
// Kept self-contained (its own accumulators, fold and output code) rather than sharing device functions with
// lowbit_gemv_kernel: factoring those changed ptxas' register allocation of the timed variants (section 22); tried
// again in section 24 (the accumulators and fold of both kernels as one struct): the SASS of 64 of the 88
// functions of the TUNED recipes changed, so sharing waits for a GPU call that re-times every variant.
#pragma once
#include <cstdint>
#include "instrument.cuh"
#include "lowbit_common.cuh"
#include "lowbit_kernel.cuh"
#include "lowbit_params.h"

namespace lowbit {

constexpr int VREGS = 4;  // GemvParams::variant

// 0: MT = 2 with zero points sums x in every warp, as MT = 1 does (the A/B build of native/NOTES.md section 25)
#ifndef LOWBIT_REGS_XZ
#define LOWBIT_REGS_XZ 1
#endif

// 0: every launch reads its stage's group ends from the stage table at run time (FC = 0, the A/B build of native/NOTES.md
// section 27); 1: a launch whose layout puts them in the same chunks of every stage runs the build that knows them (decode_fc, lowbit_kernel.cuh)
#ifndef LOWBIT_REGS_FC
#define LOWBIT_REGS_FC 1
#endif

// register stages of the ring: ~48 words in flight per lane at one tile (u1 4, u2 / u4 / i4 3, u8 / f6e3m2 2), ~32 at
// two (twice the accumulators: u2 spilled in the loop at 3 stages, u4 at 3 spilled 16 bytes and ran 3.5-5.3% slower
// than at 2, i4 -0.1 to +1.8%: native/NOTES.md section 25), never fewer than 2 nor more than 4
__host__ __device__ constexpr int regs_depth(int bits, int mt = 1) {
  const int d = (mt == 2 ? 32 : 48) / ((kstep_for(bits) / KG) * bits);  // words in flight / words per lane and stage
  return d < 2 ? 2 : d > 4 ? 4 : d;
}

// bytes of a padded x row in shared memory (64 bytes of pad: rows g, g + 1 in other banks, as xrow_bytes)
__host__ __device__ inline int regs_xrow(int bits, int iters) { return iters * kstep_for(bits) * 2 + 64; }
// MT = 2: slots of the x ring (a slot: 16 rows of one stage, xrow_bytes each)
__host__ __device__ constexpr int regs_xslots(int bits, int mt) { return regs_depth(bits, mt) + 2; }

__host__ inline int regs_smem_bytes(int bits, bool zero, int MX, int slots, int iters, int mt = 1) {
  return ((iters * 4 + 15) / 16) * 16 + WARPS * regs_depth(bits, mt) * slots * scale_bytes(zero) +
         (mt == 1 ? MX * regs_xrow(bits, iters) : regs_xslots(bits, mt) * 16 * xrow_bytes(kstep_for(bits)));
}

// MT = 2's x ring: arrive on the mbarrier once this thread's earlier cp.async have landed (counted in its init count)
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// wait for a phase with acquire semantics (the x ring's readers and writers order their shared accesses by it)
__device__ __forceinline__ void mbar_wait_acq(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(bar), "r"(parity) : "memory");
}

// 16 bytes of streamed weights into registers (read once: no L1 allocation)
__device__ __forceinline__ void ldg_stream16(uint32_t *r, const void *ptr) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(ptr));
}

// blocks per SM the build is compiled for: 2 (128 registers), but 1 for 7-8 bit codes with zero points at MT = 2
// (they spilled at 128)
__host__ __device__ constexpr int regs_min_blocks(int bits, bool zero, int mt) { return mt == 2 && zero && bits >= 7 ? 1 : 2; }

template <class R, int MT, bool PROF, int PM = INSTR_MODE_STAGED, int FC = 0>
__global__ void __launch_bounds__(THREADS, regs_min_blocks(R::BITS, R::ZERO, MT)) lowbit_regs_kernel(const __grid_constant__ GemvParams p) {
  constexpr int BITS = R::BITS, KSTEP = R::KSTEP, CHUNKS = KSTEP / KG, D = regs_depth(BITS, MT);
  constexpr bool XR = MT > 1;  // x through the ring (above)
  // MT = 2 with zero points: the sum of x per (row, group) is computed once per block-stage, by warp f % WARPS, into
  // a per-slot array xsp of the ring (its segments: the stage's pieces of groups), instead of in every warp (below).
  // 128-k stages only (u3-u8): measured against every warp's own sum (native/NOTES.md section 25) u4 -1.8 to -2.4%,
  // u8 within 0.5%, and the 256-k stages of u1 / u2 slower (u2 +2%, u1 +7 to +14%: one warp sums 8 chunks a stage)
  constexpr bool XZ = XR && R::ZERO && LOWBIT_REGS_XZ && KSTEP == 128;
  constexpr bool OFF = use_offs<R>();  // deq_off(), the offsets out in the fold (lowbit_kernel.cuh)
  constexpr int XSP = OFF ? 32 : 16;   // XZ: floats per segment of xsp (OFF: sum(x) at 0-15, sum(offset x) at 16-31)
  constexpr int XS = regs_xslots(BITS, MT), XROW = xrow_bytes(KSTEP), XCH = KSTEP / 8;  // x ring; 16-byte chunks per row
  constexpr int XPT = 16 * XCH / THREADS;       // x chunks a thread copies per stage (1: KSTEP 128, 2: 256)
  static_assert(MT == 1 || (MT == 2 && XPT * THREADS == 16 * XCH), "one or two tiles; whole chunks per thread");
  constexpr int VEC = CHUNKS * BITS / 4, NW = 4 * VEC;  // 16-byte vectors / words per lane per stage
  constexpr int SB = scale_bytes(R::ZERO);
  constexpr int SCP = (8 * SB / 16 + 31) / 32;  // scale chunks a lane may copy (<= 8 groups per stage)
  constexpr int WSTRIDE = WARPS * 32 * VEC;     // uint4 per flat stage
  static_assert(!R::BF16 && KSTEP == kstep_for(BITS) && (CHUNKS * BITS) % 4 == 0, "f16 recipes, the layout");
  static_assert(FC == 0 || (FC <= CHUNKS && CHUNKS % (FC ? FC : 1) == 0), "group ends: run time, or every FC-th chunk");
  auto gend = [](int kg, uint32_t fm) { return group_ends<FC, CHUNKS>(kg, fm); };
  extern __shared__ __align__(16) uint8_t smem[];

  instr::FlatProfiler<PROF, PM> prof;
  prof.begin(p.prof, p.prof_cap);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int xrow = regs_xrow(BITS, p.iters), wsb = p.slots * SB;
  const int tab_bytes = ((p.iters * 4 + 15) / 16) * 16;
  uint32_t *tab_sm = reinterpret_cast<uint32_t *>(smem);
  uint8_t *scr = smem + tab_bytes + warp * (D * wsb);  // this warp's scale ring
  uint8_t *xsm = smem + tab_bytes + WARPS * D * wsb;   // x: [MX][xrow] (MT = 2: the ring, [XS][16][XROW])
  __shared__ int last_flag;
  // MT = 2: full barriers [0, XS), empty [XS, 2 XS); with zero points also xsp ready [2 XS, 3 XS)
  __shared__ __align__(8) uint64_t xbar[XR ? (XZ ? 3 : 2) * XS : 1];
  __shared__ __align__(16) float xsp[XZ ? XS * CHUNKS * XSP : 1];  // [slot][segment][m]: sum of x over the segment
  const uint32_t xbar0 = smem_u32(xbar);

  for (int i = tid; i < p.iters; i += THREADS) tab_sm[i] = p.stab[i];
  const int T = p.nblocks * p.iters;
  const int per = T / gridDim.x, rem = T % gridDim.x, b = blockIdx.x;
  const int f_begin = b * per + min(b, rem);
  const int f_end = f_begin + per + (b < rem ? 1 : 0);

  // MT = 2: the x ring's barriers; MT = 1: x whole (K % 8 == 0, so a 16-byte chunk is all inside or all outside K:
  // zero-filled past it)
  if constexpr (XR) {
    if (tid == 0) {
      for (int s = 0; s < XS; ++s) {
        mbar_init(xbar0 + 8 * s, THREADS);        // every thread's copies of the slot's stage
        mbar_init(xbar0 + 8 * (XS + s), WARPS);   // every warp done reading it (and its xsp)
        if constexpr (XZ) mbar_init(xbar0 + 8 * (2 * XS + s), 1);  // its xsp written by warp f % WARPS
      }
      fence_mbar_init();
    }
  } else {
    const uint16_t *xg = reinterpret_cast<const uint16_t *>(p.x);
    const int xch = p.iters * KSTEP / 8;
    const uint32_t xs0 = smem_u32(xsm);
    for (int q = tid; q < p.MX * xch; q += THREADS) {
      const int m = q / xch, c = q - m * xch, k = c * 8;
      const bool in = k < p.K;
      cp_async16(xs0 + m * xrow + c * 16, xg + (size_t)m * p.K + (in ? k : 0), in ? 16u : 0u);
    }
    cp_async_commit();
  }
  __syncthreads();  // the stage table, read by the loader below

  // loader: the next stage to issue (words linear in the flat index; scales with the n-block and the table)
  const size_t s_nb = (size_t)WARPS * p.ngroups * (SB / 16);
  int lnb = f_begin / p.iters, lit = f_begin - lnb * p.iters;
  const uint4 *lw = static_cast<const uint4 *>(p.wq) + (size_t)f_begin * WSTRIDE + warp * (32 * VEC) + lane;
  const uint4 *ls = static_cast<const uint4 *>(p.sc) + (size_t)lnb * s_nb + (size_t)warp * p.ngroups * (SB / 16) + lane;
  const uint32_t scr0 = smem_u32(scr) + lane * 16;
  uint32_t wr[D][NW];
  // MT = 2: x in global memory, copied stage by stage into the ring by issue()
  const uint16_t *xg = reinterpret_cast<const uint16_t *>(p.x);
  // MT = 2: the ring slot of the next stage issued, and the parity of the empty barrier's phase to wait for: 1 at
  // the slots' first use -- a fresh barrier is in phase 0, and the wait for the phase before it returns at once
  int xslot = 0;
  uint32_t xpar = 1;
  auto issue = [&](uint32_t(&buf)[NW], int slot) {
    if constexpr (XR) {  // x of this stage into its ring slot, once every warp is done with the slot's previous use
      mbar_wait_acq(xbar0 + 8 * (XS + xslot), xpar);
      const uint32_t xd = smem_u32(xsm) + xslot * (16 * XROW);
#pragma unroll
      for (int j = 0; j < XPT; ++j) {
        const int q = tid + THREADS * j, m = q / XCH, c = q - m * XCH, k = lit * KSTEP + c * 8;
        const bool in = k < p.K;
        if (m < p.MX) cp_async16(xd + m * XROW + c * 16, xg + (size_t)m * p.K + (in ? k : 0), in ? 16u : 0u);
      }
      cp_async_arrive(xbar0 + 8 * xslot);
      if (++xslot == XS) {
        xslot = 0;
        xpar ^= 1u;
      }
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) ldg_stream16(&buf[4 * v], lw + v * 32);
    const uint32_t tab = tab_sm[lit];
    const int nsc = ((tab >> 16) & 0xF) * (SB / 16);
    const uint4 *ss = ls + (tab & 0xFFFF) * (SB / 16);
#pragma unroll
    for (int j = 0; j < SCP; ++j)
      if (lane + 32 * j < nsc) cp_async16(scr0 + slot * wsb + j * 512, ss + 32 * j, 16);
    lw += WSTRIDE;
    if (++lit == p.iters) {
      lit = 0;
      ls += s_nb;
    }
  };
#pragma unroll
  for (int s = 0; s < D - 1; ++s) {
    if (f_begin + s < f_end) issue(wr[s], s);
    cp_async_commit();
  }
  if constexpr (!XR) {
    cp_async_wait<D - 1>();  // x (the first group) has landed for this thread's chunks
    __syncthreads();         // ... and for every thread's
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

  // LOWBIT_XT (lowbit_kernel.cuh): at two tiles without XZ, the sum of x from one mma per tile and chunk (x's
  // fragments as A, ones as B: the two k-half sums), gathered in the fold
  constexpr bool TX = LOWBIT_XT != 0 && MT == 2 && (R::ZERO || OFF) && !XZ;
  float xt[MT][4] = {};
  const float2 xoff = xt_offsets<R, false, TX && OFF>();

  // group fold: total += s * acc (- s * z * sum(x)), scales of the staged group at sp; zt = false (XZ, a group that
  // ends before the stage does): s * acc only, its zero term later in zfold, once the block's sum of x is in xsp
  auto flush = [&](const uint8_t *sp, bool zt = true) {
    if constexpr (TX) xt_gather<OFF>(xs, xt, xoff, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s0, s1, z0 = 0.f, z1 = 0.f;
      if constexpr (R::ZERO) {
        const uint2 v = *reinterpret_cast<const uint2 *>(sp + (nt * 8 + g) * 8);
        s0 = lo_f32<false>(v.x), s1 = hi_f32<false>(v.x);
        z0 = with_bias<R>(lo_f32<false>(v.y)), z1 = with_bias<R>(hi_f32<false>(v.y));
        const float sz0 = s0 * z0, sz1 = s1 * z1;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float *tt = total[nt][mt], *aa = acc[nt][mt];
          if (!zt) {
            tt[0] = fmaf(s0, aa[0], tt[0]);
            tt[1] = fmaf(s0, aa[1], tt[1]);
            tt[2] = fmaf(s1, aa[2], tt[2]);
            tt[3] = fmaf(s1, aa[3], tt[3]);
          } else {  // OFF: acc - sum(offset x) (xo, lowbit_kernel.cuh)
            tt[0] = fmaf(s0, aa[0] - xo<OFF>(xs[mt], 0), fmaf(-sz0, xs[mt][0], tt[0]));
            tt[1] = fmaf(s0, aa[1] - xo<OFF>(xs[mt], 1), fmaf(-sz0, xs[mt][1], tt[1]));
            tt[2] = fmaf(s1, aa[2] - xo<OFF>(xs[mt], 0), fmaf(-sz1, xs[mt][0], tt[2]));
            tt[3] = fmaf(s1, aa[3] - xo<OFF>(xs[mt], 1), fmaf(-sz1, xs[mt][1], tt[3]));
          }
        }
      } else {
        const uint32_t v = *reinterpret_cast<const uint32_t *>(sp + (nt * 8 + g) * 4);
        s0 = lo_f32<false>(v), s1 = hi_f32<false>(v);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float *tt = total[nt][mt], *aa = acc[nt][mt];
          tt[0] = fmaf(s0, aa[0] - xo<OFF>(xs[mt], 0), tt[0]);
          tt[1] = fmaf(s0, aa[1] - xo<OFF>(xs[mt], 1), tt[1]);
          tt[2] = fmaf(s1, aa[2] - xo<OFF>(xs[mt], 0), tt[2]);
          tt[3] = fmaf(s1, aa[3] - xo<OFF>(xs[mt], 1), tt[3]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][mt][e] = 0.f;
    }
    if ((R::ZERO || OFF) && zt) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) xs[mt][e] = 0.f;
    }
  };
  // XZ: the zero term of a group that ended before the stage did (flush(sp, false)), its sum of x in xs[mt][0..1]
  auto zfold = [&](const uint8_t *sp) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint2 v = *reinterpret_cast<const uint2 *>(sp + (nt * 8 + g) * 8);
      const float s0 = lo_f32<false>(v.x), s1 = hi_f32<false>(v.x);
      const float sz0 = s0 * with_bias<R>(lo_f32<false>(v.y));
      const float sz1 = s1 * with_bias<R>(hi_f32<false>(v.y));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float *tt = total[nt][mt];
        if constexpr (OFF) {  // and the offsets' term, - s * sum(offset x)
          tt[0] = fmaf(-s0, xs[mt][2], tt[0]);
          tt[1] = fmaf(-s0, xs[mt][3], tt[1]);
          tt[2] = fmaf(-s1, xs[mt][2], tt[2]);
          tt[3] = fmaf(-s1, xs[mt][3], tt[3]);
        }
        tt[0] = fmaf(-sz0, xs[mt][0], tt[0]);
        tt[1] = fmaf(-sz0, xs[mt][1], tt[1]);
        tt[2] = fmaf(-sz1, xs[mt][0], tt[2]);
        tt[3] = fmaf(-sz1, xs[mt][1], tt[3]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      xs[mt][0] = xs[mt][1] = 0.f;
      if constexpr (OFF) xs[mt][2] = xs[mt][3] = 0.f;
    }
  };
  // XZ: add this block-stage's segment j of xsp (slot cs) to xs
  auto xs_add = [&](int cs, int j) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float2 q = *reinterpret_cast<const float2 *>(xsp + (cs * CHUNKS + j) * XSP + mt * 8 + 2 * t);
      xs[mt][0] += q.x;
      xs[mt][1] += q.y;
      if constexpr (OFF) {
        const float2 o = *reinterpret_cast<const float2 *>(xsp + (cs * CHUNKS + j) * XSP + 16 + mt * 8 + 2 * t);
        xs[mt][2] += o.x;
        xs[mt][3] += o.y;
      }
    }
  };

  uint32_t one = 0x3C003C00u;  // an f16 A tile of ones: sum(x) per group for the zero point
  uint32_t magic = p.magic;
  pin(one);
  pin(magic);
  uint32_t oa[2];  // rows 8-15 of the sum's A tile: the offsets (OFF) or ones (offa, lowbit_kernel.cuh)
#pragma unroll
  for (int jk = 0; jk < 2; ++jk) {
    oa[jk] = offa<R>(jk, one);
    if constexpr (OFF) pin(oa[jk]);
  }
  uint16_t *yo = reinterpret_cast<uint16_t *>(p.y);
  // this lane's B-fragment rows (see the top): MT = 1 in x whole, MT = 2 in a ring slot (+ slot * 16 * XROW)
  const uint8_t *xlane = XR ? xsm + min(g, p.MX - 1) * XROW + t * 16 : xsm + min(g, p.MX - 1) * xrow + t * 16;
  const int xoff1 = (min(8 + g, p.MX - 1) - min(g, p.MX - 1)) * XROW;  // MT = 2: tile 1's row from tile 0's
  int nb = f_begin / p.iters, it = f_begin - nb * p.iters, seg_start = it;
  int cslot = 0;       // MT = 2: the ring slot of the stage computed next, and the parity of its use
  uint32_t cpar = 0;

  // instrumented build: one wait -> compute -> wait pair per group of D stages (the loop's unroll), not per stage, so
  // "wait" is the wait of a group's first stage (and of the first stage after an output) and the later stages' waits
  // count as compute: two records per stage cost ~7% of a u4 stage's instructions (native/NOTES.md section 24)
  bool rec_in = true;  // record wait -> compute at this stage: the first of a group, or the first after an output
  prof.enter(S_WAIT);
  for (int f0 = f_begin; f0 < f_end; f0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int f = f0 + d;
      if (f >= f_end) break;
      cp_async_wait<D - 2>();  // this warp's scales of stage f (this lane's copies) ...
      __syncwarp();            // ... and every lane's; every lane is also done with the slot issued next
      if (d == 0 || rec_in) {
        prof.next(S_WAIT, S_COMPUTE);
        rec_in = false;
      }
      pin(lw);
      pin(ls);
      if (f + D - 1 < f_end) issue(wr[(d + D - 1) % D], (d + D - 1) % D);
      cp_async_commit();

#ifndef LOWBIT_SASS_STEADY
      const uint32_t fmask = (tab_sm[it] >> 20) & 0xFF;
#else
      const uint32_t fmask = 1u << (CHUNKS - 1);  // one group flush per stage (group = KSTEP): native/sass.py
#endif
      const uint8_t *ssm = scr + d * wsb;
      if constexpr (XR) mbar_wait_acq(xbar0 + 8 * cslot, cpar);  // every thread's x copies of stage f
      const uint8_t *xst = XR ? xlane + cslot * (16 * XROW) : xlane + it * (KSTEP * 2);
      if constexpr (XZ) {
        if (warp == f % WARPS) {  // this block-stage's sums of x, one per segment (a group's piece), into xsp
          float xq[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) xq[mt][e] = 0.f;
          int j = 0;
#pragma unroll
          for (int kg = 0; kg < CHUNKS; ++kg) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const uint4 q = *reinterpret_cast<const uint4 *>(xst + (mt ? xoff1 : 0) + kg * 64);
              if constexpr (OFF) {
                mma16816<false>(xq[mt], one, oa[0], one, oa[1], q.x, q.y);
                mma16816<false>(xq[mt], one, oa[0], one, oa[1], q.z, q.w);
              } else {  // (copies of `one` in rows 8-15 would change ptxas' allocation)
                mma16816<false>(xq[mt], one, one, one, one, q.x, q.y);
                mma16816<false>(xq[mt], one, one, one, one, q.z, q.w);
              }
            }
            if (gend(kg, fmask) || kg == CHUNKS - 1) {  // a segment ends: lanes of row 0 store its sums
              if (g == 0)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                  *reinterpret_cast<float2 *>(xsp + (cslot * CHUNKS + j) * XSP + mt * 8 + 2 * t) =
                      make_float2(xq[mt][0], xq[mt][1]);
                  if constexpr (OFF)
                    *reinterpret_cast<float2 *>(xsp + (cslot * CHUNKS + j) * XSP + 16 + mt * 8 + 2 * t) =
                        make_float2(xq[mt][2], xq[mt][3]);
                }
#pragma unroll
              for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) xq[mt][e] = 0.f;
              ++j;
            }
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(xbar0 + 8 * (2 * XS + cslot));
        }
      }
      int sidx = 0;
#pragma unroll
      for (int kg = 0; kg < CHUNKS; ++kg) {
        uint32_t bx[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4 q = *reinterpret_cast<const uint4 *>(xst + (mt ? xoff1 : 0) + kg * 64);
          bx[mt][0] = q.x, bx[mt][1] = q.y, bx[mt][2] = q.z, bx[mt][3] = q.w;
        }
        uint32_t a[16];
        if constexpr (OFF) R::deq_off(&wr[d][kg * BITS], a, magic);
        else R::deq(&wr[d][kg * BITS], a, magic);
        if constexpr (TX) {   // the chunk's half sums of x, one mma per tile
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma16816<false>(xt[mt], bx[mt][0], bx[mt][1], bx[mt][2], bx[mt][3], one, one);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int i0 = (2 * r + nt) * 4;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma16816<false>(acc[nt][mt], a[i0], a[i0 + 1], a[i0 + 2], a[i0 + 3], bx[mt][2 * r], bx[mt][2 * r + 1]);
          }
          if constexpr (TX) {
            // (summed above, once per chunk)
          } else if constexpr (OFF && !XZ) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma16816<false>(xs[mt], one, oa[0], one, oa[1], bx[mt][2 * r], bx[mt][2 * r + 1]);
          } else if constexpr (R::ZERO && !XZ) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mma16816<false>(xs[mt], one, one, one, one, bx[mt][2 * r], bx[mt][2 * r + 1]);
          }
        }
        if (gend(kg, fmask)) {
          if (!XZ || kg < CHUNKS - 1) {  // XZ: a group that ends with the stage is folded after the loop
            flush(ssm + sidx * SB, !XZ);
            ++sidx;
          }
        }
      }
      if constexpr (XZ) {  // the zero terms of the groups that ended in this stage; the open one's sum carried on
        mbar_wait_acq(xbar0 + 8 * (2 * XS + cslot), cpar);
        int j = 0;
#pragma unroll
        for (int kg = 0; kg < CHUNKS - 1; ++kg)
          if (gend(kg, fmask)) {
            xs_add(cslot, j);
            zfold(ssm + j * SB);
            ++j;
          }
        xs_add(cslot, j);  // the last segment: a group's end (folded whole here) or an open group's piece (carried)
        if (gend(CHUNKS - 1, fmask)) {
          flush(ssm + sidx * SB);
          ++sidx;
        }
      }
      if constexpr (XR) {  // this warp is done with the slot's x (and xsp): the copy XS stages later may overwrite it
        __syncwarp();
        if (lane == 0) mbar_arrive(xbar0 + 8 * (XS + cslot));
        if (++cslot == XS) {
          cslot = 0;
          cpar ^= 1u;
        }
      }

#ifndef LOWBIT_SASS_STEADY  // (defined only by native/sass.py to count the steady-state loop)
      const bool piece_end = it == p.iters - 1 || f == f_end - 1;  // end of this block's piece of n-block nb
      if (piece_end || d == D - 1)
        prof.record(piece_end ? instr::next_tag(S_COMPUTE, S_OUTPUT) : instr::next_tag(S_COMPUTE, S_WAIT));
      if (piece_end) {
        if (!gend(CHUNKS - 1, fmask)) flush(ssm + sidx * SB);  // the last group is open: its partial sum
        const int n0 = nb * BN + warp * 32 + g;
        const bool whole = seg_start == 0 && it == p.iters - 1;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int n = n0 + nt * 16 + (e >> 1) * 8, m = mt * 8 + 2 * t + (e & 1);
              if (m < p.M && n < p.N) {
                if (whole) yo[(size_t)m * p.N + n] = f32_to_act<false>(total[nt][mt][e]);
                else atomicAdd(p.y32 + (size_t)m * p.Npad + n, total[nt][mt][e]);
              }
            }
        if (!whole) {  // count the piece; the block that completes the n-block converts it and re-zeroes
          __threadfence();
          __syncthreads();
          if (tid == 0) {
            const int len = it - seg_start + 1;
            last_flag = (atomicAdd(p.counters + nb, len) + len == p.iters);
          }
          __syncthreads();
          if (last_flag) {
            __threadfence();
            for (int q = tid; q < p.M * BN; q += THREADS) {
              const int m = q / BN, n = nb * BN + (q % BN);
              if (n < p.N) {
                float *src = p.y32 + (size_t)m * p.Npad + n;
                yo[(size_t)m * p.N + n] = f32_to_act<false>(__ldcg(src));
                *src = 0.f;
              }
            }
            if (tid == 0) p.counters[nb] = 0;
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[nt][mt][e] = 0.f;
        prof.record(f == f_end - 1 ? instr::exit_tag(S_OUTPUT) : instr::next_tag(S_OUTPUT, S_WAIT));
        rec_in = true;
      }
#else
      if (d == D - 1) prof.next(S_COMPUTE, S_WAIT);
#endif
      if (++it == p.iters) {
        it = 0;
        ++nb;
        seg_start = 0;
      }
    }
  }
  cp_async_wait<0>();
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
    (void)seg_start;
  }
#endif
  prof.end();
}

}  // namespace lowbit
