"""Low-memory (seeded) dropout: the keep mask is regenerated from (seed, element offset)
with Triton's Philox generator instead of being stored.

llm size: 8192 tokens x 8192 hidden fp16 activations (Llama-3-70B), p = 0.1.
The reference re-implements the Philox-4x32-10 stream in torch int64 arithmetic,
so it reproduces the kernel's mask bit for bit.
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, nbytes

SHAPES = {"tiny": (7, 300), "llm": (8192, 8192)}
BLOCK = 1024


@triton.jit
def _dropout_kernel(x_ptr, y_ptr, n, p, seed, BLOCK: tl.constexpr, PROFILE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if PROFILE:
        pl.enter_scope("load")
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if PROFILE:
        pl.exit_scope("load")
        pl.enter_scope("compute")
    r = tl.rand(seed, offs)
    keep = r > p
    y = tl.where(keep, x / (1 - p), 0.0)
    if PROFILE:
        pl.exit_scope("compute")
        pl.enter_scope("store")
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, n = SHAPES[size]
    g = generator(device, seed)
    return {"x": randn((m, n), dtype=torch.float16, device=device, gen=g),
            "p": 0.1, "seed": 1234 + int(seed)}


def run(inputs, instrument=False):
    x = inputs["x"].contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    _dropout_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, inputs["p"], inputs["seed"], BLOCK=BLOCK,
                                             PROFILE=profile_flag(instrument), num_warps=4)
    return y


_M32 = 0xFFFFFFFF


def _umulhi(a: torch.Tensor, b: int) -> torch.Tensor:
    # a, b < 2**32; the int64 product wraps mod 2**64 but bits 32..63 survive the shift + mask.
    return ((a * b) >> 32) & _M32


def philox_uniform(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """float32 U[0,1) exactly as tl.rand(seed, offsets) with int32 offsets (Philox 4x32, 10 rounds)."""
    c0 = offsets.to(torch.int64) & _M32
    c1 = torch.zeros_like(c0)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for _ in range(10):
        p0, p2 = c0, c2
        c0 = _umulhi(p2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = _umulhi(p0, 0xD2511F53) ^ c3 ^ k1
        c1 = (p2 * 0xCD9E8D57) & _M32
        c3 = (p0 * 0xD2511F53) & _M32
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    s = torch.where(c0 >= 2**31, c0 - 2**32, c0)  # bitcast to int32
    s = torch.where(s < 0, -s - 1, s).to(torch.int32)
    return s.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32, device=s.device)


def reference(inputs):
    x = inputs["x"].contiguous()
    p = inputs["p"]
    offs = torch.arange(x.numel(), device=x.device, dtype=torch.int64)
    keep = (philox_uniform(inputs["seed"], offs) > p).reshape(x.shape)
    return torch.where(keep, x.to(torch.float32) / (1 - p), 0.0)


def flops_bytes(inputs):
    x = inputs["x"]
    return 2 * x.numel(), 2 * nbytes(x)


CASE = KernelCase(
    name="low_memory_dropout",
    description="seeded dropout, mask regenerated from Philox (no mask tensor)",
    sizes={"tiny": "7 x 300 fp16", "llm": "8192 tokens x 8192 hidden fp16, p=0.1"},
    scopes=("load", "compute", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 2e-3, "rtol": 2e-3},
)
