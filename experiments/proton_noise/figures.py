"""Where the noise of proton_fig13's unprofiled baseline comes from: across- and within-process spread
of the same LLM region, with the host's counters, for CPU pinning and gc.freeze (proton_noise rows),
and the same counters over every proton_fig13 point."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from harness.figures import figure, finding, table

EXP = "proton_noise"
COUNTERS = ["baseline_cv", "baseline_unit_cv", "baseline_gc_frac", "baseline_nivcsw_per_s", "baseline_minflt_per_s",
            "baseline_steal_frac", "baseline_cpu_frac", "baseline_region_s", "region_units"]


def variant(params: str) -> str:
    p = json.loads(params)
    pin = f"pinned to {p['pin_cpus']} CPUs" if p.get("pin_cpus") else "not pinned"
    return f"{pin}, {'gc.freeze' if p.get('gc_freeze') else 'gc as is'}"


def wide(df: pd.DataFrame) -> pd.DataFrame:
    d = df[(df["experiment"] == EXP) & (df["status"] == "ok") & (df["profiler"] == "none")]
    if d.empty:
        return pd.DataFrame()
    d = d.assign(variant=d["params"].map(variant))
    w = d.pivot_table(index=["model", "workload", "variant"], columns="metric", values="value").reset_index()
    return w


@figure("proton_noise", experiment=EXP,
        caption="Spread of the unprofiled LLM region (tinyllama shape, 4 layers, proton_fig13's workloads): "
                "across processes (coefficient of variation of the baselines of 4 processes) and within one "
                "process (of the region's units), with and without CPU pinning and gc.freeze(). Across-process "
                "spread is several times the within-process spread, and neither knob brings it to 2%.")
def noise(df):
    w = wide(df)
    if w.empty:
        return None
    long = w.melt(id_vars=["workload", "variant"], value_vars=["baseline_cv", "baseline_unit_cv"],
                  var_name="spread", value_name="cv")
    long["spread"] = long["spread"].map({"baseline_cv": "across processes", "baseline_unit_cv": "within a process (units)"})
    wls = sorted(long["workload"].unique())      # one panel per workload in the rows (the default runs train only)
    fig, axes = plt.subplots(1, len(wls), figsize=(5.5 * len(wls), 4), sharey=True, squeeze=False)
    for ax, (wl, g) in zip(axes[0], long.groupby("workload")):
        sns.barplot(g, x="variant", y="cv", hue="spread", ax=ax)
        ax.axhline(0.02, color="k", lw=0.8, ls="--")
        ax.set_title(f"{wl}: unprofiled region spread (dashed: 2% target)")
        ax.set_xlabel("")
        ax.set_ylabel("coefficient of variation")
        ax.tick_params(axis="x", labelsize=7, rotation=15)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@table("Host counters over the unprofiled region (per process of the control)", experiment=EXP)
def counters(df):
    w = wide(df)
    return w[["workload", "variant"] + [c for c in COUNTERS if c in w]].sort_values(["workload", "variant"])


@finding(experiment=EXP)
def said(df):
    w = wide(df)
    if w.empty:
        return []
    out = []
    for wl, g in w.groupby("workload"):
        out.append(f"{wl}: across-process spread {g['baseline_cv'].min():.1%}-{g['baseline_cv'].max():.1%} over the "
                   f"{len(g)} variants, within-process spread of units {g['baseline_unit_cv'].min():.1%}-"
                   f"{g['baseline_unit_cv'].max():.1%}; garbage collection took at most "
                   f"{g['baseline_gc_frac'].max():.2%} of the region, involuntary context switches at most "
                   f"{g['baseline_nivcsw_per_s'].max():.0f}/s, hypervisor steal at most {g['baseline_steal_frac'].max():.3f} "
                   f"CPU-seconds per second")
    return out
