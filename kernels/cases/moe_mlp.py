"""gpt-oss style MoE MLP of Proton's Figs. 9 and 10, and its tensor-/expert-parallel shard.

One step, as the CGO'26 artifact's bench_mlp.py runs it with triton_kernels' matmul_ogs:
  router   logits = x_bf16 @ wg^T (cuBLAS, in a Proton scope carrying its flops), top-k, softmax over the k
  route    (token, slot) pairs sorted by expert on the GPU, cut into BLOCK_M-row tiles (`route`)
  matmul 1 gathered token rows @ w1[e]^T, SwiGLU fused in the epilogue (gpt-oss's: interleaved gate/linear
           columns, alpha 1.702, clamp 7), stored in x's dtype (fp8: the next matmul's input)
  matmul 2 those rows @ w2[e]^T, scaled by the routing weight and scattered to (token, slot) rows
  combine  sum over the k slots (bf16 out)
Both grouped matmuls are one Triton kernel, `moe_matmul`: our stand-in for matmul_ogs (OpenAI's
triton_kernels is not on PyPI - the `triton-kernels` name there is another project - and is not on the
GPU machine). Its launch metadata gives Proton the useful flops (2 x routed rows x N x K) and bytes
(activations + the weights of the experts that received rows + outputs).

Weights are fp8 e4m3 (or f16) with one f32 scale per matrix; expert e's weights come from a generator
seeded by (seed, e), so any process can rebuild any expert (the TP x EP shards and the reference).
A shard (tp, ep) of a TP x EP split holds experts [ep E/EP, (ep+1) E/EP) and the tp-th slice of the
intermediate dimension; its step gives a partial output that sums (all-reduce) to the full MLP.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DTYPES = {"fp8": torch.float8_e4m3fn, "f16": torch.float16}
OUT_DTYPES = {"fp8": torch.bfloat16, "f16": torch.float16}
ALPHA, LIMIT = 1.702, 7.0          # gpt-oss SwiGLU


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class MoeShape:
    hidden: int = 5760          # gpt-oss hidden size (K of matmul 1, N of matmul 2)
    intermediate: int = 2880    # per-expert intermediate size (SwiGLU output; matmul 1 has 2x columns)
    experts: int = 128
    topk: int = 4

    def tokens(self, per_expert: int) -> int:
        """Tokens in a batch that gives each expert `per_expert` routed rows on average."""
        return per_expert * self.experts // self.topk


GPT_OSS = MoeShape()
TINY = MoeShape(hidden=64, intermediate=32, experts=8, topk=2)


def config(rows_per_expert: float, dtype: str) -> dict:
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)
    bk = 128 if dtype == "fp8" else 64
    if rows_per_expert <= 64:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=bk, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, num_warps=8, num_stages=3)


def _moe_metadata(grid, metadata, args):
    x, w, y = args["x_ptr"], args["w_ptr"], args["y_ptr"]
    rows, N, K = args["src_ptr"].shape[0], args["N"], args["K"]
    n_out = N // 2 if args["SWIGLU"] else N
    x_rows = x.shape[0] if args["GATHER"] else rows           # gathered: every token row read once
    w_bytes = args["N_EXPTS_HIT"] * N * K * w.element_size()
    name = "moe_matmul" + ("_swiglu" if args["SWIGLU"] else "") + ("_scatter" if args["SCATTER"] else "")
    return {"name": f"{name} [rows={rows}, N={N}, K={K}]", f"flops{8 * x.element_size()}": 2.0 * rows * N * K,
            "bytes": x_rows * K * x.element_size() + w_bytes + rows * n_out * y.element_size()}


@triton.jit(launch_metadata=_moe_metadata, do_not_specialize=["N_EXPTS_HIT"])
def moe_matmul(x_ptr, w_ptr, y_ptr, src_ptr, dst_ptr, tiles_ptr, gate_ptr, scale, N, K,
               stride_xm, stride_we, stride_wn, stride_ym, N_EXPTS_HIT,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GATHER: tl.constexpr, SCATTER: tl.constexpr, SWIGLU: tl.constexpr,
               ALPHA_: tl.constexpr, LIMIT_: tl.constexpr):
    """y[rows of tile] = act(x[rows] @ w[e]^T * scale) (* gate) for one (row tile, column tile).
    tiles_ptr: [tiles, 3] = expert, first sorted row, rows (0: an unused tile of the upper-bound grid)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tiles_ptr + pid_m * 3)
    start = tl.load(tiles_ptr + pid_m * 3 + 1)
    rows = tl.load(tiles_ptr + pid_m * 3 + 2)
    if rows > 0:
        rr = tl.arange(0, BLOCK_M)
        rmask = rr < rows
        if GATHER:
            xrow = tl.load(src_ptr + start + rr, mask=rmask, other=0)
        else:
            xrow = tl.where(rmask, start + rr, 0)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        wn = tl.where(rn < N, rn, 0)
        rk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + xrow[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w_ptrs = w_ptr + e.to(tl.int64) * stride_we + wn[None, :].to(tl.int64) * stride_wn + rk[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            kmask = rk < K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=kmask[:, None], other=0.0)
            acc = tl.dot(a, b, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        acc = acc * scale
        if SWIGLU:          # columns interleave (gate, linear) pairs, as gpt-oss's w1
            gate, lin = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
            gate = tl.minimum(gate, LIMIT_)
            lin = tl.minimum(tl.maximum(lin, -LIMIT_), LIMIT_)
            out = gate * tl.sigmoid(ALPHA_ * gate) * (lin + 1.0)
            cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            ncols = N // 2
        else:
            out = acc
            cols = rn
            ncols = N
        if SCATTER:
            orow = tl.load(dst_ptr + start + rr, mask=rmask, other=0)
            out = out * tl.load(gate_ptr + orow, mask=rmask, other=0.0)[:, None]
        else:
            orow = start + rr
        tl.store(y_ptr + orow[:, None].to(tl.int64) * stride_ym + cols[None, :], out.to(y_ptr.dtype.element_ty),
                 mask=rmask[:, None] & (cols[None, :] < ncols))


@dataclass
class Routing:
    src: torch.Tensor        # [R] token of each sorted row
    dst: torch.Tensor        # [R] flat (token * topk + slot) index of each sorted row
    tiles: torch.Tensor      # [tiles, 3] int32: local expert, first sorted row, rows
    counts: torch.Tensor     # [local experts] rows per expert
    rows: int                # R (host value)
    hits: int                # local experts with at least one row (host value)


def route(expert_ids: torch.Tensor, first: int, n_local: int, block_m: int) -> Routing:
    """Sort the (token, slot) pairs routed to experts [first, first + n_local) by expert and cut them into
    block_m-row tiles, on the device. The tile table has an upper-bound length (cdiv(R, block_m) + n_local)
    so that its size needs no host round trip; unused tiles have 0 rows. One host sync reads R and hits."""
    t, topk = expert_ids.shape
    flat = expert_ids.reshape(-1).to(torch.int64) - first
    local = (flat >= 0) & (flat < n_local)
    key = torch.where(local, flat, n_local)
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=n_local + 1)[:n_local]
    rows, hits = (int(v) for v in torch.stack([counts.sum(), (counts > 0).sum()]).tolist())
    order = order[:rows]
    src = (order // topk).to(torch.int32)
    dst = order.to(torch.int32)
    per = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(per, 0)
    row_start = torch.cumsum(counts, 0) - counts
    n_tiles = triton.cdiv(max(rows, 1), block_m) + n_local
    tid = torch.arange(n_tiles, device=expert_ids.device)
    e = torch.searchsorted(tile_end, tid, right=True)
    ec = e.clamp(max=n_local - 1)
    j = tid - (tile_end[ec] - per[ec])
    nrows = (counts[ec] - j * block_m).clamp(0, block_m) * (e < n_local)
    tiles = torch.stack([ec, row_start[ec] + j * block_m, nrows], 1).to(torch.int32).contiguous()
    return Routing(src, dst, tiles, counts, rows, hits)


def grouped_matmul(x, w, r: Routing, scale: float, cfg: dict, out_rows: int, out_dtype, *, gather=False,
                   scatter=False, swiglu=False, gate=None, out=None) -> torch.Tensor:
    """One launch of moe_matmul: x [rows or tokens, K], w [experts, N, K] -> y [out_rows, N (/2 with swiglu)]."""
    E, N, K = w.shape
    n_out = N // 2 if swiglu else N
    y = out if out is not None else torch.empty((out_rows, n_out), dtype=out_dtype, device=x.device)
    grid = (r.tiles.shape[0], triton.cdiv(N, cfg["BLOCK_N"]))
    moe_matmul[grid](x, w, y, r.src, r.dst, r.tiles, gate if gate is not None else y, float(scale), N, K,
                     x.stride(0), w.stride(0), w.stride(1), y.stride(0), r.hits,
                     BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GATHER=gather,
                     SCATTER=scatter, SWIGLU=swiglu, ALPHA_=ALPHA, LIMIT_=LIMIT, num_warps=cfg["num_warps"],
                     num_stages=cfg["num_stages"])
    return y


# ---- inputs ------------------------------------------------------------------------------------------
def _gen(device, seed: int) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    return g


def expert_weights(shape: MoeShape, e: int, dtype: str, device, seed: int):
    """Full (w1 [2I, H], w2 [H, I]) of expert e in `dtype`, entries ~N(0, 1) (scales applied in the kernel)."""
    g = _gen(device, seed * 100003 + 7919 * (e + 1))
    w1 = torch.randn((2 * shape.intermediate, shape.hidden), generator=g, device=device).to(DTYPES[dtype])
    w2 = torch.randn((shape.hidden, shape.intermediate), generator=g, device=device).to(DTYPES[dtype])
    return w1, w2


def make_weights(shape: MoeShape, dtype: str, device, seed: int = 0, tp: int = 1, tp_rank: int = 0, ep: int = 1,
                 ep_rank: int = 0) -> dict:
    """Router weights (the same in every rank) and this rank's expert weight shard."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not in {sorted(DTYPES)}")
    if shape.experts % ep or shape.intermediate % tp:
        raise ValueError(f"TP={tp} x EP={ep} does not divide experts={shape.experts} / intermediate={shape.intermediate}")
    g = _gen(device, seed)
    wg = (torch.randn((shape.experts, shape.hidden), generator=g, device=device) * shape.hidden ** -0.5)
    n_local = shape.experts // ep
    i_loc = shape.intermediate // tp
    w1 = torch.empty((n_local, 2 * i_loc, shape.hidden), dtype=DTYPES[dtype], device=device)
    w2 = torch.empty((n_local, shape.hidden, i_loc), dtype=DTYPES[dtype], device=device)
    for j in range(n_local):
        f1, f2 = expert_weights(shape, ep_rank * n_local + j, dtype, device, seed)
        w1[j] = f1[2 * i_loc * tp_rank: 2 * i_loc * (tp_rank + 1)]       # whole (gate, linear) pairs
        w2[j] = f2[:, i_loc * tp_rank: i_loc * (tp_rank + 1)]
    return {"shape": shape, "dtype": dtype, "seed": seed, "wg": wg.to(torch.bfloat16), "w1": w1, "w2": w2,
            "s1": shape.hidden ** -0.5, "s2": shape.intermediate ** -0.5, "first_expert": ep_rank * n_local,
            "tp": tp, "ep": ep}


def make_inputs(weights: dict, per_expert: int, seed: int = 0) -> dict:
    """A batch of shape.tokens(per_expert) random tokens (the same in every rank) with the weights."""
    shape, dtype = weights["shape"], weights["dtype"]
    device = weights["w1"].device
    g = _gen(device, seed * 7 + 1 + per_expert)
    x = torch.randn((shape.tokens(per_expert), shape.hidden), generator=g, device=device).to(DTYPES[dtype])
    return {**weights, "per_expert": per_expert, "x": x, "xg": x.to(torch.bfloat16)}


def router(inputs: dict):
    """Top-k experts and their softmax weights, the router matmul in a Proton scope with its flops."""
    import triton.profiler as proton
    xg, wg = inputs["xg"], inputs["wg"]
    T, H = xg.shape
    E = wg.shape[0]
    with proton.scope(f"router_matmul [T={T}, E={E}, K={H}]",
                      {"flops16": 2.0 * T * E * H, "bytes": 2 * (T * H + E * H + T * E)}):
        logits = xg @ wg.T
    vals, ids = torch.topk(logits.float(), inputs["shape"].topk, dim=-1)
    return ids, torch.softmax(vals, dim=-1)


def forward(inputs: dict, cfg: dict | None = None) -> torch.Tensor:
    """One MLP step of this shard: [T, hidden] partial output (the full output when TP = EP = 1)."""
    shape = inputs["shape"]
    cfg = cfg or config(inputs["per_expert"], inputs["dtype"])
    ids, gates = router(inputs)
    w1, w2 = inputs["w1"], inputs["w2"]
    r = route(ids, inputs["first_expert"], w1.shape[0], cfg["BLOCK_M"])
    T, k = ids.shape
    h = grouped_matmul(inputs["x"], w1, r, inputs["s1"], cfg, r.rows, inputs["x"].dtype, gather=True, swiglu=True)
    alloc = torch.empty if r.rows == T * k else torch.zeros      # slots routed to other ranks stay zero
    y = alloc((T * k, shape.hidden), dtype=OUT_DTYPES[inputs["dtype"]], device=h.device)
    grouped_matmul(h, w2, r, inputs["s2"], cfg, T * k, y.dtype, scatter=True, gate=gates.reshape(-1), out=y)
    return y.view(T, k, shape.hidden).sum(1)


def reference(inputs: dict) -> torch.Tensor:
    """The full MLP (every expert, every column) from rebuilt expert weights: float64 for f16, float32 for
    fp8; the intermediate is rounded to the activation dtype as the kernel stores it."""
    shape, dtype = inputs["shape"], inputs["dtype"]
    rt = torch.float32 if dtype == "fp8" else torch.float64
    x = inputs["x"]
    ids, gates = router(inputs)             # the same routing decision as the step (bf16 logits, torch)
    gates = gates.to(rt)
    T = x.shape[0]
    out = torch.zeros((T, shape.hidden), dtype=rt, device=x.device)
    flat = ids.reshape(-1)
    tok = torch.arange(flat.numel(), device=x.device) // shape.topk
    for e in range(shape.experts):
        sel = (flat == e).nonzero().flatten()
        if not sel.numel():
            continue
        w1, w2 = expert_weights(shape, e, dtype, x.device, inputs["seed"])
        hh = (x[tok[sel]].to(rt) @ w1.to(rt).T) * inputs["s1"]
        gate, lin = hh[:, 0::2], hh[:, 1::2]
        gate = gate.clamp(max=LIMIT)
        lin = lin.clamp(-LIMIT, LIMIT)
        hh = (gate * torch.sigmoid(ALPHA * gate) * (lin + 1)).to(x.dtype).to(rt)
        yy = (hh @ w2.to(rt).T) * inputs["s2"] * gates.reshape(-1)[sel][:, None]
        out.index_add_(0, tok[sel], yy)
    return out


def flops(shape: MoeShape, routed_rows: int, tp: int = 1) -> float:
    """Useful flops of the two expert matmuls for `routed_rows` (token, slot) rows on one TP shard."""
    i = shape.intermediate // tp
    return 2.0 * routed_rows * shape.hidden * 2 * i + 2.0 * routed_rows * i * shape.hidden
