"""Speedup over cuBLAS f16, ours and the paper's, shared by the Tilus kernel figures."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

KEY = ["gpu", "model", "layer", "M", "K", "N"]
# the paper's runner names (results/paper/README.md) -> the label we draw them with
PAPER_LABEL = {"tilus": "tilus", "triton": "triton (paper's baseline)", "ladder": "ladder/bitblas",
               "quantllm": "quantllm", "marlin": "marlin"}
OUR_LABEL = {"triton": "triton (ours)", "bitblas": "ladder/bitblas"}


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, impl): latency and speedup over cuBLAS f16 of the same shape and M."""
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
    lat = lat[lat["act_dtype"] == "f16"]
    base = lat[(lat["impl"] == "cublas") & (lat["weight_dtype"] == "f16")][KEY + ["value"]]
    base = base.groupby(KEY, as_index=False)["value"].median().rename(columns={"value": "cublas_ms"})
    d = lat[lat["impl"] != "cublas"].merge(base, on=KEY, how="inner")
    d["speedup"] = d["cublas_ms"] / d["value"]
    d["label"] = d["impl"].map(lambda s: OUR_LABEL.get(s, s))
    roof = df[df["metric"] == "roofline_frac"][KEY + ["impl", "weight_dtype", "value"]]
    roof = roof.rename(columns={"value": "roofline_frac"})
    return d.merge(roof, on=KEY + ["impl", "weight_dtype"], how="left")


def paper_speedups(paper_dir: Path, figure: int) -> pd.DataFrame:
    p = pd.read_csv(Path(paper_dir) / "tilus_kernels.csv")
    p = p[p["figure"] == figure]
    base = p[p["impl"] == "cublas"].groupby(["M", "K", "N"], as_index=False)["latency_ms"].median()
    base = base.rename(columns={"latency_ms": "cublas_ms"})
    d = p[p["impl"] != "cublas"].merge(base, on=["M", "K", "N"])
    d["speedup"] = d["cublas_ms"] / d["latency_ms"]
    d["label"] = d["impl"].map(lambda s: PAPER_LABEL.get(s, s))
    return d


def side_by_side(ours: pd.DataFrame, paper: pd.DataFrame, figure: int) -> pd.DataFrame:
    """Paper (its GPU) and ours (our GPU) speedups over cuBLAS f16 for the same point."""
    o = ours.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="label", values="speedup", aggfunc="median")
    o.columns = [f"ours: {c}" for c in o.columns]
    gpu = sorted(paper["gpu"].unique())
    p = paper.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="label", values="speedup", aggfunc="median")
    p.columns = [f"paper ({'/'.join(gpu)}): {c}" for c in p.columns]
    t = p.join(o, how="outer").reset_index()
    keep = [c for c in t.columns if not c.startswith("ours: ") or t[c].notna().any()]
    return t[keep]
