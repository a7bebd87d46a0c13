"""Benchmarks as registered functions (tritonbench's operator pattern).

A benchmark turns one Hydra job (experiment x model x precision x gpu) into a list
of `Point`s (its inner sweep) and measures one point at a time, returning
`Metric`s. The runner owns everything else: resume, status rows, shards, progress.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .specs import ExperimentSpec, GpuSpec, ModelCard, Precision
from .timing import Timer


@dataclass(frozen=True)
class Point:
    experiment: str
    figure: str
    model: str
    layer: str
    M: int
    K: int
    N: int
    weight_dtype: str
    act_dtype: str
    group_size: int
    impl: str
    profiler: str = "none"
    params: tuple[tuple[str, Any], ...] = ()      # benchmark-specific knobs, sorted
    skip_reason: str | None = field(default=None, compare=False)   # known unsupported at plan time

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    def columns(self) -> dict:
        d = asdict(self)
        d.pop("skip_reason")
        d["params"] = json.dumps(self.params_dict, sort_keys=True) if self.params else ""
        return d

    def hash(self, code_version: str, gpu: str) -> str:
        key = json.dumps({**self.columns(), "code_version": code_version, "gpu": gpu}, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class Metric:
    metric: str
    value: float
    unit: str
    p10: float | None = None
    p90: float | None = None
    n_samples: int | None = None
    sm_clock_mhz: float | None = None
    impl_config: str = ""


@dataclass
class Context:
    """What a benchmark may read: the typed config of this job and the machine."""
    experiment: ExperimentSpec
    model: ModelCard
    precision: Precision
    gpu: GpuSpec
    kernels: tuple[str, ...]
    device: str                    # "cuda" or "cpu"
    seed: int = 0
    timer: Timer | None = None     # created after planning, so planning costs no GPU work
    artifacts: "Path | None" = None  # where a benchmark may write profiles/traces the report points to
    state: dict = field(default_factory=dict)   # per-job caches (weights, references, probes)

    @property
    def on_cpu(self) -> bool:
        return self.device != "cuda"


class Benchmark(Protocol):
    primary_metric: str

    def points(self, ctx: Context) -> list[Point]: ...
    def setup(self, ctx: Context) -> list[Metric]: ...
    def run(self, point: Point, ctx: Context) -> list[Metric]: ...


BENCHMARKS: dict[str, Callable[[], Benchmark]] = {}


def register(name: str):
    def deco(cls):
        BENCHMARKS[name] = cls
        return cls
    return deco
