"""Tidy fixture rows for the report and claims tests, written through the real store (ShardWriter, merge)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.store import ShardWriter, merge


def row(experiment: str, metric: str, value: float, **axes) -> dict:
    """One GPU row; the point hash is derived from the point's axes so rows of one point share it."""
    base = dict(experiment=experiment, figure=experiment, model="llama3_70b", status="ok", device="cuda",
                gpu_name="NVIDIA H200", profiler="none", ts_utc="2026-01-01T00:00:00+00:00", unit="")
    base.update(axes)
    key = json.dumps({k: v for k, v in base.items() if k not in ("metric", "value", "p10", "p90", "unit")},
                     sort_keys=True, default=str)
    base["point_hash"] = hashlib.sha1(key.encode()).hexdigest()[:16]
    return {**base, "metric": metric, "value": value}


def write(results: Path, experiment: str, rows: list[dict], gpu: str = "h200", shard: str = "fx") -> Path:
    """Write rows (one point per point_hash) into results/<gpu>/<experiment>/ and merge them."""
    exp = Path(results) / gpu / experiment
    w = ShardWriter(exp / "shards" / f"{shard}.csv")
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        by_point.setdefault(r["point_hash"], []).append(r)
    for pts in by_point.values():
        w.write_point(pts)
    w.close()
    merge(exp)
    return exp


def matmul(experiment: str, impl: str, wdt: str, M: int, K: int, N: int, ms: float, spread: float = 0.01,
           **extra) -> list[dict]:
    """latency_ms (with p10/p90) and, where given, other metrics of one matmul point."""
    axes = dict(layer=f"k{K}n{N}", M=M, K=K, N=N, weight_dtype=wdt, act_dtype="f16",
                group_size=128 if wdt[0] in "ui" else -1, impl=impl)
    out = [row(experiment, "latency_ms", ms, p10=ms * (1 - spread), p90=ms * (1 + spread), unit="ms", **axes)]
    for metric, v in extra.items():
        out.append(row(experiment, metric, v, **axes))
    return out
