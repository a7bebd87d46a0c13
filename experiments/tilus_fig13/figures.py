"""Tilus Fig. 13 (the artifact's Fig. 12): Qwen2.5-32B f16 against u4 on every GPU with results, ours beside the paper's."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from experiments.tilus_fig12.figures import IMPLS, PRE_FIX_NOTE, label, oom_points, paper, steps, with_speedup
from harness.figures import comparison, figure, finding, impl_color, listing, paper_dir, table, title_and_legend

EXPERIMENT = "tilus_fig13"
MODEL = "qwen2_5_32b"
PAPER_COLOR = {"vllm": "#CCB974", "tilus": "#4C72B0", "ladder": "#C44E52"}   # vLLM not native's grey
PAPER_NAME = {"vllm": "paper: vLLM f16", "tilus": "paper: Tilus u4", "ladder": "paper: Ladder u4"}


def bars(df: pd.DataFrame) -> pd.DataFrame:
    """(source, gpu, step, weight, who, ms, speedup) for ours (every GPU in the rows) and the paper's H100 and L40S."""
    s = with_speedup(steps(df))
    s = s[(s["model"] == MODEL) & s["weight_dtype"].isin(["f16", "u4"])]
    ours = pd.DataFrame({"source": "ours", "gpu": s["gpu"].str.upper(), "step": s["step"], "weight": s["weight_dtype"],
                         "who": s["impl"], "ms": s["ms"], "speedup": s["speedup"], "mode": s["mode"], "status": "ok",
                         "pre_fix": s["pre_fix"]})
    o = oom_points(df)
    o = o[(o["model"] == MODEL) & o["weight_dtype"].isin(["f16", "u4"])]
    ours = pd.concat([ours, pd.DataFrame({"source": "ours", "gpu": o["gpu"].str.upper(), "step": o["step"],
                                          "weight": o["weight_dtype"], "who": o["impl"], "ms": float("nan"),
                                          "speedup": float("nan"), "mode": "", "status": "oom"})])
    rows = [ours]
    for fig_no in (12, 11):          # the artifact's numbering: 12 = H100 (published Fig. 13), 11 = L40S
        p = paper(paper_dir(df), fig_no)
        p = p[(p["model"] == MODEL) & p["weight_dtype"].isin(["f16", "u4"])]
        if len(p):
            rows.append(pd.DataFrame({"source": "paper", "gpu": p["gpu"].str.replace("NVIDIA-", ""), "step": p["step"],
                                      "weight": p["weight_dtype"], "who": p["impl"],
                                      "ms": p["latency_ms"].where(p["status"] == "ok"), "speedup": p["speedup"],
                                      "mode": "cuda_graph", "status": p["status"]}))
    b = pd.concat(rows, ignore_index=True)
    b["pre_fix"] = b["pre_fix"].astype("boolean").fillna(False).astype(bool)
    b["order"] = [IMPLS.index(w) if s == "ours" and w in IMPLS else len(IMPLS) for s, w in zip(b["source"], b["who"])]
    return b


@figure("tilus_fig13", experiment=EXPERIMENT,
        caption="Qwen2.5-32B, one forward step, f16 against u4 weights, per GPU: ours (our engine: cuBLAS f16 "
                "linears against our low-bit kernels; vLLM where it ran) beside the paper's H100 (and L40S, where f16 "
                "did not fit). Numbers above the bars: speedup over the f16 bar of the same GPU and stack. Hatched: "
                "eager (Tilus launches cannot be captured in a CUDA graph).")
def fig13(df):
    b = bars(df)
    if b[b["source"] == "ours"].empty:
        return None
    stps = sorted(set(b["step"]), key=lambda t: (t.startswith("prefill"), len(t), t))
    gpus = sorted(set(b.loc[b["source"] == "ours", "gpu"])) + [g for g in ("H100-80GB-HBM3", "L40S")
                                                                if g in set(b["gpu"])]
    fig, axes = plt.subplots(1, len(stps), figsize=(5.2 * len(stps), 3.4), squeeze=False)
    seen = {}
    for ax, st in zip(axes[0], stps):
        x, ticks = 0.0, []
        for g in gpus:
            d = b[(b["gpu"] == g) & (b["step"] == st)]
            start = x
            for r in d.sort_values(["weight", "order", "who"]).itertuples():
                if r.ms != r.ms:
                    ax.text(x, 0, "OOM" if r.status == "oom" else r.status, rotation=90, ha="center", va="bottom", color="#C44E52", fontweight="bold")
                    x += 1
                    continue
                color = impl_color(r.who) if r.source == "ours" else PAPER_COLOR.get(r.who, "#999999")
                name = label(r.who) + f" ({r.weight})" if r.source == "ours" else PAPER_NAME.get(r.who, r.who)
                ax.bar(x, r.ms, 0.9, color=color, hatch="///" if r.mode == "eager" else None, edgecolor="white")
                if r.weight == "u4" and r.speedup == r.speedup:
                    ax.text(x, r.ms, f"{r.speedup:.2f}x" + ("\u2020" if r.pre_fix else ""), ha="center", va="bottom",
                            fontsize=7)
                seen[name] = color
                x += 1
            if x > start:
                ticks.append(((start + x - 1) / 2, g + (" (ours)" if (d["source"] == "ours").any() else " (paper)")))
                x += 0.8
        ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7)
        ax.set_title(st)
        ax.grid(axis="x", visible=False)
    axes[0, 0].set_ylabel("ms per step")
    handles = [Patch(color=c, label=n) for n, c in seen.items()]
    if b["pre_fix"].any():
        handles.append(Line2D([], [], ls="none", marker="$\u2020$", color="black", label=PRE_FIX_NOTE))
    title_and_legend(fig, "Tilus Fig. 13: Qwen2.5-32B f16 vs u4 across GPUs", handles, 3)
    return fig


@table("Qwen2.5-32B speedup of u4 over f16 per GPU and step (ours and the paper's)", experiment=EXPERIMENT)
def speedups(df):
    b = bars(df)
    b = b[(b["weight"] == "u4") & b["speedup"].notna()]
    if b.empty:
        return pd.DataFrame()
    return b.pivot_table(index=["source", "gpu", "who"], columns="step", values="speedup").reset_index()


@comparison(experiment=EXPERIMENT, title="The paper's Qwen2.5-32B latencies (H100, L40S) beside ours (ms)")
def vs_paper(df, pdir):
    b = bars(df)
    b["cell"] = [f"{m:.2f}" if m == m else st for m, st in zip(b["ms"], b["status"])]
    return b.pivot_table(index=["source", "gpu", "weight", "who"], columns="step", values="cell",
                         aggfunc="first").reset_index()


@finding(experiment=EXPERIMENT)
def findings(df):
    b = bars(df)
    u4 = b[(b["weight"] == "u4") & b["speedup"].notna()]
    out = []
    for st in sorted(set(u4["step"])):
        d = u4[u4["step"] == st]
        out.append(f"{st}: u4 over f16 " + listing(f"{r.gpu} {r.source} {r.who} {r.speedup:.2f}x"
                                                   + ("\u2020" if r.pre_fix else "") for r in d.itertuples()) + ".")
    if b["pre_fix"].any():
        out.append(f"\u2020 {PRE_FIX_NOTE} (tilus_fig12's); the row stands as measured.")
    return out
