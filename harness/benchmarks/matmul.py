"""Weight-only matmul y[M,N] = x[M,K] @ dequant(W)[K,N], for every implementation.

Used by gemm_shapes, tilus_fig10, tilus_fig11, tilus_fig14 and smoke. Each point is
checked against x(float64) @ W(float64) on fresh random inputs before it is timed.
"""
from __future__ import annotations

import sys
import time

import torch

from kernels import Unavailable, Unsupported
from ..bench import Context, Metric, Point, register
from .. import impls
from ..impls import TORCH_DTYPES, Problem, get
from ..shapes import select_layers
from ..specs import ConfigError, KernelSpec, Precision
from ..timing import NumericsFail, check_numerics, measure_read_bandwidth

DEFAULT_TOL = {"f16": 2e-3, "bf16": 1e-2}
READ_REF_MAX_M = 16     # decode sizes: where a weight-only kernel's time is its weight bytes


def read_ref_n(weight_bytes: int, K: int) -> int:
    """Columns of the f16 weight that holds as many bytes as a low-bit weight of `weight_bytes` at depth K (a
    multiple of 8, for cuBLAS' aligned kernels): the shape of the same-bytes cuBLAS reference."""
    return max(8, 8 * round(weight_bytes / (2 * K) / 8))


def dense(act: str) -> Precision:
    return Precision(name=act, kind="dense", bits=16, exp_bits=0, man_bits=0, act_dtype=act, group_size=-1)


def cpu_shrink(shapes, Ms, cpu: dict):
    """On a machine without a GPU the same sweep runs on tiny shapes (interpreter)."""
    mk, mn = int(cpu.get("max_K", 256)), int(cpu.get("max_N", 256))
    shapes = [(name, min(K, mk), min(N, mn)) for name, K, N in shapes]
    Ms = sorted({min(m, int(cpu.get("max_M", 16))) for m in Ms})
    return shapes, Ms


@register("weight_only_matmul")
class WeightOnlyMatmul:
    primary_metric = "latency_ms"

    def points(self, ctx: Context) -> list[Point]:
        exp, prec = ctx.experiment, ctx.precision
        if exp.shapes:
            shapes = [(f"K{K}_N{N}", K, N) for K, N in exp.shapes]
            model = "custom" if not exp.layers else ctx.model.name
        else:
            shapes = [(l.name, l.K, l.N) for l in select_layers(ctx.model, exp.layers)]
            model = ctx.model.name
        Ms = list(exp.M)
        for _, K, _ in shapes:          # on the real shapes, before any shrinking
            prec.check_k(K)
        if ctx.on_cpu:
            shapes, Ms = cpu_shrink(shapes, Ms, exp.cpu)
        pts = []
        for kname in ctx.kernels:
            impl = KernelSpec.load(kname).impl
            try:
                dense_impl, env = impls.is_dense(impl), impls.env_key(impl)
            except Unavailable as e:
                raise ConfigError(f"kernel {kname}: {e}") from e
            # cuBLAS beside a low-bit precision is the dense baseline of the same shape.
            p = dense(prec.act_dtype) if dense_impl else prec
            for layer, K, N in shapes:
                for M in Ms:
                    pts.append(Point(exp.name, exp.figure, model, layer, M, K, N, p.weight_dtype, p.act_dtype,
                                     p.group_size, kname, skip_reason=impls.reason(impl, p, M, K, N), env=env))
        if not pts:
            raise ConfigError(f"experiment {exp.name}: the sweep is empty (kernels={list(ctx.kernels)}, M={Ms})")
        # contiguous weights: one weight (and its reference) alive at a time
        return sorted(set(pts), key=lambda q: (q.layer, q.K, q.N, q.weight_dtype, q.M, q.impl))

    def env_key(self, point: Point) -> str:
        """Presence and versions of the packages the point's implementation needs."""
        return impls.env_key(KernelSpec.load(point.impl).impl)

    def setup(self, ctx: Context) -> list[Metric]:
        if ctx.on_cpu:
            return []
        bw = measure_read_bandwidth(ctx.timer)
        ctx.state["bw_tbs"] = bw
        return [Metric("hbm_read_bw", bw, "TB/s")]

    def _precision(self, point: Point, ctx: Context) -> Precision:
        if point.weight_dtype in TORCH_DTYPES:
            return dense(point.act_dtype)
        return ctx.precision

    def _weights(self, point: Point, prec: Precision, ctx: Context):
        """The weight of this (K, N, dtype) and its float64 value, cached for the next point."""
        key = (point.K, point.N, prec.name, prec.group_size, prec.act_dtype)
        cache = ctx.state.setdefault("weights", {})
        if key not in cache:
            cache.clear()
            dev = "cuda" if not ctx.on_cpu else "cpu"
            g = torch.Generator(device=dev).manual_seed(ctx.seed + point.K * 7 + point.N)
            act = TORCH_DTYPES[prec.act_dtype]
            if prec.kind == "dense":
                w = (torch.randn(point.K, point.N, generator=g, device=dev) / point.K ** 0.5).to(act)
                w64 = w.double()
            else:
                from kernels.lowbit.formats import dequantize_ref, parse_format, random_quantized
                w = random_quantized(point.K, point.N, parse_format(prec.name), prec.group_size, act,
                                     seed=ctx.seed + point.K * 7 + point.N, device=dev)
                w64 = dequantize_ref(w, device=dev)
            cache[key] = (w, w64)
        return cache[key]

    def run(self, point: Point, ctx: Context) -> list[Metric]:
        if point.skip_reason:
            raise Unsupported(point.skip_reason)
        prec = self._precision(point, ctx)
        dev = "cuda" if not ctx.on_cpu else "cpu"
        w, w64 = self._weights(point, prec, ctx)
        kspec = KernelSpec.load(point.impl)
        t0 = time.perf_counter()
        prepared = get(kspec.impl)(Problem(point.M, point.K, point.N, prec, w, dev,
                                           seconds=ctx.timer.seconds if not ctx.on_cpu else None,
                                           tune_per_path=int(ctx.experiment.params.get("tune_per_path", 2))))
        act = TORCH_DTYPES[prec.act_dtype]
        prepared.fn(torch.randn(point.M, point.K, dtype=act, device=dev))   # first call: per-M tuning
        if dev == "cuda":
            torch.cuda.synchronize()
        prepare_s = time.perf_counter() - t0
        # correctness on fresh random activations, never zeros
        x = torch.randn(point.M, point.K, dtype=act, device=dev)
        ref = x.double() @ w64
        out = prepared.fn(x)
        tol = prepared.tolerance or DEFAULT_TOL[prec.act_dtype]
        err = check_numerics(out, ref, tol)
        del ref, out
        t = ctx.timer(lambda: prepared.fn(x))
        sec = t.median_ms * 1e-3
        nbytes = prec.weight_bytes(point.K, point.N) + 2 * point.M * (point.K + point.N)
        flops = 2 * point.M * point.K * point.N
        bw = ctx.state.get("bw_tbs") or ctx.gpu.bw_tbs
        floor_ms = None
        if bw and ctx.gpu.tflops and not ctx.on_cpu:
            floor_ms = max(nbytes / (bw * 1e12), flops / (ctx.gpu.tflops * 1e12)) * 1e3
        c = prepared.config_for(point.M)
        ms = [
            Metric("latency_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz, c),
            Metric("bandwidth_tbs", nbytes / sec / 1e12, "TB/s", impl_config=c),
            Metric("tflops", flops / sec / 1e12, "TFLOP/s", impl_config=c),
            Metric("rel_err", err, "1", impl_config=c),
            Metric("prepare_s", prepare_s, "s", impl_config=c),
        ]
        if t.host_ms is not None:     # host time per call: a row whose host_ms nears latency_ms is launch-bound
            ms.append(Metric("host_ms", t.host_ms, "ms", impl_config=c))
        if t.exposed is not None:     # samples that may hold a host wait (harness.timing; retried when many)
            ms.append(Metric("exposed_samples", t.exposed, "1", n_samples=t.n, impl_config=c))
        if floor_ms:
            ms += [Metric("floor_ms", floor_ms, "ms", impl_config=c),
                   Metric("roofline_frac", floor_ms / t.median_ms, "1", impl_config=c)]
        ref = self._read_ref(point, prec, ctx)
        if ref is not None:
            ms += [ref, Metric("read_ref_frac", ref.value / t.median_ms, "1", impl_config=ref.impl_config)]
        return ms

    def _read_ref(self, point: Point, prec: Precision, ctx: Context) -> Metric | None:
        """How fast cuBLAS reads f16 weights of the same byte count, under the same timer: torch.matmul of
        x[M, K] @ W[K, N'] in f16 with 2 K N' = the low-bit weight's bytes (read_ref_n), checked against float64
        first.  A decode kernel's floor is its bytes over the bandwidth of a 4 GiB read; this is what the
        vendor's GEMV reaches on as many bytes in one call between events after the L2 flush (launch, tail and
        the flush's write-backs included), the issue's "reads low-bit weights as fast as cuBLAS reads f16".
        Low-bit decode points on a GPU only; one timing per (M, K, N') and job, shared by every kernel."""
        if ctx.on_cpu or prec.kind == "dense" or point.M > READ_REF_MAX_M:
            return None
        n = read_ref_n(prec.weight_bytes(point.K, point.N), point.K)
        key = (point.M, point.K, n)
        cache = ctx.state.setdefault("read_ref", {})
        if key not in cache:
            cache[key] = None   # a reference that cannot run leaves the point's own rows alone (said on stderr)
            try:
                g = torch.Generator(device="cuda").manual_seed(ctx.seed + 31 * point.K + n + point.M)
                w = (torch.randn(point.K, n, generator=g, device="cuda") / point.K ** 0.5).half()
                x = torch.randn(point.M, point.K, generator=g, device="cuda").half()
                check_numerics(torch.matmul(x, w), x.double() @ w.double(), DEFAULT_TOL["f16"])
                t = ctx.timer(lambda: torch.matmul(x, w))
                cache[key] = Metric("read_ref_ms", t.median_ms, "ms", t.p10_ms, t.p90_ms, t.n, t.sm_clock_mhz,
                                    f"cublas f16 x[{point.M},{point.K}] @ W[{point.K},{n}] (same weight bytes)"
                                    + (f"; {t.exposed}/{t.n} samples exposed to the host" if t.exposed else ""))
            except (NumericsFail, torch.OutOfMemoryError) as e:
                print(f"read_ref (M={point.M}, K={point.K}, N'={n}) not measured: {type(e).__name__}: {e}",
                      file=sys.stderr)
        return cache[key]
