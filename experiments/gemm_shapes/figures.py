"""gemm_shapes: a roofline of cuBLAS on every model's layer shapes."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from harness.figures import figure, finding, paper_dir, pivot_metric, span, table
from harness.specs import GpuSpec

IDX = ["gpu", "model", "layer", "M", "K", "N", "weight_dtype"]


def _table(df: pd.DataFrame) -> pd.DataFrame:
    d = df[(df["impl"] == "cublas") & (df["status"] == "ok")]
    w = pivot_metric(d, "tflops", IDX, columns="metric")
    w = w.join(pivot_metric(d, "bandwidth_tbs", IDX, columns="metric")).reset_index()
    w["intensity"] = 2 * w["M"] * w["K"] * w["N"] / (2 * (w["K"] * w["N"] + w["M"] * (w["K"] + w["N"])))
    return w


def _probe(df: pd.DataFrame, gpu: str | None = None) -> float | None:
    p = df[(df["metric"] == "hbm_read_bw") & (df["status"] == "ok")]
    if gpu:
        p = p[p["gpu"] == gpu]
    return float(p["value"].median()) if len(p) else None


@figure("gemm_shapes_roofline", experiment="gemm_shapes",
        caption="cuBLAS on every model's linear-layer shapes. Lines: the HBM read bandwidth measured in the same "
                "jobs times intensity, the GPU card's dense f16 peak (datasheet, dashed) and its measured bf16 "
                "matmul throughput (dotted).")
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
        bw = _probe(df, g)
        xs = np.logspace(np.log10(max(d["intensity"].min() / 2, 0.1)), np.log10(d["intensity"].max() * 2), 100)
        if bw:
            ax.plot(xs, bw * xs, "k-", lw=1, label=f"HBM read {bw:.2f} TB/s (measured) x intensity")
        elif spec and spec.hbm_bw_tbs:
            ax.plot(xs, spec.hbm_bw_tbs * xs, "k-", lw=1, label=f"HBM {spec.hbm_bw_tbs:g} TB/s (datasheet) x intensity")
        if spec and spec.f16_tflops:
            ax.axhline(spec.f16_tflops, color="k", ls="--", lw=1, label=f"f16 peak {spec.f16_tflops:g} TFLOP/s (datasheet)")
        if spec and spec.measured_f16_tflops:
            ax.axhline(spec.measured_f16_tflops, color="gray", ls=":", lw=1,
                       label=f"bf16 matmul {spec.measured_f16_tflops:g} TFLOP/s (measured)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(f"cuBLAS on {d['model'].nunique()} models' layer shapes ({g.upper()})")
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
    w = w.assign(M=w["M"].astype(str))
    sns.stripplot(w, x="model", y="bandwidth_tbs", hue="M", dodge=True, jitter=False, ax=ax, size=4)  # no random jitter
    bw = _probe(df)
    if bw:
        ax.axhline(bw, color="k", lw=1, label=f"HBM read probe {bw:.2f} TB/s")
    ax.set_ylabel("achieved TB/s (weights + activations)")
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=35)
    ax.legend(fontsize=8, title=None)
    ax.set_title("cuBLAS decode-sized GEMMs: bandwidth per model (all layer shapes, f16 and bf16)")
    return fig


@table("Our earlier H200 cuBLAS timings (results/paper/design_h200.csv, not a paper's numbers) beside this run, "
       "one row per model card with that shape", experiment="gemm_shapes")
def vs_earlier(df):
    path = paper_dir(df) / "design_h200.csv"
    if not path.exists():
        return pd.DataFrame()
    ref = pd.read_csv(path)
    ref = ref[ref["impl"] == "cublas"]
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok") & (df["impl"] == "cublas")]
    rows = []
    for r in ref.itertuples():
        ours = lat[(lat["M"] == r.M) & (lat["K"] == r.K) & (lat["N"] == r.N) & (lat["weight_dtype"] == r.weight_dtype)]
        if ours.empty:
            rows.append({"M": r.M, "K": r.K, "N": r.N, "dtype": r.weight_dtype, "earlier H200 ms": r.latency_ms,
                         "model card (layer)": "not in this sweep", "this run ms": None})
        for o in ours.sort_values(["model", "layer"]).itertuples():
            rows.append({"M": r.M, "K": r.K, "N": r.N, "dtype": r.weight_dtype, "earlier H200 ms": r.latency_ms,
                         "model card (layer)": f"{o.model} ({o.layer})", "this run ms": o.value})
    return pd.DataFrame(rows)


@finding(experiment="gemm_shapes")
def findings(df):
    w = _table(df)
    out = []
    bw = _probe(df)
    small = w[w["M"] <= 16]
    if bw and len(small):
        frac = small["bandwidth_tbs"] / bw
        out.append(f"At M = 1 and 16, cuBLAS streams {span(100 * frac, 0)}% of the measured HBM read bandwidth "
                   f"({bw:.2f} TB/s), median {100 * frac.median():.0f}%, over {small['layer'].nunique()} layer kinds "
                   f"of {small['model'].nunique()} model cards (f16 and bf16).")
    big = w[w["M"] >= 2048]
    if len(big):
        spec = GpuSpec.load(sorted(set(big["gpu"]))[0])
        s = f"At M = 2048 it reaches {span(big['tflops'], 0)} TFLOP/s"
        if spec and spec.measured_f16_tflops:
            s += f" ({span(100 * big['tflops'] / spec.measured_f16_tflops, 0)}% of the card's measured bf16 matmul throughput)"
        out.append(s + ".")
    return out
