"""Our native CUDA low-bit kernels (native/lowbit.py), registered as `native`."""
from kernels.baselines.registry import register
from native import lowbit

register("native", supports=lowbit.supports, tolerance=lowbit.TOLERANCE)(lowbit.prepare)
