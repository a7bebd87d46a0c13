"""Whole-model forward steps with low-bit weights (Tilus Figs. 12 and 13), our engine and vLLM.

One point per (model, weight dtype, impl, phase, batch, seq_len), as the Tilus artifact measured
them (artifacts/bench_model.py, figure11.py): decode = one new token for each of `batch`
sequences holding seq_len // batch context tokens each (2048 in total); prefill = one sequence of
seq_len prompt tokens; the time of one forward step, median after warm-up. Decoder layers: every one of
the card's, or a cap: `model.layers=N` on the command line, else experiment.params.layers (on a CPU:
experiment.cpu.layers); the rows' model_layers says what ran.

Our engine (harness/engines/quantized.py + decode.py): the HF model of the card with its decoder
linears on a registry kernel (`cublas` for the dense f16 baseline, `triton`, `tilus`, `native`, ...), decode
steps replayed as a CUDA graph (impls whose launches a graph cannot hold, Tilus', run eagerly:
params mode=eager), prefill eager (as vLLM runs it). Before timing, at the batch size timed: the
linears against their float64 reference on the model's own activations (the kernel's tolerance) --
at a build's first point every linear, and the logits against the same model with float64
dequantized linears (`logits_tol`); at its other points the first linear of each distinct shape
(the kernel and config that point times) -- and a graph replay against the eager step.

Rows (metric: meaning):
  latency_ms      one step, median (p10, p90) of `repeats`, CUDA events (no L2 flush needed:
                  the weights are far larger than L2), after warm-up
  predicted_ms    sum over the decoder linears of their kernel-level times at this M + nongemm_ms;
                  the kernel times come from the committed kernel-level rows (experiments named in
                  `kernel_rows`) when they hold every linear shape of the model at this M, dtype and
                  impl, else from `gemm_ms` (impl_config names the source)
  gemm_ms         the same sum, each distinct linear timed here alone with the kernel-level recipe
                  (harness.timing.Timer: L2 flush, host-ahead), times its count per step
  nongemm_ms      the same step with every decoder linear returning a preallocated output (no
                  GEMM): embeddings, norms, rotary, attention, KV-cache writes, lm_head, sampling-free
  floor_ms        floor_bytes / measured HBM read bandwidth (decode); prefill: the larger of that
                  and 2 x linear parameters x tokens / the GPU's f16 TFLOP/s
  weight_bytes    weight bytes one step reads: quantized linears (codes + scales + zeros, biases) +
                  lm_head (the embedding when tied; an untied embedding is only gathered) + norms
  linear_rel_err  the worst linear's relative error against float64 (impl_config: which linears)
  logits_rel_err  the logits' against the float64-linears model (a build's first point only)
  floor_bytes     weight_bytes + the KV-cache bytes the step reads (decode: every layer's context,
                  a sliding-window layer's window at most) or writes (prefill)
  kv_cache_bytes  the static cache allocated for the step
A model whose weights exceed 0.8 x GPU memory (parameters x bits / 8, the artifact's rule; the memory in
bytes, as torch's total_memory gives it to the artifact: the card's "GB" are GiB) is an `oom` row, decided
at plan time, never built.
"""
from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from kernels import Unavailable, Unsupported
from .. import impls
from ..bench import Context, Metric, Point, register
from ..impls import TORCH_DTYPES
from ..specs import ConfigError, KernelSpec, Precision, int_value
from ..timing import NumericsFail, Timer, measure_read_bandwidth, rel_error

DEFAULT_TOL = {"f16": 2e-3, "bf16": 1e-2}      # per linear, as the kernel-level rows (benchmarks/matmul.py)
# Tilus launches are not recorded by a CUDA graph (kernel work). native's decode path is one launch of a
# torch extension on the current stream (at::cuda::getCurrentCUDAStream, which a capture redirects), into
# torch-allocated outputs, with a shared workspace grown during the warm-up calls and re-zeroed by the
# kernel itself: it is captured like cublas and triton (the replay-vs-eager check in _time_step guards it)
NOT_CAPTURABLE = {"tilus"}
PHASES = ("decode", "prefill")
SKIP_KEYS = ("impl", "weight_dtype", "phase", "batch", "model")   # what a params.skip rule may match
DEFAULTS = dict(steps=[{"phase": "decode", "batch": 1, "seq_len": 2048},
                       {"phase": "decode", "batch": 16, "seq_len": 2048},
                       {"phase": "prefill", "batch": 1, "seq_len": 2048}],
                layers=None, cuda_graphs=True, decode_repeats=30, decode_graph_repeats=10, prefill_repeats=10, check_tokens=16,
                logits_tol=0.1, tune_per_path=0, kernel_rows=[], skip=[], vllm=True, vllm_decode_steps=16,
                vllm_repeats=5)


def dense(act: str) -> Precision:
    return Precision(name=act, kind="dense", bits=16, exp_bits=0, man_bits=0, act_dtype=act, group_size=-1)


class Job:
    """What every point of one Hydra job shares: the knobs, and the card / precision actually built
    (on the CPU: the card shrunk by tiny_card, its layer cap and group size from `experiment.cpu`)."""

    def __init__(self, ctx: Context):
        p = {**DEFAULTS, **ctx.experiment.params}
        unknown = sorted(set(ctx.experiment.params) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"experiment {ctx.experiment.name}: unknown params {unknown}; valid: {sorted(DEFAULTS)}")
        for k, lo in (("decode_repeats", 1), ("decode_graph_repeats", 1), ("prefill_repeats", 1), ("check_tokens", 1),
                      ("vllm_repeats", 1),
                      ("vllm_decode_steps", 1), ("tune_per_path", 0)):
            int_value(f"experiment.params.{k}", p[k], lo)
        for k in ("cuda_graphs", "vllm"):
            if not isinstance(p[k], bool):
                raise ConfigError(f"experiment.params.{k}={p[k]!r} is not a boolean; use true or false")
        if isinstance(p["logits_tol"], bool) or not isinstance(p["logits_tol"], (int, float)) or not p["logits_tol"] > 0:
            raise ConfigError(f"experiment.params.logits_tol={p['logits_tol']!r} must be a number > 0")
        self.p = p
        cpu = dict(ctx.experiment.cpu or {})
        card, prec, steps, layers = ctx.model, ctx.precision, p["steps"], p["layers"]
        for v, where in ((layers, "experiment.params.layers"), (cpu.get("layers", 1), "experiment.cpu.layers")):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"{where}={v!r}: a layer cap must be an integer >= 1 (null = the whole model)")
        self.cpu_reason = None
        self.cpu_repeats = None
        if ctx.on_cpu:
            if cpu.get("precisions") and prec.name not in cpu["precisions"] and prec.kind != "dense":
                self.cpu_reason = (f"the CPU pipeline check runs {list(cpu['precisions'])} only "
                                   "(experiment.cpu.precisions); this precision runs on a GPU")
            self.cpu_repeats = int(cpu.get("repeats", 1))
            from ..engines.model import tiny_card
            card = tiny_card(card, **dict(cpu.get("tiny") or {}))
            steps = cpu.get("steps", steps)
            layers = cpu.get("layers", 2)
            if prec.kind != "dense" and cpu.get("group_size"):
                prec = prec.with_group(int(cpu["group_size"]))
        for s in list(p["steps"]) + list(cpu.get("steps") or []):     # both, wherever this runs
            if s.get("phase") not in PHASES or int(s.get("batch", 0)) < 1 or int(s.get("seq_len", 0)) < 1:
                raise ConfigError(f"experiment {ctx.experiment.name}: step {dict(s)}; each step needs phase in "
                                  f"{PHASES}, batch >= 1 and seq_len >= 1")
            if s["phase"] == "decode" and int(s["seq_len"]) < int(s["batch"]):
                raise ConfigError(f"experiment {ctx.experiment.name}: decode step {dict(s)}: seq_len is the total "
                                  "context over the batch and must be >= batch")
        for rule in p["skip"]:
            bad = sorted(set(rule) - set(SKIP_KEYS))
            if bad or not rule:
                raise ConfigError(f"experiment.params.skip: rule {dict(rule)}; keys must be among {SKIP_KEYS}")
        if ctx.model.layers is not None:     # `model.layers=N` (checked by ModelCard) wins over both caps above
            layers = ctx.model.layers
        self.card, self.prec, self.steps = card, prec, [dict(s) for s in steps]
        self.layers = card.num_layers if layers is None else min(int(layers), card.num_layers)
        self.real_card = ctx.model


def _tied(card) -> bool:
    from ..hf import hf_config
    return bool(getattr(hf_config(card), "tie_word_embeddings", False))


@register("llm_e2e")
class LlmE2E:
    primary_metric = "latency_ms"
    builds_models = True
    label_axes = ("model", "precision")

    # ------------------------------------------------------------------ planning (no GPU)
    def points(self, ctx: Context) -> list[Point]:
        job = Job(ctx)
        exp, p = ctx.experiment, job.p
        for layer_K in {job.real_card.hidden_size, job.real_card.num_heads * job.real_card.head_dim,
                        job.real_card.intermediate_size}:
            ctx.precision.check_k(layer_K)            # the real card's K, before any CPU shrinking
        from ..engines.quantized import weights_oom
        mem = ctx.gpu.memory_bytes
        tied = _tied(job.card) if mem else False
        names = list(ctx.kernels) + (["vllm"] if p["vllm"] else [])
        from ..shapes import linear_layers
        shapes = [(l.K, l.N) for l in linear_layers(job.card)]
        pts = []
        for kname in names:
            reason = None
            if kname == "vllm":
                from ..engines.vllm_adapter import quantization_config
                prec, impl = job.prec, None
                try:
                    quantization_config(prec)
                except Unsupported as e:
                    reason = str(e)
            else:
                impl = KernelSpec.load(kname).impl
                try:
                    prec = dense(job.prec.act_dtype) if impls.is_dense(impl) else job.prec
                except Unavailable as e:
                    raise ConfigError(f"kernel {kname}: {e}") from e
            if job.card.num_experts and not reason and kname != "vllm":
                reason = (f"{job.card.name} is MoE: transformers stores its experts as 3-D fused parameters, "
                          "not nn.Linear layers; the quantized swap covers dense decoders only")
            if mem and not reason:
                reason = weights_oom(job.card, prec.bits, mem, job.layers, tied)
            if job.cpu_reason and prec.kind != "dense" and not reason:
                reason = job.cpu_reason
            for s in job.steps:
                phase, B, T = s["phase"], int(s["batch"]), int(s["seq_len"])
                M = B if phase == "decode" else B * T
                fields = {"impl": kname, "weight_dtype": prec.weight_dtype, "phase": phase, "batch": B,
                          "model": job.real_card.name}
                if any(all(str(fields[k]) == str(v) for k, v in rule.items()) for rule in p["skip"]):
                    continue
                why = reason
                if not why and impl is not None:
                    why = next((r for K, N in shapes if (r := impls.reason(impl, prec, M, K, N))), None)
                mode = "eager"
                if phase == "decode" and p["cuda_graphs"] and not ctx.on_cpu and kname not in NOT_CAPTURABLE:
                    mode = "cuda_graph"
                reps = (p["prefill_repeats"] if phase == "prefill" else
                        p["decode_graph_repeats"] if mode == "cuda_graph" else p["decode_repeats"])
                reps = job.cpu_repeats or reps
                params = {"mode": mode, "repeats": int(reps)}
                if kname == "vllm":
                    params = {"mode": "cuda_graph" if not ctx.on_cpu else "eager",
                              "repeats": int(job.cpu_repeats or p["vllm_repeats"]),
                              "decode_steps": int(p["vllm_decode_steps"])}
                pts.append(Point(exp.name, exp.figure, model=job.card.name, M=M, weight_dtype=prec.weight_dtype,
                                 act_dtype=prec.act_dtype, group_size=prec.group_size, impl=kname,
                                 params=tuple(sorted(params.items())), workload="infer", phase=phase, batch=B,
                                 seq_len=T, model_layers=job.layers, skip_reason=why))
        if not pts:
            raise ConfigError(f"experiment {exp.name}: the sweep is empty (kernels={list(ctx.kernels)}, "
                              f"steps={job.steps}, skip={p['skip']})")
        order = {k: i for i, k in enumerate(names)}
        # one model build per (impl, dtype): its decode steps (small M first), then its prefill
        return sorted(set(pts), key=lambda q: (order[q.impl], q.weight_dtype, PHASES.index(q.phase), q.M))

    def env_key(self, point: Point) -> str:
        """Presence and versions of the packages the point needs (an `unavailable` point is final
        until they change)."""
        if point.impl == "vllm":
            from ..engines.vllm_adapter import vllm_version
            return f"vllm={vllm_version() or 'missing'}"
        return impls.env_key(KernelSpec.load(point.impl).impl)

    # ------------------------------------------------------------------ per job
    def _ensure(self, ctx: Context) -> "Job":
        if "job" not in ctx.state:
            job = ctx.state["job"] = Job(ctx)
            # one step is far larger than L2 (the weights), so no flush; events time what a caller waits for
            ctx.state["e2e_timer"] = Timer(ctx.device, warmup_ms=ctx.timer.warmup_ms if ctx.timer else 25,
                                           samples=10, flush_l2=False,
                                           cpu_samples=ctx.timer.samples if ctx.timer else 3, host_ahead=False)
            ctx.state["kernel_rows"] = self._kernel_rows(ctx, job.p["kernel_rows"])
        return ctx.state["job"]

    def setup(self, ctx: Context) -> list[Metric]:
        self._ensure(ctx)
        if ctx.on_cpu:
            return []
        gc.collect()                      # the previous job's model (jobs of a multirun share the process)
        torch.cuda.empty_cache()
        bw = measure_read_bandwidth(ctx.timer)
        ctx.state["bw_tbs"] = bw
        return [Metric("hbm_read_bw", bw, "TB/s")]

    def _kernel_rows(self, ctx: Context, experiments) -> dict:
        """(impl, weight_dtype, act, group, K, N, M) -> median latency_ms of committed kernel-level rows."""
        if ctx.on_cpu or not experiments:
            return {}
        from ..provenance import ROOT
        from ..store import load_experiment_lenient
        roots = []
        if ctx.artifacts is not None:
            roots.append(Path(ctx.artifacts).parents[1])
        roots.append(ROOT / "results" / ctx.gpu.name)
        out: dict = {}
        for e in experiments:
            for root in roots:
                d = root / e
                if not (d / "results.csv").exists():
                    continue
                df = load_experiment_lenient(d, warn=lambda m: None)
                df = df[(df["metric"] == "latency_ms") & (df["status"] == "ok")]
                for key, v in df.groupby(["impl", "weight_dtype", "act_dtype", "group_size", "K", "N", "M"])["value"]:
                    out.setdefault(tuple(str(x) if i < 3 else int(x) for i, x in enumerate(key)), (float(v.median()), e))
                break
        return out

    # ------------------------------------------------------------------ one point
    def run(self, point: Point, ctx: Context) -> list[Metric]:
        if point.skip_reason:
            if point.skip_reason.startswith("oom:"):
                raise torch.cuda.OutOfMemoryError(point.skip_reason)
            raise Unsupported(point.skip_reason)
        job = self._ensure(ctx)
        prec = dense(point.act_dtype) if point.weight_dtype in TORCH_DTYPES else job.prec
        if point.impl == "vllm":
            return self._run_vllm(point, ctx, job, prec)
        qm = self._model(point, ctx, job, prec)
        dev = "cuda" if not ctx.on_cpu else "cpu"
        tune = int(job.p["tune_per_path"])
        t0 = time.perf_counter()
        qm.prepare(point.M, seconds=ctx.timer.seconds if tune and not ctx.on_cpu else None, tune_per_path=tune)
        lin_err, logit_err = self._check(qm, point, ctx, job, prec, dev)
        prepare_s = time.perf_counter() - t0
        mode = point.params_dict["mode"]
        timer: Timer = ctx.state["e2e_timer"]
        timer.samples = int(point.params_dict["repeats"])
        t, kv_bytes, kv_step = self._time_step(qm, point, ctx, mode, timer, dev)
        with qm.mode("skip"):
            t_skip, _, _ = self._time_step(qm, point, ctx, mode, timer, dev)
        gemm_ms, rows_ms, source = self._gemm_times(qm, point, ctx)
        cfgs = qm.configs()
        ms = [
            Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz, f"mode={mode}; {cfgs}"),
            Metric("nongemm_ms", t_skip.median_ms, "ms", t_skip.p10_ms, t_skip.p90_ms, t_skip.n,
                   impl_config=f"mode={mode}; decoder linears return preallocated outputs"),
            Metric("gemm_ms", gemm_ms, "ms", impl_config="sum of per-linear kernel times measured in this job"),
            Metric("predicted_ms", (rows_ms if rows_ms is not None else gemm_ms) + t_skip.median_ms, "ms",
                   impl_config=source),
            Metric("weight_bytes", float(qm.weight_bytes), "B"),
            Metric("kv_cache_bytes", float(kv_bytes), "B"),
            Metric("floor_bytes", float(qm.weight_bytes + kv_step), "B",
                   impl_config="weight_bytes + the KV-cache bytes the step reads (decode) or writes (prefill)"),
            Metric("linear_rel_err", lin_err, "1",
                   impl_config="every linear" if logit_err is not None else "the first linear of each distinct shape"),
            Metric("build_s", qm.build_s, "s"),
            Metric("prepare_s", prepare_s, "s", impl_config="prepare + numerics check at this M"),
        ]
        if logit_err is not None:           # the build's first point (see _check)
            ms.append(Metric("logits_rel_err", logit_err, "1"))
        bw = ctx.state.get("bw_tbs")
        if bw:
            floor = (qm.weight_bytes + kv_step) / (bw * 1e12) * 1e3
            note = "(weight bytes + KV-cache bytes of the step) / measured HBM bandwidth"
            if point.phase == "prefill" and ctx.gpu.tflops:
                flops = 2 * sum(lin.K * lin.N for lin in qm.linears) * point.M
                if flops / (ctx.gpu.tflops * 1e12) * 1e3 > floor:
                    floor, note = flops / (ctx.gpu.tflops * 1e12) * 1e3, "linear FLOPs / f16 TFLOP/s"
            ms.append(Metric("floor_ms", floor, "ms", impl_config=note))
        return ms

    def _model(self, point: Point, ctx: Context, job: Job, prec: Precision):
        """The built model for this (impl, precision), reused by the points that follow; a build that
        failed is remembered and re-raised for its other points."""
        from ..engines.decode import prepare_inference
        from ..engines.quantized import build_quantized
        key = (KernelSpec.load(point.impl).impl, prec.name, prec.group_size, prec.act_dtype, job.layers)
        failed = ctx.state.setdefault("failed_builds", {})
        if key in failed:
            raise failed[key]
        cur = ctx.state.get("model")
        if cur is not None and cur[0] == key:
            return cur[1]
        ctx.state.pop("model", None)
        del cur
        gc.collect()
        if not ctx.on_cpu:
            torch.cuda.empty_cache()
        dev = "cuda" if not ctx.on_cpu else "cpu"
        keep = True
        if not ctx.on_cpu:    # keep the canonical weights beside the prepared copy only where both fit easily
            from ..engines.quantized import param_count
            lin_bytes = (param_count(job.card, job.layers, tied=True) - job.card.vocab_size * job.card.hidden_size) \
                * prec.bits / 8
            keep = 2 * lin_bytes < 0.5 * torch.cuda.get_device_properties(0).total_memory
        try:
            qm = build_quantized(job.card, prec, key[0], job.layers, device=dev, seed=ctx.seed, keep_weights=keep)
        except (Unsupported, Unavailable, torch.cuda.OutOfMemoryError, ConfigError, NotImplementedError) as e:
            failed[key] = type(e)(str(e))        # without its traceback, which holds the half-built model
            raise
        prepare_inference(qm.model)
        ctx.state["model"] = (key, qm)
        return qm

    def _check(self, qm, point: Point, ctx: Context, job: Job, prec: Precision, dev: str) -> tuple[float, float | None]:
        """At a model build's first point: every linear against float64 at this M and the logits against the
        float64-linears model. At the build's other points: each distinct linear shape (its first linear, on
        the model's own activations of fresh token ids) against float64 at this point's M -- the kernel and
        config that point times; the other linears of a shape run the same kernel on other weights, and the
        float64 reference of all of them (320 linears in Llama-3.3-70B, regenerated where two copies of the
        weights do not fit) made up most of each point's prepare_s. Returns (worst linear error, logits
        error or None where the logits were not checked)."""
        from ..engines.quantized import step_inputs
        B, T = (point.batch, 1) if point.phase == "decode" else (1, min(int(job.p["check_tokens"]), point.seq_len))
        path = getattr(qm.linears[0].prepared.fn, "decode_ok", None)   # native: its path depends on the rows
        while path is not None and T < point.M and path(B * T) != path(point.M):
            T = min(2 * T, point.seq_len)       # check the path the timed step takes (native: dequantize+cuBLAS)
        ids = step_inputs(job.card.vocab_size, B, T, dev, seed=ctx.seed + point.M + 17)
        full = not qm.logits_checked
        for lin in qm.linears:
            lin.check_errors.clear()
        with torch.inference_mode():
            if full:
                with qm.mode("check"):
                    ref = qm.model(input_ids=ids, logits_to_keep=1).logits
                out = qm.model(input_ids=ids, logits_to_keep=1).logits
            else:
                with qm.mode("check", only=qm.first_of_each_shape()):
                    qm.model(input_ids=ids, logits_to_keep=1)
        worst = max(((max(lin.check_errors), lin) for lin in qm.linears if lin.check_errors), key=lambda e: e[0])
        tol = qm.linears[0].prepared.tolerance or DEFAULT_TOL[prec.act_dtype]
        if not worst[0] <= tol:
            raise NumericsFail(f"linear {worst[1].name} of layer {worst[1].layer} (K={worst[1].K}, N={worst[1].N}): "
                               f"relative error {worst[0]:.3g} > tolerance {tol:.3g} at M={B * T}")
        if not full:
            return worst[0], None
        logit_err = rel_error(out, ref)
        ltol = float(job.p["logits_tol"])
        if not logit_err <= ltol:
            raise NumericsFail(f"logits relative error {logit_err:.3g} > {ltol:.3g} against the model with float64 "
                               "dequantized linears")
        qm.logits_checked = True
        return worst[0], logit_err

    def _time_step(self, qm, point: Point, ctx: Context, mode: str, timer: Timer, dev: str):
        from ..engines.decode import Step, StaticKV
        from ..engines.quantized import step_inputs
        dtype = TORCH_DTYPES[point.act_dtype]
        B = point.batch
        if point.phase == "decode":
            ctxlen = point.seq_len // B
            cache = StaticKV(qm.config, qm.layers, B, ctxlen + 1, dtype, dev)
            cache.fill_random(ctxlen, seed=ctx.seed)
            step = Step(qm.model, cache, B, 1, ctxlen)
            step.set_ids(step_inputs(qm.card.vocab_size, B, 1, dev, seed=ctx.seed + 1))
        else:
            cache = StaticKV(qm.config, qm.layers, B, point.seq_len, dtype, dev)
            step = Step(qm.model, cache, B, point.seq_len, 0)
            step.set_ids(step_inputs(qm.card.vocab_size, B, point.seq_len, dev, seed=ctx.seed + 2))
        try:
            if mode == "cuda_graph":
                replay = step.capture()
                if qm.linears[0].mode == "kernel":      # the replay computes what the eager step computes
                    step.set_ids(step_inputs(qm.card.vocab_size, B, 1, dev, seed=ctx.seed + 3))
                    replay()
                    g = step.logits.float().clone()
                    e = step.eager().float()
                    err = rel_error(g, e)
                    if not err <= 1e-2:
                        raise RuntimeError(f"CUDA graph replay differs from the eager step (relative error {err:.3g}): "
                                           "some launches were not captured")
                t = timer(replay)
            else:
                t = timer(step.eager)
            return t, cache.nbytes, cache.step_bytes(qm.config, step.start + step.tokens)
        finally:
            step.graph = None
            del step, cache
            if dev == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    def _gemm_times(self, qm, point: Point, ctx: Context):
        """(in-job sum, sum from committed kernel rows or None, source) of the linears' kernel times."""
        from ..engines.quantized import time_linear
        counts = {(n, K, N): c for n, K, N, c in qm.shapes()}
        total, rows, srcs = 0.0, 0.0, set()
        table = ctx.state.get("kernel_rows", {})
        for lin in qm.first_of_each_shape():
            c = counts[(lin.name, lin.K, lin.N)]
            total += c * time_linear(lin, point.M, ctx.timer if not ctx.on_cpu else ctx.state["e2e_timer"])
            hit = table.get((point.impl, point.weight_dtype, point.act_dtype, point.group_size, lin.K, lin.N, point.M))
            if hit is None:
                rows = None
            elif rows is not None:
                rows += c * hit[0]
                srcs.add(hit[1])
        if rows is not None:
            return total, rows, f"kernel-level rows of {', '.join(sorted(srcs))} + nongemm_ms"
        return total, None, "gemm_ms (kernel times measured in this job; committed rows lack a shape) + nongemm_ms"

    def _run_vllm(self, point: Point, ctx: Context, job: Job, prec: Precision) -> list[Metric]:
        """Through vLLM: one engine per job's precision, built once (our engine's model released first)."""
        from ..engines.vllm_adapter import VllmRunner, result_quantiles
        pp = point.params_dict
        key = (prec.name, prec.group_size, prec.act_dtype, job.layers)
        failed = ctx.state.setdefault("failed_builds", {})
        if ("vllm",) + key in failed:
            raise failed[("vllm",) + key]
        cur = ctx.state.get("vllm")
        if cur is None or cur[0] != key:
            ctx.state.pop("model", None)
            ctx.state.pop("vllm", None)
            gc.collect()
            if not ctx.on_cpu:
                torch.cuda.empty_cache()
            max_len = max(int(s["seq_len"]) // (int(s["batch"]) if s["phase"] == "decode" else 1)
                          for s in job.steps) + int(pp["decode_steps"]) + 8
            try:
                runner = VllmRunner(job.card, prec, job.layers, max_len, max(int(s["batch"]) for s in job.steps),
                                    ctx.device, check=ctx.on_cpu and prec.kind == "dense", seed=ctx.seed)
            except (Unsupported, Unavailable) as e:
                failed[("vllm",) + key] = type(e)(str(e))
                raise
            ctx.state["vllm"] = cur = (key, runner)
        r = cur[1].measure(point.phase, point.batch, point.seq_len, repeats=pp["repeats"],
                           decode_steps=pp["decode_steps"])
        p10, p90 = result_quantiles(r)
        note = f"vllm {r.version}; quantization={r.quantization}; {r.method}; {r.check}"
        return [Metric("latency_ms", r.median_ms, "ms", p10, p90, len(r.samples_ms), impl_config=note),
                Metric("build_s", r.build_s, "s", impl_config=note)]
