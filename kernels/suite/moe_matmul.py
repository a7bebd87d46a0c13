"""MoE grouped matmul with gather / scatter (stands in for gpt-oss's matmul_ogs):
out[t * topk + s] = x[t] @ w[expert[t, s]]. Routing is done with the inputs: the (token, slot)
pairs are sorted by expert and cut into BLOCK_M-row tiles; each program gathers its tile's
token rows, multiplies by its expert's weight tile and scatters the rows back.

llm size: gpt-oss-20b MoE up-projection: 8192 tokens, 32 experts, top-4, hidden 2880 ->
gate_up 5760 (fp16).
"""
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, interpreting, nbytes

SHAPES = {"tiny": dict(tokens=20, experts=4, topk=2, k=32, n=48),
          "llm": dict(tokens=8192, experts=32, topk=4, k=2880, n=5760)}


def config():
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)


@triton.jit
def _moe_matmul_kernel(x_ptr, w_ptr, out_ptr, src_ptr, dst_ptr, tiles_ptr, N, K,
                       stride_xm, stride_we, stride_wk, stride_wn, stride_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PROFILE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PROFILE:
        pl.enter_scope("gather")
    e = tl.load(tiles_ptr + pid_m * 3)
    start = tl.load(tiles_ptr + pid_m * 3 + 1)
    rows = tl.load(tiles_ptr + pid_m * 3 + 2)
    rr = tl.arange(0, BLOCK_M)
    rmask = rr < rows
    src = tl.load(src_ptr + start + rr, mask=rmask, other=0)
    dst = tl.load(dst_ptr + start + rr, mask=rmask, other=0)
    if PROFILE:
        pl.exit_scope("gather")
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + src[:, None].to(tl.int64) * stride_xm + rk[None, :]
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + rk[:, None] * stride_wk + rn[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PROFILE:
        pl.enter_scope("mainloop")
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = rk < K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if PROFILE:
        pl.exit_scope("mainloop")
        pl.enter_scope("scatter")
    o_ptrs = out_ptr + dst[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & (rn[None, :] < N))
    if PROFILE:
        pl.exit_scope("scatter")


def route(expert_ids: torch.Tensor, num_experts: int, block_m: int):
    """(src token per sorted row, dst output row per sorted row, tile table [tiles, 3] = expert, start, rows)."""
    t, topk = expert_ids.shape
    flat = expert_ids.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    src = (order // topk).to(torch.int32)
    dst = order.to(torch.int32)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    tiles, start = [], 0
    for e, c in enumerate(counts):
        for s in range(0, c, block_m):
            tiles.append([e, start + s, min(block_m, c - s)])
        start += c
    return src, dst, torch.tensor(tiles, dtype=torch.int32, device=expert_ids.device)


def make_inputs(size, device, seed=0):
    check_size(size)
    s = SHAPES[size]
    g = generator(device, seed)
    x = randn((s["tokens"], s["k"]), dtype=torch.float16, device=device, gen=g)
    w = randn((s["experts"], s["k"], s["n"]), dtype=torch.float16, device=device, gen=g, scale=s["k"] ** -0.5)
    scores = torch.rand((s["tokens"], s["experts"]), generator=g, device=device)
    expert_ids = torch.topk(scores, s["topk"], dim=-1).indices.to(torch.int32)
    cfg = config()
    src, dst, tiles = route(expert_ids, s["experts"], cfg["BLOCK_M"])
    return {"x": x, "w": w, "expert_ids": expert_ids, "src": src, "dst": dst, "tiles": tiles,
            "block_m": cfg["BLOCK_M"]}


def run(inputs, instrument=False):
    cfg = config()
    if cfg["BLOCK_M"] != inputs["block_m"]:
        raise ValueError("inputs were routed for another BLOCK_M (interpreter vs GPU)")
    x, w = inputs["x"], inputs["w"]
    t, k = x.shape
    n = w.shape[2]
    rows = inputs["expert_ids"].numel()
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    grid = (inputs["tiles"].shape[0], triton.cdiv(n, cfg["BLOCK_N"]))
    _moe_matmul_kernel[grid](x, w, out, inputs["src"], inputs["dst"], inputs["tiles"], n, k,
                             x.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
                             PROFILE=profile_flag(instrument), **cfg)
    return out


def reference(inputs):
    x = inputs["x"].to(torch.float32)
    w = inputs["w"]
    ids = inputs["expert_ids"].reshape(-1).to(torch.int64)
    topk = inputs["expert_ids"].shape[1]
    tok = torch.arange(ids.numel(), device=ids.device) // topk
    out = torch.empty((ids.numel(), w.shape[2]), dtype=torch.float32, device=x.device)
    for e in range(w.shape[0]):
        sel = (ids == e).nonzero().flatten()
        if sel.numel():
            out[sel] = x[tok[sel]] @ w[e].to(torch.float32)
    return out


def flops_bytes(inputs):
    rows = inputs["expert_ids"].numel()
    k, n = inputs["w"].shape[1:]
    return 2 * rows * k * n, nbytes(inputs["x"], inputs["w"]) + 2 * rows * n


CASE = KernelCase(
    name="moe_matmul",
    description="MoE grouped matmul with gathered token rows and scattered outputs (matmul_ogs stand-in)",
    sizes={"tiny": "20 tokens, 4 experts, top-2, K=32, N=48 fp16",
           "llm": "gpt-oss-20b MoE gate_up: 8192 tokens, 32 experts, top-4, K=2880, N=5760 fp16"},
    scopes=("gather", "mainloop", "scatter"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 2e-2, "rtol": 1e-2},
)
