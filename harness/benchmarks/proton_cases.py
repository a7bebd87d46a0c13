"""Proton's case studies (CGO'26 artifact figs. 8, 9, 10, 12) on our kernels (kernels/cases/).

proton_matmul_variants (Fig. 8)  every matmul variant x dtype x K x loop flattening, checked against the
    reference, timed by CUDA events (with L2 flush) and profiled by Proton (`hook="triton"`): TFLOP/s is the
    profile's flops metric (launch_metadata) over its CUPTI time. Each point's tree is merged into one profile
    per (dtype, flattening) under artifacts/, the pair that `proton-viewer -m tflop16/s -diff A B` compares.
proton_moe_roofline (Fig. 9)     the gpt-oss MoE MLP over tokens per expert; each step profiled by Proton:
    useful flops and bytes from the matmul frames, time of every kernel; roofs measured in setup().
proton_moe_split (Fig. 10)       TP x EP splits of that MLP launched with torchrun, one profile per rank; a
    split needing more GPUs than visible is a row `unavailable: needs N GPUs, M visible`.
proton_gluon_attention (Fig. 12) Gluon attention with intra-kernel cycle profiles: Blackwell only (planned rows).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kernels import Unavailable, Unsupported
from ..bench import Context, Metric, Point, register
from ..specs import ConfigError, GpuSpec
from ..timing import NumericsFail

NO_PROTON = "Proton's CUPTI profiler needs a CUDA GPU"
# Compute capability by conf/gpu card name, for planning without the device (GPU runs ask the device).
def arch(ctx: Context) -> tuple[int, int] | None:
    """(major, minor) of the GPU: the device's own on a GPU run, else the `arch` of the card (conf/gpu/)."""
    if not ctx.on_cpu:
        import torch
        return tuple(torch.cuda.get_device_capability())
    card = GpuSpec.load(ctx.gpu.name) if ctx.gpu.arch is None else ctx.gpu
    a = card.arch if card else None
    if not a:
        return None
    digits = str(a).lower().removeprefix("sm_")
    return int(digits[:-1]), int(digits[-1])


def _sm(a) -> str:
    return f"sm_{a[0]}{a[1]}" if a else "no GPU"


def _need_list(prm: dict, key: str, default, valid=None, positive=False) -> list:
    vals = list(prm.get(key) if prm.get(key) is not None else default)
    if not vals:
        raise ConfigError(f"experiment.params.{key} is empty")
    for v in vals:
        if valid is not None and v not in valid:
            raise ConfigError(f"experiment.params.{key}: {v!r} unknown; valid: {', '.join(map(str, valid))}")
        if positive and not (isinstance(v, int) and v > 0):
            raise ConfigError(f"experiment.params.{key}: {v!r} must be a positive integer")
    return vals


def _sweep_params(ctx: Context) -> dict:
    """The experiment's params, with its `cpu:` values (tiny shapes for the interpreter) on a CPU run."""
    prm = dict(ctx.experiment.params)
    if ctx.on_cpu:
        cpu = {k: v for k, v in (ctx.experiment.cpu or {}).items() if v is not None}
        for k, v in cpu.items():       # the GPU values a CPU run replaces must still be well-formed
            _same_kind(f"experiment.params.{k}", prm.get(k), v)
        prm.update(cpu)
    return prm


def _same_kind(key: str, given, example) -> None:
    """`given` has the type of `example` (a list: every element the type of the example's elements)."""
    def kind(v):
        return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
    if given is None:
        return
    if isinstance(example, (list, tuple)):
        if not isinstance(given, (list, tuple)):
            raise ConfigError(f"{key}={given!r} must be a list like {list(example)!r}")
        kinds = {kind(e) for e in example}
        bad = [g for g in given if kind(g) not in kinds]
        if bad:
            raise ConfigError(f"{key}: {bad[0]!r} is not a {'/'.join(sorted(kinds))}, as in {list(example)!r}")
    elif kind(given) != kind(example):
        raise ConfigError(f"{key}={given!r} must be a {kind(example)}, like {example!r}")


def _proton_profile(fn, reps: int, stem: Path) -> tuple[list, int]:
    """Run fn `reps` times inside one Proton session (kernel level, launch-metadata hook); the tree and its size."""
    import torch
    import triton.profiler as proton
    from kernels.cases import proton_tree as pt
    stem.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.synchronize()
    proton.start(str(stem), hook="triton")
    try:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    finally:
        proton.finalize()
    path = stem.with_suffix(".hatchet")
    return pt.load(path), os.path.getsize(path)


def check_numerics(out, ref, tol: float) -> float:
    """||out - ref|| / ||ref|| in float64 on the output's device (an 8192^2 output copied to the host for
    harness.timing.rel_error would cost a second per point); NumericsFail above `tol`."""
    import torch
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    if o.shape != r.shape:
        raise NumericsFail(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    err = float("inf") if not torch.isfinite(o).all() else (torch.linalg.norm(o - r) / (torch.linalg.norm(r) or 1.0)).item()
    if not err <= tol:
        raise NumericsFail(f"relative error {err:.3g} > tolerance {tol:.3g}")
    return err


def _compiled(fn, ctx: Context):
    """First call of a Triton variant: a kernel Triton cannot compile for this GPU is `unsupported`, with the
    compiler's first line as the reason."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources
    try:
        return fn()
    except (CompilationError, OutOfResources) as e:
        raise Unsupported(f"does not compile for {_sm(arch(ctx))}: {_first_line(e)}") from e
    except RuntimeError as e:
        if "PassManager" in str(e) or "ptxas" in str(e):
            raise Unsupported(f"does not compile for {_sm(arch(ctx))}: {_first_line(e)}") from e
        raise


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def _cached(ctx: Context, slot: str, key, make):
    """One cached value per slot (the previous one is dropped first: GPU memory)."""
    cache = ctx.state.setdefault(slot, {})
    if key not in cache:
        cache.clear()
        cache[key] = make()
    return cache[key]


# ---- Fig. 8 -----------------------------------------------------------------------------------------------
@register("proton_matmul_variants")
class MatmulVariants:
    primary_metric = "tflops"
    label_axes = ()

    def points(self, ctx: Context) -> list[Point]:
        from kernels.cases import matmul_variants as mv
        exp, prm = ctx.experiment, ctx.experiment.params
        src = _sweep_params(ctx)
        variants = _need_list(prm, "variants", mv.VARIANTS, mv.VARIANTS)
        dtypes = _need_list(prm, "dtypes", mv.DTYPES, sorted(mv.DTYPES))
        ks = _need_list(src, "K", [512, 1024, 2048, 4096, 8192], positive=True)
        flat = _need_list(prm, "flatten", [False, True], (False, True))
        M, N = int(src.get("M", 8192)), int(src.get("N", 8192))
        for k in ks:
            if k % 16:
                raise ConfigError(f"experiment.params.K: {k} must be a multiple of 16 (TMA needs 16-byte rows)")
        if M <= 0 or N <= 0 or N % 16:
            raise ConfigError(f"experiment.params M={M}, N={N}: positive, N a multiple of 16")
        return [Point(exp.name, exp.figure, workload="matmul", impl=v, M=M, N=N, K=k, weight_dtype=d, act_dtype=d,
                      profiler="proton", params=(("flatten", bool(f)),))
                for d in dtypes for k in ks for f in flat for v in variants]

    def setup(self, ctx: Context) -> list[Metric]:
        return []

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        import torch
        from kernels.cases import matmul_variants as mv
        from kernels.cases import proton_tree as pt
        dtype, flatten, variant = point.weight_dtype, bool(point.params_dict["flatten"]), point.impl
        dev = "cpu" if ctx.on_cpu else "cuda"
        key = (dtype, point.M, point.N, point.K)
        inputs = _cached(ctx, "mm_inputs", key, lambda: mv.make_inputs(point.M, point.N, point.K, dtype, dev, ctx.seed))
        ref = _cached(ctx, "mm_ref", key, lambda: mv.reference(inputs))
        if variant.endswith("_ws") and not ctx.on_cpu:
            self._check_ws(ctx, variant, dtype)
        cfg = None if variant == "cublas" else mv.config(variant, dtype)
        impl_cfg = mv.cublas_impl(dtype, dev) if variant == "cublas" else mv.config_str(cfg)
        fn = lambda: mv.run(variant, inputs, flatten=flatten, cfg=cfg)     # noqa: E731
        # fp8 out: e4m3 rounding alone is ~3% (Frobenius); the interpreter's f32->fp8 cast also halves values
        # whose rounding carries into the next binade (Triton 3.6), hence its wider bound.
        tol = (0.15 if mv.interpreting() else 0.05) if dtype == "fp8" else 2e-3
        err = check_numerics(_compiled(fn, ctx), ref, tol)
        if ctx.on_cpu:
            raise Unavailable(f"{NO_PROTON}; numerics checked in the interpreter (rel err {err:.2g})")
        t = ctx.timer(fn)
        reps = int(ctx.experiment.params.get("reps", 20))
        tag = f"{variant}_{dtype}_K{point.K}_{'flat' if flatten else 'noflat'}"
        prof, size = _proton_profile(fn, reps, ctx.artifacts / "tmp" / tag)
        frames = pt.top_frames(prof)
        if len(frames) != 1:
            raise RuntimeError(f"expected one top-level Proton frame for {variant}, got {sorted(frames)}")
        (name, node), = frames.items()
        m = pt.inclusive(node)
        d = pt.derived(m)
        if not m["time (ns)"] or not d["flops"]:
            raise RuntimeError(f"Proton frame {name!r} has no time or no flops metric: {m}")
        merged = ctx.artifacts / f"matmul_{dtype}{'_flatten' if flatten else ''}.hatchet"
        pt.merge(merged, ctx.artifacts / "tmp" / f"{tag}.hatchet")
        shutil.rmtree(ctx.artifacts / "tmp", ignore_errors=True)
        n_kernels = len(pt.leaves(node))
        return [Metric("tflops", d["tflop/s"], "TFLOP/s", impl_config=impl_cfg),
                Metric("proton_ms", d["time/ms"] / reps, "ms", n_samples=reps, impl_config=impl_cfg),
                Metric("tbs", d["tbyte/s"], "TB/s"),
                Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz, impl_cfg),
                Metric("events_tflops", d["flops"] / reps / (t.median_ms * 1e-3) / 1e12, "TFLOP/s"),
                Metric("rel_err", err, "1"),
                Metric("launches", m["count"], "1"),
                Metric("kernels_in_frame", n_kernels, "1"),
                Metric("profile_bytes", size, "B"),
                Metric("merged_profile_bytes", os.path.getsize(merged), "B", impl_config=merged.name)]

    def _check_ws(self, ctx: Context, variant: str, dtype: str) -> None:
        """Warp specialization is lowered by Triton 3.6 for Blackwell only: on other GPUs the `_ws` kernel
        compiles to the same PTX as the plain one, which is not a warp-specialized variant."""
        from kernels.cases import matmul_variants as mv
        from kernels.cases.compile_check import warp_specialize_lowered
        a = arch(ctx)
        persistent = variant.startswith("tma_persistent")
        key = (a, dtype, persistent)
        cache = ctx.state.setdefault("ws_lowered", {})
        if key not in cache:
            cache[key] = warp_specialize_lowered(a[0] * 10 + a[1], mv.DTYPES[dtype], persistent)
        if not cache[key]:
            import triton
            raise Unsupported(f"Triton {triton.__version__} does not warp-specialize on {_sm(a)}: with "
                              f"warp_specialize=True the kernel compiles to the same PTX as "
                              f"{variant.removesuffix('_ws')} (lowered for sm_100+ only)")


# ---- Fig. 9 -----------------------------------------------------------------------------------------------
def _moe_shape(prm: dict, cpu: bool):
    from kernels.cases import moe_mlp as mm
    if cpu:
        return mm.TINY
    s = mm.MoeShape(int(prm.get("hidden", 5760)), int(prm.get("intermediate", 2880)), int(prm.get("experts", 128)),
                    int(prm.get("topk", 4)))
    if not (0 < s.topk <= s.experts) or s.hidden <= 0 or s.intermediate <= 0:
        raise ConfigError(f"experiment.params MoE shape {s}: need 0 < topk <= experts and positive sizes")
    return s


def _moe_point(exp, shape, dtype, pe, tp=1, ep=1) -> Point:
    return Point(exp.name, exp.figure, model=exp.params.get("model_label", "gpt-oss-x2"), workload="moe_mlp",
                 impl="triton", M=shape.tokens(pe), K=shape.hidden, N=2 * shape.intermediate, weight_dtype=dtype,
                 act_dtype=dtype, profiler="proton",
                 params=(("ep", ep), ("experts", shape.experts), ("per_expert", pe), ("topk", shape.topk), ("tp", tp)))


@register("proton_moe_roofline")
class MoeRoofline:
    primary_metric = "tflops"
    label_axes = ()

    def points(self, ctx: Context) -> list[Point]:
        from kernels.cases import moe_mlp as mm
        prm = ctx.experiment.params
        shape = _moe_shape(prm, ctx.on_cpu)
        src = _sweep_params(ctx)
        dtypes = _need_list(prm, "dtypes", ["fp8"], sorted(mm.DTYPES))
        pes = _need_list(src, "per_expert", [4, 8, 16, 32, 64, 128, 256, 512, 1024], positive=True)
        return [_moe_point(ctx.experiment, shape, d, pe) for d in dtypes for pe in pes]

    def setup(self, ctx: Context) -> list[Metric]:
        """The roofs, measured on this GPU: memset and copy bandwidth, cuBLAS TFLOP/s (8192^3)."""
        if ctx.on_cpu:
            return []
        import torch
        from kernels.cases import matmul_variants as mv
        out = []

        def probe(fn):            # a roof that fails is left out (the figure then omits that roof), not fatal
            try:
                out.append(fn())
            except Exception as e:  # noqa: BLE001
                print(f"warning: roofline probe failed: {type(e).__name__}: {e}", file=sys.stderr)

        n = 4 << 30
        buf = torch.empty(n, dtype=torch.uint8, device="cuda")

        def memset():
            t = ctx.timer(lambda: buf.zero_())
            return Metric("memset_tbs", n / (t.median_ms * 1e-3) / 1e12, "TB/s", n_samples=t.n,
                          sm_clock_mhz=t.sm_clock_mhz)

        def copy():
            half, other = buf[: n // 2], buf[n // 2:]
            t = ctx.timer(lambda: other.copy_(half))
            return Metric("copy_tbs", n / (t.median_ms * 1e-3) / 1e12, "TB/s", n_samples=t.n,
                          sm_clock_mhz=t.sm_clock_mhz, impl_config="read+write bytes")

        def cublas(dtype):
            inp = mv.make_inputs(8192, 8192, 8192, dtype, "cuda", ctx.seed)
            t = ctx.timer(lambda: mv.cublas(inp["a"], inp["b"]))
            return Metric(f"cublas_{dtype}_tflops", 2 * 8192 ** 3 / (t.median_ms * 1e-3) / 1e12, "TFLOP/s",
                          n_samples=t.n, sm_clock_mhz=t.sm_clock_mhz, impl_config=mv.cublas_impl(dtype))

        probe(memset)
        probe(copy)
        del buf
        for dtype in ("fp8", "f16"):
            probe(lambda: cublas(dtype))
        torch.cuda.empty_cache()
        return out

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        from kernels.cases import moe_mlp as mm
        from kernels.cases import proton_tree as pt
        prm = ctx.experiment.params
        shape = _moe_shape(prm, ctx.on_cpu)
        dtype, pe = point.weight_dtype, point.params_dict["per_expert"]
        dev = "cpu" if ctx.on_cpu else "cuda"
        weights = _cached(ctx, "moe_weights", (shape, dtype), lambda: mm.make_weights(shape, dtype, dev, ctx.seed))
        inputs = mm.make_inputs(weights, pe, ctx.seed)
        cfg = mm.config(pe, dtype)
        fn = lambda: mm.forward(inputs, cfg)       # noqa: E731
        tol = (0.15 if mm.interpreting() else 2e-2) if dtype == "fp8" else 2e-3
        err = check_numerics(fn(), mm.reference(inputs), tol)
        if ctx.on_cpu:
            raise Unavailable(f"{NO_PROTON}; numerics checked in the interpreter (rel err {err:.2g})")
        iters = int(prm.get("iters", 10))
        stem = ctx.artifacts / f"moe_{dtype}_pe{pe}"
        prof, size = _proton_profile(fn, iters, stem)
        s = pt.summarize(prof, useful="matmul")
        mat_ns = sum(float(m.get("time (ns)", 0)) for n, m in pt.leaves(prof[0]) if "moe_matmul" in n)
        ids, _ = mm.router(inputs)
        r = mm.route(ids, 0, shape.experts, cfg["BLOCK_M"])
        impl_cfg = f"BM{cfg['BLOCK_M']}_BN{cfg['BLOCK_N']}_BK{cfg['BLOCK_K']}_w{cfg['num_warps']}_s{cfg['num_stages']}"
        return [Metric("tflops", s["flops"] / s["time_ns"] / 1e3, "TFLOP/s", n_samples=iters, impl_config=impl_cfg),
                Metric("tbs", s["bytes"] / s["time_ns"] / 1e3, "TB/s"),
                Metric("step_ms", s["time_ns"] / iters / 1e6, "ms", n_samples=iters),
                Metric("matmul_ms", mat_ns / iters / 1e6, "ms", n_samples=iters),
                Metric("matmul_tflops", s["flops"] / mat_ns / 1e3 if mat_ns else float("nan"), "TFLOP/s"),
                Metric("intensity", s["flops"] / s["bytes"], "FLOP/B"),
                Metric("gflop_per_step", s["flops"] / iters / 1e9, "GFLOP"),
                Metric("gbytes_per_step", s["bytes"] / iters / 1e9, "GB"),
                Metric("kernels_per_step", s["kernels"], "1"),
                Metric("routed_rows", r.rows, "1"), Metric("experts_hit", r.hits, "1"),
                Metric("rel_err", err, "1"), Metric("profile_bytes", size, "B", impl_config=stem.name + ".hatchet")]


# ---- Fig. 10 ----------------------------------------------------------------------------------------------
def visible_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_gate(world: int, visible: int) -> str | None:
    """Why a split of `world` ranks cannot run here (None: it can)."""
    if visible < world:
        return f"needs {world} GPUs, {visible} visible"
    return None


@register("proton_moe_split")
class MoeSplit:
    primary_metric = "tflops_imbalance"
    label_axes = ()

    def _splits(self, prm) -> list[tuple[int, int]]:
        splits = [tuple(int(v) for v in s) for s in (prm.get("splits") or [[1, 2], [2, 1]])]
        for s in splits:
            if len(s) != 2 or min(s) < 1:
                raise ConfigError(f"experiment.params.splits: {list(s)} must be [TP, EP] with TP, EP >= 1")
        return splits

    def points(self, ctx: Context) -> list[Point]:
        prm = ctx.experiment.params
        shape = _moe_shape(prm, ctx.on_cpu)
        src = _sweep_params(ctx)
        pes = _need_list(src, "per_expert", [16, 64, 256, 1024], positive=True)
        dtype = prm.get("dtype", "fp8")
        pts = []
        for tp, ep in self._splits(prm):
            if shape.experts % ep or shape.intermediate % tp:
                raise ConfigError(f"split TP={tp} x EP={ep}: EP must divide experts={shape.experts} and TP "
                                  f"intermediate={shape.intermediate}")
            pts += [_moe_point(ctx.experiment, shape, dtype, pe, tp, ep) for pe in pes]
        return pts

    def setup(self, ctx: Context) -> list[Metric]:
        return []

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        p = point.params_dict
        tp, ep, pe = p["tp"], p["ep"], p["per_expert"]
        if ctx.on_cpu:
            raise Unavailable(f"{NO_PROTON}; a {tp}x{ep} split needs {tp * ep} GPUs (CPU run)")
        why = gpu_gate(tp * ep, visible_gpus())
        if why:
            raise Unavailable(why)
        summary = _cached(ctx, "split", (tp, ep), lambda: self._torchrun(ctx, point, tp, ep))
        ranks = sorted((r for r in summary["ranks"] if r["per_expert"] == pe), key=lambda r: r["rank"])
        if len(ranks) != tp * ep:
            raise RuntimeError(f"summary has {len(ranks)} ranks for per_expert={pe}, expected {tp * ep}")
        tol = 2e-2 if point.weight_dtype == "fp8" else 2e-3
        err = ranks[0]["rel_err"]
        if not err <= tol:
            raise NumericsFail(f"all-reduced output: relative error {err:.3g} > tolerance {tol:.3g}")
        fl = [r["flops"] for r in ranks]
        tm = [r["time_ms"] for r in ranks]
        cm = [r["compute_ms"] for r in ranks]
        tf = [f / (t * 1e-3) / 1e12 for f, t in zip(fl, tm)]

        def imb(v):
            return 1 - min(v) / max(v) if max(v) > 0 else float("nan")

        out = [Metric("tflops_imbalance", imb(tf), "1", impl_config="1 - min/max over ranks (the artifact's plot)"),
               Metric("flop_imbalance", imb(fl), "1"), Metric("time_imbalance", imb(tm), "1"),
               Metric("compute_time_imbalance", imb(cm), "1", impl_config="kernel time without NCCL kernels"),
               Metric("step_ms_max", max(tm), "ms"), Metric("tflops_total", sum(fl) / (max(tm) * 1e-3) / 1e12, "TFLOP/s"),
               Metric("rel_err", err, "1")]
        for r in ranks:
            i = r["rank"]
            out += [Metric(f"rank{i}/gflop", r["flops"] / 1e9, "GFLOP"), Metric(f"rank{i}/time_ms", r["time_ms"], "ms"),
                    Metric(f"rank{i}/compute_ms", r["compute_ms"], "ms"), Metric(f"rank{i}/rows", r["rows"], "1"),
                    Metric(f"rank{i}/profile_bytes", r["profile_bytes"], "B", impl_config=r["profile"])]
        return out

    def _torchrun(self, ctx: Context, point: Point, tp: int, ep: int) -> dict:
        """One torchrun for the split, every tokens-per-expert value of the experiment at once."""
        prm = ctx.experiment.params
        shape = _moe_shape(prm, False)
        pes = _need_list(prm, "per_expert", [16, 64, 256, 1024], positive=True)
        out = ctx.artifacts / f"split_tp{tp}_ep{ep}"
        root = Path(__file__).resolve().parents[2]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp * ep}",
               "-m", "kernels.cases.moe_dist", "--tp", str(tp), "--ep", str(ep), "--dtype", point.weight_dtype,
               "--per-expert", *map(str, pes), "--hidden", str(shape.hidden), "--intermediate", str(shape.intermediate),
               "--experts", str(shape.experts), "--topk", str(shape.topk), "--iters", str(int(prm.get("iters", 10))),
               "--seed", str(ctx.seed), "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                           timeout=int(prm.get("timeout_s", 900)))
        if r.returncode != 0:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"torchrun {tp}x{ep} exited {r.returncode}: {tail}")
        return json.loads((out / "summary.json").read_text())


# ---- Fig. 12 ----------------------------------------------------------------------------------------------
@register("proton_gluon_attention")
class GluonAttention:
    primary_metric = "tflops"
    label_axes = ()

    def points(self, ctx: Context) -> list[Point]:
        exp, prm = ctx.experiment, ctx.experiment.params
        shapes = prm.get("shapes") or [{"Z": 4, "H": 32, "D": 64, "N_CTX": 2048, "causal": True, "dtype": "fp8e5"}]
        pts = []
        for s in shapes:
            s = dict(s)
            bad = sorted(set(s) - {"Z", "H", "D", "N_CTX", "causal", "dtype"})
            if bad:
                raise ConfigError(f"experiment.params.shapes: unknown keys {bad}; valid: Z, H, D, N_CTX, causal, dtype")
            pts.append(Point(exp.name, exp.figure, workload="attention_fwd", impl="gluon", batch=int(s["Z"]),
                             seq_len=int(s["N_CTX"]), weight_dtype=str(s["dtype"]), act_dtype=str(s["dtype"]),
                             profiler="proton_instrumentation",
                             params=tuple(sorted((k, v) for k, v in s.items() if k not in ("Z", "N_CTX", "dtype")))))
        return pts

    def setup(self, ctx: Context) -> list[Metric]:
        return []

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        a = arch(ctx)
        if a is None or a[0] < 10:
            raise Unsupported(f"Gluon attention uses Blackwell's tcgen05 MMA and tensor memory (sm_100+); "
                              f"{ctx.gpu.name} is {_sm(a)}")
        raise Unavailable("no Gluon attention kernel in kernels/cases yet: the artifact's is Triton's Blackwell "
                          "Gluon tutorial, not written for this project (it needs a Blackwell GPU to be checked)")
