"""Tidy results: one CSV row per (sweep point, metric), written shard by shard.

Layout: <results_dir>/<gpu>/<experiment>/shards/<shard>.csv, merged into
<results_dir>/<gpu>/<experiment>/results.csv by `merge`. Each finished point is
appended and flushed at once, so a crash or Ctrl-C loses no finished row. Resume
is by content: a point whose point_hash has a final latest attempt is skipped.

A point's latest attempt defines it: when a point is measured again, every row of
its earlier attempt is dropped (no stale `ok` metric survives beside a new `error`).
A running job holds an exclusive lock on its shard; a shard that nobody holds (its
job was killed) is an orphan, and the next run of the experiment folds it.
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
# Not retried on resume. `unavailable` is final because a point's hash covers the versions of the
# packages it needs (Point.env): when the environment changes, the point is a new one.
FINAL = ("ok", "unsupported", "numerics_fail", "unavailable")


class SchemaError(ValueError):
    pass


class ShardWriter:
    """Appends the rows of finished points to one shard file, holding a lock on it while open."""

    def __init__(self, path: Path):
        import fcntl

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the lock first, the shard second: a shard that exists is always held by its live writer or by nobody,
        # so another job's orphan_shards() never folds (and deletes) a shard that is being written (the other
        # order left a window in which a job starting at the same moment took a fresh shard for an orphan)
        self._lock = open(_lock_path(self.path), "a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)      # released when the process ends, however it ends
        if not self.path.exists() or self.path.stat().st_size == 0:
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(SCHEMA)
        else:
            _check_header(self.path)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
            _lock_path(self.path).unlink(missing_ok=True)

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


def _lock_path(shard: Path) -> Path:
    return shard.with_name(shard.name + ".lock")


def orphan_shards(exp_dir: Path) -> list[Path]:
    """Shards that no running job holds (their job was killed): safe to fold."""
    import fcntl

    out = []
    for p in shard_files(exp_dir):
        lock = _lock_path(p)
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue                       # a live job writes it
            out.append(p)
            fcntl.flock(f, fcntl.LOCK_UN)
    return out


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float) and v != v:
        return ""
    return v


def _check_header(path: Path) -> None:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as e:
        raise SchemaError(f"{path}: line 1: not a results CSV ({type(e).__name__})") from None
    if not header:
        raise SchemaError(f"{path}: empty file (no header line); expected the results schema header")
    if header != SCHEMA:
        missing = [c for c in SCHEMA if c not in header]
        extra = [c for c in header if c not in SCHEMA]
        if not missing and not extra:
            raise SchemaError(f"{path}: line 1: the columns are in the wrong order; expected: {','.join(SCHEMA)}")
        raise SchemaError(f"{path}: line 1: columns do not match the results schema "
                          f"(missing {missing}, unexpected {extra})")


def read_csv(path: Path) -> pd.DataFrame:
    """Read one shard or merged file.

    A torn last line (a job killed mid-write; the file does not end with a newline) is dropped.
    Any other malformed line (wrong number of fields, an unknown status, no point_hash) raises
    SchemaError naming the file and the line: a garbage line is never taken for a finished point.
    """
    _check_header(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise SchemaError(f"{path}: not a UTF-8 text file") from None
    torn = bool(text) and not text.endswith("\n")
    rows = list(csv.reader(io.StringIO(text)))
    body = []
    for i, r in enumerate(rows[1:], start=2):
        last = i == len(rows)
        if not r:
            continue
        if len(r) != len(SCHEMA):
            if last and torn:
                continue
            raise SchemaError(f"{path}: line {i}: {len(r)} fields, the schema has {len(SCHEMA)}")
        rec = dict(zip(SCHEMA, r))
        if rec["status"] not in STATUSES or not rec["point_hash"]:
            if last and torn:
                continue
            raise SchemaError(f"{path}: line {i}: status {rec['status']!r} / point_hash {rec['point_hash']!r} "
                              f"is not a valid row (status one of {', '.join(STATUSES)})")
        body.append(r)
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
    """A point is its latest attempt: keep only the rows of the newest ts_utc per point_hash
    (all rows of one attempt share one timestamp), then one row per metric."""
    if df.empty:
        return df.reset_index(drop=True)
    ts = pd.to_datetime(df["ts_utc"], utc=True, errors="coerce", format="mixed")
    df = df.assign(_ts=ts).sort_values("_ts", kind="stable", na_position="first")
    latest = df.groupby("point_hash")["_ts"].transform("max")
    df = df[(df["_ts"] == latest) | latest.isna()]
    df = df.drop_duplicates(["point_hash", "metric"], keep="last").drop(columns="_ts")
    return df.reset_index(drop=True)


def done_points(exp_dir: Path) -> dict[str, str]:
    """point_hash -> status of its latest attempt, for the points whose latest attempt is final."""
    df = load_experiment(exp_dir)
    d = df.drop_duplicates("point_hash")
    d = d[d["status"].isin(FINAL)]
    return dict(zip(d["point_hash"], d["status"]))


def done_hashes(exp_dir: Path) -> set[str]:
    return set(done_points(exp_dir))


def merge(exp_dir: Path, only: list[Path] | None = None) -> Path:
    """Validate shards against the schema and fold them into results.csv.

    `only` folds just those shards (a job folds its own when it ends); by default
    every shard is folded. A lock file serialises concurrent merges; the merged
    file is replaced atomically and a folded shard is removed only afterwards.
    """
    import fcntl

    exp_dir = Path(exp_dir)
    out = exp_dir / "results.csv"
    exp_dir.mkdir(parents=True, exist_ok=True)
    with open(exp_dir / ".merge.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # listed under the lock: a shard that another job's merge folded while this one waited is gone
        shards = shard_files(exp_dir) if only is None else [Path(p) for p in only if Path(p).exists()]
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
            _lock_path(p).unlink(missing_ok=True)
    return out


# what makes two rows the same point across code versions (the point_hash also covers the code, the timing recipe and
# the environment): Point's axes, without `timing`
POINT_KEY = ["experiment", "model", "model_layers", "workload", "phase", "batch", "seq_len", "layer", "M", "K", "N",
             "weight_dtype", "act_dtype", "group_size", "impl", "profiler", "params"]


def replace_points(results: Path, new: Path, where: str | None = None) -> tuple[int, int]:
    """Fold another run's rows into a committed results.csv, a point at a time: every row of a point that `new`
    measured replaces every earlier row of the same point, whatever code measured it (a re-measurement after a kernel
    changed).  `where`, a pandas query (e.g. "M == 16"), picks the points: those with at least one row of `new` that
    matches it, each then taken whole (a query on a per-row column such as `metric` cannot split a point).  Both files
    are validated; returns (rows dropped, rows added)."""
    results, new = Path(results), Path(new)
    old_df, new_df = read_csv(results), read_csv(new)
    key = lambda d: d[POINT_KEY].astype(str).agg("|".join, axis=1)  # noqa: E731
    if where:
        try:
            picked = new_df.query(where, engine="python")
        except Exception as e:  # noqa: BLE001 - a bad expression is the user's input
            raise SchemaError(f"--where {where!r}: {e}") from e
        new_df = new_df[key(new_df).isin(set(key(picked)))]
    keep = old_df[~key(old_df).isin(set(key(new_df)))]
    df = pd.concat([keep, new_df], ignore_index=True)
    df = df.sort_values(["model", "layer", "impl", "weight_dtype", "M", "K", "N", "metric"], kind="stable")
    tmp = results.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False, columns=SCHEMA)
    os.replace(tmp, results)
    return len(old_df) - len(keep), len(new_df)


def load_experiment_lenient(exp_dir: Path, warn=None) -> pd.DataFrame:
    """Like load_experiment, but a file that is not a valid results CSV is skipped with a one-line
    warning naming it (a broken CPU shard must not take the committed GPU results down with it)."""
    import sys

    exp_dir = Path(exp_dir)
    warn = warn or (lambda m: print(m, file=sys.stderr))
    parts = []
    files = shard_files(exp_dir) + ([exp_dir / "results.csv"] if (exp_dir / "results.csv").exists() else [])
    for p in files:
        try:
            parts.append(read_csv(p))
        except SchemaError as e:
            warn(f"skipping {e}")
    if not parts:
        return _types(pd.DataFrame(columns=SCHEMA))
    return _dedupe(pd.concat(parts, ignore_index=True))


def load_results(results_dir: Path, gpu: str | None = None, experiment: str | None = None,
                 strict: bool = False) -> pd.DataFrame:
    """Every row under results/<gpu>/<experiment>/ (the paper's reference data excluded).
    strict=False skips (with a warning) files that are not valid results CSVs."""
    root = Path(results_dir)
    frames = []
    for exp_dir in sorted(p for p in root.glob("*/*") if p.is_dir()):
        g, e = exp_dir.parent.name, exp_dir.name
        if g in ("paper", "figures", "checks") or (gpu and g != gpu) or (experiment and e != experiment):
            continue
        if not (exp_dir / "results.csv").exists() and not shard_files(exp_dir):
            continue
        df = load_experiment(exp_dir) if strict else load_experiment_lenient(exp_dir)
        if len(df):
            df.insert(0, "gpu", g)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["gpu", *SCHEMA])
    return pd.concat(frames, ignore_index=True)
