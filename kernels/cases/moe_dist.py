"""One TP x EP split of the MoE MLP over the GPUs of one host, one Proton profile per rank (Proton Fig. 10).

    torchrun --standalone --nproc-per-node=<TP*EP> -m kernels.cases.moe_dist --tp 1 --ep 2 \
        --dtype fp8 --per-expert 16 256 --out DIR

Rank r is (tp_rank = r % TP, ep_rank = r // TP), as in the artifact. Every rank holds the whole batch
(the same seed) and the router; it keeps the (token, slot) pairs routed to its experts, multiplies by
its slice of the intermediate dimension, and the partial outputs are summed with an all-reduce. Before
timing, rank 0 checks the reduced output against the float reference. Then each rank runs `--iters`
steps (MLP + all-reduce) inside its own Proton session (`DIR/rank<r>_pe<per_expert>.hatchet`) and the
ranks' summaries (useful flops, all-kernel time, time without NCCL kernels, routed rows) are written by
rank 0 to DIR/summary.json. On CPU processes (gloo) the same runs through the Triton interpreter
without Proton (for checking the split only).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from . import moe_mlp as mm
from . import proton_tree as pt


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(o).all():
        return float("inf")
    return (torch.linalg.norm(o - r) / (torch.linalg.norm(r) or 1.0)).item()


def step(inputs: dict) -> torch.Tensor:
    out = mm.forward(inputs).float()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--dtype", default="fp8", choices=sorted(mm.DTYPES))
    ap.add_argument("--per-expert", type=int, nargs="+", required=True)
    ap.add_argument("--hidden", type=int, default=mm.GPT_OSS.hidden)
    ap.add_argument("--intermediate", type=int, default=mm.GPT_OSS.intermediate)
    ap.add_argument("--experts", type=int, default=mm.GPT_OSS.experts)
    ap.add_argument("--topk", type=int, default=mm.GPT_OSS.topk)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != a.tp * a.ep:
        raise SystemExit(f"world size {world} != TP {a.tp} x EP {a.ep}")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = mm.MoeShape(a.hidden, a.intermediate, a.experts, a.topk)
    tp_rank, ep_rank = rank % a.tp, rank // a.tp
    weights = mm.make_weights(shape, a.dtype, dev, a.seed, a.tp, tp_rank, a.ep, ep_rank)
    mine = []
    for pe in a.per_expert:
        inputs = mm.make_inputs(weights, pe, a.seed)
        out = step(inputs)
        err = _rel_err(out, mm.reference(inputs)) if rank == 0 else None
        ids, _ = mm.router(inputs)
        n_local = weights["w1"].shape[0]
        first = weights["first_expert"]
        rows = int(((ids >= first) & (ids < first + n_local)).sum())
        rec = {"rank": rank, "tp_rank": tp_rank, "ep_rank": ep_rank, "per_expert": pe, "rows": rows,
               "tokens": int(inputs["x"].shape[0]), "analytic_flops": mm.flops(shape, rows, a.tp), "rel_err": err}
        if cuda:
            import triton.profiler as proton
            step(inputs)                                       # warm (compiled by the check)
            torch.cuda.synchronize()
            dist.barrier()
            stem = out_dir / f"rank{rank}_pe{pe}"
            proton.start(str(stem), hook="triton")
            for _ in range(a.iters):
                step(inputs)
            torch.cuda.synchronize()
            proton.finalize()
            prof = pt.load(stem.with_suffix(".hatchet"))
            s = pt.summarize(prof, useful="matmul", exclude_time=("nccl", "ncclDevKernel"))
            rec.update(iters=a.iters, flops=s["flops"] / a.iters, bytes=s["bytes"] / a.iters,
                       time_ms=s["time_ns"] / a.iters / 1e6, compute_ms=s["compute_ns"] / a.iters / 1e6,
                       profile=stem.with_suffix(".hatchet").name,
                       profile_bytes=os.path.getsize(stem.with_suffix(".hatchet")))
        mine.append(rec)
        del inputs
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    summary = {"tp": a.tp, "ep": a.ep, "dtype": a.dtype, "world": world, "device": str(dev.type),
               "ranks": [r for per_rank in gathered for r in per_rank]}
    if rank == 0:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
