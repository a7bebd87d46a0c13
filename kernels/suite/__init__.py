"""Instrumented Triton kernel suite (Proton's Fig. 15 kernels), pure compute.

SUITE maps a kernel name to its KernelCase (see _common.KernelCase). Each kernel takes a
`PROFILE: tl.constexpr`; run(inputs, instrument=True) sets it (never under TRITON_INTERPRET=1),
which opens Proton scopes (triton.profiler.language.enter_scope/exit_scope) around its phases.
"""
from ._common import KernelCase, SIZES, compare, interpreting, profile_flag
from . import (fused_softmax, grouped_gemm, layer_norm, low_memory_dropout, matmul, swiglu, topk,
               persistent_matmul, moe_matmul, fused_attention)

SUITE: dict = {m.CASE.name: m.CASE for m in (
    fused_softmax, grouped_gemm, layer_norm, low_memory_dropout, matmul, swiglu, topk,
    persistent_matmul, moe_matmul, fused_attention)}

__all__ = ["SUITE", "KernelCase", "SIZES", "compare", "interpreting", "profile_flag"]
