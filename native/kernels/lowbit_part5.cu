// Instantiations of the native low-bit kernels for the recipes of part 5 (native/include/lowbit_recipes.cuh);
// the recipes are spread over several translation units so that the build runs in parallel.
#include "lowbit_launch.cuh"

LOWBIT_RECIPES_PART5(LOWBIT_DEFINE)
