"""Tilus Fig. 13: speedup over cuBLAS f16 across M."""
from __future__ import annotations

import seaborn as sns

from experiments.speedup import paper_speedups, side_by_side, speedups
from harness.figures import comparison, figure, table


@figure("tilus_fig14", experiment="tilus_fig14",
        caption="Speedup over cuBLAS f16 from decode (M=1) to prefill (M=12288) at K=8192, N=57344.")
def fig13(df):
    d = speedups(df)
    if d.empty:
        return None
    g = sns.relplot(d, kind="line", x="M", y="speedup", hue="label", col="weight_dtype", marker="o",
                    height=3.2, aspect=1.4, errorbar=None)
    for ax in g.axes.flat:
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="k", lw=0.8)
    g.set_axis_labels("M (tokens)", "speedup over cuBLAS f16")
    g.figure.suptitle(f"Tilus Fig. 13 reproduced on {', '.join(sorted(d['gpu'].unique()))}", y=1.03)
    return g.figure


@comparison(experiment="tilus_fig14")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 13), 13)


@table("Large-M target of issue 3 (within 10% of cuBLAS f16 at M >= 2048)", experiment="tilus_fig14")
def large_m(df):
    d = speedups(df)
    d = d[d["M"] >= 2048].pivot_table(index=["M", "weight_dtype"], columns="label", values="speedup")
    return d.reset_index()
