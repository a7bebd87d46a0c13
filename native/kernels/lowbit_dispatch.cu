// Host entry points of the native low-bit kernels: recipe name -> the instantiations in lowbit_part*.cu.
#include <cstring>
#include <cuda_runtime.h>
#include "lowbit_common.cuh"
#include "lowbit_kernel.cuh"
#include "lowbit_params.h"
#include "lowbit_recipes.cuh"

// the recipes this build dispatches to (native/build.py build_tune compiles only LOWBIT_RECIPES_TUNED)
#ifndef LOWBIT_DISPATCH_LIST
#define LOWBIT_DISPATCH_LIST LOWBIT_RECIPES
#endif

#define LOWBIT_DECLARE(R)                                                                                  \
  int lowbit_gemv_##R(int mt, bool ob, bool xs, int prof, const lowbit::GemvParams &p, int sms, void *s,    \
                      int grid, int *used, bool dry);                                                      \
  int lowbit_dequant_##R(bool ob, const lowbit::DequantParams &p, int nblk, void *s);
LOWBIT_DISPATCH_LIST(LOWBIT_DECLARE)

namespace {
struct Entry {
  const char *name;
  int bits;
  bool zero;
  int (*gemv)(int, bool, bool, int, const lowbit::GemvParams &, int, void *, int, int *, bool);
  int (*dequant)(bool, const lowbit::DequantParams &, int, void *);
};
#define LOWBIT_ENTRY(R) {lowbit::R::NAME, lowbit::R::BITS, lowbit::R::ZERO, &lowbit_gemv_##R, &lowbit_dequant_##R},
const Entry kEntries[] = {LOWBIT_DISPATCH_LIST(LOWBIT_ENTRY)};

const Entry *find(const char *name) {
  for (const Entry &e : kEntries)
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}
}  // namespace

int native_lowbit_gemv(const char *recipe, int mt, int out_bf16, int xsplit, int prof, const lowbit::GemvParams *p,
                       int sms, void *stream, int grid, int *grid_used) {
  const Entry *e = find(recipe);
  if (prof && !instr::capacity_ok(p->prof_cap)) return (int)cudaErrorInvalidValue;
  return e ? e->gemv(mt, out_bf16 != 0, xsplit != 0, prof, *p, sms, stream, grid, grid_used, false) : -1;
}

int native_lowbit_gemv_grid(const char *recipe, int mt, int out_bf16, int xsplit, int prof,
                            const lowbit::GemvParams *p, int sms, int grid) {
  const Entry *e = find(recipe);
  int used = 0;
  const int err = e ? e->gemv(mt, out_bf16 != 0, xsplit != 0, prof, *p, sms, nullptr, grid, &used, true) : -1;
  return err ? -1 : used;
}

int native_lowbit_dequant(const char *recipe, int out_bf16, const lowbit::DequantParams *p, int nblk, void *stream) {
  const Entry *e = find(recipe);
  return e ? e->dequant(out_bf16 != 0, *p, nblk, stream) : -1;
}

int native_lowbit_smem_bytes(const char *recipe, int MX, int slots, int iters) {
  const Entry *e = find(recipe);
  return e ? lowbit::gemv_smem_bytes(e->bits, e->zero, MX, slots, iters) : -1;
}

int native_lowbit_xsplit(const void *x, void *out, int n_elem, void *stream) {
  const int blocks = (n_elem + lowbit::THREADS - 1) / lowbit::THREADS;
  lowbit::xsplit_kernel<<<blocks, lowbit::THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __half *>(x), static_cast<__nv_bfloat16 *>(out), n_elem);
  return (int)cudaGetLastError();
}
