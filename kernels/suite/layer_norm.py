"""LayerNorm forward (with weight and bias), one program per row.

llm size: 8192 tokens x hidden 8192 (Llama-3-70B hidden size), float16, eps 1e-5.
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, nbytes

SHAPES = {"tiny": (5, 96), "llm": (8192, 8192)}
EPS = 1e-5


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, stride, eps,
                       BLOCK: tl.constexpr, PROFILE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PROFILE:
        pl.enter_scope("load")
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if PROFILE:
        pl.exit_scope("load")
        pl.enter_scope("compute")
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd * w + b
    if PROFILE:
        pl.exit_scope("compute")
        pl.enter_scope("store")
    tl.store(y_ptr + row * stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, n = SHAPES[size]
    g = generator(device, seed)
    return {
        "x": randn((m, n), dtype=torch.float16, device=device, gen=g, scale=1.5, shift=0.3),
        "weight": randn((n,), dtype=torch.float16, device=device, gen=g, scale=0.2, shift=1.0),
        "bias": randn((n,), dtype=torch.float16, device=device, gen=g, scale=0.1),
        "eps": EPS,
    }


def run(inputs, instrument=False):
    x = inputs["x"]
    m, n = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    _layer_norm_kernel[(m,)](x, inputs["weight"], inputs["bias"], y, n, x.stride(0), inputs["eps"],
                             BLOCK=block, PROFILE=profile_flag(instrument), num_warps=warps)
    return y


def reference(inputs):
    x = inputs["x"].to(torch.float32)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), inputs["weight"].float(),
                                          inputs["bias"].float(), inputs["eps"])


def flops_bytes(inputs):
    x = inputs["x"]
    return 8 * x.numel(), 2 * nbytes(x) + nbytes(inputs["weight"], inputs["bias"])


CASE = KernelCase(
    name="layer_norm",
    description="LayerNorm forward with affine weight/bias (fp16 in/out, fp32 statistics)",
    sizes={"tiny": "5 x 96 fp16", "llm": "8192 tokens x 8192 hidden fp16 (Llama-3-70B)"},
    scopes=("load", "compute", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 1e-2, "rtol": 1e-2},
)
