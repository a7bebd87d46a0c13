// lowbit_params.h -- launch parameters and host entry points of the native low-bit kernels
// (plain C++: included by the CUDA sources and by bindings.cpp).
#pragma once
#include <cstdint>

namespace lowbit {

struct GemvParams {
  const void *wq;          // [nblocks][iters][WARPS][BITS][32 lanes] x 16 bytes (native/lowbit_layout.py)
  const void *sc;          // [nblocks][WARPS][ngroups][SB bytes] scales (+ zero points)
  const uint32_t *stab;    // [iters]: first group | groups in stage << 16 | flush mask << 20
  const void *x;           // [MX][K] activations (f16 / bf16; with xsplit bf16 hi rows then lo rows)
  void *y;                 // [M][N] output (activation dtype)
  float *y32;              // [M][Npad] f32 workspace, all zero between launches
  int *counters;           // [nblocks], all zero between launches
  int M, MX, K, N, Npad, iters, nblocks, ngroups, slots;  // slots: scale groups staged per warp (1 or 4)
  uint32_t *prof;          // instrumentation buffer (instrumented instantiations only)
  uint32_t prof_cap;
  uint32_t magic;          // the recipe's MAGIC (set by the launcher)
  int variant;             // decode-kernel variant (lowbit_kernel.cuh: 0 base, 1 lean, 2 lean3); read by the host
};

struct DequantParams {
  const void *wq;
  const void *scales;      // [ngroups][N] activation dtype (QuantizedWeight layout)
  const void *zeros;       // same (uint formats) or nullptr
  void *out;               // [(nb1 - nb0) * 256][K] activation dtype: W^T rows of n-blocks nb0..nb1-1
  int K, N, iters, nb0, group;  // group: k per scale group (K for per channel)
  uint32_t magic;          // the recipe's MAGIC (set by the launcher)
};

struct FusedParams {      // the fused prefill kernel (lowbit_fused.cuh)
  const void *wq;          // the packed words (as GemvParams::wq)
  const void *sc;          // the packed scales (as GemvParams::sc)
  const void *xp;          // x as the kernel's ring-slot images, 128 rows x 128 k each (wide: 256 x 64), zero past K and M (native_lowbit_xperm)
  void *y;                 // [M][N] output, row-major (activation dtype)
  int M, N, Kpad, iters, nblocks, ngroups, group;  // iters: the layout's stages; group: k per group (Kpad per channel)
  int build;               // G (32-k chunks per wgmma group) | DIAG << 4 | OPT << 8 (lowbit_fused.cuh): 0 = the build's default
  uint32_t magic;          // the recipe's MAGIC (set by the launcher)
};
// the m-tile (rows of one x image) of a FusedParams::build: 256 for the wide build (OPT bit 1), else 128
inline int fused_bm(int build) { return (build >> 8) & 2 ? 256 : 128; }

}  // namespace lowbit

// Host entry points (native/kernels/lowbit_dispatch.cu). Return 0, a cudaError_t, or -1 when the
// recipe / variant combination was not built. `recipe` is e.g. "f16_u4" (native/lowbit_layout.py).
int native_lowbit_gemv(const char *recipe, int mt, int out_bf16, int xsplit, int prof, const lowbit::GemvParams *p,
                       int sms, void *stream, int grid, int *grid_used);
// the grid native_lowbit_gemv would launch (only M, MX, slots, iters, nblocks, ngroups of *p are read); -1: none
int native_lowbit_gemv_grid(const char *recipe, int mt, int out_bf16, int xsplit, int prof, const lowbit::GemvParams *p,
                            int sms, int grid);
int native_lowbit_dequant(const char *recipe, int out_bf16, const lowbit::DequantParams *p, int nblk, void *stream);
int native_lowbit_xsplit(const void *x, void *out, int n_elem, void *stream);
// the fused prefill kernel (native/kernels/lowbit_fused.cu): -1 where it is not built for the recipe in that dtype;
// p == nullptr: 0 where it is built (nothing launched)
int native_lowbit_fused(const char *recipe, int out_bf16, const lowbit::FusedParams *p, void *stream);
// bm: the m-tile of the build (128, or 256 for the wide build, FusedParams::build >> 8 & 2); -1 for another
int native_lowbit_xperm(const void *x, void *xp, int M, int Mp, int K, int Kpad, int bm, void *stream);
int native_lowbit_smem_bytes(const char *recipe, int MX, int slots, int iters);
