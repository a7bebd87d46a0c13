// Host entry points of the fused prefill kernel (native/include/lowbit_fused.cuh): recipe name -> the instantiation
// in lowbit_fused_part*.cu, built for each recipe in its own tensor-core dtype (no x split).
#include <cstring>
#include <cuda_runtime.h>
#include "lowbit_fused.cuh"
#include "lowbit_recipes.cuh"

#ifndef LOWBIT_DISPATCH_LIST
#define LOWBIT_DISPATCH_LIST LOWBIT_RECIPES
#endif

#define LOWBIT_FUSED_DECLARE(R) int lowbit_fused_##R(const lowbit::FusedParams &p, void *s);
LOWBIT_DISPATCH_LIST(LOWBIT_FUSED_DECLARE)

namespace {
struct FusedEntry {
  const char *name;
  bool bf16;
  int (*fn)(const lowbit::FusedParams &, void *);
};
#define LOWBIT_FUSED_ENTRY(R) {lowbit::R::NAME, lowbit::R::BF16, &lowbit_fused_##R},
const FusedEntry kFused[] = {LOWBIT_DISPATCH_LIST(LOWBIT_FUSED_ENTRY)};
}  // namespace

int native_lowbit_fused(const char *recipe, int out_bf16, const lowbit::FusedParams *p, void *stream) {
  for (const FusedEntry &e : kFused)
    if (std::strcmp(e.name, recipe) == 0) {
      if (e.bf16 != (out_bf16 != 0)) return -1;
      return p ? e.fn(*p, stream) : 0;  // p == nullptr: only whether it is built
    }
  return -1;
}

int native_lowbit_xperm(const void *x, void *xp, int M, int Mp, int K, int Kpad, int bm, void *stream) {
  if (bm != lowbit::fused::BM && bm != lowbit::fused::WBM) return -1;
  const int fk = bm == lowbit::fused::WBM ? lowbit::fused::WFK : lowbit::fused::FK;
  const long long n = (long long)Mp * (Kpad / lowbit::KG);
  const int blocks = (int)((n + lowbit::THREADS - 1) / lowbit::THREADS);
  if (blocks > 0)
    lowbit::lowbit_xperm_kernel<<<blocks, lowbit::THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint32_t *>(x), static_cast<uint32_t *>(xp), M, Mp, K, Kpad, bm, fk);
  return (int)cudaGetLastError();
}
