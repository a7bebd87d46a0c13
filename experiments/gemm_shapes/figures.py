"""gemm_shapes: a roofline of cuBLAS on every model's layer shapes."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from harness.figures import comparison, figure, pivot_metric
from harness.specs import GpuSpec


def _table(df: pd.DataFrame) -> pd.DataFrame:
    d = df[df["impl"] == "cublas"]
    w = pivot_metric(d, "tflops", ["gpu", "model", "layer", "M", "K", "N", "weight_dtype"], columns="metric")
    w = w.join(pivot_metric(d, "bandwidth_tbs", ["gpu", "model", "layer", "M", "K", "N", "weight_dtype"],
                            columns="metric")).reset_index()
    w["intensity"] = 2 * w["M"] * w["K"] * w["N"] / (2 * (w["K"] * w["N"] + w["M"] * (w["K"] + w["N"])))
    return w


@figure("gemm_shapes_roofline", experiment="gemm_shapes",
        caption="cuBLAS on every model's linear-layer shapes. Lines: measured HBM read bandwidth (probe in "
                "the same jobs) times intensity, and the GPU card's dense f16 peak (datasheet, dashed; "
                "measured, dotted).")
def roofline(df):
    w = _table(df)
    if w.empty:
        return None
    gpus = sorted(set(w["gpu"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(7.5 * len(gpus), 5), squeeze=False)
    for ax, g in zip(axes[0], gpus):
        d = w[w["gpu"] == g].assign(M=lambda t: "M=" + t["M"].astype(str))
        sns.scatterplot(d, x="intensity", y="tflops", hue="M", style="weight_dtype", palette="deep",
                        ax=ax, s=30, legend="full")
        spec = GpuSpec.load(g)
        probe = df[(df["gpu"] == g) & (df["metric"] == "hbm_read_bw")]["value"]
        bw = probe.median() if len(probe) else (spec.bw_tbs if spec else None)
        xs = np.logspace(np.log10(max(d["intensity"].min() / 2, 0.1)), np.log10(d["intensity"].max() * 2), 100)
        if bw:
            ax.plot(xs, bw * xs, "k-", lw=1, label=f"HBM read {bw:.2f} TB/s x intensity")
        if spec and spec.f16_tflops:
            ax.axhline(spec.f16_tflops, color="k", ls="--", lw=1, label=f"f16 peak {spec.f16_tflops:g} TFLOP/s (datasheet)")
        if spec and spec.measured_f16_tflops:
            ax.axhline(spec.measured_f16_tflops, color="gray", ls=":", lw=1,
                       label=f"bf16 matmul {spec.measured_f16_tflops:g} TFLOP/s (measured)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(f"cuBLAS on {d['model'].nunique()} models' layer shapes ({g})")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
    return fig


@figure("gemm_shapes_bandwidth", experiment="gemm_shapes",
        caption="Achieved weight-streaming bandwidth of cuBLAS at M = 1 and 16 per model, every layer "
                "shape; the line is the HBM read bandwidth measured in the same jobs.")
def bandwidth(df):
    w = _table(df)
    w = w[w["M"] <= 16]
    if w.empty:
        return None
    fig, ax = plt.subplots(figsize=(11, 4))
    w = w.assign(shape=w["layer"] + " (" + w["weight_dtype"] + ")")
    sns.stripplot(w, x="model", y="bandwidth_tbs", hue="M", dodge=True, jitter=False, ax=ax, size=4)  # no random jitter: same bytes every build
    probe = df[df["metric"] == "hbm_read_bw"]["value"]
    if len(probe):
        ax.axhline(probe.median(), color="k", lw=1, label=f"HBM read probe {probe.median():.2f} TB/s")
    ax.set_ylabel("achieved TB/s (weights + activations)")
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=35)
    ax.legend(fontsize=8)
    ax.set_title("cuBLAS decode-sized GEMMs: bandwidth per model (all layer shapes, f16 and bf16)")
    return fig


@comparison(experiment="gemm_shapes")
def vs_design(df, paper_dir):
    """The cuBLAS timings DESIGN.md recorded on this project's H200, beside this run's."""
    path = Path(paper_dir) / "design_h200.csv"
    if not path.exists():
        return pd.DataFrame()
    ref = pd.read_csv(path)
    ref = ref[ref["impl"] == "cublas"]
    lat = df[df["metric"] == "latency_ms"]
    rows = []
    for r in ref.itertuples():
        ours = lat[(lat["M"] == r.M) & (lat["K"] == r.K) & (lat["N"] == r.N) & (lat["weight_dtype"] == r.weight_dtype)]
        rows.append({"M": r.M, "K": r.K, "N": r.N, "dtype": r.weight_dtype, "DESIGN.md H200 (ms)": r.latency_ms,
                     "ours (ms)": ours["value"].median() if len(ours) else None})
    return pd.DataFrame(rows)
