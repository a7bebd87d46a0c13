"""GPU comparison of the native prefill schedules against cuBLAS f16 (issue 13), ~2 minutes on an H200.

    python -m native.prefill_tune --json OUT [--points FMT,G,K,N,M[;...]] [--samples 20] [--tune-build]

The prefill path (native/lowbit.py, M > 16) dequantizes the weight chunk by chunk of output channels on a
side stream while cuBLAS multiplies the previous chunk; PREFILL_SCHEDULES are the chunkings it can run.
For every point (default: tilus_fig14's gate_up (8192, 57344) at M = 2048 .. 12288 for u4 g128 and f6e3m2
per channel, and the decoder linears of Gemma-2-9B and Qwen2.5-32B at M = 2048 for u4 / u8 / u2 g128):

1. every schedule against x(float64) @ dequantize_ref(W) on fresh random inputs (tolerance 2e-3, f16);
2. the harness's Timer (CUDA events, 256 MB L2 flush, host ahead) in two alternating rounds of: cuBLAS f16
   on the dense weight as the `cublas` impl runs it (x @ W, W [K, N] row-major), cuBLAS on W^T's layout
   (x @ W^T.t(): what the prefill path multiplies), the dequantize kernel alone over the whole weight
   (its bytes: codes + scales + zeros read, K x N x 2 written, over its time), and each schedule;
3. the choice `auto` makes on that point (its own timing, PREFILL_TUNE_ROUNDS rounds, no flush).

Where the fused prefill kernel is built for the recipe (native/include/lowbit_fused.cuh), it is one more candidate
("fused") in 1-3. --tune-build uses the small extension of native.tune (the TUNED recipes: f16 u1 u2 u4 u8 i4
f6e3m2) instead of the full one. Prints one line per point; --json writes every number.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from native.tune import _check_json_path, build_or_report

GEMMA = [(3584, 4096), (3584, 2048), (4096, 3584), (3584, 14336), (14336, 3584)]
QWEN = [(5120, 5120), (5120, 1024), (5120, 27648), (27648, 5120)]
DEFAULT_POINTS = ([("u4", 128, 8192, 57344, m) for m in (2048, 4096, 8192, 12288)]
                  + [("f6e3m2", -1, 8192, 57344, m) for m in (2048, 4096, 8192, 12288)]
                  + [(f, 128, K, N, 2048) for f in ("u4", "u8", "u2") for K, N in GEMMA]
                  + [("u4", 128, K, N, 2048) for K, N in QWEN])
TOL = 2e-3


def parse_points(text):
    """FMT,G,K,N,M[;...] -> [(fmt, group, K, N, M)] (ValueError naming the bad entry)."""
    if not text:
        return list(DEFAULT_POINTS)
    out = []
    for part in text.split(";"):
        f = part.split(",")
        try:
            if len(f) != 5:
                raise ValueError
            fmt, g, K, N, M = f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4])
        except ValueError:
            raise ValueError(f"--points entry {part!r}: FMT,GROUP,K,N,M (e.g. u4,128,8192,57344,2048)") from None
        if min(K, N) < 1 or M <= 16:
            raise ValueError(f"--points entry {part!r}: K, N >= 1 and M > 16 (M <= 16 runs the decode kernel)")
        out.append((fmt, g, K, N, M))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--points", default=None, metavar="FMT,G,K,N,M[;...]")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--tune-build", action="store_true", help="the TUNED recipes' extension (faster to build)")
    a = ap.parse_args(argv)
    try:
        points = parse_points(a.points)
        _check_json_path(a.json)
        if a.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {a.samples}")
        from kernels.baselines import Case
        from native import lowbit
        from native import lowbit_layout as LL
        for fmt, g, K, N, M in points:
            why = lowbit.supports(Case(fmt, "f16", g, K, N))
            if why:
                raise ValueError(f"point {fmt},{g},{K},{N},{M}: {why}")
            if a.tune_build and f"f16_{fmt}" not in LL.TUNED:
                raise ValueError(f"point {fmt},{g},{K},{N},{M}: --tune-build has the recipes {list(LL.TUNED)} only")
    except ValueError as e:   # before any GPU work: one line naming the value
        print(f"config error: {e}")
        return 2
    from harness.timing import Timer, rel_error
    from kernels.lowbit.formats import dequantize_ref, random_quantized
    from native.build import build, build_tune
    t0 = time.time()
    mod = build_or_report(build_tune if a.tune_build else build)
    if mod is None:
        return 2
    timer = Timer(samples=a.samples, warmup_ms=10)
    dt = torch.float16
    rows, bad = [], 0
    for fmt, g, K, N, M in points:
        qw = random_quantized(K, N, fmt, g, dt, seed=K + N, device="cuda")
        w64 = dequantize_ref(qw, device="cuda")
        w16, w16t = w64.to(dt), w64.t().contiguous().to(dt)
        fn = lowbit.LowbitMatmul(lowbit.pack(qw), mod)
        cands = fn.prefill_schedules()
        x = torch.randn(M, K, device="cuda").to(dt)
        xc = torch.randn(M, K, device="cuda").to(dt)
        ref = xc.double() @ w64
        del w64
        errs = {}
        for name, sched in cands.items():
            errs[name] = rel_error(fn._prefill(xc, sched), ref)
        both_g = a.tune_build and lowbit.FUSED in cands   # the tuning extension builds both chunk-group sizes G
        if both_g:
            for g_ in (1, 2):
                errs[f"fused_g{g_}"] = rel_error(fn._fused(xc, lowbit.FUSED_BUILDS[f"g{g_}"]), ref)
        del ref
        ok = all(e <= TOL for e in errs.values())
        bad += not ok
        scheds = {n: (list(s) if isinstance(s, tuple) else s) for n, s in cands.items()}
        row = dict(fmt=fmt, g=g, K=K, N=N, M=M, schedules=scheds, err=errs, ok=ok)
        if ok:
            L = fn.pw.L
            dq_out = torch.empty(L.nblocks * 256, K, dtype=dt, device="cuda")
            zeros = qw.zeros if qw.zeros is not None else fn._empty
            group = K if L.per_channel else qw.group_size
            jobs = {"cublas": lambda: torch.matmul(x, w16), "cublas_wt": lambda: torch.mm(x, w16t.t()),
                    "dequant": lambda: mod.lowbit_dequant(fn.pw.rec.name, fn.pw.words, qw.scales, zeros, dq_out, K, N,
                                                          L.iters, 0, L.nblocks, group)}
            jobs.update({f"sched_{n}": (lambda s=s: fn._prefill(x, s)) for n, s in cands.items()})
            if both_g:
                jobs.update({f"fused_g{g_}": (lambda b=lowbit.FUSED_BUILDS[f"g{g_}"]: fn._fused(x, b)) for g_ in (1, 2)})
            ms = {k: [] for k in jobs}
            for _ in range(2):
                for k, j in jobs.items():
                    ms[k].append(timer(j).median_ms)
            row["ms_rounds"] = ms
            med = {k: statistics.mean(v) for k, v in ms.items()}
            row["ms"] = med
            row["dequant_gbs"] = (qw.nbytes + K * N * 2) / (med["dequant"] * 1e-3) / 1e9
            fn_auto = lowbit.LowbitMatmul(fn.pw, mod)
            name, _ = fn_auto.prefill_schedule(x)
            row["auto"] = name
            row["auto_ms"] = lowbit._PREFILL_TUNED[fn_auto._prefill_key(M)][1]
            best = min((k for k in med if k.startswith("sched_")), key=med.get)
            row["best"] = best[6:]
            row["vs_cublas"] = {k[6:]: med["cublas"] / med[k] for k in med if k.startswith("sched_")}
            del dq_out
            print(f"{fmt:6s} g{g:4d} K={K:5d} N={N:5d} M={M:5d} | cublas {med['cublas']:.3f} ms (W^T layout "
                  f"{med['cublas_wt']:.3f}) | dequant {med['dequant']:.3f} ms {row['dequant_gbs']:.0f} GB/s | "
                  + " ".join(f"{n} {row['vs_cublas'][n]:.3f}x" for n in cands)
                  + "".join(f" fused_g{g_} {med['cublas'] / med[f'fused_g{g_}']:.3f}x" for g_ in (1, 2) if both_g)
                  + f" | best {row['best']}, auto {name}", flush=True)
        else:
            print(f"FAIL {fmt} g{g} K={K} N={N} M={M}: errors {errs}", flush=True)
        rows.append(row)
        del w16, w16t, fn, qw, x, xc
        torch.cuda.empty_cache()
    print(f"{len(rows) - bad}/{len(rows)} points correct; {time.time() - t0:.0f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"points": rows}, f, indent=1, default=str)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
