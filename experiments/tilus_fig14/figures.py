"""Tilus Fig. 14 (artifact Fig. 13): speedup over cuBLAS f16 from decode to prefill sizes, ours beside the paper's."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from experiments.speedup import paper_speedups, side_by_side, speedups, tilus_prefill_note
from harness.figures import (comparison, figure, finding, impl_color, impl_label, order_impls, paper_dir, span,
                             table, title_and_legend)

GAP = 0.8          # extra room between the decode (M <= 16) and prefill (M >= 2048) groups


def positions(Ms) -> dict[int, float]:
    """Categorical x positions, the two groups apart: nothing is drawn across the unmeasured 16..2048."""
    pos, x, prev = {}, 0.0, None
    for m in sorted(Ms):
        if prev is not None and prev <= 16 < m:
            x += GAP
        pos[m] = x
        x += 1
        prev = m
    return pos


def _segments(ms):
    """Runs of consecutive M on one side of the gap."""
    lo = [m for m in ms if m <= 16]
    hi = [m for m in ms if m > 16]
    return [s for s in (lo, hi) if s]


@figure("tilus_fig14", experiment="tilus_fig14",
        caption="Speedup over cuBLAS f16 from decode (M=1) to prefill (M=12288) at K=8192, N=57344, M categorical "
                "as in the paper (no line across the unmeasured 16 < M < 2048). Solid lines and filled markers: ours, "
                "with the p10/p90 spread of both timings; dashed lines and hollow markers: the paper's L40S values "
                "for the same implementation (its artifact also measured M=2048 but does not draw it).")
def fig14(df):
    d = speedups(df)
    if d.empty:
        return None
    p = paper_speedups(paper_dir(df), 14)
    types = [t for t in ("u4", "f6e3m2") if t in set(d["weight_dtype"])] + \
        sorted(set(d["weight_dtype"]) - {"u4", "f6e3m2"})
    Ms = sorted(set(d["M"]) | set(p["M"]))
    pos = positions(Ms)
    fig, axes = plt.subplots(1, len(types), figsize=(6.0 * len(types), 3.8), sharey=True, squeeze=False)
    drawn = set()
    for ax, t in zip(axes[0], types):
        dd, pp = d[d["weight_dtype"] == t], p[p["weight_dtype"] == t]
        for impl in order_impls(set(dd["impl"]) | set(pp["impl"])):
            c = impl_color(impl)
            ours = dd[dd["impl"] == impl].groupby("M")[["speedup", "lo", "hi"]].median()
            for seg in _segments(list(ours.index)):
                s = ours.loc[seg]
                x = [pos[m] for m in seg]
                ax.errorbar(x, s["speedup"], yerr=[(s["speedup"] - s["lo"]).clip(lower=0),
                                                   (s["hi"] - s["speedup"]).clip(lower=0)],
                            color=c, marker="o", ms=4, lw=1.5, capsize=2)
                drawn.add(impl)
            theirs = pp[pp["impl"] == impl].groupby("M")["speedup"].median()
            for seg in _segments(list(theirs.index)):
                ax.plot([pos[m] for m in seg], theirs.loc[seg], color=c, ls="--", lw=1, marker="o", ms=5,
                        mfc="white", mec=c)
                drawn.add(impl)
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        split = (max(v for m, v in pos.items() if m <= 16) + min(v for m, v in pos.items() if m > 16)) / 2 \
            if any(m <= 16 for m in pos) and any(m > 16 for m in pos) else None
        if split is not None:
            ax.axvline(split, color="0.6", lw=0.8)
            ax.text(split, 0.98, "decode | prefill", transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="0.4", bbox=dict(fc="white", ec="none", pad=1))
        ax.set_xticks(list(pos.values()), [str(m) for m in pos])
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"{t}, K=8192, N=57344")
        ax.grid(axis="x", visible=False)
    axes[0][0].set_ylabel("speedup over cuBLAS f16")
    handles = [Line2D([], [], color=impl_color(i), marker="o", ms=4, label=impl_label(i)) for i in order_impls(drawn)]
    pg = ", ".join(sorted(p["gpu"].str.replace("NVIDIA-", "").unique())) if len(p) else "no paper data"
    handles += [Line2D([], [], color="black", marker="o", ms=4, label="ours (filled, solid)"),
                Line2D([], [], color="black", ls="--", marker="o", mfc="white", ms=5, label=f"paper, {pg} (hollow, dashed)")]
    gpu = ", ".join(sorted(d["gpu"].str.upper().unique()))
    title_and_legend(fig, f"Tilus Fig. 14 on the {gpu}, beside the paper's {pg} values", handles, 4)
    return fig


@comparison(experiment="tilus_fig14", title="The paper's speedups over cuBLAS f16 beside ours, every M")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 14))


@table("Prefill sizes (M >= 2048): speedup over cuBLAS f16 of the same run", experiment="tilus_fig14")
def large_m(df):
    d = speedups(df)
    d = d[d["M"] >= 2048].pivot_table(index=["M", "weight_dtype"], columns="impl", values="speedup")
    d = d[order_impls(d.columns)]
    d.columns = [impl_label(c) for c in d.columns]
    return d.reset_index()


@finding(experiment="tilus_fig14")
def findings(df):
    d = speedups(df)
    out = []
    for t in ("u4", "f6e3m2"):
        dt = d[d["weight_dtype"] == t]
        if dt.empty:
            continue
        parts = []
        for impl in order_impls(dt["impl"]):
            s = dt[dt["impl"] == impl].groupby("M")["speedup"].median()
            m1, small = s.get(1), s[(s.index > 1) & (s.index <= 16)]
            bit = impl_label(impl) + (f" {m1:.2f}x at M=1" if m1 is not None else "")
            if len(small):
                bit += f", {span(small)}x at M={min(small.index)}..{max(small.index)}"
            parts.append(bit)
        out.append(f"Decode, {t}: " + "; ".join(parts) + ".")
    big = d[d["M"] >= 2048]
    if len(big):
        parts = [f"{impl_label(i)} {span(big[big['impl'] == i]['speedup'])}x" for i in order_impls(big["impl"])]
        out.append(f"Prefill (M = {min(big['M'])}..{max(big['M'])}): " + "; ".join(parts) + ".")
        tri = big[big["impl"] == "triton"]["speedup"]
        if len(tri):
            out.append(f"{impl_label('triton')} is within 10% of cuBLAS f16 (>= 0.90x) at {int((tri >= 0.9).sum())} of "
                       f"{len(tri)} prefill points (it dequantizes once and calls cuBLAS there).")
        note = tilus_prefill_note(big[big["impl"] == "tilus"])
        if note:
            out.append(note[:1].upper() + note[1:] + ".")
    p = paper_speedups(paper_dir(df), 14)
    pt = p[(p["impl"] == "tilus") & (p["M"] >= 2048)]["speedup"]
    if len(pt):
        below = int((pt < 1).sum())
        out.append(f"The paper's Tilus (L40S) at M >= 2048: {span(pt)}x of cuBLAS f16, below 1x at {below} of its "
                   f"{len(pt)} points.")
    from experiments.native_targets import later_changes
    return out + later_changes(df)


@table("Issue 13 targets of the native CUDA kernel at prefill sizes (>= 0.95x cuBLAS f16), computed from the rows",
       experiment="tilus_fig14")
def native_prefill_targets(df):
    from experiments.native_targets import prefill_targets
    return prefill_targets(df)
