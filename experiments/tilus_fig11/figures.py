"""Tilus Fig. 11 (artifact Fig. 10): speedup over cuBLAS f16 for every weight width, the paper's heat map beside ours."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm

from experiments.native_targets import PACE_CAPTION, pace_figure
from experiments.speedup import paper_speedups, side_by_side, speedups
from harness.claims import FIG11_TYPES
from harness.figures import comparison, figure, finding, impl_label, listing, order_impls, paper_dir, span, table

KINDS = ("uint", "int", "float")
BITS = (8, 7, 6, 5, 4, 3, 2, 1)           # the paper's column order
LEVEL = 0.03                               # "level": within 3% of each other's time


def _cell(name: str) -> tuple[str, int]:
    return {"u": "uint", "i": "int", "f": "float"}[name[0]], int(name[1])


def _grid(values: pd.Series) -> np.ndarray:
    """3 x 8 array (kind x bits) of the values of Fig. 11's fixed types; NaN where absent."""
    g = np.full((len(KINDS), len(BITS)), np.nan)
    for t, v in values.items():
        if t in FIG11_TYPES:
            k, b = _cell(t)
            g[KINDS.index(k), BITS.index(b)] = v
    return g


def _panel(ax, grid, lo, hi, norm, title):
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=_CMAP, norm=norm, aspect="auto")
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            v = grid[r, c]
            if v != v:
                ax.text(c, r, "-", ha="center", va="center", fontsize=7, color="0.45")
                continue
            dark = norm(v) > 0.6
            ax.text(c, r - (0.12 if lo is not None else 0), f"{v:.2f}x", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
            if lo is not None and lo[r, c] == lo[r, c]:
                ax.text(c, r + 0.22, f"{lo[r, c]:.2f}-{hi[r, c]:.2f}", ha="center", va="center", fontsize=5,
                        color="white" if dark else "0.25")
    ax.set_xticks(range(len(BITS)), BITS)
    ax.set_yticks(range(len(KINDS)), KINDS)
    ax.set_xlabel("weight bits")
    ax.set_title(title)
    ax.grid(False)
    return im


_CMAP = plt.get_cmap("YlGnBu").copy()
_CMAP.set_bad("0.93")


@figure("tilus_fig11", experiment="tilus_fig11",
        caption="Speedup over cuBLAS f16 at M=16, K=8192, N=57344, per-channel scales, for the weight types the "
                "paper draws (floats with its fixed exponent/mantissa splits: f3e1m1, f4e2m1, f5e2m2, f6e3m2, "
                "f7e3m3, f8e4m3; our other splits are in the CSV and the table below). First panel: the paper's "
                "Tilus on the L40S; then ours, one panel per implementation, with the p10-p90 spread of each cell "
                "under its value. One logarithmic colour scale for every panel. '-': not run (see status).")
def fig11(df):
    d = speedups(df)
    if d.empty:
        return None
    p = paper_speedups(paper_dir(df), 11)
    panels = []
    if len(p):
        pt = p[p["impl"] == "tilus"].groupby("weight_dtype")["speedup"].median()
        pg = ", ".join(sorted(p["gpu"].str.replace("NVIDIA-", "").unique()))
        panels.append((f"paper: Tilus ({pg})", _grid(pt), None, None))
    gpu = ", ".join(sorted(d["gpu"].str.upper().unique()))
    for impl in order_impls(d["impl"]):
        s = d[d["impl"] == impl].groupby("weight_dtype")[["speedup", "lo", "hi"]].median()
        if not set(s.index) & set(FIG11_TYPES):
            continue
        panels.append((f"ours ({gpu}): {impl_label(impl)}", _grid(s["speedup"]), _grid(s["lo"]), _grid(s["hi"])))
    vals = np.concatenate([g[~np.isnan(g)] for _, g, _, _ in panels])
    norm = LogNorm(vmin=min(0.5, float(vals.min())), vmax=max(8.0, float(vals.max())))
    ncol = 2
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(11, 2.2 * nrow + 0.6), squeeze=False, layout="constrained")
    im = None
    for ax, (title, g, lo, hi) in zip(axes.ravel(), panels):
        im = _panel(ax, g, lo, hi, norm, title)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    cbar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, pad=0.02)
    ticks = [t for t in (0.5, 1, 2, 4, 8, 16) if norm.vmin <= t <= norm.vmax]
    cbar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    cbar.minorticks_off()
    cbar.set_label("speedup over cuBLAS f16")
    fig.suptitle(f"Tilus Fig. 11: every weight width at M=16 (paper: L40S; ours: {gpu})")
    return fig


@comparison(experiment="tilus_fig11", title="The paper's speedups over cuBLAS f16 beside ours, every weight type")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 11))


@finding(experiment="tilus_fig11")
def findings(df):
    from experiments.native_targets import decode_summary
    return _findings(df) + decode_summary(df)


def _findings(df):
    d = speedups(df)
    out = []
    w = d.pivot_table(index="weight_dtype", columns="impl", values="value", aggfunc="median")
    s = d.pivot_table(index="weight_dtype", columns="impl", values="speedup", aggfunc="median")
    if "triton" in s:
        t = s["triton"].dropna()
        out.append(f"{impl_label('triton')} runs {len(t)} weight types (every width and kind swept), "
                   f"{span(t)}x over cuBLAS f16 at M = 16.")
    if {"triton", "tilus"} <= set(w.columns):
        r = (w["tilus"] / w["triton"]).dropna()          # > 1: ours faster
        ahead = [t for t in r.index if r[t] > 1 + LEVEL]
        level = [t for t in r.index if 1 / (1 + LEVEL) <= r[t] <= 1 + LEVEL]
        behind = [t for t in r.index if r[t] < 1 / (1 + LEVEL)]
        only = sorted(set(w["triton"].dropna().index) - set(w["tilus"].dropna().index))
        parts = []
        if ahead:
            parts.append(f"ahead by more than {LEVEL:.0%} for {listing(ahead)}")
        if level:
            parts.append(f"level (within {LEVEL:.0%}) for {listing(level)}")
        if behind:
            parts.append(f"behind by more than {LEVEL:.0%} for {listing(behind)} "
                         f"({span(100 * (1 / r[behind] - 1), 1)}% slower)")
        out.append(f"Against {impl_label('tilus')} in the same run, {impl_label('triton')} is " + "; ".join(parts)
                   + (f"; it also runs {listing(only)}, which our Tilus kernel does not." if only else "."))
    p = paper_speedups(paper_dir(df), 11)
    if len(p) and "tilus" in s:
        pt = p[p["impl"] == "tilus"].groupby("weight_dtype")["speedup"].median()
        both = pt.index.intersection(s["tilus"].dropna().index)
        if len(both):
            ratio = pt[both] / s.loc[both, "tilus"]
            out.append(f"The paper's Tilus speedups (L40S) are {span(ratio)}x those of {impl_label('tilus')} "
                       f"on our GPU over the {len(both)} types both ran.")
    return out


@table("Issue 13 targets of the native CUDA kernel on the Fig. 11 types, computed from the rows (decode: % of the HBM floor, "
       "faster than Triton and Tilus)", experiment="tilus_fig11")
def native_targets(df):
    from experiments.native_targets import decode_targets
    return decode_targets(df)


@figure("tilus_fig11_native_pace", experiment="tilus_fig11", caption=PACE_CAPTION)
def native_pace(df):
    return pace_figure(df, "tilus_fig11 types (M = 16, 8192 x 57344): native and same-bytes cuBLAS f16 against the floor")
