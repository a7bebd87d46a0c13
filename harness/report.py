"""`python -m harness.report`: the report, its figures and the claims table from the result CSVs (no GPU).

Two reports, never mixed:
  results/REPORT.md, results/figures/, results/claims.csv   GPU rows only (device == cuda); committed.
      Rebuilding from the same CSVs gives the same bytes (figures carry no timestamps or versions),
      so `make figures` leaves a clean checkout clean.
  results/cpu/REPORT.md, results/cpu/figures/               rows measured on the CPU through the Triton
      interpreter (pipeline checks, never performance); under the git-ignored results/cpu/.
A result file that cannot be read is skipped with a one-line warning naming it; a figure, table or
finding that fails is named in the report (and on stderr) instead of taking the report down.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from . import claims as claims_mod
from .figures import (COMPARISONS, FIGURES, FINDINGS, IMPORT_FAILURES, TABLES, load_experiments, reset_style, save,
                      span)
from .provenance import ROOT
from .specs import GpuSpec
from .store import load_experiment_lenient

NOT_EXPERIMENTS = {"paper", "figures", "checks"}


# ---- reading rows ------------------------------------------------------------------------------------

def load_rows(results_dir: Path, cpu: bool) -> tuple[pd.DataFrame, list[str]]:
    """Rows under results/<gpu>/<experiment>/ (cpu=False) or results/cpu/<experiment>/ (cpu=True),
    with the `gpu` column first, and warnings for the files that could not be read."""
    frames, warnings = [], []
    for exp_dir in sorted(p for p in Path(results_dir).glob("*/*") if p.is_dir()):
        g = exp_dir.parent.name
        if g in NOT_EXPERIMENTS or exp_dir.name in NOT_EXPERIMENTS or (g == "cpu") != cpu:
            continue
        df = load_experiment_lenient(exp_dir, warn=warnings.append)   # a broken file is skipped and named
        if len(df):
            df.insert(0, "gpu", g)
            frames.append(df)
    if not frames:
        from .store import SCHEMA
        return pd.DataFrame(columns=["gpu", *SCHEMA]), warnings
    return pd.concat(frames, ignore_index=True), warnings


def _rel(p: Path) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:240]}"


# ---- markdown -----------------------------------------------------------------------------------------

def _cell(v, floatfmt: str) -> str:
    if v is None or v is pd.NA:
        return ""
    if isinstance(v, (float, np.floating)):
        return "" if v != v else format(float(v), floatfmt)
    return " ".join(str(v).split()).replace("|", "\\|")


def md_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    if df is None or df.empty:
        return "_no rows_\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v, floatfmt) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


PROV = ["gpu", "device", "gpu_name", "driver", "cuda", "torch", "triton", "git_sha", "git_dirty", "code_version"]
AXES = ["model", "workload", "profiler", "phase", "batch", "seq_len", "weight_dtype", "M", "K", "N"]


def _provenance(df: pd.DataFrame) -> str:
    cols = PROV + (["timing"] if (df["timing"].fillna("") != "").any() else [])
    return md_table(df[cols].drop_duplicates().astype(str).sort_values(cols))


def _status(df: pd.DataFrame) -> str:
    pts = df.drop_duplicates("point_hash")
    t = pts.groupby(["gpu", "impl", "status"]).size().rename("points").reset_index()
    out = md_table(t)
    bad = pts[pts["status"] != "ok"]
    if len(bad):
        axes = [a for a in AXES if (bad[a].astype(str).replace({"<NA>": "", "nan": "", "0": "", "none": ""}) != "").any()]
        bad = bad.drop_duplicates(["impl", "status", "error"]).head(20)
        bad = bad.assign(error=bad["error"].fillna("").map(lambda s: s if len(s) <= 220 else s[:217] + "..."))
        out += "\nPoints that did not run, and why (first of each kind):\n\n"
        out += md_table(bad[["gpu", "impl", *axes, "status", "error"]])
    return out + _exposed(df)


def _exposed(df: pd.DataFrame) -> str:
    """The matmul points whose timing kept more than a tenth of its samples exposed to the host (harness.timing:
    the GPU had passed a sample's start before its call was enqueued, even after the retries)."""
    from harness.timing import exposed_too_many
    e = df[(df["metric"] == "exposed_samples") & df["value"].notna() & df["n_samples"].notna()]
    e = e[[exposed_too_many(int(v), int(n)) for v, n in zip(e["value"], e["n_samples"])]]
    if e.empty:
        return ""
    axes = [a for a in AXES if a in e and (e[a].astype(str).replace({"<NA>": "", "nan": ""}) != "").any()]
    return ("\nTimings with more than a tenth of their samples exposed to the host (their medians may hold host "
            "waits; README, Timing recipe):\n\n" + md_table(e[["gpu", "impl", *axes, "value", "n_samples"]]
                                                          .rename(columns={"value": "exposed samples"})))


def _run_time(df: pd.DataFrame) -> str:
    """First to last row per code version: about the GPU time the committed rows took."""
    ts = pd.to_datetime(df["ts_utc"], errors="coerce", utc=True, format="mixed")
    d = df.assign(ts=ts).dropna(subset=["ts"])
    if d.empty:
        return ""
    spans = d.groupby(["gpu", "code_version"])["ts"].agg(["min", "max"])
    mins = [(r["max"] - r["min"]).total_seconds() / 60 for _, r in spans.iterrows()]
    return (f"The committed rows span {sum(mins):.0f} min of measurement (first to last row of each of "
            f"{len(mins)} code version(s); setup and compilation before the first row are not included).\n")


# ---- experiments: names and figure numbers -----------------------------------------------------------

def figure_of(name: str) -> tuple[str, str]:
    """(the published paper's figure, the artifact's) for an experiment name."""
    if name.startswith("tilus_fig"):
        n = int(name.removeprefix("tilus_fig"))
        return f"Tilus Fig. {n}", f"Fig. {n - 1}"
    if name.startswith("proton_fig"):
        n = int(name.removeprefix("proton_fig"))
        return f"Proton Fig. {n}", f"Fig. {n} (the paper keeps the artifact's numbers)"
    return "-", "-"


def _order(name: str):
    for i, p in enumerate(("tilus_fig", "proton_fig")):
        if name.startswith(p) and name.removeprefix(p).isdigit():
            return (i, int(name.removeprefix(p)), name)
    return (2, 0, name)


# ---- claims and environment --------------------------------------------------------------------------

VERDICT_WORDS = {"holds": "hold", "holds_other_magnitude": "hold with another magnitude",
                 "does_not_hold": "do not hold", "not_measurable": "are not measurable yet"}


def _claims_table(c: pd.DataFrame) -> pd.DataFrame:
    t = pd.DataFrame({
        "claim": c["claim_id"],
        "figure": c["paper"] + " Fig. " + c["figure"].astype(str),
        "statement": c["statement"],
        "paper (GPU)": [f"{v} ({g.replace('NVIDIA ', '')})" if v else f"({g.replace('NVIDIA ', '')})"
                        for v, g in zip(c["paper_value"], c["paper_gpu"])],
        "ours": c["measured_value"],
        "verdict": c["verdict"],
        "why": c["why"],
    })
    return t


def _claims_section(c: pd.DataFrame) -> str:
    n = len(c)
    counts = c["verdict"].value_counts()
    summary = ", ".join(f"{counts.get(v, 0)} {VERDICT_WORDS[v]}" for v in claims_mod.VERDICTS)
    return ("\n## Verdicts: every quantitative claim of both papers\n\n"
            f"{n} claims ({_rel(Path(ROOT / 'results' / 'paper' / 'claims.yaml'))} lists them, with how each is "
            f"computed and its tolerance; `results/claims.csv` holds this table): {summary}. Our values come from "
            "the GPU rows below; the paper's from its text or, where it gives no number, from its artifact's data "
            "in `results/paper/`. A claim about an experiment without rows says what would make it measurable.\n\n"
            + md_table(_claims_table(c)))


def _datasheet(card: str | None) -> str:
    spec = GpuSpec.load(card) if card else None
    return f"{spec.hbm_bw_tbs:g} TB/s" if spec and spec.hbm_bw_tbs else "(no datasheet card in conf/gpu/)"


def _environment(df: pd.DataFrame, paper_dir: Path) -> str:
    path = paper_dir / "environment.yaml"
    env = yaml.safe_load(path.read_text()) if path.exists() else {}
    ours = df[df["status"] == "ok"] if len(df) else df
    gpus = sorted(set(ours["gpu"])) if len(ours) else []
    names = sorted(set(ours["gpu_name"].dropna()) - {""}) if len(ours) else []
    card = {"NVIDIA GH200": "gh200", "AMD MI300X": None, **claims_mod.GPU_CARD}

    def paper_col(p, key):
        e = env.get(p, {})
        if key == "gpu":
            return "; ".join(f"{g['gpu']} (Fig{'s' if ',' in g['figures'] else ''}. {g['figures']})"
                             for g in e.get("gpus", []))
        if key == "bw":
            return "; ".join(f"{g['gpu'].replace('NVIDIA ', '')} {_datasheet(card.get(g['gpu']))}"
                             for g in e.get("gpus", []))
        return e.get(key, "")

    bw = ours[ours["metric"] == "hbm_read_bw"]["value"] if len(ours) else pd.Series(dtype=float)
    clocks = ours["sm_clock_mhz"].dropna() if len(ours) else pd.Series(dtype=float)
    ours_sheet = "; ".join(f"{g.upper()} {_datasheet(g)}" for g in gpus)
    sw = []
    for col, what in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("triton", "triton")):
        vals = sorted(set(ours[col].dropna().astype(str)) - {""}) if len(ours) else []
        if vals:
            sw.append(f"{what} {', '.join(vals)}")
    timing = sorted(set(ours["timing"].fillna("")) - {""}) if len(ours) else []
    rows = [
        ("GPU", paper_col("Tilus", "gpu"), paper_col("Proton", "gpu"), ", ".join(names) or "no GPU rows"),
        ("HBM bandwidth, datasheet", paper_col("Tilus", "bw"), paper_col("Proton", "bw"), ours_sheet),
        ("HBM bandwidth, measured", "not published", "not published",
         f"{span(bw, 2)} TB/s (sum of 4 GiB f16 in each matmul job)" if len(bw) else "not measured"),
        ("SM clock", paper_col("Tilus", "clocks"), paper_col("Proton", "clocks"),
         (f"median {np.median(clocks):.0f} MHz (p10 {np.percentile(clocks, 10):.0f}, min {clocks.min():.0f}), "
          "read by NVML while the samples ran; not locked by the harness") if len(clocks) else "not recorded"),
        ("software", paper_col("Tilus", "software"), paper_col("Proton", "software"), "; ".join(sw)),
        ("timing", paper_col("Tilus", "timing"), paper_col("Proton", "timing"),
         ("recipe per row: " + "; ".join(timing)) if timing else
         "harness/timing.py (README: float64 check, L2 flush, CUDA events, median with p10/p90); the committed "
         "rows predate the per-row `timing` column"),
    ]
    t = pd.DataFrame(rows, columns=["", "Tilus paper", "Proton paper", "this reproduction"])
    ratio = ""
    sheets = {g: GpuSpec.load(g) for g in gpus}
    l40s, gh200 = GpuSpec.load("l40s"), GpuSpec.load("gh200")
    parts = []
    for g, s in sheets.items():
        if s and s.hbm_bw_tbs:
            parts += [f"{g.upper()} / L40S {s.hbm_bw_tbs / l40s.hbm_bw_tbs:.1f}x",
                      f"{g.upper()} / GH200 {s.hbm_bw_tbs / gh200.hbm_bw_tbs:.1f}x"]
    if parts:
        ratio = ("\nBandwidth ratios, datasheet to datasheet (no measured bandwidth of the papers' GPUs is "
                 "published, so measured and datasheet figures are never divided by each other): "
                 + ", ".join(parts) + ".\n")
    return ("\n## Environment: the papers' machines and ours\n\n"
            "The papers' side comes from `results/paper/environment.yaml` (each entry names its source file); "
            "ours from the provenance columns of the GPU rows and the GPU cards in `conf/gpu/`.\n\n"
            + md_table(t) + ratio)


# ---- the reports ---------------------------------------------------------------------------------------

class Failures(list):
    def note(self, what: str, e: BaseException | str) -> str:
        line = f"{what} failed: {e if isinstance(e, str) else _one_line(e)}"
        self.append(line)
        print(f"warning: {line}", file=sys.stderr)
        return f"\n**{line}**\n"


def _clean(fig_dir: Path) -> None:
    for old in list(fig_dir.glob("*.png")) + list(fig_dir.glob("*.pdf")):   # no stale figure survives
        old.unlink()


def _demote(md: str) -> str:
    """Headings one level down (outside code fences)."""
    out, fenced = [], False
    for ln in md.splitlines():
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        out.append("#" + ln if ln.startswith("#") and not fenced else ln)
    return "\n".join(out)


def _section(name: str, d: pd.DataFrame, fig_dir: Path, paper_dir: Path, claims: pd.DataFrame | None,
             failures: Failures, cpu: bool) -> list[str]:
    pub, art = figure_of(name)
    parts = [f"\n## {name}\n"]
    if pub != "-":
        parts.append(f"{pub}; the artifact's {art}.\n")
    readme = ROOT / "experiments" / name / "README.md"
    if readme.exists() and not cpu:
        body = readme.read_text().split("\n", 1)[1].strip()
        # the README's own headings become subsections of this experiment's section
        parts.append(_demote(body) + "\n")
    if d.empty:
        parts.append("\n**No GPU results are committed for this experiment yet.**\n" if not cpu else
                     "\n_no CPU rows_\n")
    if claims is not None and len(claims):
        mine = claims[claims["experiments"].str.split(", ").map(lambda es: name in es)]
        if len(mine):
            parts.append("\n### Claims checked here\n\n" + md_table(
                _claims_table(mine)[["claim", "paper (GPU)", "ours", "verdict", "why"]]))
    if not d.empty and not cpu and name in FINDINGS:
        try:
            lines = FINDINGS[name](d)
            if lines:
                parts.append("\n### Findings (sentences generated from the rows)\n\n"
                             + "\n".join(f"- {s[:1].upper()}{s[1:]}" for s in lines) + "\n")
        except Exception as e:  # noqa: BLE001
            parts.append(failures.note(f"findings of {name}", e))
    for f in sorted((f for f in FIGURES.values() if f.experiment == name), key=lambda f: f.name):
        if d.empty or (cpu and not f.cpu_ok):
            continue
        try:
            fig = f.fn(d)
        except Exception as e:  # noqa: BLE001
            parts.append(failures.note(f"figure {f.name}", e))
            continue
        if fig is None:
            continue
        save(fig, fig_dir, f.name)
        parts.append(f"\n![{f.name}](figures/{f.name}.png)\n\n{f.caption}\n")
    if not d.empty and not cpu:
        for title_, (exp_name, fn) in TABLES.items():
            if exp_name != name:
                continue
            try:
                parts.append(f"\n### {title_}\n\n" + md_table(fn(d)))
            except Exception as e:  # noqa: BLE001
                parts.append(failures.note(f"table '{title_}'", e))
        if name in COMPARISONS:
            ctitle, fn = COMPARISONS[name]
            try:
                parts.append(f"\n### {ctitle}\n\n" + md_table(fn(d, paper_dir)))
            except Exception as e:  # noqa: BLE001
                parts.append(failures.note(f"comparison '{ctitle}'", e))
    if not d.empty:
        parts.append("\n### Where the rows came from\n\n" + _provenance(d))
        if not cpu:
            parts.append("\n" + _run_time(d))
        parts.append("\n### Point status\n\n" + _status(d))
    return parts


def build_main(results_dir: Path, out: Path | None = None) -> tuple[Path, Failures]:
    results_dir = Path(results_dir)
    out = out or results_dir / "REPORT.md"
    reset_style()
    names = sorted(load_experiments(), key=_order)
    df, warnings = load_rows(results_dir, cpu=False)
    df = df[df["device"] == "cuda"].reset_index(drop=True)
    df.attrs["results_dir"] = str(results_dir)
    paper_dir = results_dir / "paper"
    fig_dir = results_dir / "figures"
    _clean(fig_dir)
    failures = Failures()
    for name, err in sorted(IMPORT_FAILURES.items()):
        failures.note(f"importing experiments/{name}/figures.py", err)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    claims = None
    if (paper_dir / "claims.yaml").exists():
        try:
            claims = claims_mod.evaluate(df, paper_dir)
            claims_mod.write_csv(claims, results_dir / "claims.csv")
        except Exception as e:  # noqa: BLE001
            failures.note("claims", e)
    parts = ["# Reproduction report\n",
             "Generated by `make figures` (`python -m harness.report`) from the CSVs under `results/`; every "
             "sentence with a number in it below is computed from those rows or from the papers' data in "
             "`results/paper/` (see its README for the sources and GPUs). Only GPU rows (`device=cuda`) are "
             "used; rows measured on a CPU through the Triton interpreter check the pipeline and go to the "
             "separate, git-ignored `results/cpu/REPORT.md`. Tilus' figures carry the published ASPLOS'26 "
             "numbers (its artifact numbers them one lower); Proton's the artifact's, which the paper uses. "
             "`tilus` rows are our kernel written in Tilus 0.2.0, not the paper's kernels; `triton` is our "
             "optimized Triton kernel and `triton_plain` our kernel of the plain design Tilus compared against.\n"]
    if warnings:
        parts.append("\nResult files that could not be read (skipped):\n\n" + "\n".join(f"- {w}" for w in warnings) + "\n")
    if claims is not None:
        parts.append(_claims_section(claims))
        covered = {e for es in claims["experiments"] for e in es.split(", ")}
        bare = [n for n in names if figure_of(n)[0] != "-" and n not in covered]
        if bare:
            parts.append("\nExperiments of a paper figure with no claim above (the paper's abstract and artifact "
                         "state no number for them; their figures are shown below): "
                         + ", ".join(f"`{n}`" for n in bare) + ".\n")
    parts.append(_environment(df, paper_dir))
    idx = []
    for name in names:
        pub, art = figure_of(name)
        d = df[df["experiment"] == name]
        idx.append({"experiment": f"[{name}](#{name})", "paper figure": pub, "artifact figure": art,
                    "GPU rows": len(d), "GPU": ", ".join(sorted(set(d["gpu"]))) or "-"})
    parts.append("\n## Experiments\n\n" + md_table(pd.DataFrame(idx)))
    body = []
    for name in names:
        d = df[df["experiment"] == name]
        d.attrs["results_dir"] = str(results_dir)
        body += _section(name, d, fig_dir, paper_dir, claims, failures, cpu=False)
    if failures:
        parts.append("\n**Parts of this report that failed to build:**\n\n" + "\n".join(f"- {f}" for f in failures) + "\n")
    parts += body
    out.write_text("\n".join(parts))
    return out, failures


def build_cpu(results_dir: Path) -> tuple[Path | None, Failures]:
    """The CPU pipeline report under results/cpu/ (git-ignored), where there are CPU rows."""
    results_dir = Path(results_dir)
    df, warnings = load_rows(results_dir, cpu=True)
    failures = Failures()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if df.empty and not warnings:
        return None, failures
    reset_style()
    names = sorted(load_experiments(), key=_order)
    cpu_dir = results_dir / "cpu"
    fig_dir = cpu_dir / "figures"
    _clean(fig_dir)
    parts = ["# CPU pipeline report (not performance)\n",
             "Rows measured without a GPU, through the Triton interpreter (`device=cpu-interpreter`): they check "
             "planning, numerics against float64, rows, merging and drawing. No timing here is a result; the GPU "
             "report is `results/REPORT.md`.\n"]
    if warnings:
        parts.append("\nResult files that could not be read (skipped):\n\n" + "\n".join(f"- {w}" for w in warnings) + "\n")
    for name in names:
        d = df[df["experiment"] == name]
        if d.empty:
            continue
        d.attrs["results_dir"] = str(results_dir)
        parts += _section(name, d, fig_dir, results_dir / "paper", None, failures, cpu=True)
    out = cpu_dir / "REPORT.md"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts))
    return out, failures


def build(results_dir: Path, out: Path | None = None) -> Path:
    """Both reports; returns the GPU report's path."""
    path, _ = build_main(Path(results_dir), out)
    build_cpu(Path(results_dir))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "results"), help="results folder (default: results/)")
    ap.add_argument("--out", default=None, help="GPU report path (default: <results>/REPORT.md)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a figure, table or finding failed")
    a = ap.parse_args(argv)
    results = Path(a.results)
    if not results.is_dir():
        print(f"error: --results {results} is not a folder", file=sys.stderr)
        return 2
    out, failed = build_main(results, Path(a.out) if a.out else None)
    cpu_out, cpu_failed = build_cpu(results)
    print(f"wrote {_rel(out)}, {_rel(results / 'claims.csv')} and figures under {_rel(results / 'figures')}")
    if cpu_out:
        print(f"wrote the CPU pipeline report {_rel(cpu_out)} (git-ignored)")
    n = len(failed) + len(cpu_failed)
    if n:
        print(f"{n} part(s) of the reports failed (named in them)", file=sys.stderr)
    return 1 if (n and a.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
