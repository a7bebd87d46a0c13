// Instantiations of the fused prefill kernel (native/include/lowbit_fused.cuh) for the recipes of parts 2 and 3
// (native/include/lowbit_recipes.cuh), each in its own tensor-core dtype.
#include "lowbit_fused.cuh"
#include "lowbit_recipes.cuh"

LOWBIT_RECIPES_PART2(LOWBIT_FUSED_DEFINE)
LOWBIT_RECIPES_PART3(LOWBIT_FUSED_DEFINE)
