"""Tilus Fig. 9: grouped bars of speedup over cuBLAS f16."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from experiments.speedup import paper_speedups, side_by_side, speedups
from harness.figures import comparison, figure, table

ORDER = ["u8", "f6e3m2", "u4", "i4", "u2", "u1"]


@figure("tilus_fig10", experiment="tilus_fig10",
        caption="Speedup over cuBLAS f16 (same run, same GPU) per weight type; one panel per (K, N) and M. "
                "Missing bars are points an implementation does not support (see the status table).")
def fig9(df):
    d = speedups(df)
    if d.empty:
        return None
    d["shape"] = "K=" + d["K"].astype(str) + " N=" + d["N"].astype(str)
    order = [o for o in ORDER if o in set(d["weight_dtype"])] + sorted(set(d["weight_dtype"]) - set(ORDER))
    g = sns.catplot(d, kind="bar", x="weight_dtype", y="speedup", hue="label", col="shape", row="M",
                    order=order, height=3, aspect=1.5, errorbar=None, sharey=False)
    for ax in g.axes.flat:
        ax.axhline(1.0, color="k", lw=0.8)
    g.set_axis_labels("weight type", "speedup over cuBLAS f16")
    g.figure.suptitle(f"Tilus Fig. 9 reproduced on {', '.join(sorted(d['gpu'].unique()))}", y=1.02)
    return g.figure


@comparison(experiment="tilus_fig10")
def vs_paper(df, paper_dir):
    return side_by_side(speedups(df), paper_speedups(paper_dir, 9), 9)


@table("Targets of issue 3 at M <= 16 (our Triton kernel against our Tilus kernel, same run)",
       experiment="tilus_fig10")
def targets(df):
    """Per shape, type and M: both kernels' latency, our fraction of the roofline floor, and the verdicts."""
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


@table("Beside the H200 timings DESIGN.md recorded (K=8192, N=57344; same type and group size only)",
       experiment="tilus_fig10")
def vs_design(df):
    paper_dir = Path(df.attrs.get("results_dir", "results")) / "paper"
    if not (paper_dir / "design_h200.csv").exists():
        return pd.DataFrame()
    ref = pd.read_csv(paper_dir / "design_h200.csv")
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
    rows = []
    for r in ref[ref["M"] <= 16].itertuples():
        same = lat[(lat["M"] == r.M) & (lat["K"] == r.K) & (lat["N"] == r.N) & (lat["weight_dtype"] == r.weight_dtype)
                   & (lat["group_size"] == r.group_size)]
        impl = {"tilus_example": "tilus"}.get(r.impl, r.impl)
        pick = lambda i: same[same["impl"] == i]["value"].median() if (same["impl"] == i).any() else None  # noqa: E731
        rows.append({"reference (DESIGN.md)": r.note, "type": r.weight_dtype, "group": r.group_size, "M": r.M,
                     "reference ms": r.latency_ms, "ours: impl": impl, "ours: same impl ms": pick(impl),
                     "ours: triton ms": pick("triton")})
    return pd.DataFrame(rows)
