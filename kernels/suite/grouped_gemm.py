"""Grouped GEMM: several independent GEMMs of different shapes in one launch. Operands live in
flat buffers; a per-group table (M, N, K, offsets) and a per-tile table (group, tile_m, tile_n),
both built with the inputs, tell each program what to compute.

llm size: the four linear layers of one Llama-3-8B decoder layer for 8192 tokens:
qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096 (fp16).
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, interpreting, nbytes

SHAPES = {  # list of (M, N, K)
    "tiny": [(24, 32, 48), (16, 40, 32), (40, 16, 16)],
    "llm": [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336)],
}


def config():
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, meta_ptr, tiles_ptr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROFILE: tl.constexpr):
    pid = tl.program_id(0)
    if PROFILE:
        pl.enter_scope("setup")
    g = tl.load(tiles_ptr + pid * 3)
    tm = tl.load(tiles_ptr + pid * 3 + 1)
    tn = tl.load(tiles_ptr + pid * 3 + 2)
    M = tl.load(meta_ptr + g * 6)
    N = tl.load(meta_ptr + g * 6 + 1)
    K = tl.load(meta_ptr + g * 6 + 2)
    a_off = tl.load(meta_ptr + g * 6 + 3)
    b_off = tl.load(meta_ptr + g * 6 + 4)
    c_off = tl.load(meta_ptr + g * 6 + 5)
    if PROFILE:
        pl.exit_scope("setup")
    rm = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_off + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + b_off + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PROFILE:
        pl.enter_scope("mainloop")
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = rk < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * N
    if PROFILE:
        pl.exit_scope("mainloop")
        pl.enter_scope("store")
    c_ptrs = c_ptr + c_off + rm[:, None] * N + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
    if PROFILE:
        pl.exit_scope("store")


def _tables(shapes, block_m, block_n, device):
    meta, tiles = [], []
    a_off = b_off = c_off = 0
    for gi, (m, n, k) in enumerate(shapes):
        meta.append([m, n, k, a_off, b_off, c_off])
        a_off += m * k
        b_off += k * n
        c_off += m * n
        for tm in range(triton.cdiv(m, block_m)):
            for tn in range(triton.cdiv(n, block_n)):
                tiles.append([gi, tm, tn])
    return (torch.tensor(meta, dtype=torch.int64, device=device),
            torch.tensor(tiles, dtype=torch.int32, device=device), (a_off, b_off, c_off))


def make_inputs(size, device, seed=0):
    check_size(size)
    shapes = SHAPES[size]
    g = generator(device, seed)
    cfg = config()
    meta, tiles, (na, nb, nc) = _tables(shapes, cfg["BLOCK_M"], cfg["BLOCK_N"], device)
    a = randn((na,), dtype=torch.float16, device=device, gen=g)
    b_parts = [randn((k * n,), dtype=torch.float16, device=device, gen=g, scale=k ** -0.5) for (m, n, k) in shapes]
    return {"a": a, "b": torch.cat(b_parts), "meta": meta, "tiles": tiles, "shapes": list(shapes),
            "c_numel": nc, "block_m": cfg["BLOCK_M"], "block_n": cfg["BLOCK_N"]}


def run(inputs, instrument=False):
    cfg = config()
    if (cfg["BLOCK_M"], cfg["BLOCK_N"]) != (inputs["block_m"], inputs["block_n"]):
        raise ValueError("inputs were built for another tile size (interpreter vs GPU)")
    a = inputs["a"]
    c = torch.empty((inputs["c_numel"],), dtype=a.dtype, device=a.device)
    grid = (inputs["tiles"].shape[0],)
    _grouped_gemm_kernel[grid](a, inputs["b"], c, inputs["meta"], inputs["tiles"],
                               PROFILE=profile_flag(instrument), **cfg)
    return c


def reference(inputs):
    outs = []
    ao = bo = 0
    for (m, n, k) in inputs["shapes"]:
        a = inputs["a"][ao:ao + m * k].view(m, k).to(torch.float32)
        b = inputs["b"][bo:bo + k * n].view(k, n).to(torch.float32)
        outs.append((a @ b).reshape(-1))
        ao += m * k
        bo += k * n
    return torch.cat(outs)


def flops_bytes(inputs):
    flops = sum(2 * m * n * k for (m, n, k) in inputs["shapes"])
    return flops, nbytes(inputs["a"], inputs["b"]) + 2 * inputs["c_numel"]


CASE = KernelCase(
    name="grouped_gemm",
    description="grouped fp16 GEMM over a table of (M, N, K) problems in one launch",
    sizes={"tiny": "3 groups: (24,32,48) (16,40,32) (40,16,16) as (M,N,K)",
           "llm": "Llama-3-8B layer, 8192 tokens: qkv (N=6144,K=4096), o (4096,4096), gate_up (28672,4096), "
                  "down (4096,14336)"},
    scopes=("setup", "mainloop", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 2e-2, "rtol": 1e-2},
)
