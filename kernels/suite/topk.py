"""Row-wise top-k (values and indices) by k rounds of arg-max over a row held in registers,
as an MoE router does.

llm size: 8192 tokens x 128 experts router logits, k = 8 (Qwen3-30B-A3B), float32.
Output: a [2, rows, k] float32 tensor: the k largest values (descending) and the input
gathered at the returned indices, so that one comparison checks both.
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, nbytes

SHAPES = {"tiny": (6, 40, 4), "llm": (8192, 128, 8)}  # rows, cols, k
ROWS_PER_PROG = 4


@triton.jit
def _topk_kernel(x_ptr, val_ptr, idx_ptr, n_rows, n_cols, stride_x,
                 K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PROFILE: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols[None, :] < n_cols)
    if PROFILE:
        pl.enter_scope("load")
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    if PROFILE:
        pl.exit_scope("load")
        pl.enter_scope("compute")
    kk = tl.arange(0, BLOCK_K)
    vals = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    idxs = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)
    for j in tl.static_range(K):
        m = tl.max(x, axis=1)
        # smallest column holding the max
        cand = tl.where(x == m[:, None], cols[None, :], BLOCK_N)
        i = tl.min(cand, axis=1)
        vals = tl.where(kk[None, :] == j, m[:, None], vals)
        idxs = tl.where(kk[None, :] == j, i[:, None], idxs)
        x = tl.where(cols[None, :] == i[:, None], -float("inf"), x)
    if PROFILE:
        pl.exit_scope("compute")
        pl.enter_scope("store")
    omask = rmask[:, None] & (kk[None, :] < K)
    tl.store(val_ptr + rows[:, None] * K + kk[None, :], vals, mask=omask)
    tl.store(idx_ptr + rows[:, None] * K + kk[None, :], idxs, mask=omask)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    m, n, k = SHAPES[size]
    g = generator(device, seed)
    return {"x": randn((m, n), dtype=torch.float32, device=device, gen=g), "k": k}


def run(inputs, instrument=False):
    x = inputs["x"]
    k = inputs["k"]
    m, n = x.shape
    vals = torch.empty((m, k), dtype=torch.float32, device=x.device)
    idxs = torch.empty((m, k), dtype=torch.int32, device=x.device)
    _topk_kernel[(triton.cdiv(m, ROWS_PER_PROG),)](
        x, vals, idxs, m, n, x.stride(0), K=k, BLOCK_M=ROWS_PER_PROG,
        BLOCK_N=triton.next_power_of_2(n), BLOCK_K=triton.next_power_of_2(k),
        PROFILE=profile_flag(instrument), num_warps=4)
    gathered = torch.gather(x.to(torch.float32), 1, idxs.to(torch.int64))
    return torch.stack([vals, gathered])


def reference(inputs):
    v = torch.topk(inputs["x"].to(torch.float32), inputs["k"], dim=-1).values
    return torch.stack([v, v])


def flops_bytes(inputs):
    x = inputs["x"]
    k = inputs["k"]
    return 2 * k * x.numel(), nbytes(x) + 8 * x.shape[0] * k


CASE = KernelCase(
    name="topk",
    description="row top-k (values + indices) by k arg-max rounds, MoE-router style",
    sizes={"tiny": "6 x 40, k=4 fp32", "llm": "8192 tokens x 128 experts, k=8 fp32 (Qwen3-30B-A3B router)"},
    scopes=("load", "compute", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 0.0, "rtol": 0.0},
)
