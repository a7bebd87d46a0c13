"""Proton Fig. 10: imbalance between ranks of TP x EP splits of the MoE MLP (one Proton profile per rank)."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd

from harness.figures import figure, table

METRICS = [("tflops_imbalance", "TFLOP/s imbalance (the artifact's)"),
           ("flop_imbalance", "FLOP imbalance"),
           ("compute_time_imbalance", "kernel-time imbalance (without NCCL)")]


def _split(params: str) -> tuple:
    p = json.loads(params) if params else {}
    return p.get("tp"), p.get("ep"), p.get("per_expert")


def splits(df: pd.DataFrame) -> pd.DataFrame:
    d = df.copy()
    parsed = pd.DataFrame(d["params"].fillna("").map(_split).tolist(), index=d.index,
                          columns=["tp", "ep", "per_expert"])
    d[["tp", "ep", "per_expert"]] = parsed
    d["split"] = "TP=" + d["tp"].astype(str) + ", EP=" + d["ep"].astype(str)
    return d


@figure("proton_fig10", experiment="proton_fig10",
        caption="Imbalance between the ranks of each TP x EP split (1 - min/max over ranks) against routed tokens "
                "per expert, from one Proton profile per rank: left as the artifact plots it (per-rank TFLOP/s), "
                "then the useful FLOPs and the kernel time without NCCL. Expert parallelism splits tokens by "
                "routing, so its ranks get unequal work; tensor parallelism splits every matmul evenly.")
def fig10(df):
    d = splits(df[(df["status"] == "ok")])
    if d.empty:
        return None
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4), squeeze=False)
    for ax, (m, label) in zip(axes[0], METRICS):
        sub = d[d["metric"] == m]
        for (gpu, split), g in sub.groupby(["gpu", "split"]):
            g = g.sort_values("per_expert")
            ax.plot(g["per_expert"], g["value"], "o-", label=f"{split} ({gpu})")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("routed tokens per expert")
        ax.set_ylabel(label)
        ax.grid(True, ls=":", lw=0.5)
        ax.legend(fontsize=7)
    return fig


@table("TP x EP splits: what ran and what needs more GPUs", experiment="proton_fig10")
def split_status(df):
    d = splits(df).drop_duplicates("point_hash")
    return (d.groupby(["gpu", "split", "status", "error"], dropna=False).size().rename("points").reset_index())


@table("TP x EP splits: per-rank numbers", experiment="proton_fig10")
def per_rank(df):
    d = splits(df[(df["status"] == "ok") & df["metric"].str.startswith("rank")])
    if d.empty:
        return d
    d[["rank", "what"]] = d["metric"].str.split("/", n=1, expand=True)
    return d.pivot_table(index=["gpu", "split", "per_expert", "rank"], columns="what", values="value").reset_index()
