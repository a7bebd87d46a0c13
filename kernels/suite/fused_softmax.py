"""Row-wise fused softmax: one program per row, the whole row held in registers.

llm size: 8192 rows (tokens) x 8192 columns (e.g. attention scores of an 8192-token
prefill for one head, or a hidden-size-8192 row as in Llama-3-70B), float16.
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, nbytes

SHAPES = {"tiny": (6, 100), "llm": (8192, 8192)}


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y,
                    BLOCK: tl.constexpr, PROFILE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PROFILE:
        pl.enter_scope("load")
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    if PROFILE:
        pl.exit_scope("load")
        pl.enter_scope("compute")
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    if PROFILE:
        pl.exit_scope("compute")
        pl.enter_scope("store")
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, n = SHAPES[size]
    g = generator(device, seed)
    return {"x": randn((m, n), dtype=torch.float16, device=device, gen=g, scale=2.0)}


def run(inputs, instrument=False):
    x = inputs["x"]
    m, n = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    _softmax_kernel[(m,)](x, y, m, n, x.stride(0), y.stride(0), BLOCK=block,
                          PROFILE=profile_flag(instrument), num_warps=warps)
    return y


def reference(inputs):
    return torch.softmax(inputs["x"].to(torch.float32), dim=-1)


def flops_bytes(inputs):
    x = inputs["x"]
    return 4 * x.numel(), 2 * nbytes(x)


CASE = KernelCase(
    name="fused_softmax",
    description="row softmax, whole row in registers (fp16 in/out, fp32 math)",
    sizes={"tiny": "6 x 100 fp16", "llm": "8192 x 8192 fp16 (8192 tokens x 8192 = Llama-3-70B hidden)"},
    scopes=("load", "compute", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 2e-3, "rtol": 1e-2},
)
