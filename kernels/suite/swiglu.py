"""SwiGLU activation: y = silu(gate) * up, reading the fused gate_up projection output
([tokens, 2*I], gate in the first half as vLLM lays it out).

llm size: 8192 tokens x intermediate 14336 (Llama-3-8B / Mistral-7B), fp16.
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, nbytes

SHAPES = {"tiny": (9, 200), "llm": (8192, 14336)}  # (tokens, intermediate)
BLOCK_M, BLOCK_N = 4, 1024


@triton.jit
def _swiglu_kernel(gu_ptr, y_ptr, n_rows, n_cols, stride_gu, stride_y,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PROFILE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    base = gu_ptr + rows[:, None] * stride_gu + cols[None, :]
    if PROFILE:
        pl.enter_scope("load")
    g = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(base + n_cols, mask=mask, other=0.0).to(tl.float32)
    if PROFILE:
        pl.exit_scope("load")
        pl.enter_scope("compute")
    y = g * tl.sigmoid(g) * u
    if PROFILE:
        pl.exit_scope("compute")
        pl.enter_scope("store")
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, i = SHAPES[size]
    g = generator(device, seed)
    return {"gate_up": randn((m, 2 * i), dtype=torch.float16, device=device, gen=g, scale=2.0)}


def run(inputs, instrument=False):
    gu = inputs["gate_up"]
    m, n2 = gu.shape
    n = n2 // 2
    y = torch.empty((m, n), dtype=gu.dtype, device=gu.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _swiglu_kernel[grid](gu, y, m, n, gu.stride(0), y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         PROFILE=profile_flag(instrument), num_warps=4)
    return y


def reference(inputs):
    gu = inputs["gate_up"].to(torch.float32)
    g, u = gu.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


def flops_bytes(inputs):
    gu = inputs["gate_up"]
    return 3 * gu.numel(), nbytes(gu) + nbytes(gu) // 2


CASE = KernelCase(
    name="swiglu",
    description="silu(gate) * up over the fused gate_up activations",
    sizes={"tiny": "9 tokens x 200 intermediate fp16",
           "llm": "8192 tokens x 14336 intermediate fp16 (Llama-3-8B MLP)"},
    scopes=("load", "compute", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 1e-2, "rtol": 1e-2},
)
