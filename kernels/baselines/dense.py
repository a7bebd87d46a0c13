"""``cublas``: torch.matmul on the dense f16/bf16 weight (cuBLAS on a GPU): the speedup reference.

Beside a low-bit precision the harness runs it on the dense weight of the same shape in the
activation dtype (``dense=True``: it takes a [K, N] tensor, not a QuantizedWeight)."""
import torch

from kernels.baselines._common import act_dtype_of, check_x
from kernels.baselines.registry import register


def supports(case):
    if act_dtype_of(case.weight) is None:
        return f"{case.weight}: cublas runs dense f16/bf16 weights only"
    if act_dtype_of(case.act) != act_dtype_of(case.weight):
        return f"cublas multiplies {case.weight} weights by {case.weight} activations, not {case.act}"
    return None


@register("cublas", supports=supports, tolerance=None, dense=True)
def prepare_cublas(w, act_dtype, **hints):
    act = act_dtype_of(act_dtype)
    K = w.shape[0]

    def run(x):
        check_x(x, act, K)
        return torch.matmul(x, w)

    run.config = "torch.matmul"
    return run
