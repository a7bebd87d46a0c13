"""Intra-kernel instrumentation overhead (Proton Fig. 15) on our kernel suite.

For every kernel of kernels.suite: the kernel without instrumentation, then with
Proton's instrumentation backend in each configured mode (buffer size,
granularity, clock32, time_shift), timed in the same job. For the native CUDA
kernels (native/: matmul, softmax, layer_norm and the low-bit decode kernel
"lowbit", in its `auto` variant, and "lowbit_regs", in the regs variant): the same kernel without and with our own instrumentation header, in
each of its modes (params.native_modes: staged, warp0, direct; the low-bit
kernel's instrumented builds: staged and warp0). A calibration kernel spins a known
number of cycles inside one scope and checks the decoded scope time (per mode). Every variant is checked against the reference
before it is timed. Profiles (hatchet trees) and one Chrome trace per kernel are
written under the experiment's artifacts/ folder.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import torch

from kernels import Unavailable
from ..bench import Context, Metric, Point, register
from ..specs import ConfigError, int_list, int_value
from ..timing import NumericsFail, device_time

def _mode_params(mode: dict) -> tuple:
    keys = ("buffer_size", "granularity", "clock32", "time_shift")
    bad = sorted(set(mode) - set(keys))
    if bad:
        raise ConfigError(f"proton mode keys {bad} unknown; valid keys: {list(keys)}")
    return tuple(sorted(mode.items()))


def _scope_metrics(tree, scopes) -> list[Metric]:
    """Per-scope numbers from a hatchet literal (Proton's tree layout): one metric per (scope, key)."""
    out: dict[str, float] = {}

    def walk(node, path):
        name = node.get("frame", {}).get("name", "")
        here = path + (name,) if name not in ("ROOT",) else path
        if name in scopes:
            for k, v in node.get("metrics", {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"scope/{'/'.join(p for p in here if p in scopes)}/{k}"] = float(v)
        for c in node.get("children", []):
            walk(c, here)

    roots = tree if isinstance(tree, list) else [tree]
    for r in roots:
        if isinstance(r, dict) and "frame" in r:
            walk(r, ())
    return [Metric(k, v, "cycles" if "cycles" in k else "1") for k, v in sorted(out.items())]


def _triton_match(impl: str):
    """Kernel-name filter: the Triton JIT functions defined in the suite kernel's module."""
    import importlib

    import triton
    mod = importlib.import_module(f"kernels.suite.{impl}")
    names = [v.__name__ for v in vars(mod).values() if isinstance(v, triton.runtime.JITFunction)]
    return lambda n: any(k in n for k in names)


def _native_match(name: str):
    return lambda n: name in n


def _save(src: str | Path, dst: Path, compress_over: int = 1 << 20) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if os.path.getsize(src) > compress_over:
        dst = dst.with_name(dst.name + ".gz")
        with open(src, "rb") as f, gzip.open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    else:
        shutil.copyfile(src, dst)
    return dst


@register("kernel_instrumentation")
class KernelInstrumentation:
    primary_metric = "latency_ms"
    label_axes = ()          # its sizes come from kernels.suite, not from a model card or precision
    # on the GPU kernel times come from CUPTI with the experiment's own sample counts (params);
    # timing.* applies only to the wall-clock timer of a CPU run
    timing_keys = ("cpu_samples",)

    def points(self, ctx: Context) -> list[Point]:
        from kernels.suite import SUITE
        exp = ctx.experiment
        prm = exp.params
        size = "tiny" if ctx.on_cpu else prm.get("size", "llm")
        suite = sorted(SUITE) if prm.get("suite") is None else list(prm["suite"])   # [] = native kernels only
        native = prm.get("native") or []
        for k in suite:
            if k not in SUITE:
                raise ConfigError(f"unknown suite kernel {k!r}; valid: {', '.join(sorted(SUITE))}")
        from native.native_kernels import LOWBIT_KERNELS
        valid_native = ("matmul", "softmax", "layer_norm", *LOWBIT_KERNELS)
        for k in native:
            if k not in valid_native:
                raise ConfigError(f"unknown native kernel {k!r}; valid: {', '.join(valid_native)}")
        from native.native_kernels import MODES as NATIVE_MODES
        native_modes = [str(m) for m in (prm.get("native_modes") or ["staged"])]
        for m in native_modes:
            if m not in NATIVE_MODES:
                raise ConfigError(f"unknown native instrumentation mode {m!r}; valid: {', '.join(NATIVE_MODES)}")
        modes = [_mode_params(dict(m)) for m in (prm.get("modes") or [{}])]
        from native.native_kernels import check_capacity
        records = prm.get("native_buffer_records") or ["auto"]
        records = list(records) if isinstance(records, (list, tuple)) else [records]
        for r in records:   # "auto": each kernel's buffer holds what it writes, no more (native_kernels.fitted_capacity)
            if r == "auto":
                continue
            try:
                check_capacity(r)
            except ValueError as e:
                raise ConfigError(f"experiment.params.native_buffer_records: {e}; or 'auto'") from None
        for key, default in (("spin_cycles", 1_000_000), ("samples_plain", 10), ("samples_instrumented", 3),
                             ("samples_native", 20)):
            int_value(f"experiment.params.{key}", prm.get(key, default), 1)

        def pt(kernel, impl, profiler, params=()):
            params = tuple(sorted((*params, ("size", size))))
            return Point(exp.name, exp.figure, workload=kernel, impl=impl, profiler=profiler, params=params)

        pts = []
        for k in suite:
            pts.append(pt(k, "triton", "none"))
            pts += [pt(k, "triton", "proton", m) for m in modes]
        for k in native:
            pts.append(pt(k, "native", "none"))
            # (lowbit in a mode it is not built for: its row says unsupported, from native_kernels.run)
            pts += [pt(k, "native", "native", (("buffer_records", r), ("mode", m)))
                    for r in records for m in native_modes]
        if native:
            pts += [pt("calibrate", "native", "native",
                       (("mode", m), ("spin_cycles", int(prm.get("spin_cycles", 1_000_000))))) for m in native_modes]
        return pts

    def setup(self, ctx: Context) -> list[Metric]:
        return []

    def _time(self, ctx: Context, fn, match, plain: bool, native: bool = False):
        """CUPTI kernel time on the GPU for both variants (Proton post-processes every instrumented
        launch on the host, so events would time the host); the wall clock on the CPU.  The native kernels take
        samples_native samples, plain and instrumented (our header needs no host work per launch)."""
        if ctx.on_cpu:
            return ctx.timer(fn)
        prm = ctx.experiment.params
        n = int(prm.get("samples_native", 20) if native else
                prm.get("samples_plain", 10) if plain else prm.get("samples_instrumented", 3))
        return device_time(fn, n, match, warm=plain)     # instrumented variants ran once for their check

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        if point.impl == "native":
            return self._native(point, ctx)
        return self._triton(point, ctx)

    # ---- Triton suite under Proton ---------------------------------------------------------------
    def _inputs(self, ctx, key, make):
        cache = ctx.state.setdefault("inputs", {})
        if key not in cache:
            cache.clear()
            cache[key] = make()
        return cache[key]

    def _triton(self, point: Point, ctx: Context) -> list[Metric]:
        from kernels.suite import SUITE
        case = SUITE[point.workload]
        size = point.params_dict["size"]
        dev = "cpu" if ctx.on_cpu else "cuda"
        inputs = self._inputs(ctx, (point.workload, size), lambda: case.make_inputs(size, dev, ctx.seed))
        if point.profiler == "none":
            ok, err = case.check(inputs)
            if not ok:
                raise NumericsFail(f"max abs error {err:.3g} over tolerance {case.tolerance}")
            t = self._time(ctx, lambda: case.run(inputs), _triton_match(point.workload), plain=True)
            return [Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz),
                    Metric("max_abs_err", err, "1")]
        if ctx.on_cpu:
            raise Unavailable("Proton's instrumentation backend needs a CUDA GPU (scopes raise in the interpreter)")
        import triton.profiler as proton
        import triton.profiler.language as pl
        from kernels.suite.proton_modes import make_mode
        mode = {k: v for k, v in point.params if k != "size"}
        pl.enable_semantic("triton")
        case.run(inputs)                         # compile the plain variant outside the session
        tag = point.workload + "".join(f"__{k}-{v}" for k, v in sorted(mode.items()))
        tmp = Path(ctx.artifacts or ".") / "tmp" / tag
        tmp.parent.mkdir(parents=True, exist_ok=True)
        proton.start(str(tmp), backend="instrumentation", mode=make_mode(**mode), data="tree")
        try:
            out = case.run(inputs, instrument=True)
            ok, err = case.check(inputs, out)
            if not ok:
                raise NumericsFail(f"instrumented: max abs error {err:.3g} over tolerance {case.tolerance}")
            t = self._time(ctx, lambda: case.run(inputs, instrument=True), _triton_match(point.workload), plain=False)
        finally:
            proton.finalize()
        ms = [Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz, make_mode(**mode)),
              Metric("max_abs_err", err, "1")]
        files = sorted(tmp.parent.glob(tmp.name + "*"))
        if files:
            tree = json.loads(Path(files[-1]).read_text())
            ms += _scope_metrics(tree, set(case.scopes))
            if not mode and ctx.artifacts:           # default mode: keep its tree (and a trace)
                _save(files[-1], ctx.artifacts / "proton" / f"{point.workload}.hatchet")
                ms.append(Metric("profile_bytes", os.path.getsize(files[-1]), "B"))
                traces = ctx.experiment.params.get("proton_traces")
                if traces is None or point.workload in traces:
                    ms.append(self._proton_trace(case, inputs, mode,
                                                 ctx.artifacts / "proton" / f"{point.workload}.chrome_trace.json"))
        shutil.rmtree(tmp.parent, ignore_errors=True)
        return ms

    def _proton_trace(self, case, inputs, mode, dst: Path) -> Metric:
        import triton.profiler as proton
        from kernels.suite.proton_modes import make_mode
        stem = dst.parent / "tmp_trace" / dst.stem
        stem.parent.mkdir(parents=True, exist_ok=True)
        proton.start(str(stem), backend="instrumentation", mode=make_mode(**mode), data="trace")
        try:
            case.run(inputs, instrument=True)
            torch.cuda.synchronize()
        finally:
            proton.finalize()
        files = sorted(stem.parent.glob(stem.name + "*"))
        if not files:
            raise RuntimeError("Proton wrote no trace file")
        size = os.path.getsize(files[-1])
        _save(files[-1], dst)
        shutil.rmtree(stem.parent, ignore_errors=True)
        return Metric("trace_bytes", size, "B")

    # ---- native CUDA kernels with native/include/instrument.cuh ----------------------------------
    def _native(self, point: Point, ctx: Context) -> list[Metric]:
        if ctx.on_cpu:
            raise Unavailable("native CUDA kernels need a GPU (their sources are compile-checked in the tests)")
        from native import decode as dec
        from native import native_kernels as nk
        name = point.workload
        prm = dict(point.params)
        mode = str(prm.get("mode", "staged"))
        if name == "calibrate":
            return self._calibrate(prm["spin_cycles"], ctx, mode)
        inputs = self._inputs(ctx, (name, prm["size"]), lambda: nk.make_inputs(name, prm["size"], "cuda", ctx.seed))
        ref = nk.reference(name, inputs)

        def check(out):
            if name in nk.LOWBIT_KERNELS:   # relative Frobenius error, as every weight-only matmul is checked
                from harness.timing import check_numerics
                return check_numerics(out, ref, 2e-3)
            from kernels.suite import compare
            tol = nk.suite_case(name).tolerance
            ok, err = compare(out, ref, tol)
            if not ok:
                raise NumericsFail(f"max abs error {err:.3g} over tolerance {tol}")
            return err

        if point.profiler == "none":
            out, _ = nk.run(name, inputs, instrument=False)
            err = check(out)
            t = self._time(ctx, lambda: nk.run(name, inputs, instrument=False), _native_match(name), plain=True,
                           native=True)
            return [Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz),
                    Metric("rel_err" if name in nk.LOWBIT_KERNELS else "max_abs_err", err, "1")]
        records = prm["buffer_records"]
        if records == "auto":   # a first launch counts the records per warp (every header counts past its capacity)
            _, probe = nk.run(name, inputs, instrument=True, buffer_records=16, mode=mode)
            records = nk.fitted_capacity(probe)
        out, raw = nk.run(name, inputs, instrument=True, buffer_records=records, mode=mode)
        err = check(out)
        words, _, _ = nk.buffer_words(name, inputs, records, mode)
        buf = torch.zeros(words, dtype=torch.int32, device="cuda")
        t = self._time(ctx, lambda: nk.run(name, inputs, instrument=True, buffer_records=records, host=False,
                                           buffer=buf, clear=False, mode=mode), _native_match(name), plain=False,
                       native=True)
        prof = dec.decode(raw, nk.SCOPES[name], kernel=nk.KERNEL_NAMES[name])
        ms = [Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz,
                     f"buffer_records={prm['buffer_records']} ({records}) mode={mode}"),
              Metric("buffer_records", records, "records"),
              Metric("rel_err" if name in nk.LOWBIT_KERNELS else "max_abs_err", err, "1"),
              Metric("dropped_records", prof.dropped, "records"),
              Metric("kernel_span_ms", prof.kernel_span_ns() / 1e6, "ms"),
              Metric("profile_bytes", int(raw.nbytes), "B")]
        ms += _scope_metrics(prof.tree(), set(nk.SCOPES[name]))
        if ctx.artifacts:
            d = ctx.artifacts / "native"
            d.mkdir(parents=True, exist_ok=True)
            stem = name if mode == "staged" else f"{name}.{mode}"     # the default mode keeps the plain names
            prof.write_tree(str(d / f"{stem}.hatchet"))
            _save(prof.write_trace(str(d / f"{stem}.tmp.json"), max_blocks=8), d / f"{stem}.chrome_trace.json")
            os.remove(d / f"{stem}.tmp.json")
        return ms

    def _calibrate(self, spin_cycles: int, ctx: Context, mode: str = "staged") -> list[Metric]:
        """Known work inside one scope: the decoded scope length must match it; and the decoded
        kernel span (first block start to last block end) must agree with the event-timed kernel."""
        from native import decode as dec
        from native import native_kernels as nk
        inputs = nk.make_inputs("calibrate", "llm", "cuda")
        inputs["spin_cycles"] = spin_cycles
        out, raw = nk.run("calibrate", inputs, instrument=True, buffer_records=16, mode=mode)
        prof = dec.decode(raw, nk.SCOPES["calibrate"], kernel=nk.KERNEL_NAMES["calibrate"])
        tot = prof.scope_totals().get("spin")
        if not tot:
            raise NumericsFail("calibration scope 'spin' missing from the decoded buffer")
        per_warp = tot["normalized_cycles"] / max(tot["count"] / max(tot["warps"], 1), 1)
        err_scope = abs(per_warp - spin_cycles) / spin_cycles
        words, _, _ = nk.buffer_words("calibrate", inputs, 16)
        buf = torch.empty(words, dtype=torch.int32, device="cuda")
        t = self._time(ctx, lambda: nk.run("calibrate", inputs, instrument=True, buffer_records=16, host=False,
                                           buffer=buf, clear=False, mode=mode), _native_match("calibrate"), plain=False)
        span_ms = prof.kernel_span_ns() / 1e6
        return [Metric("calib_scope_cycles", per_warp, "cycles"),
                Metric("calib_scope_err", err_scope, "1"),
                Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz),
                Metric("kernel_span_ms", span_ms, "ms"),
                Metric("calib_span_vs_events_err", abs(span_ms - t.median_ms) / t.median_ms, "1")]
