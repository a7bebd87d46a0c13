"""Tiled GEMM C = A @ B (fp16 in, fp32 accumulate, fp16 out) with grouped tile ordering for L2 reuse.

llm size: M = 8192 tokens, K = 8192, N = 8192 (Llama-3-70B attention output projection).
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, interpreting, nbytes

SHAPES = {"tiny": (40, 48, 64), "llm": (8192, 8192, 8192)}  # M, N, K


def config():
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PROFILE: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PROFILE:
        pl.enter_scope("loop")
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = rk < K - k * BLOCK_K
        if PROFILE:
            pl.enter_scope("load")
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
        if PROFILE:
            pl.exit_scope("load")
            pl.enter_scope("dot")
        acc = tl.dot(a, b, acc)
        if PROFILE:
            pl.exit_scope("dot")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if PROFILE:
        pl.exit_scope("loop")
        pl.enter_scope("store")
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, n, k = SHAPES[size]
    g = generator(device, seed)
    return {"a": randn((m, k), dtype=torch.float16, device=device, gen=g),
            "b": randn((k, n), dtype=torch.float16, device=device, gen=g, scale=k ** -0.5)}


def run(inputs, instrument=False):
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    cfg = config()
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1), PROFILE=profile_flag(instrument), **cfg)
    return c


def reference(inputs):
    return inputs["a"].to(torch.float32) @ inputs["b"].to(torch.float32)


def flops_bytes(inputs):
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.shape[1]
    return 2 * m * n * k, nbytes(a, b) + 2 * m * n


CASE = KernelCase(
    name="matmul",
    description="tiled fp16 GEMM, fp32 accumulate, grouped tile order",
    sizes={"tiny": "M=40 N=48 K=64 fp16", "llm": "M=8192 tokens, K=8192, N=8192 fp16 (Llama-3-70B o_proj)"},
    scopes=("loop", "load", "dot", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 2e-2, "rtol": 1e-2},
)
