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
from .specs import ConfigError, ExperimentSpec, GpuSpec, ModelCard, Precision, RunSpec, TimingSpec, choices
from .store import SchemaError, ShardWriter, done_points, merge, orphan_shards
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
    RunSpec.from_cfg(cfg.run)
    TimingSpec.from_cfg(cfg.timing)
    exp = ExperimentSpec.from_cfg(cfg.experiment)
    card = ModelCard.from_cfg(cfg.model)
    prec = Precision.from_cfg(cfg.precision).with_group(exp.group_size)
    kernel = cfg.get("kernel")
    kernels = exp.kernels
    if kernel:
        if not exp.kernels:
            raise ConfigError(f"kernel={kernel.name}: experiment {exp.name} has no kernel axis")
        if kernel.name not in exp.kernels:
            raise ConfigError(f"kernel={kernel.name} is not among experiment {exp.name}'s kernels: "
                              f"{', '.join(exp.kernels)}")
        kernels = (kernel.name,)
    if exp.benchmark not in BENCHMARKS:
        raise ConfigError(f"experiment {exp.name}: unknown benchmark {exp.benchmark!r}; valid: {sorted(BENCHMARKS)}")
    if plan_only:
        device = "cpu" if cfg.run.device == "cpu" else "cuda"
        gpu = GpuSpec(name=cfg.gpu.name)
        if cfg.run.device == "auto" and resolve_device("auto") == "cpu":
            device = "cpu"
    else:
        device = resolve_device(cfg.run.device)
        gpu = resolve_gpu(cfg.gpu, device)
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        # `python -m harness` decides this before anything imports Triton (harness.__main__);
        # a caller that builds a context itself must have decided it the same way.
        raise ConfigError("a run on the CPU needs TRITON_INTERPRET=1 set before Triton is imported "
                          "(python -m harness sets it; set it in the environment when calling run_job directly)")
    ctx = Context(exp, card, prec, gpu, tuple(kernels), device, seed=int(cfg.run.seed))
    bench = BENCHMARKS[exp.benchmark]()
    if card.layers is not None and not getattr(bench, "builds_models", False):
        raise ConfigError(f"model.layers={card.layers}: experiment {exp.name} times layer shapes, not whole models "
                          f"(a decoder-layer cap applies to whole-model experiments only)")
    points = bench.points(ctx)
    return ctx, bench, points


TIMING_KEYS = ("warmup_ms", "samples", "flush_l2", "flush_mb", "cuda_graph", "host_ahead", "cpu_samples")


def timing_key(t: DictConfig, keys: tuple[str, ...] = TIMING_KEYS) -> str:
    """The timing settings a benchmark reads (JSON, part of every point's hash and row): changing any
    of them measures the points again. A benchmark that times in its own way declares the `timing.*`
    keys it does read (`timing_keys`); settings that cannot change a number are not here."""
    return json.dumps({k: t[k] for k in keys}, sort_keys=True)


def _rows(point: Point, metrics: list[Metric], status: str, error: str, prov: dict, phash: str) -> list[dict]:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")   # one stamp per attempt
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
    err = " ".join(err.split())[:600]
    return [Metric(bench.primary_metric, float("nan"), "")], status, err


class Interrupted(Exception):
    """Ctrl-C during a sweep: the finished points are kept; the message says how many."""


def results_root(cfg: DictConfig) -> Path:
    results_dir = Path(str(cfg.run.results_dir))
    return results_dir if results_dir.is_absolute() else ROOT / results_dir


def _env_key(bench, point: Point) -> str:
    fn = getattr(bench, "env_key", None)
    return fn(point) if fn else ""


def run_job(cfg: DictConfig) -> Path:
    ctx, bench, points = build_context(cfg)
    exp_dir = results_root(cfg) / ctx.gpu.name / ctx.experiment.name
    check_writable(exp_dir)
    cv = code_version()
    timing = timing_key(cfg.timing, getattr(bench, "timing_keys", TIMING_KEYS))
    points = [dataclasses.replace(p, timing=timing, env=_env_key(bench, p)) for p in points]
    hashes = {p: p.hash(cv, ctx.gpu.name) for p in points}
    shown_dir = exp_dir.relative_to(ROOT) if exp_dir.is_relative_to(ROOT) else exp_dir
    try:
        return _run_job(cfg, ctx, bench, points, exp_dir, cv, timing, hashes, shown_dir)
    except SchemaError as e:
        raise ConfigError(f"results file unreadable: {e}; move it aside (the same command then re-measures "
                          f"what it held) or repair it") from None


def _run_job(cfg, ctx, bench, points, exp_dir, cv, timing, hashes, shown_dir) -> Path:
    orphans = orphan_shards(exp_dir)
    if orphans:          # shards of killed jobs: fold them first (under the merge lock) so nothing is lost
        merge(exp_dir, only=orphans)
        print(f"folded {len(orphans)} shard(s) left by an interrupted run into {shown_dir}/results.csv", flush=True)
    done = done_points(exp_dir) if cfg.run.resume else {}
    todo = [p for p in points if hashes[p] not in done]
    axes = {"model": ctx.model.name, "precision": ctx.precision.name}
    shown = getattr(bench, "label_axes", tuple(axes))          # the job axes this benchmark uses
    label = " ".join([ctx.experiment.name, *(f"{a}={axes[a]}" for a in shown), f"gpu={ctx.gpu.name}"])
    kept: dict[str, int] = {}
    for p in points:
        if hashes[p] in done:
            kept[done[hashes[p]]] = kept.get(done[hashes[p]], 0) + 1
    why = f" ({', '.join(f'{n} {s}' for s, n in sorted(kept.items()))})" if kept else ""
    print(f"[{label}] {len(points)} points, {len(points) - len(todo)} already done{why}, {len(todo)} to run"
          f" -> {shown_dir}", flush=True)
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
    counts: dict[str, int] = {}
    skipped: dict[tuple[str, str, str], int] = {}
    try:
        probe = Point(ctx.experiment.name, ctx.experiment.figure, model=ctx.model.name, layer="probe",
                      impl="probe", timing=timing)
        setup_metrics = bench.setup(ctx)
        if setup_metrics and probe.hash(cv, ctx.gpu.name) not in done:
            writer.write_point(_rows(probe, setup_metrics, "ok", "", prov, probe.hash(cv, ctx.gpu.name)))
        bar = _progress(todo, cfg.run.progress, label)
        for i, p in enumerate(bar, start=1):
            metrics, status, err = run_point(bench, p, ctx)
            writer.write_point(_rows(p, metrics, status, err, prov, hashes[p]))
            counts[status] = counts.get(status, 0) + 1
            if status in ("unsupported", "unavailable"):     # expected gaps: summarised below
                skipped[(p.impl, status, err)] = skipped.get((p.impl, status, err), 0) + 1
            elif status != "ok":                              # failures: printed when they happen
                _say(bar, f"  {status}: {describe(p)}: {err}")
            if not hasattr(bar, "write") and cfg.run.progress and (i == len(todo) or i % 10 == 0):
                print(f"[{label}] {i}/{len(todo)} points", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        n = sum(counts.values())
        raise Interrupted(f"interrupted: {n} point(s) of this job finished and are kept in {shown_dir}; "
                          f"{len(todo) - n} not run. The same command resumes.") from None
    finally:
        writer.close()
        merge(exp_dir, only=[shard])
    for (impl, status, err), n in sorted(skipped.items()):
        print(f"  {n} point(s) {status}: {impl}: {err}")
    print(f"[{label}] done: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), flush=True)
    return exp_dir


def describe(p: Point) -> str:
    """The axes of a point that are set, for messages."""
    cols = {k: v for k, v in p.columns().items() if k not in ("experiment", "figure", "timing")}
    return " ".join(f"{k}={v}" for k, v in cols.items() if v not in ("", None, "none", ()))


def _say(bar, msg: str) -> None:
    (bar.write if hasattr(bar, "write") else print)(msg, file=sys.stderr)


def check_writable(folder: Path) -> None:
    """The results folder can be created and written (tried for real: a read-only file system,
    a path under a file, or missing permission all fail here), or a one-line ConfigError says why."""
    import tempfile

    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"run.results_dir: {parent} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as e:
        raise ConfigError(f"run.results_dir: cannot write to {folder}: {e.strerror or e}") from None


def _progress(items, enabled: bool, label: str):
    """A tqdm bar on a terminal; plain lines every few points otherwise (no carriage returns in logs)."""
    if not enabled or not sys.stderr.isatty():
        return items
    from tqdm import tqdm
    return tqdm(items, desc=label[:60], unit="pt", dynamic_ncols=True, file=sys.stderr)
