// Instantiations of the fused prefill kernel (native/include/lowbit_fused.cuh) for the recipes of parts 4 and 5
// (native/include/lowbit_recipes.cuh), each in its own tensor-core dtype.
#include "lowbit_fused.cuh"
#include "lowbit_recipes.cuh"

LOWBIT_RECIPES_PART4(LOWBIT_FUSED_DEFINE)
LOWBIT_RECIPES_PART5(LOWBIT_FUSED_DEFINE)
