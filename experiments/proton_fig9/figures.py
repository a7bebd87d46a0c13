"""Proton Fig. 9: the gpt-oss MoE MLP on a roofline measured on the same GPU."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.figures import figure, table
from harness.specs import GpuSpec


def _pe(params: str) -> float:
    return float(json.loads(params).get("per_expert", np.nan)) if params else np.nan


def points(df: pd.DataFrame) -> pd.DataFrame:
    d = df[(df["status"] == "ok") & (df["workload"] == "moe_mlp")].copy()
    if d.empty:
        return d
    d["per_expert"] = d["params"].fillna("").map(_pe)
    return d.pivot_table(index=["gpu", "weight_dtype", "per_expert"], columns="metric", values="value").reset_index()


def roofs(df: pd.DataFrame) -> pd.DataFrame:
    p = df[(df["impl"] == "probe") & (df["status"] == "ok")]
    return p.pivot_table(index="gpu", columns="metric", values="value", aggfunc="median")


def knee(intensity: np.ndarray, x: np.ndarray, tbs: float, tflops: float) -> float:
    """Tokens per expert where the bandwidth roof meets the compute roof (interpolated in log x)."""
    k = tflops / tbs                                   # FLOP/byte at the knee
    if not len(x) or k <= intensity.min() or k >= intensity.max():
        return float("nan")
    return float(np.exp(np.interp(k, intensity, np.log(x))))


@figure("proton_fig9", experiment="proton_fig9",
        caption="TFLOP/s of one MoE MLP step (useful matmul flops from Proton's launch metadata over the CUPTI "
                "time of every kernel in the step) against routed tokens per expert. Orange: the roofline measured "
                "on this GPU (dashed: memset bandwidth x the step's arithmetic intensity; dotted: cuBLAS at "
                "8192^3 in the same dtype); grey: datasheet peaks. The grouped matmul is ours, standing in for "
                "triton_kernels' matmul_ogs.")
def fig9(df):
    d = points(df)
    r = roofs(df)
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (gpu, dt), g in d.groupby(["gpu", "weight_dtype"]):
        g = g.sort_values("per_expert")
        x, inten = g["per_expert"].to_numpy(), g["intensity"].to_numpy()
        ax.plot(x, g["tflops"], "o-", label=f"MLP step, {dt} ({gpu})")
        if "matmul_tflops" in g:
            ax.plot(x, g["matmul_tflops"], "s:", ms=3, color="tab:green", alpha=0.8, label=f"grouped matmuls only, {dt}")
        if gpu in r.index:
            bw, peak = r.loc[gpu].get("memset_tbs"), r.loc[gpu].get(f"cublas_{dt}_tflops")
            if bw and peak:
                ax.plot(x, np.minimum(inten * bw, peak), "--", color="#f68b56",
                        label=f"roof: memset {bw:.2f} TB/s, cuBLAS {dt} {peak:.0f} TFLOP/s")
                kx = knee(inten, x, bw, peak)
                if kx == kx:
                    ax.axvline(kx, color="#f68b56", lw=0.8, ls=":")
                    ax.annotate(f"knee ~{kx:.0f}", (kx, peak * 0.5), fontsize=7, color="#f68b56")
        spec = GpuSpec.load(gpu)
        if spec and spec.hbm_bw_tbs and spec.f16_tflops:
            pk = spec.f16_tflops * (2 if dt == "fp8" else 1)
            ax.plot(x, np.minimum(inten * spec.hbm_bw_tbs, pk), "--", color="0.6", lw=0.8,
                    label=f"datasheet {spec.hbm_bw_tbs} TB/s, {pk:.0f} TFLOP/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routed tokens per expert")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, ls=":", lw=0.5)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("gpt-oss-x2 MoE MLP roofline (hidden 5760, 128 experts, top-4)")
    return fig


@table("MoE MLP: roofline numbers per point", experiment="proton_fig9")
def mlp_table(df):
    d = points(df)
    if d.empty:
        return d
    r = roofs(df)
    cols = [c for c in ["gpu", "weight_dtype", "per_expert", "tflops", "matmul_tflops", "tbs", "intensity",
                        "step_ms", "matmul_ms", "routed_rows", "experts_hit", "rel_err", "profile_bytes"] if c in d]
    d = d[cols].copy()
    for gpu in d["gpu"].unique():
        if gpu in r.index and "memset_tbs" in r.columns:
            m = d["gpu"] == gpu
            peak = d.loc[m, "weight_dtype"].map(lambda t: r.loc[gpu].get(f"cublas_{t}_tflops", np.nan))
            roof = np.minimum(d.loc[m, "intensity"] * r.loc[gpu]["memset_tbs"], peak)
            d.loc[m, "of_roof"] = d.loc[m, "tflops"] / roof
    return d


@table("MoE MLP: roofs measured on the GPU", experiment="proton_fig9")
def roof_table(df):
    return roofs(df).reset_index()
