"""Proton Fig. 13 (profiler overhead) and Fig. 14 (profile size) from the proton_fig13 rows, beside
the paper's GH200 numbers (results/paper/proton_overhead.csv, proton_profile_size.csv).

Fig. 14 is drawn from the same runs as Fig. 13 (each profiled process writes the profile whose
bytes are counted), so both figures live in this experiment's section of the report; see
experiments/proton_fig14/README.md.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from harness.figures import comparison, figure, table

try:
    from harness.figures import finding
except ImportError:                      # a harness.figures without findings: the sentences are not shown
    def finding(experiment):
        return lambda fn: fn

# our card name -> the paper's label (results/paper/*.csv, from the artifact's MODEL_MAPPING)
PAPER_NAME = {"llama3_1_8b": "Llama-3.1-8B", "llama3_3_70b": "Llama-3.3-70B", "gemma3_4b": "Gemma3-4B",
              "qwen3_30b_a3b": "Qwen3-30B-A3B", "gpt_oss_20b": "GPT-OSS-20B", "mistral_7b": "Mistral-7B",
              "phi3_5_mini": "Phi-3.5-Mini", "smollm2_1_7b": "SmolLM2.1-7B", "tinyllama_1_1b": "TinyLlama-Chat",
              "zephyr_7b": "Zephyr-SFT"}
ORDER = list(PAPER_NAME.values())
PROFILERS = ["none", "proton", "proton_python", "torch", "nsys"]
COLORS = {"none": "0.75", "proton": "#1f77b4", "proton_python": "#17becf", "torch": "#d62728", "nsys": "#2ca02c"}


def label(model: str) -> str:
    return PAPER_NAME.get(model, model)


def _paper(df: pd.DataFrame, name: str) -> pd.DataFrame:
    path = Path(df.attrs.get("results_dir", "results")) / "paper" / name
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def metric(df: pd.DataFrame, name: str, experiment: str = "proton_fig13") -> pd.DataFrame:
    """One row per point of `experiment` with the metric's value, p10, p90 and a `label` column."""
    d = df[(df["experiment"] == experiment) & (df["metric"] == name) & (df["status"] == "ok")]
    return d.assign(label=d["model"].map(label))


def geomean(xs) -> float:
    xs = np.asarray([x for x in xs if x == x and x > 0], dtype=float)
    return float(np.exp(np.log(xs).mean())) if len(xs) else float("nan")


def human(b: float) -> str:
    if b != b:
        return ""
    for unit in ("B", "K", "M", "G"):
        if b < 1024 or unit == "G":
            return f"{b:.0f}{unit}" if unit == "B" else f"{b:.3g}{unit}"
        b /= 1024
    return ""


def _bars(ax, rows: pd.DataFrame, order: list[str], hues: list[str], colors: dict, hatch: set[str]) -> None:
    """Grouped bars of rows (label, who, value, lo, hi) with p10-p90 whiskers where known."""
    width = 0.8 / max(1, len(hues))
    for j, who in enumerate(hues):
        r = rows[rows["who"] == who].set_index("label").reindex(order)
        x = np.arange(len(order)) + (j - (len(hues) - 1) / 2) * width
        err = np.vstack([(r["value"] - r["lo"]).clip(lower=0).fillna(0), (r["hi"] - r["value"]).clip(lower=0).fillna(0)])
        ax.bar(x, r["value"], width, color=colors[who], hatch="//" if who in hatch else None, edgecolor="white",
               label=who, yerr=err if r["lo"].notna().any() else None, capsize=1.5, error_kw={"lw": 0.7})
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    ax.axhline(1.0, color="k", lw=0.8)


@figure("proton_fig13", experiment="proton_fig13",
        caption="Profiled over unprofiled time of the same region (LoRA fine-tuning steps; inference = prefill + "
                "decode), per model and profiler. Ours: H200, one fresh process per profiler, whiskers = the "
                "unprofiled baseline's p10-p90 across the group's processes; `none` is the control (the region "
                "timed twice without a profiler). Hatched: the paper's GH200 numbers (Unsloth, whole "
                "trainer.train() of 30 steps, full depth); ours run capped layers (model_layers in the rows).")
def fig13(df):
    o = metric(df, "overhead")
    if o.empty:
        return None
    workloads = [w for w in ("train", "infer") if w in set(o["workload"])]
    fig, axes = plt.subplots(len(workloads), 1, figsize=(13, 4.2 * len(workloads)), squeeze=False)
    paper = _paper(df, "proton_overhead.csv")
    for ax, w in zip(axes[:, 0], workloads):
        d = o[o["workload"] == w]
        gpus = sorted(d["gpu"].unique())
        rows = [pd.DataFrame({"label": d["label"], "who": d["profiler"] + " (" + d["gpu"] + ")",
                              "value": d["value"], "lo": d["p10"], "hi": d["p90"]})]
        colors = {f"{p} ({g})": COLORS.get(p, "0.5") for p in PROFILERS for g in gpus}
        hatch = set()
        if w == "train" and not paper.empty:
            pp = paper[(paper["gpu"] == "GH200") & (paper["profiler"] != "none")]
            rows.insert(0, pd.DataFrame({"label": pp["model"], "who": "paper " + pp["profiler"] + " (GH200)",
                                         "value": pp["overhead_ratio"], "lo": np.nan, "hi": np.nan}))
            for p in ("proton", "torch", "nsys"):
                colors[f"paper {p} (GH200)"] = sns.desaturate(COLORS[p], 0.35)
                hatch.add(f"paper {p} (GH200)")
        rows = pd.concat(rows, ignore_index=True)
        order = [m for m in ORDER if m in set(rows["label"])] + sorted(set(rows["label"]) - set(ORDER))
        hues = sorted((h for h in colors if h in set(rows["who"])), key=lambda h: not h.startswith("paper"))
        _bars(ax, rows, order, hues, colors, hatch)
        vals = rows[["value", "lo", "hi"]].to_numpy(dtype=float)
        ax.set_ylim(min(0.8, float(np.nanmin(vals)) * 0.95), max(1.5, float(np.nanmax(vals)) * 1.05))
        ax.set_ylabel("profiled / unprofiled time")
        ax.set_title(f"{'LoRA fine-tuning' if w == 'train' else 'Inference (prefill + decode)'}: profiler overhead")
        ax.legend(fontsize=7, ncol=4, loc="upper left")
    fig.tight_layout()
    return fig


@figure("proton_fig14", experiment="proton_fig13",
        caption="Bytes each profiler wrote for the region of Fig. 13 (log colour scale): the paper's GH200 "
                "profiles of 30 full-depth training steps beside ours (H200, capped layers, a region of about "
                "target_s seconds). Proton writes a tree (one node per kernel and context), the PyTorch profiler "
                "one Chrome-trace event per op and kernel, so only Proton's size is independent of run length.")
def fig14(df):
    b = metric(df, "profile_bytes")
    if b.empty:
        return None
    cols = {}
    paper = _paper(df, "proton_profile_size.csv")
    if not paper.empty:
        p = paper[paper["gpu"] == "GH200"].pivot_table(index="model", columns="profiler", values="size_bytes")
        for c in ("proton", "torch", "nsys"):
            if c in p:
                cols[f"paper {c}\n(GH200)"] = p[c]
    for (w, g), d in sorted(b.groupby(["workload", "gpu"]), key=lambda kv: (kv[0][0] != "train", kv[0][1])):
        piv = d.pivot_table(index="label", columns="profiler", values="value")
        for c in [c for c in PROFILERS if c in piv]:
            cols[f"{c}\n({g}, {w})"] = piv[c]
    t = pd.DataFrame(cols)
    t = t.reindex([m for m in ORDER if m in t.index] + sorted(set(t.index) - set(ORDER)))
    fig, ax = plt.subplots(figsize=(1.15 * len(t.columns) + 2.5, 0.45 * len(t) + 1.8))
    sns.heatmap(np.log10(t.astype(float)), annot=t.map(human), fmt="", cmap="viridis", ax=ax,
                cbar_kws={"label": "log10(bytes)"}, annot_kws={"fontsize": 7})
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title("Profile size (Proton Fig. 14)")
    return fig


@comparison(experiment="proton_fig13")
def vs_paper(df, paper_dir):
    """Overhead per model: the paper's GH200 LoRA runs beside ours (train and infer), with the noise of
    our unprofiled baseline; a geomean row."""
    p = pd.read_csv(Path(paper_dir) / "proton_overhead.csv")
    p = p[(p["gpu"] == "GH200") & (p["profiler"] != "none")].pivot_table(index="model", columns="profiler",
                                                                          values="overhead_ratio")
    p.columns = [f"paper {c} (GH200)" for c in p.columns]
    o = metric(df, "overhead")
    ours = o[o["profiler"] != "none"].pivot_table(index="label", columns=["workload", "profiler", "gpu"], values="value")
    ours.columns = [f"ours {w} {pr} ({g})" for w, pr, g in ours.columns]
    cv = metric(df, "baseline_cv").pivot_table(index="label", columns=["workload", "gpu"], values="value")
    cv.columns = [f"baseline CV {w} ({g})" for w, g in cv.columns]
    layers = metric(df, "overhead").groupby("label")["model_layers"].first().rename("model_layers")
    t = p.join(ours, how="outer").join(cv, how="left").join(layers, how="left")
    t = t.reindex([m for m in ORDER if m in t.index] + sorted(set(t.index) - set(ORDER)))
    geo = {c: geomean(t[c]) for c in t.columns if c.startswith(("paper", "ours"))}
    t = t.astype(object)                    # the geomean row leaves the other columns empty
    t.loc["geomean"] = pd.Series(geo, dtype=object)
    return t.reset_index().rename(columns={"index": "model"})


@table("Profile size: paper (GH200) vs ours", experiment="proton_fig13")
def sizes(df):
    p = _paper(df, "proton_profile_size.csv")
    b = metric(df, "profile_bytes")
    ours = b.pivot_table(index="label", columns=["workload", "profiler"], values="value")
    ours.columns = [f"ours {w} {pr}" for w, pr in ours.columns]
    t = ours
    if not p.empty:
        pp = p[p["gpu"] == "GH200"].pivot_table(index="model", columns="profiler", values="size_bytes")
        pp.columns = [f"paper {c}" for c in pp.columns]
        t = pp.join(ours, how="outer")
    t = t.reindex([m for m in ORDER if m in t.index] + sorted(set(t.index) - set(ORDER)))
    out = t.map(human)
    for pre in ("paper", "ours train", "ours infer"):
        a, c = f"{pre} torch", f"{pre} proton"
        if a in t and c in t:
            out[f"{pre}: torch / proton"] = (t[a] / t[c]).round(0)
    return out.reset_index().rename(columns={"index": "model"})


@table("Does the paper's ordering hold on this GPU? (LoRA training)", experiment="proton_fig13")
def ordering(df):
    """Per model: Proton's and the PyTorch profiler's overhead, whether Proton is lower by more than the
    baseline noise (2 x CV), and how many times larger the PyTorch trace is than Proton's tree."""
    o = metric(df, "overhead")
    o = o[o["workload"] == "train"]
    cv = metric(df, "baseline_cv")
    cv = cv[cv["workload"] == "train"].groupby("label")["value"].first()
    b = metric(df, "profile_bytes")
    b = b[b["workload"] == "train"].pivot_table(index="label", columns="profiler", values="value")
    piv = o.pivot_table(index="label", columns="profiler", values="value")
    rows = []
    for m in [m for m in ORDER if m in piv.index] + sorted(set(piv.index) - set(ORDER)):
        pr, to = piv.loc[m].get("proton", np.nan), piv.loc[m].get("torch", np.nan)
        noise = 2 * cv.get(m, np.nan)
        verdict = ("yes" if to - pr > noise else "no" if pr - to > noise else "within noise") if pr == pr and to == to else ""
        ratio = b.loc[m, "torch"] / b.loc[m, "proton"] if m in b.index and {"torch", "proton"} <= set(b.columns) else np.nan
        rows.append({"model": m, "proton": pr, "proton_python": piv.loc[m].get("proton_python", np.nan), "torch": to,
                     "baseline CV": cv.get(m, np.nan), "proton below torch": verdict, "torch / proton bytes": ratio})
    return pd.DataFrame(rows)


@finding(experiment="proton_fig13")
def findings(df):
    """Model by model, with numbers: does Proton cost less than the PyTorch profiler here, are the
    sizes orders of magnitude apart, and what the workload's launch rate was."""
    t = ordering(df)
    if t.empty:
        return []
    out = []
    both = t.dropna(subset=["proton", "torch"])
    if len(both):
        held = int((both["proton below torch"] == "yes").sum())
        paper = _paper(df, "proton_overhead.csv")
        pg = paper[paper["gpu"] == "GH200"].groupby("profiler")["overhead_ratio"].apply(geomean) \
            if not paper.empty else pd.Series(dtype=float)
        ref = (f"; the paper on GH200: {pg['proton']:.2f}x and {pg['torch']:.2f}x"
               if {"proton", "torch"} <= set(pg.index) else "")
        out.append(f"LoRA training: Proton's overhead is below the PyTorch profiler's by more than twice the "
                   f"baseline's noise for {held} of {len(both)} models (geomean Proton {geomean(both['proton']):.2f}x, "
                   f"PyTorch profiler {geomean(both['torch']):.2f}x{ref}).")
    for _, r in t.iterrows():
        bits = [f"Proton {r['proton']:.2f}x" if r["proton"] == r["proton"] else "",
                f"Proton (Python context) {r['proton_python']:.2f}x" if r["proton_python"] == r["proton_python"] else "",
                f"PyTorch profiler {r['torch']:.2f}x" if r["torch"] == r["torch"] else "",
                f"baseline CV {100 * r['baseline CV']:.1f}%" if r["baseline CV"] == r["baseline CV"] else "",
                f"PyTorch trace {r['torch / proton bytes']:.0f}x Proton's tree" if r["torch / proton bytes"] == r["torch / proton bytes"] else ""]
        verdict = {"yes": "the paper's ordering holds", "no": "the ordering is reversed",
                   "within noise": "the two are within the noise"}.get(r["proton below torch"], "")
        out.append(f"{r['model']}: " + ", ".join(b for b in bits if b) + (f"; {verdict}." if verdict else "."))
    rate = metric(df, "launches_per_s")
    rate = rate[(rate["workload"] == "train") & (rate["profiler"] == "proton")]
    if len(rate):
        out.append(f"Kernel launches per second of the unprofiled training region (from Proton's tree): "
                   f"{rate['value'].min():,.0f} to {rate['value'].max():,.0f} "
                   f"(experiments/proton_overhead_sweep relates overhead to this rate).")
    cv, ctrl = metric(df, "baseline_cv"), metric(df, "overhead")
    cv, ctrl = cv[cv["profiler"] == "none"], ctrl[ctrl["profiler"] == "none"]
    for wl, g in cv.groupby("workload"):
        c = ctrl[ctrl["workload"] == wl]["value"]
        out.append(f"Noise, {wl}: the unprofiled baseline's spread across the processes of a point is "
                   f"{g['value'].min():.1%}-{g['value'].max():.1%} (median {g['value'].median():.1%}; target 2%), and the "
                   f"`none` control reads {c.min():.2f}-{c.max():.2f}x: per-model differences smaller than about "
                   f"{2 * g['value'].median():.0%} are not resolved (experiments/proton_noise looks for the cause).")
    return out
