// Instantiations of the fused prefill kernel (native/include/lowbit_fused.cuh) for the recipes of parts 6 and 7
// (native/include/lowbit_recipes.cuh), each in its own tensor-core dtype.
#include "lowbit_fused.cuh"
#include "lowbit_recipes.cuh"

LOWBIT_RECIPES_PART6(LOWBIT_FUSED_DEFINE)
LOWBIT_RECIPES_PART7(LOWBIT_FUSED_DEFINE)
