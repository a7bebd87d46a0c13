"""Where the profilers' overhead comes from: overhead against the workload's kernel-launch rate,
finalize/export time, and the slowdown a profiler leaves behind (proton_overhead_sweep rows)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from experiments.proton_fig13.figures import COLORS, label
from harness.figures import figure, table

EXP = "proton_overhead_sweep"
KEY = ["gpu", "model", "workload", "batch", "seq_len"]


def wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point): overhead, finalize, residual, baseline, plus the group's launch rate
    (kernels per second of the unprofiled region, counted in the group's Proton tree)."""
    d = df[(df["experiment"] == EXP) & (df["status"] == "ok")]
    if d.empty:
        return pd.DataFrame()
    w = d.pivot_table(index=KEY + ["profiler"], columns="metric", values="value").reset_index()
    rate = w[w["profiler"].str.startswith("proton")].groupby(KEY)["launches_per_s"].max() \
        if "launches_per_s" in w else pd.Series(dtype=float)
    w = w.drop(columns=[c for c in ("launches_per_s",) if c in w]).merge(
        rate.rename("launches_per_s").reset_index(), on=KEY, how="left")
    w["shape"] = "B" + w["batch"].astype(int).astype(str) + " x S" + w["seq_len"].astype(int).astype(str)
    w["label"] = w["model"].map(label)
    return w


@figure("proton_overhead_sweep", experiment=EXP,
        caption="Overhead (profiled / unprofiled region) against the unprofiled region's kernel-launch rate, "
                "LoRA training over batch x sequence length, two models. Launch-bound steps (many short kernels) "
                "are where a per-launch cost shows; GPU-bound steps hide it.")
def overhead_vs_rate(df):
    w = wide(df)
    if w.empty or "launches_per_s" not in w or w["launches_per_s"].isna().all():
        return None
    w = w[w["profiler"] != "none"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = dict(zip(sorted(w["label"].unique()), "osD^v"))
    for (prof, lab), g in w.groupby(["profiler", "label"]):
        g = g.sort_values("launches_per_s")
        ax.plot(g["launches_per_s"], g["overhead"], marker=markers[lab], color=COLORS.get(prof, "0.4"),
                label=f"{prof}, {lab}")
        for _, r in g.iterrows():
            ax.annotate(r["shape"], (r["launches_per_s"], r["overhead"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("kernel launches per second (unprofiled region)")
    ax.set_ylabel("profiled / unprofiled time")
    ax.legend(fontsize=7)
    ax.set_title("Profiler overhead vs launch rate")
    return fig


@figure("proton_overhead_breakdown", experiment=EXP,
        caption="Where each profiler's cost goes, per configuration: (left) extra time inside the region "
                "(overhead - 1), (middle) finalize/export after the region, as a fraction of the unprofiled "
                "region, (right) slowdown of the same region timed again unprofiled after the profiler "
                "finalized (residual_slowdown - 1).")
def breakdown(df):
    w = wide(df)
    if w.empty:
        return None
    w = w.assign(**{"in region": w["overhead"] - 1,
                    "finalize / region": w.get("finalize_s", np.nan) / w["baseline_region_s"],
                    "left behind": w.get("residual_slowdown", np.nan) - 1})
    w["config"] = w["label"] + "\n" + w["shape"]
    parts = ["in region", "finalize / region", "left behind"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharey=False)
    order = list(dict.fromkeys(w.sort_values(["label", "batch", "seq_len"])["config"]))
    hues = [p for p in ("none", "proton", "proton_python", "torch", "nsys") if p in set(w["profiler"])]
    for ax, part in zip(axes, parts):
        d = w[w["profiler"] != "none"] if part == "finalize / region" else w
        sns.barplot(d, x="config", y=part, hue="profiler", order=order,
                    hue_order=[h for h in hues if h in set(d["profiler"])], palette=COLORS, ax=ax)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("")
        ax.tick_params(axis="x", labelsize=6, rotation=45)
        ax.set_title(part)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@table("Overhead, launch rate and finalize time per configuration", experiment=EXP)
def summary(df):
    w = wide(df)
    cols = [c for c in ("overhead", "baseline_cv", "launches_per_s", "start_s", "finalize_s", "residual_slowdown",
                        "profile_bytes", "unit_s") if c in w]
    return w[["label", "shape", "profiler"] + cols].sort_values(["label", "shape", "profiler"])
