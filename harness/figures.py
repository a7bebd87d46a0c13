"""Figures, tables and findings as registered functions of a tidy DataFrame (drawn by harness/report.py).

experiments/<name>/figures.py registers, with the decorators below:
  @figure("name", experiment="...")      df -> matplotlib Figure (or None when there is no data)
  @table("title", experiment="...")      df -> DataFrame shown as a table
  @finding(experiment="...")             df -> list of markdown sentences, every number computed from df
  @comparison(experiment="...")          (df, paper_dir) -> DataFrame of the paper's numbers beside ours
The report passes GPU rows only (device == "cuda"); a figure registered with cpu_ok=True (no
performance in it, e.g. numerics) is also drawn from CPU rows, in the separate, git-ignored CPU report.
Figures are saved byte-for-byte reproducibly (fixed style and fonts, no timestamps or software
versions in the files), so rebuilding from the same CSVs with the same matplotlib gives the same bytes.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .provenance import ROOT  # noqa: E402


@dataclass
class FigureDef:
    name: str
    experiment: str
    fn: Callable[[pd.DataFrame], "plt.Figure | None"]
    caption: str = ""
    cpu_ok: bool = False      # True only for figures that show no performance (e.g. numerics)


FIGURES: dict[str, FigureDef] = {}
COMPARISONS: dict[str, tuple[str, Callable[[pd.DataFrame, Path], pd.DataFrame]]] = {}  # experiment -> (title, fn)
TABLES: dict[str, tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]] = {}   # title -> (experiment, fn)
FINDINGS: dict[str, Callable[[pd.DataFrame], list[str]]] = {}                # experiment -> fn


def figure(name: str, experiment: str, caption: str = "", cpu_ok: bool = False):
    def deco(fn):
        FIGURES[name] = FigureDef(name, experiment, fn, caption, cpu_ok)
        return fn
    return deco


def table(title: str, experiment: str):
    """A table of the report computed from the rows (targets, breakdowns): df -> DataFrame."""
    def deco(fn):
        TABLES[title] = (experiment, fn)
        return fn
    return deco


def finding(experiment: str):
    """The experiment's findings: df -> list of markdown sentences whose numbers are computed from df."""
    def deco(fn):
        FINDINGS[experiment] = fn
        return fn
    return deco


def comparison(experiment: str, title: str = "The paper's numbers beside ours"):
    def deco(fn):
        COMPARISONS[experiment] = (title, fn)
        return fn
    return deco


IMPORT_FAILURES: dict[str, str] = {}      # experiment -> why its figures.py did not import


def load_experiments() -> list[str]:
    """Import experiments/*/figures.py (registers their figures); returns experiment names.
    One that fails to import is recorded in IMPORT_FAILURES (the report names it) and skipped."""
    names = []
    for d in sorted((ROOT / "experiments").iterdir()):
        if (d / "figures.py").exists():
            try:
                importlib.import_module(f"experiments.{d.name}.figures")
            except Exception as e:  # noqa: BLE001 - one broken experiment must not take the report down
                IMPORT_FAILURES[d.name] = f"{type(e).__name__}: {' '.join(str(e).split())[:240]}"
            names.append(d.name)
    return names


def gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["device"] == "cuda") & (df["status"] == "ok")]


def pivot_metric(df: pd.DataFrame, metric: str, index: list[str], columns: str = "impl") -> pd.DataFrame:
    d = df[df["metric"] == metric]
    return d.pivot_table(index=index, columns=columns, values="value", aggfunc="median")


def paper_dir(df: pd.DataFrame) -> Path:
    """results/paper/ next to the rows being drawn (the report sets df.attrs['results_dir'])."""
    return Path(df.attrs.get("results_dir", ROOT / "results")) / "paper"


# ---- names as the report shows them -------------------------------------------------------------

# Our implementations (impl column). Two Triton kernels can appear side by side: ours, and our
# kernel of the plain design Tilus' paper compared against; both are labelled so they are not confused.
IMPL_LABEL = {
    "cublas": "cuBLAS f16",
    "triton": "Triton (ours, optimized)",
    "triton_plain": "Triton (Tilus' baseline design)",
    "tilus": "our kernel in Tilus 0.2.0",
    "bitblas": "Ladder/BitBLAS",
    "quantllm": "QuantLLM",
    "marlin": "Marlin",
    "gemlite": "GemLite",
    "torch_int4": "torch int4 (tinygemm)",
    "fp8": "cuBLAS fp8",
    "native": "native CUDA",
}
# The Tilus artifact's runner names (results/paper/tilus_kernels.csv impl) -> our impl of the same design
PAPER_IMPL = {"tilus": "tilus", "triton": "triton_plain", "ladder": "bitblas", "quantllm": "quantllm",
              "marlin": "marlin", "cublas": "cublas"}
PAPER_LABEL = {"tilus": "Tilus", "triton_plain": "Triton", "bitblas": "Ladder", "quantllm": "QuantLLM",
               "marlin": "Marlin", "cublas": "cuBLAS f16"}
IMPL_ORDER = ["tilus", "triton_plain", "triton", "bitblas", "quantllm", "marlin", "gemlite", "torch_int4", "fp8",
              "cublas"]
_PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
            "#CCB974", "#64B5CD"]


def impl_label(impl: str) -> str:
    return IMPL_LABEL.get(impl, impl)


def impl_color(impl: str) -> str:
    """One fixed colour per implementation in every figure."""
    i = IMPL_ORDER.index(impl) if impl in IMPL_ORDER else len(IMPL_ORDER) + sum(map(ord, impl))
    return _PALETTE[i % len(_PALETTE)]


def order_impls(impls) -> list[str]:
    return sorted(set(impls), key=lambda s: (IMPL_ORDER.index(s) if s in IMPL_ORDER else len(IMPL_ORDER), s))


# ---- numbers in prose -----------------------------------------------------------------------------

def fmt(v: float, nd: int = 2) -> str:
    return f"{v:.{nd}f}"


def span(values, nd: int = 2, unit: str = "") -> str:
    """'a-b<unit>' of the values (one number where they round alike); '' when empty."""
    v = [float(x) for x in values if x == x]
    if not v:
        return ""
    lo, hi = fmt(min(v), nd), fmt(max(v), nd)
    return (lo if lo == hi else f"{lo}-{hi}") + unit


def geomean(values) -> float:
    v = np.asarray([float(x) for x in values if x == x and x > 0])
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def listing(items) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---- reproducible drawing ----------------------------------------------------------------------

STYLE = {
    "font.family": "DejaVu Sans",        # bundled with matplotlib: the same glyphs on every machine
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "figure.dpi": 100,
    "savefig.dpi": 130,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.axisbelow": True,
    "pdf.fonttype": 42,
    "svg.hashsalt": "harness",
}


def reset_style() -> None:
    """Matplotlib's defaults plus STYLE, whatever the user's matplotlibrc says, and DejaVu from matplotlib's
    own files only (a system copy of DejaVu, another version, would otherwise win on some machines)."""
    from matplotlib import font_manager as fm
    matplotlib.rcdefaults()
    matplotlib.rcParams.update(STYLE)
    bundled = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    fm.fontManager.ttflist = [f for f in fm.fontManager.ttflist
                              if not f.name.startswith("DejaVu") or Path(f.fname).parent == bundled]
    fm.fontManager._findfont_cached.cache_clear()


def save(fig, out_dir: Path, name: str) -> list[Path]:
    """PNG and PDF without timestamps or software versions: the same rows give the same bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.savefig(paths[0], bbox_inches="tight", metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight",
                metadata={"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None})
    plt.close(fig)
    return paths


def title_and_legend(fig, title: str, handles: list, ncol: int) -> None:
    """Lay out the panels under a title and a legend that never overlap (sizes in inches)."""
    h = fig.get_figheight()
    rows = -(-len(handles) // ncol)
    top = 1 - (0.4 + 0.2 * rows + 0.1) / h
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.suptitle(title, y=1 - 0.06 / h, va="top")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.36 / h), ncol=ncol, frameon=False)
