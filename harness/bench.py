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
    """One sweep point. Every benchmark fills the axes it has and leaves the others empty:

    matmul:           model, layer, M, K, N, weight_dtype, act_dtype, group_size, impl
    whole models:     model, model_layers (the layer cap that ran), workload (train | infer | decode ...),
                      phase, batch, seq_len, weight_dtype/act_dtype, impl (the stack), profiler
    kernel suites:    workload (the kernel), impl (triton | native), profiler, params (size, mode)
    `timing` (the timing recipe, set by the runner) and `params` are part of the point's identity.
    """
    experiment: str
    figure: str
    model: str = ""
    layer: str = ""
    M: int | None = None
    K: int | None = None
    N: int | None = None
    weight_dtype: str = ""
    act_dtype: str = ""
    group_size: int | None = None
    impl: str = ""
    profiler: str = "none"
    params: tuple[tuple[str, Any], ...] = ()      # benchmark-specific knobs, sorted
    workload: str = ""
    phase: str = ""
    batch: int | None = None
    seq_len: int | None = None
    model_layers: int | None = None
    timing: str = ""                              # the timing settings that measured it (JSON)
    skip_reason: str | None = field(default=None, compare=False)   # known unsupported at plan time
    env: str = field(default="", compare=False)   # what it needs from the environment (package versions)

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    def columns(self) -> dict:
        d = asdict(self)
        d.pop("skip_reason")
        d.pop("env")
        d["params"] = json.dumps(self.params_dict, sort_keys=True) if self.params else ""
        return d

    def hash(self, code_version: str, gpu: str) -> str:
        """Content address of the measurement: every column, the code, the GPU, and the environment
        the point depends on (so an `unavailable` point is final until its package appears)."""
        key = {**self.columns(), "code_version": code_version, "gpu": gpu}
        if self.env:
            key["env"] = self.env
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


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
    """Optional attributes: `label_axes` (the job axes its progress label shows), `timing_keys` (the
    `timing.*` settings it reads: they go into the hash and the `timing` column; default all),
    `env_key(point)` (package versions the point depends on), `builds_models` (True: it builds whole
    models, so `model.layers=N` caps them; elsewhere that setting is refused)."""
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
