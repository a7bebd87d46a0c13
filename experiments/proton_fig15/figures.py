"""Proton Fig. 15: instrumentation overhead per kernel, ours (H200) beside the paper's (GH200), and a warp timeline."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from harness.figures import comparison, figure, finding, geomean, listing, paper_dir, span, table

NATIVE_TARGET = 1.03   # issue 13: the native header's geomean overhead over the native kernels
REGS_KERNEL = "native_lowbit_regs"   # the low-bit kernel in its regs variant: reported beside the target, not in it

PAPER_NAME = {"moe_matmul": "matmul_ogs"}


def kernel_label(df: pd.DataFrame) -> pd.Series:
    """The suite kernel for Triton rows, 'native_<kernel>' for our CUDA kernels."""
    return df["workload"].where(df["impl"] != "native", "native_" + df["workload"])


def _size(params: str) -> str:
    return json.loads(params).get("size", "") if params else ""


def overheads(df: pd.DataFrame) -> pd.DataFrame:
    """instrumented / plain latency per (gpu, kernel, profiler, mode), plain measured in the same job;
    lo/hi: the ratio's spread from both timings' p10/p90."""
    lat = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
    lat = lat.assign(kernel=kernel_label(lat), size=lat["params"].fillna("").map(_size))
    base = lat[lat["profiler"] == "none"][["gpu", "kernel", "size", "value", "p10", "p90"]]
    base = base.rename(columns={"value": "plain_ms", "p10": "plain_p10", "p90": "plain_p90"})
    inst = lat[lat["profiler"] != "none"].merge(base, on=["gpu", "kernel", "size"])
    inst["overhead"] = inst["value"] / inst["plain_ms"]
    inst["lo"] = (inst["p10"] / inst["plain_p90"]).fillna(inst["overhead"])
    inst["hi"] = (inst["p90"] / inst["plain_p10"]).fillna(inst["overhead"])
    inst["mode"] = inst["params"].fillna("").map(_mode_label)
    return inst


def _mode_label(params: str) -> str:
    if not params:
        return "default"
    d = {k: v for k, v in json.loads(params).items() if k != "size"}
    if "buffer_records" in d:                   # our native header: staged (default) | warp0 | direct
        cap = d["buffer_records"]               # auto (the default) | records per warp
        return f"native {d.get('mode', 'direct')}" + ("" if cap == "auto" else f" ({cap} records)")
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items())) or "default"


def _paper(df: pd.DataFrame) -> pd.DataFrame:
    path = paper_dir(df) / "proton_instrumentation.csv"
    if not path.exists():
        return pd.DataFrame(columns=["gpu", "kernel", "overhead_ratio"])
    p = pd.read_csv(path)
    inv = {v: k for k, v in PAPER_NAME.items()}
    return p.assign(kernel=p["kernel"].map(lambda k: inv.get(k, k)))


BAR_COLORS = {"paper": "0.62", "proton": "#4C72B0", "native": "#DD8452"}


@figure("proton_fig15", experiment="proton_fig15",
        caption="Instrumented over plain kernel time (CUPTI kernel durations, same job), per kernel; bars start at "
                "1.0, so an overhead below 1 points down. Grey: the paper's GH200 value (Proton's default mode); "
                "blue: ours with Proton's default mode; orange: our native CUDA kernels with our own header "
                "(native/). Error bars: the ratio's spread from both timings' p10/p90. The other modes are in "
                "the table below.")
def fig15(df):
    o = overheads(df)
    if o.empty:
        return None
    ours = o[((o["profiler"] == "proton") & (o["mode"] == "default"))
             | ((o["profiler"] == "native") & (o["mode"] == "native staged"))]
    ours = ours.groupby(["kernel", "profiler"])[["overhead", "lo", "hi"]].median().reset_index()
    p = _paper(df)
    p = p[p["gpu"] == "GH200"]
    kernels = sorted(set(ours["kernel"]) | set(p["kernel"]), key=lambda k: (k.startswith("native_"), k))
    gpu = ", ".join(sorted(o["gpu"].str.upper().unique()))
    fig, ax = plt.subplots(figsize=(12, 4.2))
    w = 0.38
    for i, k in enumerate(kernels):
        pk = p[p["kernel"] == k]["overhead_ratio"]
        ok = ours[ours["kernel"] == k]
        if len(pk):
            v = float(pk.iloc[0])
            ax.bar(i - w / 2, v - 1, w, bottom=1, color=BAR_COLORS["paper"])
        for r in ok.itertuples():
            x = i + w / 2 if len(pk) else i
            ax.bar(x, r.overhead - 1, w, bottom=1, color=BAR_COLORS["native" if r.profiler == "native" else "proton"])
            ax.errorbar(x, r.overhead, yerr=[[max(r.overhead - r.lo, 0)], [max(r.hi - r.overhead, 0)]],
                        color="black", lw=0.8, capsize=2)
    ax.axhline(1.0, color="black", lw=0.8)
    allv = list(ours["hi"]) + list(ours["lo"]) + list(p["overhead_ratio"])
    ax.set_ylim(min(0.95, min(allv) - 0.02), max(allv) + 0.03)
    ax.set_xticks(range(len(kernels)), kernels, rotation=30, ha="right")
    ax.set_ylabel("instrumented / plain time")
    ax.grid(axis="x", visible=False)
    ax.legend(handles=[Patch(color=BAR_COLORS["paper"], label="paper: Proton default (GH200)"),
                       Patch(color=BAR_COLORS["proton"], label=f"ours: Proton default ({gpu})"),
                       Patch(color=BAR_COLORS["native"], label=f"ours: native header, staged mode ({gpu})")],
              loc="upper right", frameon=False)
    ax.set_title(f"Proton Fig. 15: intra-kernel instrumentation overhead, GH200 (paper) beside {gpu} (ours)")
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
    boxes: dict[str, list] = {n: [] for n in names}          # one collection per scope: fast to draw
    for e in ev:
        t = (e["pid"], e["tid"])
        if t in ypos:
            x0, x1, y = e["ts"], e["ts"] + max(e["dur"], 1e-3), ypos[t]
            boxes[e["name"]].append([(x0, y - 0.4), (x1, y - 0.4), (x1, y + 0.4), (x0, y + 0.4)])
    for n, verts in boxes.items():
        ax.add_collection(PolyCollection(verts, facecolors=col[n], edgecolors="none"))
    ax.autoscale_view()
    ax.set_yticks(range(len(tracks)), [f"SM{p} t{t}" for p, t in tracks], fontsize=6)
    ax.set_xlabel("time since the first block started (us)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in col.values()], labels=names, fontsize=7,
              loc="upper right")
    ax.set_title(f"Warp timeline: {cands[0].name} ({cands[0].parent.name}, {gpu.upper()})")
    return fig


@comparison(experiment="proton_fig15", title="The paper's overheads beside ours, per kernel and mode")
def vs_paper(df, paper_dir):
    o = overheads(df)
    p = pd.read_csv(Path(paper_dir) / "proton_instrumentation.csv")
    p = p.pivot_table(index="kernel", columns="gpu", values="overhead_ratio")
    p.columns = [f"paper {c}" for c in p.columns]
    ours = o.pivot_table(index="kernel", columns=["gpu", "mode"], values="overhead", aggfunc="median")
    ours.columns = [f"ours {g} {m}" for g, m in ours.columns]
    ours.index = [PAPER_NAME.get(i, i) for i in ours.index]
    t = p.join(ours, how="outer")
    geo = {c: geomean(t[c].dropna()) for c in t.columns if t[c].notna().any()}
    t.loc["geomean"] = pd.Series(geo)
    return t.reset_index().rename(columns={"index": "kernel"})


@table("Native instrumentation: calibration and buffer use", experiment="proton_fig15")
def native_checks(df):
    keys = ["calib_scope_cycles", "calib_scope_err", "calib_span_vs_events_err", "kernel_span_ms", "dropped_records"]
    d = df[df["metric"].isin(keys) & (df["status"] == "ok")]
    d = d.assign(kernel=kernel_label(d))
    return d.pivot_table(index="kernel", columns="metric", values="value").reset_index()


@finding(experiment="proton_fig15")
def findings(df):
    o = overheads(df)
    out = []
    if o.empty:
        return out
    p = _paper(df)
    gh = p[p["gpu"] == "GH200"].set_index("kernel")["overhead_ratio"]
    prot = o[o["profiler"] == "proton"]
    dflt = prot[prot["mode"] == "default"].groupby("kernel")["overhead"].median()
    if len(dflt):
        common = dflt.index.intersection(gh.index)
        worst = dflt.idxmax()
        out.append(f"Proton's default instrumentation: geomean {geomean(dflt):.3f}x over {len(dflt)} kernels, "
                   f"{span(dflt)}x per kernel, the most expensive {worst} ({dflt[worst]:.2f}x); the paper's GH200 "
                   f"geomean over the same {len(common)} kernels is {geomean(gh[common]):.3f}x, its most expensive "
                   f"{gh[common].idxmax()} ({gh[common].max():.2f}x).")
        spread = prot[prot["mode"] == "default"].groupby("kernel")[["lo", "hi"]].median()
        below = dflt[dflt < 1]
        if len(below):
            inside = [k for k in below.index if spread.loc[k, "hi"] >= 1]
            out.append(f"Below 1x (instrumented faster than plain): "
                       f"{listing(f'{k} {v:.3f}x' for k, v in below.items())}; 1x lies inside the p10/p90 spread "
                       f"for {len(inside)} of them.")
    modes = prot[prot["mode"] != "default"].groupby("mode")["overhead"].apply(geomean)
    if len(modes):
        out.append("Other modes, geomean over the kernels: " + "; ".join(f"{m} {v:.3f}x" for m, v in modes.items()) + ".")
    kernels = set(o.loc[o["profiler"] == "native", "kernel"]) - {REGS_KERNEL}
    for m, g in o[o["profiler"] == "native"].groupby("mode"):
        per = g.groupby("kernel")["overhead"].median()
        nat = per.drop(REGS_KERNEL, errors="ignore")   # the target's kernels: the low-bit one in its `auto` variant
        gm = geomean(nat)
        bounds = g[g["kernel"] != REGS_KERNEL].groupby("kernel")[["lo", "hi"]].median()   # p10 / plain p90 .. p90 / p10
        missing = sorted(kernels - set(nat.index))
        verdict = (f"the issue-13 target (<= {NATIVE_TARGET}x over the native kernels, the low-bit one included) "
                   f"is {'met' if gm <= NATIVE_TARGET and not missing else 'missed'}"
                   + (f" (not built in this mode: {', '.join(missing)})" if missing else ""))
        if REGS_KERNEL in per and "native_lowbit" in nat:   # the same target with the variant `timed` runs there
            alt = geomean(pd.concat([nat.drop("native_lowbit"), per[[REGS_KERNEL]]]))
            verdict += (f"; with the low-bit kernel's regs variant (what `timed` runs at this point, "
                        f"{per[REGS_KERNEL]:.3f}x) in place of `auto`'s: geomean {alt:.3f}x, "
                        f"{'met' if alt <= NATIVE_TARGET else 'missed'}")
        out.append(f"Our native header ({m.removeprefix('native ')} mode) on our CUDA kernels: "
                   f"{listing(f'{k} {v:.3f}x' for k, v in nat.items())}; geomean {gm:.3f}x "
                   f"({geomean(bounds['lo']):.3f}-{geomean(bounds['hi']):.3f}x from the p10/p90 of both timings): "
                   f"{verdict}.")
    failed = df[(df["status"] != "ok") & (df["profiler"] == "proton")].drop_duplicates("point_hash")
    if len(failed):
        mode = failed["params"].fillna("").map(_mode_label)
        for (m, err), g in failed.groupby([mode, "error"]):
            out.append(f"Mode {m} did not run for {len(g)} kernels: {err[:160]}.")
    calib = df[(df["metric"] == "calib_scope_err") & (df["status"] == "ok")]["value"]
    if len(calib):
        out.append(f"Calibration: a scope spinning a known number of cycles reads back within "
                   f"{100 * float(np.max(np.abs(calib))):.2f}% of it.")
    return out
