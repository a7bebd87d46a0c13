"""Figures as registered functions of a tidy DataFrame, and the report that shows them.

experiments/<name>/figures.py registers, with the decorators below:
  @figure("name", experiment="...")      df -> matplotlib Figure (or None when no data)
  @comparison(experiment="...")          (df, paper_dir) -> DataFrame of paper vs ours
Only GPU rows (device == "cuda") are ever drawn as performance.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
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
COMPARISONS: dict[str, Callable[[pd.DataFrame, Path], pd.DataFrame]] = {}
TABLES: dict[str, tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]] = {}   # name -> (experiment, fn)


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


def comparison(experiment: str):
    def deco(fn):
        COMPARISONS[experiment] = fn
        return fn
    return deco


def load_experiments() -> list[str]:
    """Import experiments/*/figures.py (registers their figures); returns experiment names."""
    names = []
    for d in sorted((ROOT / "experiments").iterdir()):
        if (d / "figures.py").exists():
            importlib.import_module(f"experiments.{d.name}.figures")
            names.append(d.name)
    return names


def gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["device"] == "cuda") & (df["status"] == "ok")]


def pivot_metric(df: pd.DataFrame, metric: str, index: list[str], columns: str = "impl") -> pd.DataFrame:
    d = df[df["metric"] == metric]
    return d.pivot_table(index=index, columns=columns, values="value", aggfunc="median")


def save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=130, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})
    plt.close(fig)
    return paths
