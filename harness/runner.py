"""One Hydra job: validate and plan the inner sweep, then measure point by point.

Order matters: everything that can be wrong with the config is found while
planning, before the first CUDA call. Each finished point is written at once
(crash-safe) and every point that cannot run becomes a row with its status.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import socket
import sys
from pathlib import Path

from omegaconf import DictConfig

from kernels import Unavailable, Unsupported
from . import benchmarks  # noqa: F401  (registers the benchmarks)
from .bench import BENCHMARKS, Context, Metric, Point
from .provenance import ROOT, code_version, collect
from .specs import ConfigError, ExperimentSpec, GpuSpec, ModelCard, Precision, choices
from .store import ShardWriter, done_hashes, merge
from .timing import NumericsFail, Timer


def resolve_device(want: str) -> str:
    import torch
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible; use run.device=auto or cpu")
    if want not in ("cuda", "cpu"):
        raise ConfigError(f"run.device={want!r}; valid: auto, cuda, cpu")
    return want


def resolve_gpu(cfg: DictConfig, device: str) -> GpuSpec:
    if device == "cpu":
        if cfg.name not in ("auto", "cpu"):
            raise ConfigError(f"gpu={cfg.name} asked for, but this run is on the CPU (no GPU visible); use gpu=auto")
        return GpuSpec.load("cpu")
    import torch
    name = torch.cuda.get_device_name()
    if cfg.name != "auto":
        spec = GpuSpec.from_cfg(cfg)
        if spec.match and spec.match not in name:
            print(f"warning: gpu={spec.name} but the device is {name!r}", file=sys.stderr)
        return spec
    for g in choices("gpu"):
        if g in ("auto", "cpu"):
            continue
        spec = GpuSpec.load(g)
        if spec.match and spec.match in name:
            return spec
    slug = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
    print(f"warning: no conf/gpu card matches {name!r}; results go to results/{slug}/ without peaks", file=sys.stderr)
    return GpuSpec(name=slug)


def build_context(cfg: DictConfig, plan_only: bool = False) -> tuple[Context, object, list[Point]]:
    """Everything up to (not including) the first GPU work: typed config, plan, validation.

    plan_only: validate and plan without touching the device (the multirun preflight)."""
    exp = ExperimentSpec.from_cfg(cfg.experiment)
    card = ModelCard.from_cfg(cfg.model)
    prec = Precision.from_cfg(cfg.precision).with_group(exp.group_size)
    kernel = cfg.get("kernel")
    kernels = (kernel.name,) if kernel else exp.kernels
    if exp.benchmark not in BENCHMARKS:
        raise ConfigError(f"experiment {exp.name}: unknown benchmark {exp.benchmark!r}; valid: {sorted(BENCHMARKS)}")
    if plan_only:
        device = "cpu" if cfg.run.device == "cpu" else "cuda"
        gpu = GpuSpec(name=cfg.gpu.name)
        # Planning may import kernel modules, and a Triton kernel is interpreted or compiled
        # from the moment it is defined: choose the interpreter now for a run on the CPU.
        if cfg.run.device == "cpu" or (cfg.run.device == "auto" and resolve_device("auto") == "cpu"):
            os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        device = resolve_device(cfg.run.device)
        if device == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        gpu = resolve_gpu(cfg.gpu, device)
    ctx = Context(exp, card, prec, gpu, tuple(kernels), device, seed=int(cfg.run.seed))
    bench = BENCHMARKS[exp.benchmark]()
    points = bench.points(ctx)
    return ctx, bench, points


TIMING_KEYS = ("warmup_ms", "samples", "flush_l2", "flush_mb", "cuda_graph", "host_ahead")


def timing_key(t: DictConfig, device: str) -> str:
    """The timing settings that change what is measured (JSON, part of every point's hash and row).
    On the CPU only the sample count applies."""
    d = {"cpu_samples": int(t.cpu_samples)} if device != "cuda" else {k: t[k] for k in TIMING_KEYS}
    return json.dumps(d, sort_keys=True)


def _rows(point: Point, metrics: list[Metric], status: str, error: str, prov: dict, phash: str) -> list[dict]:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    base = {**point.columns(), **prov, "point_hash": phash, "status": status, "error": error, "ts_utc": now}
    return [{**base, "metric": m.metric, "value": m.value, "unit": m.unit, "p10": m.p10, "p90": m.p90,
             "n_samples": m.n_samples, "sm_clock_mhz": m.sm_clock_mhz, "impl_config": m.impl_config}
            for m in metrics]


def run_point(bench, point: Point, ctx: Context) -> tuple[list[Metric], str, str]:
    """Measure one point; any failure becomes (status, one-line error) and the sweep goes on."""
    import torch
    try:
        return bench.run(point, ctx), "ok", ""
    except Unsupported as e:
        status, err = "unsupported", str(e)
    except Unavailable as e:
        status, err = "unavailable", str(e)
    except NumericsFail as e:
        status, err = "numerics_fail", str(e)
    except torch.cuda.OutOfMemoryError as e:
        status, err = "oom", str(e).splitlines()[0]
    except TimeoutError as e:
        status, err = "timeout", str(e)
    except Exception as e:  # noqa: BLE001 - every failure is a row, the sweep goes on
        status, err = "error", f"{type(e).__name__}: {e}"
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
    err = " ".join(err.split())[:300]
    return [Metric(bench.primary_metric, float("nan"), "")], status, err


def run_job(cfg: DictConfig) -> Path:
    ctx, bench, points = build_context(cfg)
    results_dir = Path(cfg.run.results_dir)
    if not results_dir.is_absolute():
        results_dir = ROOT / results_dir
    exp_dir = results_dir / ctx.gpu.name / ctx.experiment.name
    cv = code_version()
    timing = timing_key(cfg.timing, ctx.device)
    points = [dataclasses.replace(p, timing=timing) for p in points]
    hashes = {p: p.hash(cv, ctx.gpu.name) for p in points}
    done = done_hashes(exp_dir) if cfg.run.resume else set()
    todo = [p for p in points if hashes[p] not in done]
    axes = {"model": ctx.model.name, "precision": ctx.precision.name}
    shown = getattr(bench, "label_axes", tuple(axes))          # the job axes this benchmark uses
    label = " ".join([ctx.experiment.name, *(f"{a}={axes[a]}" for a in shown), f"gpu={ctx.gpu.name}"])
    print(f"[{label}] {len(points)} points, {len(points) - len(todo)} already done, {len(todo)} to run"
          f" -> {exp_dir.relative_to(ROOT) if exp_dir.is_relative_to(ROOT) else exp_dir}", flush=True)
    if not todo:
        return exp_dir
    shard_name = cfg.run.shard or f"{socket.gethostname()}-{os.getpid()}-{dt.datetime.now():%Y%m%d%H%M%S%f}"
    shard = exp_dir / "shards" / f"{shard_name}.csv"
    writer = ShardWriter(shard)
    prov = collect(ctx.device)
    prov = {**prov, "git_sha": os.environ.get("HARNESS_GIT_SHA", prov["git_sha"]),
            "git_dirty": os.environ.get("HARNESS_GIT_DIRTY", prov["git_dirty"])}
    t = cfg.timing
    ctx.artifacts = exp_dir / "artifacts"
    ctx.timer = Timer(ctx.device, t.warmup_ms, t.samples, t.flush_l2, t.flush_mb, t.cuda_graph, t.cpu_samples,
                      t.host_ahead)
    probe = Point(ctx.experiment.name, ctx.experiment.figure, model=ctx.model.name, layer="probe", impl="probe",
                  timing=timing)
    setup_metrics = bench.setup(ctx)
    if setup_metrics and probe.hash(cv, ctx.gpu.name) not in done:
        writer.write_point(_rows(probe, setup_metrics, "ok", "", prov, probe.hash(cv, ctx.gpu.name)))
    bar = _progress(todo, cfg.run.progress, label)
    counts: dict[str, int] = {}
    skipped: dict[tuple[str, str, str], int] = {}
    try:
        for p in bar:
            metrics, status, err = run_point(bench, p, ctx)
            writer.write_point(_rows(p, metrics, status, err, prov, hashes[p]))
            counts[status] = counts.get(status, 0) + 1
            if status in ("unsupported", "unavailable"):     # expected gaps: summarised below
                skipped[(p.impl, status, err)] = skipped.get((p.impl, status, err), 0) + 1
            elif status != "ok":                              # failures: printed when they happen
                msg = f"  {status}: {p.impl} {p.layer} M={p.M} K={p.K} N={p.N} {p.weight_dtype}: {err}"
                (bar.write if hasattr(bar, "write") else print)(msg, file=sys.stderr)
    finally:
        merge(exp_dir, only=[shard])
    for (impl, status, err), n in sorted(skipped.items()):
        print(f"  {n} point(s) {status}: {impl}: {err}")
    print(f"[{label}] done: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), flush=True)
    return exp_dir


def _progress(items, enabled: bool, label: str):
    if not enabled:
        return items
    from tqdm import tqdm
    return tqdm(items, desc=label[:60], unit="pt", dynamic_ncols=True, file=sys.stderr)
