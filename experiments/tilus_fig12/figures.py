"""Tilus Fig. 12 (the artifact's Fig. 11): whole-model step latency with low-bit weights, ours beside the paper's."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.figures import (comparison, figure, finding, impl_color, impl_label, listing, paper_dir, span, table,
                             title_and_legend)

EXPERIMENT = "tilus_fig12"
DTYPES = ["f16", "bf16", "u8", "u4", "u2"]             # the paper's order, widest first
MODELS = ["gemma2_9b", "qwen2_5_32b", "llama3_3_70b"]
# the artifact's model ids (results/paper/tilus_e2e.csv) -> our cards (Llama-3-70B and 3.3-70B share the architecture)
PAPER_MODEL = {"google/gemma-2-9b": "gemma2_9b", "Qwen/Qwen2.5-Coder-32B-Instruct": "qwen2_5_32b",
               "meta-llama/Meta-Llama-3-70B-Instruct": "llama3_3_70b"}
# the artifact's backends -> labels; its f16 bars are vLLM's own f16 path
PAPER_IMPL = {"vllm": "vLLM f16", "tilus": "Tilus", "ladder": "Ladder"}
OUR_LABEL = {"cublas": "our engine, cuBLAS f16", "vllm": "vLLM (our adapter)"}
IMPLS = ["cublas", "triton", "native", "tilus", "torch_int4", "vllm"]     # bar order within a weight type
# commit 8b50789 (2026-12-01 06:32 UTC): the engine hands a kernel's transposed output (native's prefill path returns
# y^T viewed as [M, N]) to the model row-major. native prefill rows timed before it ran with that layout in every op
# after the linears, and attention on PyTorch's f32 math path where SDPA would have used flash attention
NATIVE_LAYOUT_FIX = pd.Timestamp("2026-12-01T06:32:32+00:00")
PRE_FIX_NOTE = "native prefill timed before the engine's layout fix (8b50789): not the kernels' time, see the README"


def label(impl: str) -> str:
    return OUR_LABEL.get(impl, f"our engine, {impl_label(impl)}")


def step_name(phase: str, batch: int, seq_len: int) -> str:
    return f"decode, batch {batch}" if phase == "decode" else f"prefill, {seq_len} tokens"


def steps(df: pd.DataFrame) -> pd.DataFrame:
    """One row per measured point: latency (p10, p90), prediction, split, floor, the execution mode."""
    ok = df[df["status"] == "ok"]
    key = ["gpu", "model", "phase", "batch", "seq_len", "weight_dtype", "impl", "model_layers"]
    lat = ok[ok["metric"] == "latency_ms"]
    lat = lat.assign(ts=pd.to_datetime(lat["ts_utc"], utc=True, errors="coerce") if "ts_utc" in lat
                     else pd.NaT)[key + ["value", "p10", "p90", "params", "ts"]].rename(columns={"value": "ms"})
    if lat.empty:
        return lat
    lat = lat.groupby(key, as_index=False).agg({"ms": "median", "p10": "median", "p90": "median", "params": "first",
                                                "ts": "max"})
    lat["pre_fix"] = ((lat["impl"] == "native") & (lat["phase"] == "prefill")
                      & (lat["ts"] < NATIVE_LAYOUT_FIX).fillna(False).astype(bool))
    lat["mode"] = lat["params"].map(lambda s: json.loads(s).get("mode", "") if isinstance(s, str) and s else "")
    for m in ("predicted_ms", "gemm_ms", "nongemm_ms", "floor_ms", "weight_bytes", "floor_bytes", "kv_cache_bytes"):
        v = ok[ok["metric"] == m].groupby(key)["value"].median().rename(m)
        lat = lat.merge(v, left_on=key, right_index=True, how="left")
    # decode rows from before floor_bytes (floor_ms = weight_bytes / bandwidth): the floor also reads the KV
    # cache; their whole cache is read (its context fits every layer's window), so scale by its bytes
    old = (lat["phase"] == "decode") & lat["floor_bytes"].isna() & lat["kv_cache_bytes"].notna() & (lat["weight_bytes"] > 0)
    lat.loc[old, "floor_ms"] = lat.loc[old, "floor_ms"] * (1 + lat.loc[old, "kv_cache_bytes"] / lat.loc[old, "weight_bytes"])
    src = ok[ok["metric"] == "predicted_ms"].groupby(key)["impl_config"].first().rename("predicted_from")
    lat = lat.merge(src, left_on=key, right_index=True, how="left")
    lat["step"] = [step_name(p, b, s) for p, b, s in zip(lat["phase"], lat["batch"], lat["seq_len"])]
    return lat


def oom_points(df: pd.DataFrame) -> pd.DataFrame:
    o = df[df["status"] == "oom"].drop_duplicates("point_hash")
    o = o.assign(step=[step_name(p, b, s) for p, b, s in zip(o["phase"], o["batch"], o["seq_len"])])
    return o


def with_speedup(s: pd.DataFrame) -> pd.DataFrame:
    """Speedup over the f16 baseline of the same stack and step: our engine's cuBLAS f16 for our engine's
    kernels, vLLM's f16 for vLLM; predicted speedup the same way from predicted_ms."""
    s = s.copy()
    s["stack"] = np.where(s["impl"] == "vllm", "vllm", "ours")
    base = s[s["weight_dtype"].isin(["f16", "bf16"])].groupby(["gpu", "model", "step", "stack"])[
        ["ms", "predicted_ms"]].median().rename(columns={"ms": "f16_ms", "predicted_ms": "f16_predicted_ms"})
    s = s.merge(base, left_on=["gpu", "model", "step", "stack"], right_index=True, how="left")
    s["speedup"] = s["f16_ms"] / s["ms"]
    s["predicted_speedup"] = s["f16_predicted_ms"] / s["predicted_ms"]
    return s


def paper(pdir, figure_no: int = 11) -> pd.DataFrame:
    """The artifact's end-to-end rows (its figure numbers: 11 = published Fig. 12, 12 = Fig. 13)."""
    path = pdir / "tilus_e2e.csv"
    if not path.exists():
        return pd.DataFrame()
    p = pd.read_csv(path)
    p = p[p["figure"] == figure_no].copy()
    p["model"] = p["model"].map(PAPER_MODEL).fillna(p["model"])
    p["step"] = [step_name(a, b, c) for a, b, c in zip(p["stage"], p["batch_size"], p["prompt_or_context_tokens"])]
    base = p[(p["impl"] == "vllm") & (p["status"] == "ok")].set_index(["gpu", "model", "step"])["latency_ms"]
    p["speedup"] = [base.get((g, m, st), np.nan) / v for g, m, st, v in zip(p["gpu"], p["model"], p["step"],
                                                                            p["latency_ms"])]
    return p


def _order(values, order):
    return [v for v in order if v in set(values)] + sorted(set(values) - set(order))


def latency_grid(s: pd.DataFrame, oom: pd.DataFrame, title: str, p: pd.DataFrame | None = None):
    """Rows = models, columns = steps; per weight type one bar per implementation (p10-p90 whisker),
    a black tick at the prediction, a red dash at the floor, hatching for eager (no CUDA graph) runs."""
    models = _order(set(s["model"]) | set(oom["model"]), MODELS)
    stps = sorted(set(s["step"]) | set(oom["step"]), key=lambda t: (t.startswith("prefill"), len(t), t))
    impls = _order(set(s["impl"]), IMPLS)
    fig, axes = plt.subplots(len(models), len(stps), figsize=(4.2 * len(stps), 2.7 * len(models)), squeeze=False)
    for r, model in enumerate(models):
        for c, st in enumerate(stps):
            ax = axes[r, c]
            d = s[(s["model"] == model) & (s["step"] == st)]
            o = oom[(oom["model"] == model) & (oom["step"] == st)]
            x, ticks = 0.0, []
            top = d["p90"].max() if len(d) else 1.0
            for t in _order(set(d["weight_dtype"]) | set(o["weight_dtype"]), DTYPES):
                start = x
                dd = d[d["weight_dtype"] == t]
                if dd.empty and (o["weight_dtype"] == t).any():
                    ax.text(x, 0.05 * top, "OOM", rotation=90, ha="center", va="bottom", fontweight="bold",
                            color="#C44E52")
                    x += 1
                for i in impls:
                    row = dd[dd["impl"] == i]
                    if row.empty:
                        continue
                    row = row.iloc[0]
                    ax.bar(x, row["ms"], 0.9, color=impl_color(i), edgecolor="white", linewidth=0.5,
                           hatch="///" if row["mode"] == "eager" else None)
                    ax.errorbar(x, row["ms"], yerr=[[row["ms"] - row["p10"]], [row["p90"] - row["ms"]]],
                                color="black", lw=0.7, capsize=1.5)
                    if row["predicted_ms"] == row["predicted_ms"]:
                        ax.plot([x - 0.4, x + 0.4], [row["predicted_ms"]] * 2, color="black", lw=1.4)
                    if row["floor_ms"] == row["floor_ms"]:
                        ax.plot([x - 0.4, x + 0.4], [row["floor_ms"]] * 2, color="#C44E52", lw=1.2, ls="--")
                    if row["pre_fix"]:
                        ax.text(x, row["p90"], "\u2020", ha="center", va="bottom", fontsize=9, fontweight="bold")
                    x += 1
                if x > start:
                    ticks.append(((start + x - 1) / 2, t))
                    x += 0.6
            if p is not None and len(p):   # the paper's speedup over its f16, as text under the panel title
                pp = p[(p["model"] == model) & (p["step"] == st) & (p["impl"] == "tilus") & (p["status"] == "ok")]
                sp = ", ".join(f"{w} {v:.2f}x" for w, v in pp.set_index("weight_dtype")["speedup"].dropna().items())
                if sp:
                    ax.text(0.99, 0.97, f"paper (L40S) Tilus vs f16: {sp}", transform=ax.transAxes, ha="right",
                            va="top", fontsize=7)
            ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks])
            ax.set_xlim(-0.7, max(x - 1.1, 0.5))
            ax.set_ylim(0, top * 1.25 if top == top else 1)
            ax.grid(axis="x", visible=False)
            if r == 0:
                ax.set_title(st)
            if c == 0:
                ax.set_ylabel(f"{model}\nms per step")
    handles = [Patch(color=impl_color(i), label=label(i)) for i in impls]
    handles += [Line2D([], [], color="black", lw=1.4, label="predicted (kernel rows + non-GEMM)"),
                Line2D([], [], color="#C44E52", lw=1.2, ls="--", label="floor (weight + KV bytes)"),
                Patch(facecolor="white", edgecolor="black", hatch="///", label="eager (not a CUDA graph)")]
    if s["pre_fix"].any():
        handles.append(Line2D([], [], ls="none", marker="$\u2020$", color="black", label=PRE_FIX_NOTE))
    _same_width(axes)
    title_and_legend(fig, title, handles, 4)
    return fig


def _same_width(axes) -> None:
    """One bar width in every panel: the x range of the widest panel everywhere (a panel of one bar would
    otherwise stretch it across the panel)."""
    right = max(ax.get_xlim()[1] for ax in axes.flat)
    for ax in axes.flat:
        ax.set_xlim(-0.7, right)


@figure("tilus_fig12", experiment=EXPERIMENT,
        caption="One forward step of whole models with random weights (bars: median, whiskers p10-p90): decode of one "
                "token for each of 1 or 16 sequences holding 2048 context tokens in total, and a 2048-token prefill, "
                "per weight type and implementation. Black tick: the prediction from kernel-level times plus the "
                "measured non-GEMM time; red dash: weight and KV-cache bytes over the measured HBM bandwidth; hatched: run eagerly "
                "(Tilus launches cannot be captured in a CUDA graph). 'OOM': weights over 0.8 x GPU memory (the "
                "artifact's rule). The text in a panel gives the paper's L40S speedups of Tilus over vLLM f16.")
def fig12(df):
    s = steps(df)
    if s.empty:
        return None
    gpu = ", ".join(sorted(s["gpu"].str.upper().unique()))
    return latency_grid(s, oom_points(df), f"Tilus Fig. 12 reproduced on the {gpu}: step latency (ms)",
                        paper(paper_dir(df)))


@figure("tilus_fig12_speedup", experiment=EXPERIMENT,
        caption="Speedup over f16 of the same stack and step (our engine: over its cuBLAS f16 linears; vLLM: over its "
                "own f16), measured (bars) and predicted from kernel-level times (circles); diamonds: the paper's "
                "Tilus speedup over vLLM f16 on the L40S where its f16 model fit (Gemma-2-9B only).")
def fig12_speedup(df):
    s = with_speedup(steps(df))
    s = s[~s["weight_dtype"].isin(["f16", "bf16"]) & s["speedup"].notna()]
    if s.empty:
        return None
    p = paper(paper_dir(df))
    stps = sorted(set(s["step"]), key=lambda t: (t.startswith("prefill"), len(t), t))
    models = _order(set(s["model"]), MODELS)
    impls = _order(set(s["impl"]), IMPLS)
    fig, axes = plt.subplots(len(models), len(stps), figsize=(4.2 * len(stps), 2.6 * len(models)), squeeze=False,
                             sharey=True)
    for r, model in enumerate(models):
        for c, st in enumerate(stps):
            ax = axes[r, c]
            d = s[(s["model"] == model) & (s["step"] == st)]
            x, ticks = 0.0, []
            for t in _order(set(d["weight_dtype"]), DTYPES):
                start = x
                for i in impls:
                    row = d[(d["weight_dtype"] == t) & (d["impl"] == i)]
                    if row.empty:
                        continue
                    row = row.iloc[0]
                    ax.bar(x, row["speedup"], 0.9, color=impl_color(i), hatch="///" if row["mode"] == "eager" else None,
                           edgecolor="white", linewidth=0.5)
                    if row["predicted_speedup"] == row["predicted_speedup"]:
                        ax.plot(x, row["predicted_speedup"], "o", mfc="white", mec="black", ms=4)
                    if row["pre_fix"]:
                        ax.text(x, 0.05, "\u2020", ha="center", va="bottom", fontsize=9, fontweight="bold")
                    x += 1
                pv = p[(p["model"] == model) & (p["step"] == st) & (p["weight_dtype"] == t) & (p["impl"] == "tilus")]
                if len(pv) and pv["speedup"].notna().any():
                    ax.plot((start + x - 1) / 2, pv["speedup"].iloc[0], "D", mfc="#4C72B0", mec="black", ms=5)
                ticks.append(((start + x - 1) / 2, t))
                x += 0.6
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks])
            ax.set_xlim(-0.7, max(x - 1.1, 0.5))
            ax.grid(axis="x", visible=False)
            if r == 0:
                ax.set_title(st)
            if c == 0:
                ax.set_ylabel(f"{model}\nspeedup over f16")
    handles = [Patch(color=impl_color(i), label=label(i)) for i in impls]
    handles += [Line2D([], [], marker="o", mfc="white", mec="black", ls="none", label="predicted speedup"),
                Line2D([], [], marker="D", mfc="#4C72B0", mec="black", ls="none", label="paper, Tilus (L40S)")]
    if s["pre_fix"].any():
        handles.append(Line2D([], [], ls="none", marker="$\u2020$", color="black", label=PRE_FIX_NOTE))
    _same_width(axes)
    gpu = ", ".join(sorted(s["gpu"].str.upper().unique()))
    title_and_legend(fig, f"Tilus Fig. 12 on the {gpu}: speedup over f16 (ours) beside the paper's L40S", handles, 3)
    return fig


@table("Issue targets on this GPU, computed from the rows (u4, our engine)", experiment=EXPERIMENT)
def targets(df):
    """u4 decode: measured speedup over f16 within 15% of the predicted one; u4 decode at batch 1 within 1.3x of the
    floor (weight + KV-cache bytes; Gemma-2-9B, Qwen2.5-32B); prefill with low-bit weights no slower than 0.9x f16."""
    s = with_speedup(steps(df))
    u4 = s[(s["weight_dtype"] == "u4") & (s["impl"] != "vllm")]
    if u4.empty:
        return pd.DataFrame()
    out = pd.DataFrame({
        "gpu": u4["gpu"], "model": u4["model"], "step": u4["step"], "impl": u4["impl"], "mode": u4["mode"],
        "f16 ms": u4["f16_ms"], "u4 ms": u4["ms"], "speedup": u4["speedup"],
        "predicted speedup": u4["predicted_speedup"],
        "measured / predicted": u4["speedup"] / u4["predicted_speedup"],
        "u4 / floor": u4["ms"] / u4["floor_ms"],
        "note": np.where(u4["pre_fix"], PRE_FIX_NOTE, ""),
    })
    dec = u4["phase"] == "decode"
    out["within 15% of prediction"] = np.where(dec & out["measured / predicted"].notna(),
                                               np.where((out["measured / predicted"] - 1).abs() <= 0.15, "yes", "no"),
                                               "")
    floor_target = dec & (u4["batch"] == 1) & u4["model"].isin(["gemma2_9b", "qwen2_5_32b"])
    out["<= 1.3x floor"] = np.where(floor_target, np.where(out["u4 / floor"] <= 1.3, "yes", "no"), "")
    out[">= 0.9x f16 (prefill)"] = np.where(~dec & out["speedup"].notna(),
                                            np.where(out["speedup"] >= 0.9, "yes", "no"), "")
    return out.sort_values(["gpu", "model", "step", "impl"]).reset_index(drop=True)


@table("Speedup over f16 of every low-bit weight type and kernel, measured and predicted (our engine)",
       experiment=EXPERIMENT)
def speedups(df):
    s = with_speedup(steps(df))
    s = s[~s["weight_dtype"].isin(["f16", "bf16"]) & s["speedup"].notna() & (s["impl"] != "vllm")]
    if s.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"gpu": s["gpu"], "model": s["model"], "step": s["step"], "weight": s["weight_dtype"],
                        "impl": s["impl"], "mode": s["mode"], "f16 ms": s["f16_ms"], "ms": s["ms"],
                        "speedup": s["speedup"], "predicted speedup": s["predicted_speedup"],
                        "measured / predicted": s["speedup"] / s["predicted_speedup"],
                        "note": np.where(s["pre_fix"], PRE_FIX_NOTE, "")})
    out["weight"] = pd.Categorical(out["weight"], [t for t in DTYPES if t in set(out["weight"])]
                                   + sorted(set(out["weight"]) - set(DTYPES)))
    out["impl"] = pd.Categorical(out["impl"], _order(set(out["impl"]), IMPLS))
    return out.sort_values(["gpu", "model", "step", "weight", "impl"]).astype({"weight": str, "impl": str}) \
        .reset_index(drop=True)


@table("Where the step time goes: measured, predicted, GEMM and non-GEMM parts, floor (ms)", experiment=EXPERIMENT)
def split(df):
    s = steps(df)
    if s.empty:
        return pd.DataFrame()
    cols = ["gpu", "model", "step", "weight_dtype", "impl", "mode", "ms", "predicted_ms", "gemm_ms", "nongemm_ms",
            "floor_ms", "model_layers", "predicted_from"]
    out = s[[c for c in cols if c in s]].copy()
    out["note"] = np.where(s["pre_fix"], PRE_FIX_NOTE, "")
    out["predicted_from"] = out["predicted_from"].fillna("").str.replace(" + nongemm_ms", "", regex=False)
    return out.sort_values(["gpu", "model", "step", "weight_dtype", "impl"]).reset_index(drop=True)


@comparison(experiment=EXPERIMENT, title="The paper's step latencies (L40S) beside ours, and speedups over f16")
def vs_paper(df, pdir):
    s = with_speedup(steps(df))
    oom = oom_points(df)
    p = paper(pdir)
    models = set(s["model"]) | set(oom["model"])
    p = p[p["model"].isin(models)]
    keys = sorted({(m, st, t) for m, st, t in zip(s["model"], s["step"], s["weight_dtype"])}
                  | {(m, st, t) for m, st, t in zip(oom["model"], oom["step"], oom["weight_dtype"])}
                  | {(m, st, t) for m, st, t in zip(p["model"], p["step"], p["weight_dtype"])})
    rows = []
    for model, st, t in keys:
        row = {"model": model, "step": st, "weight": t}
        for r in p[(p["model"] == model) & (p["step"] == st) & (p["weight_dtype"] == t)].itertuples():
            name = PAPER_IMPL.get(r.impl, r.impl)
            row[f"paper {name} ms"] = r.latency_ms if r.status == "ok" else r.status
            if r.speedup == r.speedup and r.impl != "vllm":
                row[f"paper {name} speedup"] = r.speedup
        for r in s[(s["model"] == model) & (s["step"] == st) & (s["weight_dtype"] == t)].itertuples():
            row[f"ours {r.impl} ms"] = r.ms
            if r.speedup == r.speedup and r.weight_dtype not in ("f16", "bf16"):
                row[f"ours {r.impl} speedup"] = r.speedup
        for r in oom[(oom["model"] == model) & (oom["step"] == st) & (oom["weight_dtype"] == t)].itertuples():
            row[f"ours {r.impl} ms"] = "oom"
        rows.append(row)
    return pd.DataFrame(rows)


@finding(experiment=EXPERIMENT)
def findings(df):
    s = with_speedup(steps(df))
    out = []
    if s.empty:
        return out
    p = paper(paper_dir(df))
    for impl in ("triton", "native"):
        u4 = s[(s["weight_dtype"] == "u4") & (s["impl"] == impl) & s["speedup"].notna()]
        for st in sorted(set(u4["step"])):
            d = u4[u4["step"] == st]
            out.append(f"{impl_label(impl)}, u4, {st}: speedup over our cuBLAS f16 engine "
                       + listing(f"{m} {v:.2f}x (predicted {pv:.2f}x)" + (" \u2020" if pf else "") for m, v, pv, pf in
                                 zip(d["model"], d["speedup"], d["predicted_speedup"], d["pre_fix"])) + ".")
    pre = s[s["pre_fix"]]
    if len(pre):
        out.append(f"\u2020 {listing(sorted(set(pre['model'])))}: the {impl_label('native')} prefill rows were timed "
                   "before the engine's layout fix (8b50789: native's prefill output, y^T viewed as [M, N], is now "
                   "handed on row-major). Before it every op after a linear inherited the transposed layout, and "
                   "where attention is SDPA (not Gemma-2's soft-capped formula) the query's last-dim stride ruled out "
                   "flash attention: PyTorch ran its math path in f32. Measured "
                   f"{span(pre['ms'] / pre['predicted_ms'])}x their prediction; they stand as measured.")
    from experiments.native_targets import later_changes
    out += later_changes(df[df["phase"] == "decode"], ["model", "weight_dtype", "batch"],
                         lambda r: f"{r['model']} {r['weight_dtype']} decode batch {r['batch']:g}")
    g = p[(p["model"] == "gemma2_9b") & (p["impl"] == "tilus") & (p["weight_dtype"] == "u4")]
    if len(g):
        out.append("The paper's Gemma-2-9B u4 speedups of Tilus over vLLM f16 on the L40S: "
                   + listing(f"{st} {v:.2f}x" for st, v in zip(g["step"], g["speedup"])) + ".")
    eager = s[s["mode"] == "eager"]
    graph = s[s["mode"] == "cuda_graph"]
    if len(eager) and len(graph):
        out.append(f"Decode rows of {listing(sorted(impl_label(i) for i in set(eager[eager['phase'] == 'decode']['impl'])))} "
                   "ran eagerly (their launches cannot be captured): their latency includes the host's launch path, "
                   "unlike the CUDA-graph rows; compare them with each other only.")
    fl = s[(s["phase"] == "decode") & (s["batch"] == 1) & s["floor_ms"].notna()]
    if len(fl):
        r = fl["ms"] / fl["floor_ms"]
        out.append(f"Decode at batch 1 runs at {span(r)}x the floor (weight + KV-cache bytes over the measured "
                   "bandwidth) over all models, types and kernels.")
        best = fl[(fl["weight_dtype"] == "u4") & (fl["mode"] == "cuda_graph")].sort_values("ms").drop_duplicates(
            ["gpu", "model"])
        if len(best):
            out.append("u4 decode at batch 1, fastest CUDA-graph kernel per model, against the floor (target: "
                       "<= 1.3x): " + listing(f"{m} {impl_label(i)} {v:.2f} ms = {v / f:.2f}x the floor ({f:.2f} ms)"
                                              for m, i, v, f in zip(best["model"], best["impl"], best["ms"],
                                                                    best["floor_ms"])) + ".")
    return out
