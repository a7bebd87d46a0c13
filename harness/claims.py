"""Every quantitative claim of both papers, computed from our tidy rows into a verdict.

results/paper/claims.yaml lists the claims (id, paper, published figure, the sentence and where it
comes from, the paper's value and GPU, the qualitative test, the tolerance). Each id has one
function here, registered with @claim(id): it reads our GPU rows (loaded with harness.store by the
report) and the paper's artifact data in results/paper/, and returns our value, the paper's value
where the paper's text gives none, and one sentence on what differs or what is missing.
`judge` turns that into one of VERDICTS; `python -m harness.report` writes results/claims.csv.

A claim on an experiment without rows yet is `not_measurable` and says so; it fills in when the
rows land. Extend by one yaml entry and one @claim function.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import yaml

from .figures import geomean, impl_label
from .provenance import ROOT
from .specs import GpuSpec

CLAIMS_FILE = ROOT / "results" / "paper" / "claims.yaml"
VERDICTS = ("holds", "holds_other_magnitude", "does_not_hold", "not_measurable")
COLUMNS = ["claim_id", "paper", "figure", "statement", "paper_value", "measured_value", "gpu", "verdict", "why"]
COMPARES = ("ratio", "excess", "factor")
PRIMARY_GPU = "h200"          # the project's GPU: its rows decide a claim where several GPUs have rows, unless the
                              # claim's own GPU (its paper_gpu) has rows of the experiment: like for like first
# the papers' GPU names -> our GPU cards (conf/gpu/), for datasheet bandwidths
GPU_CARD = {"NVIDIA L40S": "l40s", "NVIDIA H100 80GB HBM3": "h100_sxm", "NVIDIA GH200": "gh200"}


@dataclass(frozen=True)
class ClaimSpec:
    id: str
    paper: str
    figure: int
    statement: str
    source: str
    how: str
    paper_value: float | None
    paper_gpu: str
    expect: str
    compare: str
    tolerance: float
    experiments: tuple[str, ...]

    @staticmethod
    def load_all(path: Path = CLAIMS_FILE) -> list["ClaimSpec"]:
        items = yaml.safe_load(Path(path).read_text())
        out, seen = [], set()
        for i, d in enumerate(items):
            cid = d.get("id", f"#{i}")
            missing = [k for k in ClaimSpec.__dataclass_fields__ if k not in d]
            if missing:
                raise ValueError(f"{path}: claim {cid} lacks {missing}")
            if d["compare"] not in COMPARES:
                raise ValueError(f"{path}: claim {cid}: compare={d['compare']!r}; valid: {COMPARES}")
            if cid in seen:
                raise ValueError(f"{path}: claim id {cid} appears twice")
            seen.add(cid)
            pv = d["paper_value"]
            out.append(ClaimSpec(cid, d["paper"], int(d["figure"]), d["statement"], d["source"], d["how"],
                                 None if pv is None else float(pv), d["paper_gpu"], str(d["expect"]),
                                 d["compare"], float(d["tolerance"]), tuple(d["experiments"])))
        return out


@dataclass
class Outcome:
    value: float | None = None           # ours; None = not measurable (why says what would make it so)
    paper_value: float | None = None     # the paper's, where computed from its artifact data
    why: str = ""                        # one sentence: what was compared, what differs or is missing
    qualitative: bool | None = None      # the claim's qualitative part, where `expect` names a same-run test


FUNCS: dict[str, Callable[["Evidence", ClaimSpec], Outcome]] = {}


def claim(cid: str):
    def deco(fn):
        FUNCS[cid] = fn
        return fn
    return deco


class Evidence:
    """What a claim function reads: our GPU rows per experiment and the paper's data."""

    def __init__(self, rows: pd.DataFrame, paper_dir: Path):
        self.all = rows[rows["device"] == "cuda"] if len(rows) else rows
        self.paper_dir = Path(paper_dir)
        self.prefer: str | None = None      # the GPU card of the claim being judged (evaluate sets it)

    def gpu(self, experiment: str) -> str | None:
        """Whose rows of `experiment` decide: the claim's own GPU where it has rows, else PRIMARY_GPU, else any."""
        g = sorted(set(self.all.loc[self.all["experiment"] == experiment, "gpu"])) if len(self.all) else []
        for want in (self.prefer, PRIMARY_GPU):
            if want in g:
                return want
        return g[0] if g else None

    def any_rows(self, experiment: str) -> pd.DataFrame:
        g = self.gpu(experiment)
        return self.all[(self.all["experiment"] == experiment) & (self.all["gpu"] == g)] if g else self.all.iloc[:0]

    def rows(self, experiment: str) -> pd.DataFrame:
        d = self.any_rows(experiment)
        return d[d["status"] == "ok"]

    def gpu_name(self, experiment: str) -> str:
        d = self.any_rows(experiment)
        names = sorted(set(d["gpu_name"].dropna()) - {""}) if len(d) else []
        return names[0] if names else (self.gpu(experiment) or "")

    def no_rows(self, experiment: str) -> str:
        return f"no {PRIMARY_GPU.upper()} rows yet for {experiment}"

    def missing(self, experiment: str, impl: str, what: str = "impl", at: dict | None = None) -> str:
        """Why `impl` has no ok rows in `experiment` (only the rows matching `at`, column -> value, where
        given): its most common status and error."""
        d = self.any_rows(experiment)
        if d.empty:
            return self.no_rows(experiment)
        where = ""
        for col, v in (at or {}).items():
            d = d[d[col] == v]
            where += f" {col}={v}"
        d = d[d[what] == impl].drop_duplicates("point_hash")
        if d.empty:
            return f"{impl} has no rows in {experiment}" + (f" at{where}" if where else "")
        bad = d[d["status"] != "ok"]
        if bad.empty:
            return f"{impl} ran in {experiment} but not at the points this claim compares"
        # the reason that matters most: a failure to install or run before "does not support this type"
        rank = {"unavailable": 0, "error": 1, "oom": 2, "timeout": 3, "numerics_fail": 4, "unsupported": 5}
        counts = bad.groupby(["status", "error"]).size().reset_index(name="n")
        counts = counts.assign(r=counts["status"].map(rank).fillna(9)).sort_values(["r", "n"], ascending=[True, False],
                                                                                   kind="stable")
        top = (counts["status"].iloc[0], counts["error"].iloc[0])
        err = top[1] if len(top[1]) <= 160 else top[1][:157] + "..."
        return f"{impl} is {top[0]} in {experiment} ({err})"

    def paper(self, name: str) -> pd.DataFrame:
        path = self.paper_dir / f"{name}.csv"
        return pd.read_csv(path) if path.exists() else pd.DataFrame()

    def bandwidth(self, experiment: str) -> float | None:
        d = self.rows(experiment)
        v = d.loc[d["metric"] == "hbm_read_bw", "value"] if len(d) else []
        return float(np.median(v)) if len(v) else None

    def where(self, experiment: str) -> str:
        """'the H200 (4.24 TB/s measured)'."""
        g = (self.gpu(experiment) or "").upper().replace("_", " ")
        bw = self.bandwidth(experiment)
        return f"the {g} ({bw:.2f} TB/s HBM read, measured)" if bw else f"the {g}"


def paper_where(gpu: str) -> str:
    """'the L40S (0.864 TB/s datasheet)'."""
    card = GpuSpec.load(GPU_CARD[gpu]) if gpu in GPU_CARD else None
    short = gpu.replace("NVIDIA ", "")
    return f"the {short} ({card.hbm_bw_tbs:g} TB/s datasheet)" if card and card.hbm_bw_tbs else f"the {short}"


# ---- verdicts ---------------------------------------------------------------------------------------

def _expect(expr: str, v: float) -> bool | None:
    m = re.fullmatch(r"\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*", expr)
    if not m:
        return None
    op, x = m.group(1), float(m.group(2))
    return {">": v > x, ">=": v >= x - 1e-12, "<": v < x, "<=": v <= x + 1e-12}[op]


def _magnitude(spec: ClaimSpec, v: float, p: float) -> tuple[bool, str]:
    """(within tolerance, phrase) comparing our value v with the paper's p."""
    if spec.compare == "ratio":
        r = v / p
        ok = abs(r - 1) <= spec.tolerance + 1e-9
        return ok, f"ours is {r:.2f}x the paper's value (tolerance +-{spec.tolerance:.0%})"
    if spec.compare == "excess":
        ev, ep = v - 1, p - 1
        ok = ep != 0 and abs(ev / ep - 1) <= spec.tolerance + 1e-9
        return ok, f"our overhead is {ev:+.1%} against the paper's {ep:+.1%} (tolerance +-{spec.tolerance:.0%} of it)"
    r = v / p
    ok = max(r, 1 / r) <= spec.tolerance + 1e-9
    return ok, f"ours is {r:.3g}x the paper's value (tolerance a factor {spec.tolerance:g})"


def judge(spec: ClaimSpec, out: Outcome) -> tuple[str, str]:
    """(verdict, why) of one claim."""
    v = out.value
    if v is None or not math.isfinite(v):
        return "not_measurable", out.why
    p = spec.paper_value if spec.paper_value is not None else out.paper_value
    q = out.qualitative if out.qualitative is not None else _expect(spec.expect, v)
    if q is None:
        raise ValueError(f"claim {spec.id}: expect {spec.expect!r} is not a threshold and its function "
                         f"did not decide the qualitative part")
    if not q:
        return "does_not_hold", f"{out.why}; qualitative test ({spec.expect}) fails"
    if p is None or not math.isfinite(p):
        return "holds", out.why
    ok, phrase = _magnitude(spec, v, p)
    return ("holds" if ok else "holds_other_magnitude"), f"{out.why}; {phrase}"


def _num(v) -> str:
    return "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


def evaluate(rows: pd.DataFrame, paper_dir: Path, specs: list[ClaimSpec] | None = None) -> pd.DataFrame:
    """One row per claim (COLUMNS, plus paper_gpu and experiments for the report)."""
    specs = ClaimSpec.load_all(Path(paper_dir) / "claims.yaml") if specs is None else specs
    ev = Evidence(rows, paper_dir)
    out = []
    for s in specs:
        if s.id not in FUNCS:
            raise ValueError(f"claim {s.id} in claims.yaml has no @claim function in harness/claims.py")
        ev.prefer = GPU_CARD.get(s.paper_gpu)
        o = FUNCS[s.id](ev, s)
        verdict, why = judge(s, o)
        pv = s.paper_value if s.paper_value is not None else o.paper_value
        ours = ev.gpu_name(s.experiments[0]) if verdict != "not_measurable" else ""
        out.append({"claim_id": s.id, "paper": s.paper, "figure": s.figure, "statement": s.statement,
                    "paper_value": _num(pv), "measured_value": _num(o.value) if verdict != "not_measurable" else "",
                    "gpu": f"{ours or 'none'} (paper: {s.paper_gpu})", "verdict": verdict,
                    "why": why.rstrip(".") + ".", "paper_gpu": s.paper_gpu, "experiments": ", ".join(s.experiments)})
    return pd.DataFrame(out, columns=COLUMNS + ["paper_gpu", "experiments"])


def write_csv(table: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table[COLUMNS].to_csv(path, index=False, lineterminator="\n")
    return path


# ---- Tilus: kernels ------------------------------------------------------------------------------------

POINT = ["model", "layer", "M", "K", "N", "weight_dtype"]
PAPER_BASELINE = {"triton_plain": "triton", "bitblas": "ladder", "quantllm": "quantllm", "marlin": "marlin"}
PAPER_NAME = {"triton_plain": "Triton", "bitblas": "Ladder", "quantllm": "QuantLLM", "marlin": "Marlin"}
WHAT_WOULD_HELP = {      # the rows' errors say what was tried; these say what would make the claim measurable
    "triton_plain": "H200 rows of triton_plain (our kernel of Tilus' plain Triton design)",
    "bitblas": "a bitblas (Ladder) build that loads on the GPU machine",
    "quantllm": "a QuantLLM (FP6-LLM) kernel that loads on the GPU machine",
    "marlin": "a Marlin build that loads on the GPU machine",
}


def _latency(d: pd.DataFrame) -> pd.DataFrame:
    lat = d[d["metric"] == "latency_ms"]
    return lat.pivot_table(index=POINT, columns="impl", values="value", aggfunc="median")


def _pair(d: pd.DataFrame, num: str, den: str) -> pd.Series:
    """latency(num) / latency(den) at every point where both ran."""
    w = _latency(d)
    if num not in w or den not in w:
        return pd.Series(dtype=float)
    return (w[num] / w[den]).dropna()


def _paper_kernels(ev: Evidence, figure: int) -> pd.DataFrame:
    from experiments.speedup import paper_speedups
    return paper_speedups(ev.paper_dir, figure)


def _paper_pair(p: pd.DataFrame, baseline: str) -> pd.Series:
    """The paper's tilus speedup over `baseline` (our impl name) per point."""
    w = p.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="impl", values="latency_ms", aggfunc="median")
    if baseline not in w or "tilus" not in w:
        return pd.Series(dtype=float)
    return (w[baseline] / w["tilus"]).dropna()


def _vs_baseline(ev: Evidence, spec: ClaimSpec, baseline: str) -> Outcome:
    exp = "tilus_fig10"
    art = _paper_pair(_paper_kernels(ev, 10), baseline)
    art_note = (f"the artifact's own {PAPER_NAME[baseline]} comparison gives {geomean(art):.2f}x over its "
                f"{len(art)} Fig. 10 points") if len(art) else ""
    d = ev.rows(exp)
    if d.empty:
        return Outcome(why=ev.no_rows(exp))
    r = _pair(d, baseline, "tilus")
    if r.empty:
        return Outcome(why=f"{ev.missing(exp, baseline)}; {WHAT_WOULD_HELP[baseline]} would make it measurable")
    why = (f"our kernel in Tilus 0.2.0 against {impl_label(baseline)} over {len(r)} Fig. 10 points on "
           f"{ev.where(exp)}, the paper's on {paper_where(spec.paper_gpu)}")
    return Outcome(geomean(r), why=why + (f"; {art_note}" if art_note else ""))


@claim("tilus_vs_triton")
def _tilus_vs_triton(ev, spec):
    return _vs_baseline(ev, spec, "triton_plain")


@claim("tilus_vs_ladder")
def _tilus_vs_ladder(ev, spec):
    return _vs_baseline(ev, spec, "bitblas")


@claim("tilus_vs_quantllm")
def _tilus_vs_quantllm(ev, spec):
    return _vs_baseline(ev, spec, "quantllm")


@claim("tilus_vs_marlin")
def _tilus_vs_marlin(ev, spec):
    return _vs_baseline(ev, spec, "marlin")


def _share_fastest(w: pd.DataFrame, baselines: list[str]) -> tuple[float, int]:
    cols = [b for b in baselines if b in w]
    if "tilus" not in w or not cols:
        return float("nan"), 0
    best = w[cols].min(axis=1)          # fastest baseline's latency at each point
    m = best.notna() & w["tilus"].notna()
    return float((w.loc[m, "tilus"] <= best[m]).mean()) if m.any() else float("nan"), int(m.sum())


@claim("tilus_fastest_everywhere")
def _tilus_fastest(ev, spec):
    exp = "tilus_fig10"
    p = _paper_kernels(ev, 10)
    pw = p.pivot_table(index=["M", "K", "N", "weight_dtype"], columns="impl", values="latency_ms", aggfunc="median")
    paper, _ = _share_fastest(pw, list(PAPER_BASELINE))
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    w = _latency(d)
    ran = [b for b in PAPER_BASELINE if b in w]
    share, n = _share_fastest(w, ran)
    if not n:
        return Outcome(paper_value=paper, why="none of the paper's baselines (" + ", ".join(PAPER_BASELINE)
                       + f") has ok rows in {exp}; " + WHAT_WOULD_HELP["triton_plain"] + " would make it measurable")
    lost = [b for b in PAPER_BASELINE if b not in ran]
    why = (f"our kernel in Tilus 0.2.0 at {n} Fig. 10 points on {ev.where(exp)} against "
           + ", ".join(impl_label(b) for b in ran)
           + (f" (not run: {', '.join(lost)})" if lost else ""))
    return Outcome(share, paper_value=paper, why=why)


@claim("tilus_near_roofline")
def _tilus_roofline(ev, spec):
    exp = "tilus_fig10"
    d = ev.rows(exp)
    if d.empty:
        return Outcome(why=ev.no_rows(exp))
    bw = ev.bandwidth(exp)
    t = d[(d["impl"] == "tilus") & (d["M"] == 1)]
    frac = t[t["metric"] == "roofline_frac"].groupby(["K", "N", "weight_dtype"])["value"].median()
    if frac.empty or not bw:
        return Outcome(why=ev.missing(exp, "tilus") + "; tilus rows at M = 1 with floor_ms would make it measurable")
    card = GpuSpec.load(GPU_CARD[spec.paper_gpu])
    p = _paper_kernels(ev, 10)
    p = p[(p["impl"] == "tilus") & (p["M"] == 1)].set_index(["K", "N", "weight_dtype"])["latency_ms"]
    # the same bytes (each point's bandwidth_tbs x latency_ms: what the row read, independent of which job's measured
    # bandwidth its floor used) over the paper GPU's datasheet bandwidth
    per = lambda m: t[t["metric"] == m].groupby(["K", "N", "weight_dtype"])["value"].median()
    tb_ms = per("bandwidth_tbs") * per("latency_ms")
    common = tb_ms.dropna().index.intersection(p.index)
    paper = [tb_ms[i] / card.hbm_bw_tbs / p[i] for i in common]
    why = (f"our kernel in Tilus 0.2.0 at M = 1 over {len(frac)} shapes x types on {ev.where(exp)}, floor from "
           f"that bandwidth; the paper's fraction over the same {len(common)} points uses "
           f"{paper_where(spec.paper_gpu)}, for no measured L40S bandwidth is published")
    return Outcome(float(np.median(frac)), paper_value=float(np.median(paper)) if paper else None, why=why)


FIG11_TYPES = ("u8", "u7", "u6", "u5", "u4", "u3", "u2", "u1", "i8", "i7", "i6", "i5", "i4", "i3", "i2",
               "f8e4m3", "f7e3m3", "f6e3m2", "f5e2m2", "f4e2m1", "f3e1m1")   # the cells artifacts/figure10.py draws


@claim("tilus_all_widths")
def _tilus_widths(ev, spec):
    exp = "tilus_fig11"
    p = _paper_kernels(ev, 11)
    paper = len(set(p.loc[p["impl"] == "tilus", "weight_dtype"]) & set(FIG11_TYPES)) / len(FIG11_TYPES)
    d = ev.any_rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    t = d[(d["impl"] == "tilus") & d["weight_dtype"].isin(FIG11_TYPES)].drop_duplicates("point_hash")
    ok = set(t.loc[t["status"] == "ok", "weight_dtype"])
    lost = [w for w in FIG11_TYPES if w not in ok]
    why = f"our kernel in Tilus 0.2.0 ran {len(ok)} of Fig. 11's {len(FIG11_TYPES)} weight types on the {ev.gpu(exp).upper()}"
    if lost:
        errs = t[t["weight_dtype"].isin(lost)]
        why += "; not: " + ", ".join(f"{r.weight_dtype} ({r.status})" for r in errs.itertuples())
    return Outcome(len(ok) / len(FIG11_TYPES), paper_value=paper, why=why)


def _speedup(d: pd.DataFrame) -> pd.DataFrame:
    from experiments.speedup import speedups
    return speedups(d)


@claim("tilus_speedup_grows_as_bits_shrink")
def _tilus_bits(ev, spec):
    exp = "tilus_fig11"
    p = _paper_kernels(ev, 11)
    ps = p[p["impl"] == "tilus"].set_index("weight_dtype")["speedup"]
    paper = float(ps["u1"] / ps["u8"]) if {"u1", "u8"} <= set(ps.index) else None
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    s = _speedup(d)
    s = s[s["impl"] == "tilus"].groupby("weight_dtype")["speedup"].median()
    if not {"u1", "u8"} <= set(s.index):
        return Outcome(paper_value=paper, why=ev.missing(exp, "tilus") + "; tilus rows for u1 and u8 would make it measurable")
    why = (f"our kernel in Tilus 0.2.0 on {ev.where(exp)}: u8 {s['u8']:.2f}x and u1 {s['u1']:.2f}x over cuBLAS f16; "
           f"the paper's on {paper_where(spec.paper_gpu)}: {ps['u8']:.2f}x and {ps['u1']:.2f}x")
    return Outcome(float(s["u1"] / s["u8"]), paper_value=paper, why=why)


DECODE_M = (1, 4, 8, 16)
PREFILL_M = (4096, 8192, 12288)          # the prefill sizes the paper plots (M = 2048 is measured, not drawn)


def _fig14_speedup(ev: Evidence, spec: ClaimSpec, dtypes: tuple[str, ...], Ms: tuple[int, ...]) -> Outcome:
    exp = "tilus_fig14"
    p = _paper_kernels(ev, 14)
    p = p[(p["impl"] == "tilus") & p["weight_dtype"].isin(dtypes) & p["M"].isin(Ms)]
    paper = geomean(p["speedup"]) if len(p) else None
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    s = _speedup(d)
    s = s[(s["impl"] == "tilus") & s["weight_dtype"].isin(dtypes) & s["M"].isin(Ms)]
    if s.empty:
        why = ev.missing(exp, "tilus")
        outside = ev.any_rows(exp)
        outside = outside[(outside["impl"] == "tilus") & outside["M"].isin(Ms) & (outside["status"] == "unsupported")]
        if len(outside):
            why = (f"our kernel in Tilus 0.2.0 does not implement these sizes ({outside['error'].iloc[0]}); "
                   f"a prefill configuration of it would make it measurable")
        return Outcome(paper_value=paper, why=why)
    why = (f"our kernel in Tilus 0.2.0 ({'/'.join(dtypes)}) over M = {', '.join(map(str, sorted(set(s['M']))))} "
           f"on {ev.where(exp)}: {s['speedup'].min():.2f}-{s['speedup'].max():.2f}x; the paper's Tilus on "
           f"{paper_where(spec.paper_gpu)}: {p['speedup'].min():.2f}-{p['speedup'].max():.2f}x")
    if Ms == PREFILL_M:
        from experiments.speedup import tilus_prefill_note
        note = tilus_prefill_note(s)
        why += f"; {note}" if note else ""
    return Outcome(geomean(s["speedup"]), paper_value=paper, why=why)


@claim("tilus_decode_u4")
def _tilus_decode_u4(ev, spec):
    return _fig14_speedup(ev, spec, ("u4",), DECODE_M)


@claim("tilus_decode_f6")
def _tilus_decode_f6(ev, spec):
    return _fig14_speedup(ev, spec, ("f6e3m2",), DECODE_M)


@claim("tilus_prefill_near_cublas")
def _tilus_prefill(ev, spec):
    return _fig14_speedup(ev, spec, ("u4", "f6e3m2"), PREFILL_M)


@claim("tilus_vs_triton_batch")
def _tilus_vs_triton_batch(ev, spec):
    exp = "tilus_fig14"
    Ms = DECODE_M + PREFILL_M
    p = _paper_kernels(ev, 14)
    pr = _paper_pair(p[p["M"].isin(Ms) & (p["weight_dtype"] == "u4")], "triton_plain")
    paper = geomean(pr) if len(pr) else None
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    d = d[d["M"].isin(Ms) & (d["weight_dtype"] == "u4")]
    r = _pair(d, "triton_plain", "tilus")
    if r.empty:
        return Outcome(paper_value=paper, why=f"{ev.missing(exp, 'triton_plain')}; {WHAT_WOULD_HELP['triton_plain']} "
                                               f"would make it measurable")
    why = (f"our kernel in Tilus 0.2.0 against {impl_label('triton_plain')}, u4, over {len(r)} batch sizes on "
           f"{ev.where(exp)}, the paper's over {len(pr)} on {paper_where(spec.paper_gpu)}")
    return Outcome(geomean(r), paper_value=paper, why=why)


# ---- Tilus: whole models ------------------------------------------------------------------------------------

PAPER_MODEL = {"google/gemma-2-9b": ("gemma2_9b",), "Qwen/Qwen2.5-Coder-32B-Instruct": ("qwen2_5_32b",),
               "meta-llama/Meta-Llama-3-70B-Instruct": ("llama3_70b", "llama3_3_70b")}


def _mode(params: str) -> str:
    try:
        return json.loads(params).get("mode", "") if params else ""
    except ValueError:
        return ""


MODES = ("cuda_graph", "eager", "")          # an e2e row's execution mode (params.mode; "" = unrecorded)
# our other low-bit kernels, in this order, for claims worded about u4 weights (not about Tilus itself) where
# Tilus has no rows in the f16 rows' mode: its launches cannot be captured, so its decode rows run eagerly
# while the f16 (cuBLAS) decode rows are CUDA graphs
U4_STANDINS = ("triton", "native")


def _modes(rows: pd.DataFrame) -> str:
    return "/".join(sorted({m or "unrecorded" for m in rows["mode"]})) or "none"


def _e2e(ev: Evidence, spec: ClaimSpec, exp: str, phase: str, num: tuple[str, str], den: tuple[str, str],
         paper_figure: int, models: tuple[str, ...] | None = None, standins: tuple[str, ...] = ()) -> Outcome:
    """geomean of latency(num) / latency(den) per (model, batch) where the paper has both; num and den are
    (weight_dtype, paper impl) pairs, e.g. ("f16", "vllm") over ("u4", "tilus"). Ours: f16 is our engine's
    cuBLAS f16 step (the paper's f16 is vLLM's, the same stack as its Tilus rows), the low-bit side the named
    impl. Only rows of one execution mode are ever compared (a CUDA-graph step against an eager one would
    measure the host's launch path); where the named impl has no rows in a mode the f16 rows have, the
    `standins` (our other low-bit kernels, in order) are taken in its place, and the why says so."""
    from experiments.speedup import ARTIFACT_FIGURE
    p = ev.paper("tilus_e2e")
    p = p[(p["figure"] == ARTIFACT_FIGURE[paper_figure]) & (p["stage"] == phase) & (p["status"] == "ok")]
    if models:
        p = p[p["model"].isin(models)]
    pw = p.pivot_table(index=["model", "batch_size"], columns=["weight_dtype", "impl"], values="latency_ms")
    pairs = [i for i in pw.index if num in pw and den in pw and pw.loc[i, num] == pw.loc[i, num]
             and pw.loc[i, den] == pw.loc[i, den]]
    paper_r = [pw.loc[i, num] / pw.loc[i, den] for i in pairs]
    paper = geomean(paper_r) if paper_r else None
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    lat = d[(d["metric"] == "latency_ms") & (d["phase"] == phase)].copy()
    lat["mode"] = lat["params"].fillna("").map(_mode)
    ours_impl = {"f16": "cublas", "vllm": "cublas", "tilus": "tilus", "ladder": "bitblas"}
    named = ours_impl[den[1]]

    ratios, used, modes, impls, mismatch = [], [], set(), {}, {}
    for pm, bs in pairs:
        for m in PAPER_MODEL.get(pm, ()):
            rows = lat[(lat["model"] == m) & (lat["batch"] == bs)]
            a = rows[(rows["weight_dtype"] == num[0]) & (rows["impl"] == ours_impl[num[1]])]
            hit = None
            for impl in (named, *standins):
                b = rows[(rows["weight_dtype"] == den[0]) & (rows["impl"] == impl)]
                if b.empty or a.empty:
                    continue
                mode = next((x for x in MODES if (a["mode"] == x).any() and (b["mode"] == x).any()), None)
                if mode is None:
                    mismatch.setdefault((impl, _modes(b), _modes(a)), []).append(f"{m} bs{bs}")
                    continue
                r = a.loc[a["mode"] == mode, "value"].median() / b.loc[b["mode"] == mode, "value"].median()
                hit = (impl, mode, r)
                break
            if hit is None:
                continue
            impl, mode, r = hit
            ratios.append(r)
            used.append(f"{m} bs{bs}")
            impls.setdefault(impl, []).append(f"{m} bs{bs}")
            modes.add(mode or "unrecorded")
            break
    differ = "; ".join(f"{i}' {den[0]} rows ran {bm} only, the {num[0]} rows {am} ({', '.join(at)})"
                       for (i, bm, am), at in mismatch.items())
    differ += " (rows of different modes are never compared)" if differ else ""
    if not ratios:
        at = ", ".join(f"{m} bs{b}" for m, b in pairs)
        if differ:
            why = f"no {phase} rows of {exp} in one execution mode at the paper's (model, batch) pairs ({at}): {differ}"
            if not standins:
                why += f"; {named} rows in the {num[0]} rows' mode would make it measurable"
        else:
            why = (f"no {phase} rows of {exp} at the paper's (model, batch) pairs ({at}): "
                   f"{ev.missing(exp, named, at={'phase': phase, 'weight_dtype': den[0]})}")
        return Outcome(paper_value=paper, why=why)
    who = "; ".join((i if i == named else impl_label(i)) + (f" at {', '.join(u)}" if len(impls) > 1 else "")
                    for i, u in impls.items())
    why = (f"{phase} over {', '.join(used)} on {ev.where(exp)}, {num[0]} on our engine's cuBLAS, {den[0]} through "
           f"{who}, mode {', '.join(sorted(modes))}")
    if set(impls) - {named}:
        lacks = differ or ev.missing(exp, named, at={"phase": phase, "weight_dtype": den[0]})
        why += (f"; {impl_label(next(i for i in impls if i != named))} stands in for {named}, as the claim is about "
                f"{den[0]} weights, not {named} itself: {lacks}")
    why += f"; the paper's in vLLM on {paper_where(spec.paper_gpu)}"
    return Outcome(geomean(ratios), paper_value=paper, why=why)


# these three claims are worded about u4 weights ("u4 weights make whole-model decode faster than f16"), not about
# Tilus' kernel: where Tilus has no rows in the f16 rows' mode, our other u4 kernels' rows stand in (the why says so)
@claim("tilus_e2e_decode_u4")
def _e2e_decode(ev, spec):
    return _e2e(ev, spec, "tilus_fig12", "decode", ("f16", "vllm"), ("u4", "tilus"), 12, standins=U4_STANDINS)


@claim("tilus_e2e_prefill_u4")
def _e2e_prefill(ev, spec):
    return _e2e(ev, spec, "tilus_fig12", "prefill", ("f16", "vllm"), ("u4", "tilus"), 12, standins=U4_STANDINS)


@claim("tilus_e2e_vs_ladder")
def _e2e_ladder(ev, spec):
    exp = "tilus_fig12"
    p = ev.paper("tilus_e2e")
    p = p[(p["figure"] == 11) & (p["stage"] == "decode") & (p["status"] == "ok")]
    pw = p.pivot_table(index=["model", "batch_size", "weight_dtype"], columns="impl", values="latency_ms")
    pr = (pw["ladder"] / pw["tilus"]).dropna() if {"ladder", "tilus"} <= set(pw.columns) else pd.Series(dtype=float)
    paper = geomean(pr) if len(pr) else None
    d = ev.rows(exp)
    if d.empty:
        return Outcome(paper_value=paper, why=ev.no_rows(exp))
    lat = d[(d["metric"] == "latency_ms") & (d["phase"] == "decode")]
    w = lat.pivot_table(index=["model", "batch", "weight_dtype", "params"], columns="impl", values="value")
    if not {"bitblas", "tilus"} <= set(w.columns) or (w["bitblas"] / w["tilus"]).dropna().empty:
        return Outcome(paper_value=paper, why=f"{ev.missing(exp, 'bitblas')}; {WHAT_WOULD_HELP['bitblas']} would make it measurable")
    r = (w["bitblas"] / w["tilus"]).dropna()
    return Outcome(geomean(r), paper_value=paper,
                   why=f"decode over {len(r)} points on {ev.where(exp)}; the paper's over {len(pr)} on {paper_where(spec.paper_gpu)}")


@claim("tilus_qwen32b_decode_h100")
def _e2e_qwen(ev, spec):
    return _e2e(ev, spec, "tilus_fig13", "decode", ("f16", "vllm"), ("u4", "tilus"), 13,
                models=("Qwen/Qwen2.5-Coder-32B-Instruct",), standins=U4_STANDINS)


# ---- Proton ------------------------------------------------------------------------------------------------

PROTON_MODEL = {"Llama-3.1-8B": "llama3_1_8b", "Llama-3.3-70B": "llama3_3_70b", "Gemma3-4B": "gemma3_4b",
                "Qwen3-30B-A3B": "qwen3_30b_a3b", "GPT-OSS-20B": "gpt_oss_20b", "Mistral-7B": "mistral_7b",
                "Phi-3.5-Mini": "phi3_5_mini", "SmolLM2.1-7B": "smollm2_1_7b", "TinyLlama-Chat": "tinyllama_1_1b",
                "Zephyr-SFT": "zephyr_7b"}
PROFILER_LABEL = {"proton": "Proton", "torch": "the PyTorch profiler", "nsys": "Nsight Systems"}
PROFILER_HELP = {"nsys": "an nsys binary on the GPU machine (it has none)",
                 "proton": "proton_fig13 rows with profiler=proton", "torch": "proton_fig13 rows with profiler=torch"}


def _train(d: pd.DataFrame) -> pd.DataFrame:
    return d[d["workload"] == "train"] if (d["workload"] == "train").any() else d


def _per_model(ev: Evidence, exps: tuple[str, ...], metric: str, profiler: str) -> tuple[pd.Series, str]:
    """Median `metric` per model for `profiler` (workload train where there is one), and the experiment."""
    for exp in exps:
        d = ev.rows(exp)
        if len(d):
            d = _train(d[(d["metric"] == metric) & (d["profiler"] == profiler)])
            if len(d):
                return d.groupby("model")["value"].median(), exp
    return pd.Series(dtype=float), exps[0]


def _paper_overhead(ev: Evidence, profiler: str) -> pd.Series:
    p = ev.paper("proton_overhead")
    p = p[(p["gpu"] == "GH200") & (p["profiler"] == profiler)].dropna(subset=["overhead_ratio"])
    return p.set_index(p["model"].map(PROTON_MODEL))["overhead_ratio"]


def _e2e_overhead(ev: Evidence, spec: ClaimSpec, profiler: str, other: str, below: bool) -> Outcome:
    exp = "proton_fig13"
    paper_all = _paper_overhead(ev, profiler)
    ours, _ = _per_model(ev, (exp,), "overhead", profiler)
    if ours.empty:
        miss = ev.missing(exp, profiler, "profiler") if not ev.any_rows(exp).empty else ev.no_rows(exp)
        return Outcome(paper_value=geomean(paper_all), why=f"{miss}; {PROFILER_HELP[profiler]} would make it measurable")
    common = [m for m in ours.index if m in paper_all.index]
    paper = geomean(paper_all[common]) if common else geomean(paper_all)
    g = geomean(ours)
    theirs, _ = _per_model(ev, (exp,), "overhead", other)
    both = [m for m in ours.index if m in theirs.index]
    if both:
        ref, ref_from = geomean(theirs[both]), f"{PROFILER_LABEL[other]}'s {geomean(theirs[both]):.2f}x in our runs"
        g_cmp = geomean(ours[both])
    else:
        po = _paper_overhead(ev, other)
        ref, ref_from, g_cmp = geomean(po), f"the paper's {PROFILER_LABEL[other]} value {geomean(po):.2f}x (ours not run)", g
    q = g_cmp < ref if below else g_cmp > ref
    why = (f"{PROFILER_LABEL[profiler]} over {len(ours)} models (LoRA training, layer caps as recorded) on "
           f"{ev.where(exp)}, against {ref_from}; the paper's over {len(common) or len(paper_all)} of its models "
           f"on the GH200 with Unsloth")
    return Outcome(g, paper_value=paper, why=why, qualitative=bool(q))


@claim("proton_e2e_overhead")
def _proton_overhead(ev, spec):
    return _e2e_overhead(ev, spec, "proton", "torch", below=True)


@claim("torch_profiler_e2e_overhead")
def _torch_overhead(ev, spec):
    return _e2e_overhead(ev, spec, "torch", "proton", below=False)


@claim("nsys_e2e_overhead")
def _nsys_overhead(ev, spec):
    return _e2e_overhead(ev, spec, "nsys", "proton", below=False)


def _size_ratio(ev: Evidence, spec: ClaimSpec, other: str) -> Outcome:
    exps = ("proton_fig14", "proton_fig13")
    p = ev.paper("proton_profile_size")
    p = p[p["gpu"] == "GH200"].dropna(subset=["size_bytes"])
    pw = p.pivot_table(index="model", columns="profiler", values="size_bytes")
    pr = (pw[other] / pw["proton"]).dropna()
    pr.index = pr.index.map(PROTON_MODEL)
    prot, exp = _per_model(ev, exps, "profile_bytes", "proton")
    them, _ = _per_model(ev, exps, "profile_bytes", other)
    both = [m for m in prot.index if m in them.index and prot[m] > 0]
    if not both:
        exp_any = next((e for e in exps if not ev.any_rows(e).empty), None)
        miss = ev.missing(exp_any, other, "profiler") if exp_any else ev.no_rows(exps[0])
        return Outcome(paper_value=geomean(pr), why=f"{miss}; {PROFILER_HELP.get(other, other)} would make it measurable")
    r = them[both] / prot[both]
    common = [m for m in both if m in pr.index]
    why = (f"{PROFILER_LABEL[other]} bytes over Proton's for {len(both)} models on {ev.where(exp)}: "
           f"Proton {prot[both].min() / 1e3:.0f}-{prot[both].max() / 1e3:.0f} KB, {PROFILER_LABEL[other]} "
           f"{them[both].min() / 1e6:.0f}-{them[both].max() / 1e6:.0f} MB; the paper's over {len(common) or len(pr)} models on the GH200")
    return Outcome(geomean(r), paper_value=geomean(pr[common]) if common else geomean(pr), why=why)


@claim("proton_profile_smaller_than_torch")
def _size_torch(ev, spec):
    return _size_ratio(ev, spec, "torch")


@claim("proton_profile_smaller_than_nsys")
def _size_nsys(ev, spec):
    return _size_ratio(ev, spec, "nsys")


def _fig15(ev: Evidence) -> tuple[pd.Series, pd.Series]:
    """Our per-kernel overhead (Proton default mode) and the paper's GH200 one, by the paper's kernel names."""
    from experiments.proton_fig15.figures import PAPER_NAME, overheads
    p = ev.paper("proton_instrumentation")
    paper = p[p["gpu"] == "GH200"].set_index("kernel")["overhead_ratio"] if len(p) else pd.Series(dtype=float)
    d = ev.rows("proton_fig15")
    if d.empty:
        return pd.Series(dtype=float), paper
    o = overheads(d)
    o = o[(o["profiler"] == "proton") & (o["mode"] == "default")]
    ours = o.groupby("kernel")["overhead"].median()
    ours.index = [PAPER_NAME.get(k, k) for k in ours.index]
    return ours, paper


@claim("proton_instrumentation_overhead")
def _instr(ev, spec):
    exp = "proton_fig15"
    ours, paper = _fig15(ev)
    common = [k for k in ours.index if k in paper.index]
    if not common:
        return Outcome(paper_value=geomean(paper), why=ev.no_rows(exp) if ev.rows(exp).empty else
                       "no Proton default-mode rows for the paper's kernels in proton_fig15")
    why = (f"Proton's default instrumentation over {len(common)} of the paper's kernels on {ev.where(exp)} "
           f"(moe_matmul for matmul_ogs); per kernel {ours[common].min():.2f}-{ours[common].max():.2f}x, the "
           f"paper's {paper[common].min():.2f}-{paper[common].max():.2f}x on the GH200")
    return Outcome(geomean(ours[common]), paper_value=geomean(paper[common]), why=why)


@claim("proton_instrumentation_worst_kernel")
def _instr_worst(ev, spec):
    exp = "proton_fig15"
    ours, paper = _fig15(ev)
    common = [k for k in ours.index if k in paper.index]
    if not common:
        return Outcome(paper_value=float(paper.max()) if len(paper) else None, why=ev.no_rows(exp))
    o, p = ours[common], paper[common]
    ko, kp = o.idxmax(), p.idxmax()
    why = f"our worst kernel on {ev.where(exp)} is {ko} ({o[ko]:.2f}x), the paper's on the GH200 is {kp} ({p[kp]:.2f}x)"
    return Outcome(float(o[ko]), paper_value=float(p[kp]), why=why, qualitative=ko == kp)

