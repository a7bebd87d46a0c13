// lowbit_launch.cuh -- host launchers of the native low-bit kernels, one set per recipe.
// Which variants are built (everything else returns -1):
//   f16 recipes:  gemv MT = 1 (M <= 8), 2 (M <= 16), f16 out; instrumented MT = 1, 2 where R::PROF
//                 (variants base and lean)
//   bf16 recipes: gemv MT = 2, bf16 out; XSPLIT recipes also f16 out with x split, MT = 2 (M <= 8), 4 (M <= 16)
//   dequantize:   output in the recipe's dtype; XSPLIT recipes also f16
//   variants 1, 2 (GemvParams::variant): f16 recipes with R::TUNE, MT = 1, 2, f16 out; variant 3 (bulk): f16
//                 recipes with R::BULK (every f16 recipe), and the XSPLIT bf16 ones with R::BULK for f16 out with x
//                 split at MT = 2, 4; 1 and 3 also instrumented where R::PROF; variant 4 (regs, lowbit_regs.cuh):
//                 f16 recipes with R::BULK, MT = 1, 2, f16 out, also instrumented where R::PROF; variant 5 (bulk1):
//                 bulk's builds, launched with one block per SM where no grid is given
#pragma once
#include <cuda_runtime.h>
#include "lowbit_regs.cuh"
#include "lowbit_kernel.cuh"
#include "lowbit_recipes.cuh"

namespace lowbit {

constexpr int VBULK1 = 5;  // GemvParams::variant: bulk (3) launched with one block per SM (native/NOTES.md section 30)

struct LaunchCache {  // per kernel instantiation (one device per process)
  int attr_smem = 0, occ_smem = -1, occ = 0;
};

// kernel k of the R recipe with smem bytes of dynamic shared memory: grid > 0: that many blocks (at most the work
// items); 0: sms x occupancy.  dry: only report the grid (still an error where smem does not fit).
template <class R, class Kern>
int launch_decode(Kern k, int smem, LaunchCache &c, const GemvParams &p, int sms, cudaStream_t s, int grid,
                  int *grid_used, bool dry) {
  if (smem > c.attr_smem) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
      cudaGetLastError();  // (not sticky: clear it, or the next launch's cudaGetLastError would report it)
      return (int)e;
    }
    c.attr_smem = smem;
  }
  if (c.occ_smem != smem) {
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.occ, k, THREADS, smem);
    if (e != cudaSuccess) return (int)e;
    c.occ_smem = smem;
  }
  if (c.occ < 1) return (int)cudaErrorInvalidConfiguration;
  const int T = p.nblocks * p.iters;
  int g = grid > 0 ? grid : sms * c.occ;
  if (g > T) g = T;
  if (grid_used) *grid_used = g;
  if (dry) return 0;
  GemvParams q = p;
  q.magic = R::MAGIC;
  k<<<g, THREADS, smem, s>>>(q);
  return (int)cudaGetLastError();
}

// Launch kern_of(FC) for the FC that decode_fc picks for this call where `on` (the builds: 0, the stage's chunks, and 4
// at one tile in 256-k stages -- at two tiles their two folds a stage spilled in regs: u1 72 bytes, u2 20), else FC = 0
// (the stage table read at run time); one occupancy cache per build
template <class R, int MT, bool ON, class KernOf>
int launch_fc(KernOf kern_of, int smem, LaunchCache (&c)[3], const GemvParams &p, int sms, cudaStream_t s, int grid,
              int *grid_used, bool dry) {
  constexpr int C = R::KSTEP / KG;
  if constexpr (ON) {
    const int fc = decode_fc(R::KSTEP, p.K, p.iters, p.ngroups > 0 ? p.K / p.ngroups : 0);
    if (fc == C) return launch_decode<R>(kern_of(std::integral_constant<int, C>{}), smem, c[1], p, sms, s, grid, grid_used, dry);
    if constexpr (C > 4 && MT == 1)
      if (fc == 4) return launch_decode<R>(kern_of(std::integral_constant<int, 4>{}), smem, c[2], p, sms, s, grid, grid_used, dry);
  }
  return launch_decode<R>(kern_of(std::integral_constant<int, 0>{}), smem, c[0], p, sms, s, grid, grid_used, dry);
}

// base / lean / lean3 / bulk: the group ends compiled in (launch_fc) for f16 out without x split
template <class R, int MT, bool OB, bool XS, bool PROF, int V = 0, int PM = INSTR_MODE_STAGED>
int launch_gemv(const GemvParams &p, int sms, cudaStream_t s, int grid, int *grid_used, bool dry) {
  static LaunchCache c[3];
  return launch_fc<R, MT, LOWBIT_GEMV_FC && !OB && !XS>(
      [](auto fc) { return lowbit_gemv_kernel<R, MT, OB, XS, PROF, V, PM, decltype(fc)::value>; },
      gemv_smem_bytes(R::BITS, R::ZERO, staged_rows(p.MX, MT, V), p.slots, p.iters, V), c, p, sms, s, grid, grid_used,
      dry);
}

// variant 4 (lowbit_regs.cuh): MT = 1, 2, f16 out, no x split; at MT = 1 x whole in shared memory, so the grid
// query fails (and the variant is not a candidate) where MX rows of the padded K do not fit; the group ends compiled in
// (launch_fc)
template <class R, int MT, bool PROF, int PM = INSTR_MODE_STAGED>
int launch_regs(const GemvParams &p, int sms, cudaStream_t s, int grid, int *grid_used, bool dry) {
  static LaunchCache c[3];
  return launch_fc<R, MT, LOWBIT_REGS_FC>(
      [](auto fc) { return lowbit_regs_kernel<R, MT, PROF, PM, decltype(fc)::value>; },
      regs_smem_bytes(R::BITS, R::ZERO, p.MX, p.slots, p.iters, MT), c, p, sms, s, grid, grid_used, dry);
}

// the instrumented build (f16 out, no x split) in instrumentation mode `prof` (INSTR_MODE_STAGED or _WARP0)
template <class R, int MT, int V>
int launch_prof(int prof, const GemvParams &p, int sms, cudaStream_t s, int grid, int *used, bool dry) {
  if (prof == INSTR_MODE_STAGED) return launch_gemv<R, MT, false, false, true, V>(p, sms, s, grid, used, dry);
  if (prof == INSTR_MODE_WARP0) return launch_gemv<R, MT, false, false, true, V, INSTR_MODE_WARP0>(p, sms, s, grid, used, dry);
  return -1;
}
template <class R, int MT>
int launch_regs_prof(int prof, const GemvParams &p, int sms, cudaStream_t s, int grid, int *used, bool dry) {
  if (prof == INSTR_MODE_STAGED) return launch_regs<R, MT, true>(p, sms, s, grid, used, dry);
  if (prof == INSTR_MODE_WARP0) return launch_regs<R, MT, true, INSTR_MODE_WARP0>(p, sms, s, grid, used, dry);
  return -1;
}

// prof: 0 = the plain kernel, else the instrumented one in that instrumentation mode (launch_prof)
template <class R>
int gemv_dispatch(int mt, bool ob, bool xs, int prof, const GemvParams &p, int sms, cudaStream_t s, int grid,
                  int *used, bool dry) {
  if (p.variant == VBULK1) {  // bulk with one block per SM (unless a grid is given): the same builds
    GemvParams q = p;
    q.variant = 3;
    return gemv_dispatch<R>(mt, ob, xs, prof, q, sms, s, grid > 0 ? grid : sms, used, dry);
  }
  if (p.variant != 0) {
    if constexpr (!R::BF16 && R::TUNE) {
      if (!xs && !ob && !prof) {
        if (p.variant == 1 && mt == 1) return launch_gemv<R, 1, false, false, false, 1>(p, sms, s, grid, used, dry);
        if (p.variant == 1 && mt == 2) return launch_gemv<R, 2, false, false, false, 1>(p, sms, s, grid, used, dry);
        if (p.variant == 2 && mt == 1) return launch_gemv<R, 1, false, false, false, 2>(p, sms, s, grid, used, dry);
        if (p.variant == 2 && mt == 2) return launch_gemv<R, 2, false, false, false, 2>(p, sms, s, grid, used, dry);
      }
      if constexpr (R::PROF) {  // the instrumented builds of lean, bulk and regs, beside base's
        if (!xs && !ob && prof && p.variant == VREGS && mt == 1) return launch_regs_prof<R, 1>(prof, p, sms, s, grid, used, dry);
        if (!xs && !ob && prof && p.variant == VREGS && mt == 2) return launch_regs_prof<R, 2>(prof, p, sms, s, grid, used, dry);
        if (!xs && !ob && prof && p.variant == 1 && mt == 1) return launch_prof<R, 1, 1>(prof, p, sms, s, grid, used, dry);
        if (!xs && !ob && prof && p.variant == 1 && mt == 2) return launch_prof<R, 2, 1>(prof, p, sms, s, grid, used, dry);
        if (!xs && !ob && prof && p.variant == 3 && mt == 1) return launch_prof<R, 1, 3>(prof, p, sms, s, grid, used, dry);
        if (!xs && !ob && prof && p.variant == 3 && mt == 2) return launch_prof<R, 2, 3>(prof, p, sms, s, grid, used, dry);
      }
    }
    if constexpr (!R::BF16 && R::BULK) {
      if (!xs && !ob && !prof && p.variant == 3 && mt == 1) return launch_gemv<R, 1, false, false, false, 3>(p, sms, s, grid, used, dry);
      if (!xs && !ob && !prof && p.variant == 3 && mt == 2) return launch_gemv<R, 2, false, false, false, 3>(p, sms, s, grid, used, dry);
      if (!xs && !ob && !prof && p.variant == VREGS && mt == 1) return launch_regs<R, 1, false>(p, sms, s, grid, used, dry);
      if (!xs && !ob && !prof && p.variant == VREGS && mt == 2) return launch_regs<R, 2, false>(p, sms, s, grid, used, dry);
    }
    if constexpr (R::BF16 && R::XSPLIT && R::BULK) {  // f16 activations with x split: bulk at 2 and 4 tiles
      if (xs && !ob && !prof && p.variant == 3 && mt == 2) return launch_gemv<R, 2, false, true, false, 3>(p, sms, s, grid, used, dry);
      if (xs && !ob && !prof && p.variant == 3 && mt == 4) return launch_gemv<R, 4, false, true, false, 3>(p, sms, s, grid, used, dry);
    }
    return -1;
  }
  if constexpr (R::BF16) {
    if (!xs && ob && !prof && mt == 2) return launch_gemv<R, 2, true, false, false>(p, sms, s, grid, used, dry);
    if constexpr (R::XSPLIT) {
      if (xs && !ob && !prof && mt == 2) return launch_gemv<R, 2, false, true, false>(p, sms, s, grid, used, dry);
      if (xs && !ob && !prof && mt == 4) return launch_gemv<R, 4, false, true, false>(p, sms, s, grid, used, dry);
    }
  } else {
    if (!xs && !ob && !prof) {
      if (mt == 1) return launch_gemv<R, 1, false, false, false>(p, sms, s, grid, used, dry);
      if (mt == 2) return launch_gemv<R, 2, false, false, false>(p, sms, s, grid, used, dry);
    }
    if constexpr (R::PROF) {
      if (!xs && !ob && prof && mt == 1) return launch_prof<R, 1, 0>(prof, p, sms, s, grid, used, dry);
      if (!xs && !ob && prof && mt == 2) return launch_prof<R, 2, 0>(prof, p, sms, s, grid, used, dry);
    }
  }
  return -1;
}

template <class R>
int dequant_dispatch(bool ob, const DequantParams &p, int nblk, cudaStream_t s) {
  const dim3 grid(p.iters, nblk);
  DequantParams q = p;
  q.magic = R::MAGIC;
  if (ob == R::BF16) {
    lowbit_dequant_kernel<R, R::BF16><<<grid, THREADS, 0, s>>>(q);
    return (int)cudaGetLastError();
  }
  if constexpr (R::XSPLIT) {
    lowbit_dequant_kernel<R, false><<<grid, THREADS, 0, s>>>(q);
    return (int)cudaGetLastError();
  }
  return -1;
}

}  // namespace lowbit

#define LOWBIT_DEFINE(R)                                                                                      \
  int lowbit_gemv_##R(int mt, bool ob, bool xs, int prof, const lowbit::GemvParams &p, int sms, void *s,       \
                      int grid, int *used, bool dry) {                                                        \
    return lowbit::gemv_dispatch<lowbit::R>(mt, ob, xs, prof, p, sms, static_cast<cudaStream_t>(s), grid, used, \
                                            dry);                                                             \
  }                                                                                                           \
  int lowbit_dequant_##R(bool ob, const lowbit::DequantParams &p, int nblk, void *s) {                        \
    return lowbit::dequant_dispatch<lowbit::R>(ob, p, nblk, static_cast<cudaStream_t>(s));                    \
  }
