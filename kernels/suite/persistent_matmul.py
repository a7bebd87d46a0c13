"""Persistent GEMM: one program per SM walks the output tiles (stride = number of programs).

llm size: M = 8192 tokens, K = 8192, N = 8192 fp16 (same problem as `matmul`).
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, profile_flag, interpreting
from . import matmul as _mm

SHAPES = _mm.SHAPES


def config():
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


def num_programs(device) -> int:
    if interpreting() or torch.device(device).type != "cuda":
        return 3
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _persistent_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              stride_cm, stride_cn, NUM_PROGS: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                              PROFILE: tl.constexpr):
    start = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_m * num_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_group = GROUP_M * num_n
    rk = tl.arange(0, BLOCK_K)
    for tile in range(start, num_tiles, NUM_PROGS):
        group = tile // per_group
        first_m = group * GROUP_M
        group_rows = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % group_rows
        pid_n = (tile % per_group) // group_rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if PROFILE:
            pl.enter_scope("mainloop")
        for k in range(0, k_tiles):
            kmask = rk < K - k * BLOCK_K
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
            b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        if PROFILE:
            pl.exit_scope("mainloop")
            pl.enter_scope("epilogue")
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
        if PROFILE:
            pl.exit_scope("epilogue")


def make_inputs(size, device, seed=0):
    return _mm.make_inputs(size, device, seed)


def run(inputs, instrument=False):
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    cfg = config()
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    progs = min(num_programs(a.device), tiles)
    _persistent_matmul_kernel[(progs,)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                        c.stride(0), c.stride(1), NUM_PROGS=progs,
                                        PROFILE=profile_flag(instrument), **cfg)
    return c


CASE = KernelCase(
    name="persistent_matmul",
    description="persistent fp16 GEMM, one program per SM looping over tiles",
    sizes=_mm.CASE.sizes,
    scopes=("mainloop", "epilogue"),
    make_inputs=make_inputs, run=run, reference=_mm.reference, flops_bytes=_mm.flops_bytes,
    tolerance=_mm.CASE.tolerance,
)
