"""smoke: numerical error of each implementation against the float64 reference."""
from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

from harness.figures import figure, impl_color, impl_label, order_impls


@figure("smoke_numerics", experiment="smoke", cpu_ok=True,
        caption="Relative Frobenius error of each implementation's output against x(f64) @ W(f64), one marker per "
                "point. Rows from the CPU interpreter are drawn only in the CPU report: this is a correctness check, "
                "not performance.")
def numerics(df):
    d = df[(df["metric"] == "rel_err") & (df["status"] == "ok")].copy()
    if d.empty:
        return None
    d["point"] = d["layer"] + " M=" + d["M"].astype(str)
    impls = order_impls(d["impl"])
    d["implementation"] = d["impl"].map(impl_label)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    sns.stripplot(d, x="point", y="value", hue="implementation", hue_order=[impl_label(i) for i in impls],
                  palette=[impl_color(i) for i in impls], dodge=True, jitter=False, size=7, ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("relative error vs float64")
    ax.set_xlabel("")
    ax.legend(title=None)
    ax.set_title("smoke: output error against the float64 reference (" + ", ".join(sorted(set(d["device"]))) + ")")
    return fig
