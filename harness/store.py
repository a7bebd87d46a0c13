"""Tidy results: one CSV row per (sweep point, metric), written shard by shard.

Layout: <results_dir>/<gpu>/<experiment>/shards/<shard>.csv, merged into
<results_dir>/<gpu>/<experiment>/results.csv by `merge`. Each finished point is
appended and flushed at once, so a crash or Ctrl-C loses no finished row. Resume
is by content: a point whose point_hash already has a final row is skipped.
"""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Iterable

import pandas as pd

SCHEMA = [
    "experiment", "figure", "model", "model_layers", "workload", "phase", "batch", "seq_len",
    "layer", "M", "K", "N", "weight_dtype", "act_dtype",
    "group_size", "impl", "profiler", "params", "timing", "impl_config", "metric", "value", "unit",
    "p10", "p90", "n_samples", "status", "error", "point_hash", "device", "gpu_name", "driver",
    "cuda", "torch", "triton", "git_sha", "git_dirty", "code_version", "sm_clock_mhz", "ts_utc",
]
STATUSES = ("ok", "unsupported", "unavailable", "oom", "numerics_fail", "timeout", "error")
FINAL = ("ok", "unsupported", "numerics_fail")   # not retried on resume; the rest are


class SchemaError(ValueError):
    pass


class ShardWriter:
    """Appends the rows of finished points to one shard file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(SCHEMA)
        else:
            _check_header(self.path)

    def write_point(self, rows: Iterable[dict]) -> None:
        if not self.path.exists():      # folded into results.csv by a merge meanwhile
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(SCHEMA)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=SCHEMA, extrasaction="raise")
        for r in rows:
            if r.get("status") not in STATUSES:
                raise SchemaError(f"status {r.get('status')!r} is not one of {STATUSES}")
            w.writerow({k: _cell(r.get(k)) for k in SCHEMA})
        with open(self.path, "a", newline="") as f:     # one write per point, then flush to disk
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float) and v != v:
        return ""
    return v


def _check_header(path: Path) -> None:
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    if header != SCHEMA:
        missing = [c for c in SCHEMA if c not in header]
        extra = [c for c in header if c not in SCHEMA]
        raise SchemaError(f"{path}: columns do not match the results schema (missing {missing}, unexpected {extra})")


def read_csv(path: Path) -> pd.DataFrame:
    """Read one shard or merged file; a torn last line (killed mid-write) is dropped."""
    _check_header(path)
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    body = [r for r in rows[1:] if len(r) == len(SCHEMA)]
    df = pd.DataFrame(body, columns=SCHEMA)
    return _types(df)


def _types(df: pd.DataFrame) -> pd.DataFrame:
    for c in ("M", "K", "N", "group_size", "n_samples", "batch", "seq_len", "model_layers"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    for c in ("value", "p10", "p90", "sm_clock_mhz"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def shard_files(exp_dir: Path) -> list[Path]:
    return sorted((Path(exp_dir) / "shards").glob("*.csv"))


def load_experiment(exp_dir: Path) -> pd.DataFrame:
    """All rows of one experiment directory: merged file plus any shards not merged yet."""
    exp_dir = Path(exp_dir)
    parts = [read_csv(p) for p in shard_files(exp_dir)]
    merged = exp_dir / "results.csv"
    if merged.exists():
        parts.append(read_csv(merged))
    if not parts:
        return _types(pd.DataFrame(columns=SCHEMA))
    df = pd.concat(parts, ignore_index=True)
    return _dedupe(df)


def _dedupe(df: pd.DataFrame) -> pd.DataFrame:
    """Keep the newest row per (point_hash, metric)."""
    df = df.sort_values("ts_utc", kind="stable")
    return df.drop_duplicates(["point_hash", "metric"], keep="last").reset_index(drop=True)


def done_hashes(exp_dir: Path) -> set[str]:
    df = load_experiment(exp_dir)
    return set(df.loc[df["status"].isin(FINAL), "point_hash"])


def merge(exp_dir: Path, only: list[Path] | None = None) -> Path:
    """Validate shards against the schema and fold them into results.csv.

    `only` folds just those shards (a job folds its own when it ends); by default
    every shard is folded. A lock file serialises concurrent merges; the merged
    file is replaced atomically and a folded shard is removed only afterwards.
    """
    import fcntl

    exp_dir = Path(exp_dir)
    shards = shard_files(exp_dir) if only is None else [Path(p) for p in only if Path(p).exists()]
    out = exp_dir / "results.csv"
    exp_dir.mkdir(parents=True, exist_ok=True)
    with open(exp_dir / ".merge.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = [read_csv(p) for p in shards]          # raises SchemaError naming the bad shard
        if out.exists():
            parts.append(read_csv(out))
        df = _dedupe(pd.concat(parts, ignore_index=True)) if parts else _types(pd.DataFrame(columns=SCHEMA))
        bad = sorted(set(df["status"]) - set(STATUSES))
        if bad:
            raise SchemaError(f"{exp_dir}: unknown status values {bad}")
        df = df.sort_values(["model", "layer", "impl", "weight_dtype", "M", "K", "N", "metric"], kind="stable")
        tmp = out.with_suffix(".csv.tmp")
        df.to_csv(tmp, index=False, columns=SCHEMA)
        os.replace(tmp, out)
        for p in shards:
            p.unlink()
    return out


def load_results(results_dir: Path, gpu: str | None = None, experiment: str | None = None) -> pd.DataFrame:
    """Every row under results/<gpu>/<experiment>/ (the paper's reference data excluded)."""
    root = Path(results_dir)
    frames = []
    for exp_dir in sorted(p for p in root.glob("*/*") if p.is_dir()):
        g, e = exp_dir.parent.name, exp_dir.name
        if g in ("paper", "figures") or (gpu and g != gpu) or (experiment and e != experiment):
            continue
        df = load_experiment(exp_dir)
        if len(df):
            df.insert(0, "gpu", g)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["gpu", *SCHEMA])
    return pd.concat(frames, ignore_index=True)
