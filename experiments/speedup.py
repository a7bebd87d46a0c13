"""Speedup over cuBLAS f16, ours and the paper's, shared by the Tilus kernel figures and claims."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.figures import PAPER_IMPL, PAPER_LABEL, impl_label, order_impls

KEY = ["gpu", "model", "layer", "M", "K", "N"]
# Tilus' published figure number -> the number its artifact (and results/paper/tilus_kernels.csv) uses
ARTIFACT_FIGURE = {10: 9, 11: 10, 12: 11, 13: 12, 14: 13}


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, impl): latency, speedup over cuBLAS f16 of the same shape and M in the same
    run, and its spread (lo, hi) from both timings' p10/p90."""
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok") & (df["act_dtype"] == "f16")]
    base = lat[(lat["impl"] == "cublas") & (lat["weight_dtype"] == "f16")]
    base = base.groupby(KEY, as_index=False)[["value", "p10", "p90"]].median()
    base = base.rename(columns={"value": "cublas_ms", "p10": "cublas_p10", "p90": "cublas_p90"})
    d = lat[lat["impl"] != "cublas"].merge(base, on=KEY, how="inner")
    d["speedup"] = d["cublas_ms"] / d["value"]
    d["lo"] = (d["cublas_p10"] / d["p90"]).fillna(d["speedup"])
    d["hi"] = (d["cublas_p90"] / d["p10"]).fillna(d["speedup"])
    d["label"] = d["impl"].map(impl_label)
    roof = df[df["metric"] == "roofline_frac"][KEY + ["impl", "weight_dtype", "value"]]
    roof = roof.rename(columns={"value": "roofline_frac"})
    return d.merge(roof, on=KEY + ["impl", "weight_dtype"], how="left")


def paper_speedups(paper_dir: Path, figure: int) -> pd.DataFrame:
    """The paper's speedups over its cuBLAS f16 for published Tilus figure `figure` (10, 11 or 14),
    with the artifact's runners renamed to our impl of the same design (triton -> triton_plain, ...)."""
    path = Path(paper_dir) / "tilus_kernels.csv"
    if not path.exists():
        return pd.DataFrame(columns=["M", "K", "N", "weight_dtype", "impl", "speedup", "gpu", "latency_ms"])
    p = pd.read_csv(path)
    p = p[p["figure"] == ARTIFACT_FIGURE[figure]]
    base = p[p["impl"] == "cublas"].groupby(["M", "K", "N"], as_index=False)["latency_ms"].median()
    base = base.rename(columns={"latency_ms": "cublas_ms"})
    d = p[p["impl"] != "cublas"].merge(base, on=["M", "K", "N"])
    d["speedup"] = d["cublas_ms"] / d["latency_ms"]
    d["impl"] = d["impl"].map(lambda s: PAPER_IMPL.get(s, s))
    return d.reset_index(drop=True)


def side_by_side(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Paper (its GPU) and ours (our GPU) speedups over cuBLAS f16 for the same point, one column each."""
    idx = ["M", "K", "N", "weight_dtype"]
    o = ours.pivot_table(index=idx, columns="impl", values="speedup", aggfunc="median")
    o = o[order_impls(o.columns)]
    gpus = sorted(set(ours["gpu"])) if len(ours) else []
    o.columns = [f"ours ({'/'.join(gpus)}): {impl_label(c)}" for c in o.columns]
    if paper.empty:
        return o.reset_index()
    pg = "/".join(sorted(paper["gpu"].unique()))
    p = paper.pivot_table(index=idx, columns="impl", values="speedup", aggfunc="median")
    p = p[order_impls(p.columns)]
    p.columns = [f"paper ({pg}): {PAPER_LABEL.get(c, c)}" for c in p.columns]
    return p.join(o, how="outer").reset_index()



def tilus_prefill_note(rows) -> str:
    """What our Tilus kernel ran at these rows' M, read from their impl_config (a prefill path says 'prefill:')."""
    cfg = [str(c) for c in rows["impl_config"].dropna()] if "impl_config" in rows else []
    if not cfg:
        return ""
    pre = sum(c.startswith("prefill") for c in cfg)
    if pre == len(cfg):
        return f"our kernel in Tilus 0.2.0 ran its prefill path there ({cfg[0]})"
    if pre == 0:
        return "our kernel in Tilus 0.2.0 ran its decode kernel there (its impl_config records no prefill path)"
    return f"our kernel in Tilus 0.2.0 ran its prefill path at {pre} of {len(cfg)} of these points"
