"""Proton Fig. 15: instrumentation overhead per kernel, ours beside the paper's, and a warp timeline."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from harness.figures import comparison, figure, table

PAPER_NAME = {"moe_matmul": "matmul_ogs"}


def kernel_label(df: pd.DataFrame) -> pd.Series:
    """The suite kernel for Triton rows, 'native_<kernel>' for our CUDA kernels."""
    return df["workload"].where(df["impl"] != "native", "native_" + df["workload"])


def _size(params: str) -> str:
    return json.loads(params).get("size", "") if params else ""


def overheads(df: pd.DataFrame) -> pd.DataFrame:
    """instrumented / plain latency per (gpu, kernel, profiler, mode), plain measured in the same job."""
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
    lat = lat.assign(kernel=kernel_label(lat), size=lat["params"].fillna("").map(_size))
    base = lat[lat["profiler"] == "none"][["gpu", "kernel", "size", "value"]].rename(columns={"value": "plain_ms"})
    inst = lat[lat["profiler"] != "none"].merge(base, on=["gpu", "kernel", "size"])
    inst["overhead"] = inst["value"] / inst["plain_ms"]
    inst["mode"] = inst["params"].fillna("").map(lambda s: _mode_label(s))
    return inst


def _mode_label(params: str) -> str:
    if not params:
        return "default"
    d = {k: v for k, v in json.loads(params).items() if k != "size"}
    if "buffer_records" in d:
        return "native"
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items())) or "default"


@figure("proton_fig15", experiment="proton_fig15",
        caption="Instrumented over plain kernel time (same job, same GPU), per kernel. Grey: the paper's GH200 "
                "values (Proton default mode). Native kernels use our CUDA header (native/).")
def fig15(df):
    o = overheads(df)
    if o.empty:
        return None
    o = o.assign(who=lambda t: t.apply(lambda r: ("our native header" if r["profiler"] == "native"
                                                  else f"proton {r['mode']}") + f" ({r['gpu']})", axis=1))
    paper_path = Path(df.attrs.get("results_dir", "results")) / "paper" / "proton_instrumentation.csv"
    rows = [o[["kernel", "who", "overhead"]]]
    if paper_path.exists():
        p = pd.read_csv(paper_path)
        p = p[p["gpu"] == "GH200"]
        inv = {v: k for k, v in PAPER_NAME.items()}
        rows.insert(0, pd.DataFrame({"kernel": p["kernel"].map(lambda k: inv.get(k, k)),
                                     "who": "paper: proton default (GH200)", "overhead": p["overhead_ratio"]}))
    d = pd.concat(rows, ignore_index=True)
    order = sorted(d["kernel"].unique(), key=lambda k: (k.startswith("native_"), k))
    hues = sorted(d["who"].unique(), key=lambda w: (not w.startswith("paper"), w))
    pal = dict(zip(hues, ["0.6"] + sns.color_palette("deep", len(hues) - 1)))
    fig, ax = plt.subplots(figsize=(13, 4.5))
    sns.barplot(d, x="kernel", y="overhead", hue="who", order=order, hue_order=hues, palette=pal, ax=ax)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0.9, max(1.3, float(np.nanmax(d["overhead"])) * 1.05))
    ax.set_xlabel("")
    ax.set_ylabel("instrumented / plain time")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Intra-kernel instrumentation overhead (Proton Fig. 15)")
    return fig


def _load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


@figure("proton_fig15_timeline", experiment="proton_fig15",
        caption="One native kernel's warps through time, decoded from our instrumentation buffer (the same "
                "Chrome trace opens in Perfetto). Each row is one warp of one block; colours are scopes. The "
                "buffer is circular: a warp that recorded more than its capacity keeps its newest records, and "
                "the rows count what was dropped (`dropped_records`).")
def timeline(df):
    root = Path(df.attrs.get("results_dir", "results"))
    for gpu in sorted(df["gpu"].unique()):
        cands = sorted((root / gpu / "proton_fig15" / "artifacts" / "native").glob("matmul.chrome_trace.json*"))
        cands += sorted((root / gpu / "proton_fig15" / "artifacts" / "proton").glob("matmul.chrome_trace.json*"))
        if cands:
            break
    else:
        return None
    ev = [e for e in _load_trace(cands[0]).get("traceEvents", []) if e.get("ph") == "X"]
    if not ev:
        return None
    tracks = sorted({(e["pid"], e["tid"]) for e in ev})[:32]
    ypos = {t: i for i, t in enumerate(tracks)}
    names = sorted({e["name"] for e in ev})
    col = dict(zip(names, sns.color_palette("deep", len(names))))
    fig, ax = plt.subplots(figsize=(11, 0.22 * len(tracks) + 1.5))
    for e in ev:
        t = (e["pid"], e["tid"])
        if t in ypos:
            ax.broken_barh([(e["ts"], max(e["dur"], 1e-3))], (ypos[t] - 0.4, 0.8), color=col[e["name"]])
    ax.set_yticks(range(len(tracks)), [f"SM{p} t{t}" for p, t in tracks], fontsize=6)
    ax.set_xlabel("time since the first block started (us)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in col.values()], labels=names, fontsize=7,
              loc="upper right")
    ax.set_title(f"Warp timeline: {cands[0].name} ({cands[0].parent.name}, {gpu})")
    return fig


@comparison(experiment="proton_fig15")
def vs_paper(df, paper_dir):
    o = overheads(df)
    p = pd.read_csv(Path(paper_dir) / "proton_instrumentation.csv")
    p = p.pivot_table(index="kernel", columns="gpu", values="overhead_ratio")
    p.columns = [f"paper {c}" for c in p.columns]
    ours = o.pivot_table(index="kernel", columns=["gpu", "mode"], values="overhead", aggfunc="median")
    ours.columns = [f"ours {g} {m}" for g, m in ours.columns]
    ours.index = [PAPER_NAME.get(i, i) for i in ours.index]
    t = p.join(ours, how="outer")
    geo = {c: float(np.exp(np.log(t[c].dropna()).mean())) for c in t.columns if t[c].notna().any()}
    t.loc["geomean"] = pd.Series(geo)
    return t.reset_index().rename(columns={"index": "kernel"})


@table("Native instrumentation: calibration and buffer use", experiment="proton_fig15")
def native_checks(df):
    keys = ["calib_scope_cycles", "calib_scope_err", "calib_span_vs_events_err", "kernel_span_ms", "dropped_records"]
    d = df[df["metric"].isin(keys) & (df["status"] == "ok")]
    d = d.assign(kernel=kernel_label(d))
    return d.pivot_table(index="kernel", columns="metric", values="value").reset_index()
