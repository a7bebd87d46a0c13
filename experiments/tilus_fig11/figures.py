"""Tilus Fig. 10: heat map of speedup over cuBLAS f16, rows kind, columns bits."""
from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

from experiments.speedup import paper_speedups, side_by_side, speedups
from harness.figures import comparison, figure


def _kind_bits(name: str) -> tuple[str, int, str]:
    kind = {"u": "uint", "i": "int", "f": "float"}[name[0]]
    bits = int(name[1])
    return kind, bits, (name[2:] if kind == "float" else "")


@figure("tilus_fig11", experiment="tilus_fig11",
        caption="Speedup over cuBLAS f16 at M=16, K=8192, N=57344, per-channel scales. For floats the "
                "cell shows the best exponent/mantissa split of that width (all splits are in the CSV).")
def fig10(df):
    d = speedups(df)
    if d.empty:
        return None
    d[["kind", "bits", "em"]] = d["weight_dtype"].apply(lambda s: __import__("pandas").Series(_kind_bits(s)))
    impls = sorted(d["label"].unique())
    vmax = max(2.0, float(d["speedup"].max()))       # one colour scale for every panel
    fig, axes = plt.subplots(1, len(impls), figsize=(5.2 * len(impls), 2.8), squeeze=False)
    for ax, impl in zip(axes[0], impls):
        t = d[d["label"] == impl].pivot_table(index="kind", columns="bits", values="speedup", aggfunc="max")
        t = t.reindex([k for k in ("uint", "int", "float") if k in t.index])
        sns.heatmap(t, annot=True, fmt=".2f", cmap="viridis", ax=ax, cbar=False, vmin=0, vmax=vmax)
        ax.set_title(impl)
        ax.set_ylabel("")
    fig.suptitle(f"Tilus Fig. 10 reproduced on {', '.join(sorted(d['gpu'].unique()))}: speedup over cuBLAS f16 "
                 f"(one colour scale, 0 to {vmax:.1f})", y=1.04)
    return fig


@comparison(experiment="tilus_fig11")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 10), 10)
