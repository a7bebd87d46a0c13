"""Profiler overhead and profile size on whole LLMs (Proton Figs. 13 and 14, and the sweep that
explains them).

One point per (model, workload, batch, seq_len, profiler). The points of one (model, workload,
batch, seq_len) form a group, measured together the first time one of them is asked for: one
fresh process per profiler (harness.engines.measure), each timing the unprofiled region first
(its baseline) and then the same region under its one profiler. The baselines of all the
group's processes are the across-process baseline sample: `overhead` = profiled region / their
median, with p10/p90 from their spread, and `baseline_cv` beside it. The first process chooses
the region length (units of work for about `target_s` seconds) and every other process of the
group times exactly that many units. Profiler settings come from conf/profiler/<name>.yaml.
"""
from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import OmegaConf

from kernels import Unavailable, Unsupported
from ..bench import Context, Metric, Point, register
from ..engines.measure import run_isolated
from ..engines.profilers import nsys_command, unavailable_reason
from ..specs import CONF_DIR, ConfigError, choices
from ..timing import NumericsFail, quantile

WORKLOADS = ("train", "infer")
PHASE = {"train": "step", "infer": "prefill+decode"}
# knobs of each workload and their defaults (the experiment's params.train / params.infer override them)
DEFAULTS = {
    "train": dict(batch=2, seq_len=256, grad_accum=4, warmup=1, lora_r=8, lora_alpha=8, grad_ckpt=True,
                  lr=2e-4, weight_decay=0.01, max_grad_norm=0.3),
    "infer": dict(batch=1, seq_len=256, decode_tokens=32, warmup=1),
}
PARAM_KEYS = ("layers", "dtype", "stack", "workloads", "profilers", "target_s", "warmup_s", "max_units", "residual",
              "launcher", "timeout_s", "keep_profiles", "train", "infer", "shapes", "per_model",
              "baseline_processes", "pin_cpus", "gc_freeze")
STACKS = ("auto", "hf+peft", "hf+peft+liger", "unsloth")
DTYPES = ("bf16", "f16", "f32")


class MeasureFailed(RuntimeError):
    """A measurement process failed with an error that has no status of its own."""


def _load_profiler(name: str) -> dict:
    path = CONF_DIR / "profiler" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown profiler {name!r}; valid: {', '.join(choices('profiler'))}")
    d = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return {"name": name, "kind": d["kind"], "options": d.get("options") or {}}


def _pos_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"llm_profile: {what}={v!r} must be a positive integer")
    return v


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


@register("llm_profile")
class LlmProfile:
    primary_metric = "overhead"
    builds_models = True
    label_axes = ("model",)
    timing_keys = ()          # times regions in its own processes (params: target_s, warmup_s), not with timing.*

    # ---- configuration ------------------------------------------------------------------------
    def settings(self, ctx: Context) -> dict:
        """The experiment's params merged over the defaults (and its `cpu` block over both on the CPU),
        validated; raises ConfigError naming the value and what is allowed. On the CPU the params
        that the `cpu` block replaces are validated too (a bad GPU value fails everywhere)."""
        prm = dict(ctx.experiment.params)
        if not ctx.on_cpu:
            return self._settings(prm, ctx)
        self._settings(prm, ctx)
        for k, v in (ctx.experiment.cpu or {}).items():
            prm[k] = {**prm.get(k, {}), **v} if isinstance(v, dict) and k in ("train", "infer") else v
        return self._settings(prm, ctx)

    def _settings(self, prm: dict, ctx: Context) -> dict:
        bad = sorted(set(prm) - set(PARAM_KEYS))
        if bad:
            raise ConfigError(f"llm_profile: unknown params {bad}; valid: {list(PARAM_KEYS)}")
        if ctx.precision.kind != "dense":
            raise ConfigError(f"llm_profile runs dense models; precision={ctx.precision.name} is a low-bit "
                              f"weight format (use precision=bf16 or f16)")
        s = {"layers": ctx.model.layers if ctx.model.layers is not None else prm.get("layers"), "dtype": prm.get("dtype") or ctx.precision.act_dtype,
             "stack": prm.get("stack", "auto"), "target_s": float(prm.get("target_s", 0.5)),
             "warmup_s": float(prm.get("warmup_s", 0.0)),
             "max_units": _pos_int(prm.get("max_units", 64), "max_units"), "residual": bool(prm.get("residual", False)),
             "launcher": prm.get("launcher", "forkserver"), "timeout_s": float(prm.get("timeout_s", 300)),
             "keep_profiles": list(prm.get("keep_profiles") or []),
             "baseline_processes": prm.get("baseline_processes", 0), "pin_cpus": prm.get("pin_cpus"), "cpus": None,
             "gc_freeze": prm.get("gc_freeze", False)}
        bp = s["baseline_processes"]
        if isinstance(bp, bool) or not isinstance(bp, int) or bp < 0:
            raise ConfigError(f"llm_profile: baseline_processes={bp!r} must be an integer >= 0")
        if not isinstance(s["gc_freeze"], bool):
            raise ConfigError(f"llm_profile: gc_freeze={s['gc_freeze']!r} must be true or false")
        if s["pin_cpus"] is not None:
            have = sorted(os.sched_getaffinity(0))
            n = _pos_int(s["pin_cpus"], "pin_cpus")
            if n > len(have):
                raise ConfigError(f"llm_profile: pin_cpus={n}, but this process may use {len(have)} CPUs")
            s["cpus"] = have[-n:]          # the last n (CPU 0 takes most device interrupts)
        if s["layers"] is not None:
            _pos_int(s["layers"], "layers")
        if s["dtype"] not in DTYPES:
            raise ConfigError(f"llm_profile: dtype={s['dtype']!r}; valid: {', '.join(DTYPES)}")
        if s["stack"] not in STACKS:
            raise ConfigError(f"llm_profile: stack={s['stack']!r}; valid: {', '.join(STACKS)}")
        if s["launcher"] not in ("forkserver", "subprocess"):
            raise ConfigError(f"llm_profile: launcher={s['launcher']!r}; valid: forkserver, subprocess")
        if not s["target_s"] > 0 or not s["timeout_s"] > 0:
            raise ConfigError("llm_profile: target_s and timeout_s must be > 0")
        if not s["warmup_s"] >= 0:
            raise ConfigError(f"llm_profile: warmup_s={s['warmup_s']} must be >= 0")
        wls = list(prm.get("workloads") or WORKLOADS)
        for w in wls:
            if w not in WORKLOADS:
                raise ConfigError(f"llm_profile: workload {w!r}; valid: {', '.join(WORKLOADS)}")
        s["workloads"] = wls
        s["profilers"] = [_load_profiler(p) for p in (prm.get("profilers") or ["none", "proton", "torch"])]
        names = [p["name"] for p in s["profilers"]]
        for k in s["keep_profiles"]:
            if k not in choices("profiler"):
                raise ConfigError(f"llm_profile: keep_profiles entry {k!r}; valid: {', '.join(choices('profiler'))}")
        if len(set(names)) != len(names):
            raise ConfigError(f"llm_profile: profilers {names} list a profiler twice")
        per_model = prm.get("per_model") or {}
        for m, d in per_model.items():
            if m not in choices("model"):
                raise ConfigError(f"llm_profile: per_model key {m!r} is not a model card; valid: {', '.join(choices('model'))}")
            for w in d or {}:
                if w not in WORKLOADS:
                    raise ConfigError(f"llm_profile: per_model.{m}.{w}: valid workloads: {', '.join(WORKLOADS)}")
        own = per_model.get(ctx.model.name) or {}
        for w in WORKLOADS:
            d = {**DEFAULTS[w], **(prm.get(w) or {}), **(own.get(w) or {})}
            unknown = sorted(set(d) - set(DEFAULTS[w]))
            if unknown:
                raise ConfigError(f"llm_profile: unknown {w} knobs {unknown}; valid: {sorted(DEFAULTS[w])}")
            for k in ("batch", "seq_len", "grad_accum", "lora_r", "lora_alpha", "decode_tokens"):
                if k in d:
                    _pos_int(d[k], f"{w}.{k}")
            if not isinstance(d["warmup"], int) or d["warmup"] < 0:
                raise ConfigError(f"llm_profile: {w}.warmup={d['warmup']!r} must be an integer >= 0")
            s[w] = d
        shapes = prm.get("shapes")
        if shapes is not None:
            try:
                shapes = [(int(b), int(t)) for b, t in shapes]
            except (TypeError, ValueError):
                raise ConfigError(f"llm_profile: shapes={shapes!r} must be a list of [batch, seq_len] pairs") from None
            for b, t in shapes:
                _pos_int(b, "shapes batch")
                _pos_int(t, "shapes seq_len")
        s["shapes"] = shapes
        return s

    def _stack(self, s: dict, workload: str, device: str) -> tuple[str, str]:
        """(impl name, why liger is or is not in it) for this machine."""
        if s["stack"] == "unsloth":
            return "unsloth", ""
        base = "hf+peft" if workload == "train" else "hf"
        if s["stack"] == "hf+peft":
            return base, "liger-kernel off (stack=hf+peft)"
        if device != "cuda":
            why = "liger-kernel not used: its Triton kernels need a CUDA GPU"
        elif importlib.util.find_spec("liger_kernel") is None:
            why = "liger-kernel not used: not installed"
        else:
            return base + "+liger", ""
        if s["stack"] == "hf+peft+liger":       # asked for explicitly: the point says it cannot run
            return base + "+liger", why
        return base, why

    def _env(self) -> str:
        if not hasattr(self, "_env_key"):
            nsys = shutil.which("nsys") or "missing"
            pk = ("transformers", "peft", "liger-kernel", "triton", "torch", "unsloth")
            self._env_key = ";".join([f"{p}={_version(p)}" for p in pk] + [f"nsys={nsys}"])
        return self._env_key

    # ---- planning -------------------------------------------------------------------------------
    def points(self, ctx: Context) -> list[Point]:
        s = self.settings(ctx)
        exp, card = ctx.experiment, ctx.model
        n_layers = card.num_layers if s["layers"] is None else min(s["layers"], card.num_layers)
        pts = []
        for w in s["workloads"]:
            knobs = {k: v for k, v in s[w].items() if k not in ("batch", "seq_len")}
            shapes = s["shapes"] or [(s[w]["batch"], s[w]["seq_len"])]
            impl, _ = self._stack(s, w, ctx.device)
            for b, t in shapes:
                for prof in s["profilers"]:
                    params = {**knobs, "target_s": s["target_s"], "warmup_s": s["warmup_s"], "residual": s["residual"],
                              "card": "tiny" if ctx.on_cpu else "full",
                              "profiler_options": json.dumps(prof["options"], sort_keys=True)}
                    for k, off in (("baseline_processes", 0), ("pin_cpus", None), ("gc_freeze", False)):
                        if s[k] != off:                   # in the point only when set (older rows keep their hash)
                            params[k] = s[k]
                    pts.append(Point(exp.name, exp.figure, model=card.name, workload=w, phase=PHASE[w], batch=b,
                                     seq_len=t, model_layers=n_layers, weight_dtype=s["dtype"], act_dtype=s["dtype"],
                                     impl=impl, profiler=prof["name"], params=tuple(sorted(params.items())),
                                     env=self._env()))
        return pts

    def setup(self, ctx: Context) -> list[Metric]:
        return []

    @staticmethod
    def group_key(p: Point) -> tuple:
        return (p.model, p.workload, p.batch, p.seq_len, p.model_layers, p.impl, p.weight_dtype,
                tuple(kv for kv in p.params if kv[0] != "profiler_options"))

    # ---- measuring ------------------------------------------------------------------------------
    def run(self, point: Point, ctx: Context) -> list[Metric]:
        groups = ctx.state.setdefault("llm_profile_groups", {})
        key = self.group_key(point)
        if key not in groups:
            groups[key] = self._run_group(key, ctx)
        out = groups[key][point.profiler]
        if isinstance(out, BaseException):
            raise out
        return out

    def _reason(self, p: Point, prof: dict, s: dict, ctx: Context) -> BaseException | None:
        """Why this point cannot run here, before any process is started."""
        impl, why = self._stack(s, p.workload, ctx.device)
        if impl == "unsloth":
            if importlib.util.find_spec("unsloth") is None:
                return Unavailable("unsloth is not installed (its wheel and its dependencies exceed what can "
                                   "travel to the GPU machine); stack=auto uses transformers + peft + liger-kernel")
            return Unsupported("Unsloth builds models from pretrained checkpoints by name; this harness builds "
                               "random-weight cards (no download), so the Unsloth stack is not run")
        if "+liger" in impl and why:
            return Unavailable(why)
        r = unavailable_reason(prof["kind"], ctx.device)
        return Unavailable(r) if r else None

    def _run_group(self, key: tuple, ctx: Context) -> dict:
        s = self.settings(ctx)
        profs = {p["name"]: p for p in s["profilers"]}
        members = [p for p in self.points(ctx) if self.group_key(p) == key]
        members.sort(key=lambda p: p.profiler != "none")          # the control first: it chooses the region
        # extra unprofiled processes (no rows of their own; their baselines join the sample), one after
        # each profiler's process so that a drift over the group's minutes reaches both alike
        extra = s["baseline_processes"]
        order: list = []
        for p in members:
            order.append(p)
            if p.profiler != "none" and extra > 0:
                order.append(None)
                extra -= 1
        order += [None] * extra
        extra_base: list[dict] = []
        tag = f"{members[0].model}_{members[0].workload}_b{members[0].batch}_s{members[0].seq_len}"
        tmp = Path(ctx.artifacts or ".") / "tmp" / tag
        out: dict = {}
        results: dict[str, tuple[Point, dict]] = {}
        units = None
        shared = None                     # a failure before any profiler ran: it repeats in every process
        for p in order:
            if p is None:
                if units is None or shared is not None:
                    continue
                spec = self._spec(members[0], {"kind": "none", "options": {}}, s, ctx, units, tmp)
                res = run_isolated({**spec, "stem": "extra"}, launcher=s["launcher"], timeout_s=s["timeout_s"])
                if res.get("status") == "ok":
                    extra_base.append(res)
                continue
            prof = profs[p.profiler]
            why = self._reason(p, prof, s, ctx)
            if why is not None:
                out[p.profiler] = why
                continue
            if shared is not None:
                out[p.profiler] = _exception({**shared, "error": f"not run: the unprofiled part failed in the "
                                                                  f"group's first process: {shared['error']}"})
                continue
            spec = self._spec(p, prof, s, ctx, units, tmp)
            prefix = nsys_command(tmp / spec["stem"], prof["options"]) if prof["kind"] == "nsys" else None
            res = run_isolated(spec, launcher=s["launcher"], timeout_s=s["timeout_s"], prefix=prefix)
            if res.get("status") == "ok":
                units = units or res["units"]
                if prof["kind"] == "nsys":
                    rep = tmp / (spec["stem"] + ".nsys-rep")
                    res["files"] = {str(rep): rep.stat().st_size} if rep.exists() else {}
                    res["profile_bytes"] = sum(res["files"].values()) or None
                    res["finalize_s"] = res["exit_wall"] - res["region_end_wall"]
                results[p.profiler] = (p, res)
            else:
                if res.get("phase") in ("build", "check", "warmup", "baseline"):
                    shared = res
                out[p.profiler] = _exception(res)
        runs = [r for _, r in results.values()] + extra_base
        base = [r["baseline_s"] for r in runs]
        norm = [r["baseline_s"] / _probe(r["baseline"]) for r in runs if _probe(r.get("baseline"))]
        for name, (p, res) in results.items():
            out[name] = self._metrics(p, res, base, s, ctx) + _norm_metrics(res, runs, norm)
            self._keep(name, res, s, ctx, tag)
        shutil.rmtree(tmp, ignore_errors=True)
        if tmp.parent.is_dir() and not any(tmp.parent.iterdir()):
            tmp.parent.rmdir()
        return out

    def _spec(self, p: Point, prof: dict, s: dict, ctx: Context, units, tmp: Path) -> dict:
        card = asdict(ctx.model)
        card["papers"] = list(card.get("papers") or ())
        knobs = {k: v for k, v in s[p.workload].items() if k not in ("batch", "seq_len")}
        return dict(card=card, tiny=ctx.on_cpu, layers=p.model_layers, dtype=p.weight_dtype, device=ctx.device,
                    workload=p.workload, batch=p.batch, seq_len=p.seq_len, knobs=knobs, liger="+liger" in p.impl,
                    profiler={"kind": prof["kind"], "options": prof["options"]}, units=units,
                    target_s=s["target_s"], warmup_s=s["warmup_s"], max_units=s["max_units"], residual=s["residual"],
                    cpus=s["cpus"], gc_freeze=s["gc_freeze"],
                    out_dir=str(tmp), stem=p.profiler, seed=ctx.seed)

    def _metrics(self, p: Point, r: dict, base: list[float], s: dict, ctx: Context) -> list[Metric]:
        k = len(base)
        med = statistics.median(base)
        p10, p90 = quantile(base, 0.1), quantile(base, 0.9)
        cv = statistics.stdev(base) / statistics.mean(base) if k >= 2 else float("nan")
        clock = r.get("sm_clock_mhz")
        _, why = self._stack(s, p.workload, ctx.device)
        cfg = "; ".join(filter(None, [
            f"stack={r.get('stack')}" + (f" ({why})" if why else ""),
            f"liger={','.join(r['liger_ops'])}" if r.get("liger_ops") else "",
            f"lora={','.join(r['info']['lora_targets'])}" if r.get("info", {}).get("lora_targets") else "",
            f"experts={r['experts_impl']}" if r.get("experts_impl") not in (None, "eager") else "",
            f"activities={','.join(r['activities'])}" if r.get("activities") else "",
            f"launcher={s['launcher']}", f"units={r['units']}"]))
        reg = r["region_s"]
        ms = [Metric("overhead", reg / med, "x", reg / p90, reg / p10, k, clock, cfg),
              Metric("region_s", reg, "s", n_samples=1, sm_clock_mhz=clock, impl_config=cfg),
              Metric("baseline_region_s", med, "s", p10, p90, k, clock, cfg),
              Metric("baseline_cv", cv, "1", n_samples=k, impl_config=cfg),
              Metric("overhead_paired", reg / r["baseline_s"], "x", n_samples=1, impl_config=cfg),
              Metric("own_baseline_s", r["baseline_s"], "s", n_samples=1),
              Metric("region_units", r["units"], "units"),
              Metric("unit_s", med / r["units"], "s", p10 / r["units"], p90 / r["units"], k),
              Metric("ready_s", r["ready_s"], "s"),
              Metric("process_s", r["process_s"], "s")]
        ms += _host_metrics("baseline", r.get("baseline")) + _host_metrics("region", r.get("region"))
        if p.profiler != "none":
            ms.append(Metric("start_s", r["start_s"], "s", impl_config=cfg))
            ms.append(Metric("finalize_s", r["finalize_s"], "s", impl_config=cfg))
            if r.get("profile_bytes") is not None:
                ms.append(Metric("profile_bytes", r["profile_bytes"], "B", impl_config=cfg))
        if r.get("kernel_launches"):
            ms += [Metric("kernel_launches", r["kernel_launches"], "launches"),
                   Metric("launches_per_s", r["kernel_launches"] / med, "1/s", impl_config="launches / baseline_region_s")]
        if r.get("residual_s") is not None:
            ms += [Metric("residual_s", r["residual_s"], "s"),
                   Metric("residual_slowdown", r["residual_s"] / r["baseline_s"], "x")]
        for key, unit in (("peak_mem_gb", "GiB"), ("model_params", "params")):
            if r.get(key) is not None:
                ms.append(Metric(key, r[key], unit))
        if r.get("info", {}).get("trainable_params"):
            ms.append(Metric("trainable_params", r["info"]["trainable_params"], "params"))
        for key, v in (r.get("check") or {}).items():
            ms.append(Metric(f"check/{key}", float(v), "1"))
        return ms

    def _keep(self, name: str, r: dict, s: dict, ctx: Context, tag: str) -> None:
        """Keep the profiles of `keep_profiles` under artifacts/profiles/ (gzipped over 1 MB); the rest
        (PyTorch traces of hundreds of MB) were only measured."""
        if name not in s["keep_profiles"] or not ctx.artifacts:
            return
        dst_dir = ctx.artifacts / "profiles"
        dst_dir.mkdir(parents=True, exist_ok=True)
        for src in r.get("files", {}):
            src = Path(src)
            if not src.exists():
                continue
            dst = dst_dir / f"{tag}_{name}{src.suffix}"
            if src.stat().st_size > (1 << 20):
                with open(src, "rb") as f, gzip.open(dst.with_name(dst.name + ".gz"), "wb") as g:
                    shutil.copyfileobj(f, g)
            else:
                shutil.copyfile(src, dst)


def _probe(reg: dict | None) -> float | None:
    """The host's speed over a region: median seconds of its host probes (harness.engines.measure.host_probe)."""
    return statistics.median(reg["probe_s"]) if reg and reg.get("probe_s") else None


def _norm_metrics(r: dict, runs: list[dict], norm: list[float]) -> list[Metric]:
    """Overhead with the host's speed taken out. Launch-bound regions run at the speed of the host's
    CPU, which drifts on this kind of machine (a VM's vCPU) by tens of percent over seconds and
    between processes; every region is therefore divided by the median of the host probes timed
    between its units, and the baselines of all the group's processes likewise. `host_speed_ratio`
    is the probe's own change from the baseline to the profiled region in this process (a profiler
    that slowed the probe itself would show here); `probe_baseline_r` is the correlation across
    processes of baseline time and probe time (near 1: the drift is the host's speed)."""
    pb, pr = _probe(r.get("baseline")), _probe(r.get("region"))
    if not pb or not pr or not norm:
        return []
    k = len(norm)
    med = statistics.median(norm)
    reg = r["region_s"] / pr
    ms = [Metric("overhead_hostnorm", reg / med, "x", reg / quantile(norm, 0.9), reg / quantile(norm, 0.1), k,
                 impl_config="region / host probe, over the median of the group's baselines / their probes"),
          Metric("baseline_norm_cv", statistics.stdev(norm) / statistics.mean(norm) if k >= 2 else float("nan"), "1",
                 n_samples=k, impl_config="across processes, baselines divided by their host probes"),
          Metric("host_speed_ratio", pr / pb, "x", impl_config="probe in the profiled region / probe in the baseline"),
          Metric("baseline_probe_ms", pb * 1e3, "ms"), Metric("region_probe_ms", pr * 1e3, "ms")]
    pairs = [(x["baseline_s"], _probe(x["baseline"])) for x in runs if _probe(x.get("baseline"))]
    if len(pairs) >= 3:
        a, b = zip(*pairs)
        try:
            ms.append(Metric("probe_baseline_r", statistics.correlation(a, b), "1", n_samples=len(pairs),
                             impl_config="across processes: baseline time vs host probe"))
        except statistics.StatisticsError:
            pass
    return ms


def _host_metrics(name: str, reg: dict | None) -> list[Metric]:
    """What the host did during one timed region of this process (harness.engines.measure.time_region):
    the spread of its units' times, the process's CPU time per wall second, page faults, involuntary
    context switches, time in the garbage collector and its full collections, and the hypervisor's
    steal time (all CPUs) per second."""
    if not reg:
        return []
    wall, units = reg["s"], reg["unit_s"]
    ms = []
    if len(units) >= 2:
        ms.append(Metric(f"{name}_unit_cv", statistics.stdev(units) / statistics.mean(units), "1", n_samples=len(units),
                         impl_config="within one process: spread of the region's units"))
    for key, metric, unit in (("cpu_s", "cpu_frac", "1"), ("sys_s", "sys_frac", "1"), ("minflt", "minflt_per_s", "1/s"),
                              ("nivcsw", "nivcsw_per_s", "1/s"), ("steal_s", "steal_frac", "1"),
                              ("gc_s", "gc_frac", "1")):
        if reg.get(key) is not None and wall > 0:
            ms.append(Metric(f"{name}_{metric}", reg[key] / wall, unit))
    if reg.get("gc_full") is not None:
        ms.append(Metric(f"{name}_gc_full", reg["gc_full"], "collections"))
    return ms


def _exception(res: dict) -> BaseException:
    msg = f"{res.get('error', 'failed')} (phase: {res.get('phase', '?')})"
    st = res.get("status")
    if st == "oom":
        return torch.cuda.OutOfMemoryError(msg)
    if st == "numerics_fail":
        return NumericsFail(msg)
    if st == "unavailable":
        return Unavailable(msg)
    if st == "unsupported":
        return Unsupported(msg)
    if st == "timeout":
        return TimeoutError(msg)
    return MeasureFailed(msg)

