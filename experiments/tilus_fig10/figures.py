"""Tilus Fig. 10 (artifact Fig. 9): speedup over cuBLAS f16 per weight type, our bars beside the paper's values."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from experiments.native_targets import PACE_CAPTION, pace_figure
from experiments.speedup import paper_speedups, side_by_side, speedups
from harness.figures import (comparison, figure, finding, impl_color, impl_label, listing, order_impls, paper_dir,
                             span, table, title_and_legend)

ORDER = ["u8", "f6e3m2", "u4", "i4", "u2", "u1"]      # the paper's order: widest first


def _types(present) -> list[str]:
    return [t for t in ORDER if t in present] + sorted(set(present) - set(ORDER))


def speedup_bars(axes_grid, d: pd.DataFrame, p: pd.DataFrame, panels: list[tuple], types: list[str]) -> list[str]:
    """Draw one panel per (row M, column (K, N)): our bars with p10/p90 spread, the paper's values as
    markers on the same implementation's slot. Returns the implementations drawn."""
    drawn = set()
    for (M, K, N), ax in zip(panels, axes_grid):
        dd = d[(d["M"] == M) & (d["K"] == K) & (d["N"] == N)]
        pp = p[(p["M"] == M) & (p["K"] == K) & (p["N"] == N)]
        x, ticks = 0.0, []
        for t in types:
            ours = dd[dd["weight_dtype"] == t].groupby("impl")[["speedup", "lo", "hi"]].median()
            theirs = pp[pp["weight_dtype"] == t].groupby("impl")["speedup"].median()
            impls = order_impls(set(ours.index) | set(theirs.index))
            if not impls:
                continue
            start = x
            for i in impls:
                if i in ours.index:
                    s, lo, hi = ours.loc[i]
                    ax.bar(x, s, 0.9, color=impl_color(i), edgecolor="white", linewidth=0.5)
                    ax.errorbar(x, s, yerr=[[max(s - lo, 0)], [max(hi - s, 0)]], color="black", lw=0.8,
                                capsize=1.5)
                    drawn.add(i)
                if i in theirs.index:
                    ax.plot(x, theirs[i], marker="D", ms=5, mfc=impl_color(i), mec="black", mew=0.8, ls="none")
                    drawn.add(i)
                x += 1
            ticks.append(((start + x - 1) / 2, t))
            x += 0.7
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks([c for c, _ in ticks], [t for _, t in ticks])
        ax.set_title(f"M={M}, K={K}, N={N}")
        ax.grid(axis="x", visible=False)
    return order_impls(drawn)


def legend_handles(impls: list[str], paper_gpu: str) -> list:
    handles = [Patch(color=impl_color(i), label=impl_label(i)) for i in impls]
    handles.append(Line2D([], [], marker="D", ms=5, mfc="white", mec="black", ls="none",
                          label=f"the paper's value ({paper_gpu}), same implementation"))
    handles.append(Line2D([], [], color="black", ls="--", lw=0.8, label="cuBLAS f16 (1x)"))
    return handles


@figure("tilus_fig10", experiment="tilus_fig10",
        caption="Speedup over cuBLAS f16 of the same run per weight type (bars, with the p10/p90 spread of both "
                "timings), one row per M with one y-scale per row; diamonds: the paper's L40S value for the same "
                "implementation (Tilus, Triton, Ladder, QuantLLM, Marlin). 'our kernel in Tilus 0.2.0' is our own "
                "Tilus program, not the paper's kernels. Missing bars are points an implementation does not support "
                "or could not install (status table below).")
def fig10(df):
    d = speedups(df)
    if d.empty:
        return None
    p = paper_speedups(paper_dir(df), 10)
    shapes = sorted(set(zip(d["K"], d["N"])), key=lambda kn: (kn[1], kn[0]))
    Ms = sorted(set(d["M"]))
    fig, axes = plt.subplots(len(Ms), len(shapes), figsize=(4.6 * len(shapes), 3.0 * len(Ms)), sharey="row",
                             squeeze=False)
    panels = [(M, K, N) for M in Ms for K, N in shapes]
    impls = speedup_bars(axes.ravel(), d, p, panels, _types(set(d["weight_dtype"])))
    for ax in axes[:, 0]:
        ax.set_ylabel("speedup over cuBLAS f16")
    gpu = ", ".join(sorted(d["gpu"].str.upper().unique()))
    pg = ", ".join(sorted(p["gpu"].str.replace("NVIDIA-", "").unique())) if len(p) else "no paper data"
    title_and_legend(fig, f"Tilus Fig. 10 on the {gpu} (bars) and the paper's {pg} values (diamonds)",
                     legend_handles(impls, pg), 5)
    return fig


@comparison(experiment="tilus_fig10", title="The paper's speedups over cuBLAS f16 beside ours, per point")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 10))


@table("Our Triton kernel against our kernel in Tilus 0.2.0 at M <= 16 (same run)", experiment="tilus_fig10")
def targets(df):
    """Per shape, type and M: both kernels' latency, their fraction of the roofline floor, host time."""
    d = speedups(df)
    d = d[d["impl"].isin(["triton", "tilus"])]
    t = d.pivot_table(index=["K", "N", "M", "weight_dtype"], columns="impl",
                      values=["value", "roofline_frac"], aggfunc="median")
    out = pd.DataFrame({
        "ours ms": t[("value", "triton")], "tilus ms": t[("value", "tilus")],
        "ours % of floor": 100 * t[("roofline_frac", "triton")],
        "tilus % of floor": 100 * t[("roofline_frac", "tilus")],
    })
    host = df[(df["metric"] == "host_ms") & (df["impl"] == "triton")]
    if len(host):     # rows measured since the harness records host time per call
        out["ours host ms"] = host.groupby(["K", "N", "M", "weight_dtype"])["value"].median()
    out["ours <= tilus"] = (out["ours ms"] <= out["tilus ms"]).map({True: "yes", False: "no"})
    out[">= 70% of floor"] = (out["ours % of floor"] >= 70).map({True: "yes", False: "no"})
    return out.reset_index()


@table("Our earlier H200 timings (results/paper/design_h200.csv) beside this run: K=8192, N=57344, same type "
       "and group size", experiment="tilus_fig10")
def vs_earlier(df):
    path = paper_dir(df) / "design_h200.csv"
    if not path.exists():
        return pd.DataFrame()
    ref = pd.read_csv(path)
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
    rows = []
    for r in ref[ref["M"] <= 16].itertuples():
        same = lat[(lat["M"] == r.M) & (lat["K"] == r.K) & (lat["N"] == r.N) & (lat["weight_dtype"] == r.weight_dtype)
                   & (lat["group_size"] == r.group_size)]
        impl = {"tilus_example": "tilus"}.get(r.impl, r.impl)
        pick = lambda i: same[same["impl"] == i]["value"].median() if (same["impl"] == i).any() else None  # noqa: E731
        rows.append({"earlier timing of": r.note, "type": r.weight_dtype, "group": r.group_size, "M": r.M,
                     "earlier ms": r.latency_ms, "this run: impl": impl, "this run: same impl ms": pick(impl),
                     "this run: Triton (ours, optimized) ms": pick("triton")})
    return pd.DataFrame(rows)


@finding(experiment="tilus_fig10")
def findings(df):
    from experiments.native_targets import decode_summary
    return _findings(df) + decode_summary(df)


def _findings(df):
    d = speedups(df)
    out = []
    lat = d.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="impl", values="value", aggfunc="median")
    roof = d.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="impl", values="roofline_frac", aggfunc="median")
    if not {"triton", "tilus"} <= set(lat.columns):
        return out
    r = (lat["tilus"] / lat["triton"]).dropna()          # > 1: ours faster
    one = r[r.index.get_level_values("M") == 1]
    if len(one):
        out.append(f"M = 1: {impl_label('triton')} is at least as fast as {impl_label('tilus')} at "
                   f"{int((one >= 1).sum())} of {len(one)} points (shapes x types); the ratio of their times is "
                   f"{span(one)}x.")
        big = [i for i in one.index if i[1] == 8192 and i[2] == 57344]
        if big:
            bits = []
            for i in sorted(big, key=lambda i: _types([j[3] for j in big]).index(i[3])):
                bits.append(f"{i[3]} {lat.loc[i, 'triton']:.3f} ms ({100 * roof.loc[i, 'triton']:.0f}% of the "
                            f"floor; Tilus {lat.loc[i, 'tilus']:.3f} ms)")
            out.append("At M = 1, K = 8192, N = 57344: " + "; ".join(bits) + ".")
    sixteen = r[r.index.get_level_values("M") == 16]
    if len(sixteen):
        ahead = sorted({i[3] for i in sixteen.index if sixteen[i] >= 1})
        behind = sixteen[sixteen < 1]
        s = f"M = 16: {impl_label('triton')} is ahead of or level with Tilus for " + (listing(_types(ahead)) or "no type")
        if len(behind):
            s += (f" and behind for {listing(_types({i[3] for i in behind.index}))} by "
                  f"{span(1 / behind)}x")
        out.append(s + " (every shape counted).")
    hit = roof["triton"].dropna() if "triton" in roof else pd.Series(dtype=float)
    if len(hit):
        top = hit[hit >= 0.7]
        out.append(f"{len(top)} of {len(hit)} points of {impl_label('triton')} reach 70% of the weight-streaming "
                   f"floor" + (f": {listing(f'{i[3]} at M={i[0]} K={i[1]} N={i[2]}' for i in top.index)}" if len(top) else "")
                   + f"; the floor fraction spans {span(100 * hit, 0)}%.")
    host = df[(df["metric"] == "host_ms") & (df["impl"] == "triton") & (df["status"] == "ok")]
    if len(host):
        h = host.groupby(["M", "K", "N", "weight_dtype"])["value"].median()
        k = lat["triton"].reindex(h.index)
        by_shape = []
        for (K, N), idx in sorted(h.groupby(level=["K", "N"]).groups.items()):
            over = int((h[idx] > k[idx]).sum())
            by_shape.append((K, N, over, len(idx), h[idx], k[idx]))
        bound = [b for b in by_shape if b[2] == b[3]]
        never = [b for b in by_shape if b[2] == 0]
        if bound:
            out.append("Host time per call (`host_ms`, the launch path) exceeds the kernel time at every point of "
                       + listing(f"K={K}, N={N} (host {span(hh, 3)} ms, kernel {span(kk, 3)} ms)"
                                 for K, N, _, _, hh, kk in bound)
                       + ": an eager caller there waits for the host; the events time GPU work because samples are "
                         "queued behind a sleep kernel (`timing.host_ahead`).")
        if never:
            out.append("At " + listing(f"K={K}, N={N}" for K, N, *_ in never) + " the host time stays below the "
                       "kernel time at every point.")
        mixed = [b for b in by_shape if 0 < b[2] < b[3]]
        if mixed:
            out.append("Host time exceeds kernel time at some points only: " + listing(
                f"K={K}, N={N} ({o} of {n})" for K, N, o, n, *_ in mixed) + ".")
    p = paper_speedups(paper_dir(df), 10)
    pt = p[p["impl"] == "tilus"].set_index(["M", "K", "N", "weight_dtype"])["speedup"]
    ot = d[d["impl"] == "tilus"].set_index(["M", "K", "N", "weight_dtype"])["speedup"]
    both = pt.index.intersection(ot.index)
    if len(both):
        out.append(f"The paper's Tilus speedups over cuBLAS f16 (L40S) are {span(pt[both] / ot[both])}x those of "
                   f"{impl_label('tilus')} on our GPU at the same {len(both)} points.")
    return out


@table("Issue 13 targets of the native CUDA kernel on the Fig. 10 shapes, computed from the rows (decode: % of the HBM floor, "
       "faster than Triton and Tilus)", experiment="tilus_fig10")
def native_targets(df):
    from experiments.native_targets import decode_targets
    return decode_targets(df)


@figure("tilus_fig10_native_pace", experiment="tilus_fig10", caption=PACE_CAPTION)
def native_pace(df):
    return pace_figure(df, "tilus_fig10 shapes (M = 1 and 16): native and same-bytes cuBLAS f16 against the floor")
