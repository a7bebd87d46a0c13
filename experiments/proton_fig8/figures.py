"""Proton Fig. 8: matmul variants' TFLOP/s from Proton profiles, and the loop-flattening diff of two profiles."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from harness.figures import figure, table

ORDER = ["cublas", "naive", "persistent", "tma", "tma_persistent", "tma_ws", "tma_persistent_ws"]


def _flatten(params: str) -> bool:
    return bool(json.loads(params).get("flatten")) if params else False


def tflops(df: pd.DataFrame) -> pd.DataFrame:
    d = df[(df["metric"] == "tflops") & (df["status"] == "ok")].copy()
    d["flatten"] = d["params"].fillna("").map(_flatten)
    return d


@figure("proton_fig8", experiment="proton_fig8",
        caption="Achieved TFLOP/s of each matmul variant (M = N = 8192) from its Proton profile: the launch "
                "metadata's flops over the CUPTI kernel time. Solid: tile loop not flattened; dashed: "
                "`tl.range(..., flatten=True)` (only the persistent kernels have a tile loop; the others are the same "
                "kernel twice, a measure of run-to-run spread). Warp-specialized variants are absent where Triton "
                "does not lower warp specialization (Hopper; see the status table).")
def fig8(df):
    d = tflops(df)
    if d.empty:
        return None
    dtypes = [t for t in ("f16", "fp8") if t in set(d["weight_dtype"])]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.5), squeeze=False, sharey=False)
    hues = [v for v in ORDER if v in set(d["impl"])]
    pal = dict(zip(hues, sns.color_palette("deep", len(hues))))
    for ax, dt in zip(axes[0], dtypes):
        sub = d[d["weight_dtype"] == dt]
        for (impl, fl), g in sub.groupby(["impl", "flatten"]):
            g = g.sort_values("K")
            ax.plot(g["K"], g["value"], ls="--" if fl else "-", marker="o", ms=3, color=pal[impl],
                    label=f"{impl}{' (flatten)' if fl else ''}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel("TFLOP/s (Proton)")
        ax.set_title(f"{dt}: M = N = 8192 ({', '.join(sorted(set(sub['gpu'])))})")
        ax.grid(True, ls=":", lw=0.5)
        ax.legend(fontsize=6, ncol=2)
    return fig


def profile_diff(results_dir: Path, gpu: str, dtype: str, metric: str = "tflop/s") -> pd.DataFrame:
    """flatten minus no-flatten per kernel frame, from the two merged profiles (as `proton-viewer -m
    tflop16/s -diff matmul_f16.hatchet matmul_f16_flatten.hatchet` prints)."""
    from kernels.cases import proton_tree as pt
    art = Path(results_dir) / gpu / "proton_fig8" / "artifacts"
    a, b = art / f"matmul_{dtype}_flatten.hatchet", art / f"matmul_{dtype}.hatchet"
    if not (a.exists() and b.exists()):
        return pd.DataFrame()
    rows = pt.diff(pt.load(a), pt.load(b), metric)
    d = pd.DataFrame(rows).rename(columns={"a": "flatten", "b": "no_flatten", "diff": "flatten_minus_no_flatten"})
    d.insert(0, "dtype", dtype)
    d.insert(0, "gpu", gpu)
    return d


@figure("proton_fig8_flatten_diff", experiment="proton_fig8",
        caption="The loop-flattening difference as a diff of two Proton profiles (flattened minus not flattened, "
                "TFLOP/s per kernel frame, matched by name as proton-viewer's `-diff` matches frames). Frames of "
                "kernels without a tile loop show the run-to-run spread.")
def fig8_diff(df):
    root = Path(df.attrs.get("results_dir", "results"))
    parts = [profile_diff(root, g, dt) for g in sorted(df["gpu"].unique()) for dt in ("f16", "fp8")]
    d = pd.concat([p for p in parts if not p.empty], ignore_index=True) if any(not p.empty for p in parts) else None
    if d is None or d.empty:
        return None
    d = d.dropna(subset=["flatten_minus_no_flatten"])
    d["kernel"] = d["name"].str.split(" ").str[0]
    d["K"] = d["name"].str.extract(r"K=(\d+)").astype(float)
    dtypes = list(dict.fromkeys(d["dtype"]))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.2), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        sub = d[d["dtype"] == dt].sort_values("K")
        sub = sub.assign(K=sub["K"].astype(int).astype(str))
        sns.barplot(sub, x="K", y="flatten_minus_no_flatten", hue="kernel", ax=ax)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_ylabel("TFLOP/s: flatten - no flatten")
        ax.set_title(f"{dt}: Proton profile diff")
        ax.legend(fontsize=6)
    return fig


@table("Loop flattening: Proton profile diff (TFLOP/s, flatten - no flatten)", experiment="proton_fig8")
def diff_table(df):
    root = Path(df.attrs.get("results_dir", "results"))
    parts = [profile_diff(root, g, dt) for g in sorted(df["gpu"].unique()) for dt in ("f16", "fp8")]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


@table("Matmul variants: Proton TFLOP/s vs CUDA-event TFLOP/s and profile sizes", experiment="proton_fig8")
def summary(df):
    keys = ["tflops", "events_tflops", "proton_ms", "latency_ms", "rel_err", "profile_bytes"]
    d = df[df["metric"].isin(keys) & (df["status"] == "ok")].copy()
    if d.empty:
        return d
    d["flatten"] = d["params"].fillna("").map(_flatten)
    return d.pivot_table(index=["gpu", "weight_dtype", "K", "impl", "flatten"], columns="metric",
                         values="value").reset_index()
