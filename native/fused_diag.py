"""Take the fused prefill kernel's time apart (native/include/lowbit_fused.cuh; issue 13), ~1 minute on an H200.

    python -m native.fused_diag [--json OUT] [--points FMT,G,K,N,M[;...]] [--rounds 2] [--samples 10] [--clocks S]

Builds the tuning extension (native.build.build_tune: the TUNED recipes, both chunk-group sizes G = 1, 2 and the
diagnostic builds of G = 1) and times, per point, in alternating rounds with the harness's Timer: cuBLAS f16 on the
dense weight (x @ W, as the `cublas` impl), the fused kernel with G = 1 and 2 (each checked against float64 first),
the G = 1 kernel with each stage's words read into registers at once (`fused_hoist`), and the diagnostic builds,
whose outputs are wrong on purpose: `nodeq` (the packed words fed to the tensor cores
as they are: no dequantize, no scales), `noload` (no copies into the ring: no global traffic but the output) and
`bare` (neither: the wgmma, the ring's barriers and the epilogue). For even widths also the wide build
(`fused_wide`: half an n-block x 256 tokens per block, each warpgroup dequantizing one n16 tile of its warps' 32
channels and issuing m64n256k16) and its diagnostic builds `wide_nodeq`, `wide_noload`, `wide_bare`. Each time is also
given as cuBLAS time over it; tensor time at the dense peak is 2 M K N / 989 TFLOP/s.

Before any timing, every checked build (not the diagnostic ones) of every TUNED recipe is checked against float64
on small shapes with K and N padding and partial m-tiles (N = 700, M 17 / 130 / 300; K = 1000 with groups per
channel / 8 / 40, K = 1152 with groups 128 / 64 / 32); a failure there fails the run (--no-small skips it).

--clocks S: then each job also runs back to back for S seconds while `nvidia-smi` samples the SM clock, the board
power and the temperature every 50 ms (median of the samples after the first quarter of the window), beside the
time per call over that window -- whether a build is slower per cycle or runs at a lower clock (power).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from native.prefill_tune import parse_points
from native.tune import _check_json_path, build_or_report

DEFAULT = "u4,128,8192,57344,2048;u8,128,8192,57344,2048;u4,128,8192,57344,8192"
TOL = 2e-3
SMI = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits", "-lms", "50"]


def sustained(job, seconds: float) -> dict:
    """job run back to back for `seconds` under nvidia-smi sampling: ms per call, median SM MHz, W, deg C."""
    for _ in range(3):
        job()
    torch.cuda.synchronize()
    smi = subprocess.Popen(SMI, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    calls, t0 = 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                job()
            calls += 8
            torch.cuda.synchronize()
        el = time.perf_counter() - t0
    finally:
        smi.terminate()
        out, _ = smi.communicate(timeout=10)
    rows = [[float(v) for v in ln.split(",")] for ln in out.splitlines() if ln.count(",") == 2 and "N/A" not in ln]
    rows = rows[len(rows) // 4:]   # after the clock settled
    if not rows:
        return {"ms_per_call": el / calls * 1e3, "calls": calls, "samples": 0}
    return {"ms_per_call": el / calls * 1e3, "calls": calls, "samples": len(rows),
            "sm_mhz": statistics.median(r[0] for r in rows), "power_w": statistics.median(r[1] for r in rows),
            "temp_c": statistics.median(r[2] for r in rows)}


SMALL_N, SMALL_M = 700, (17, 130, 300)
SMALL_KG = [(1000, -1), (1000, 8), (1000, 40), (1152, 128), (1152, 64), (1152, 32)]   # (K, group)


def for_width(builds: dict, bits: int) -> tuple[dict, list]:
    """The builds the tuning extension has for this width, and the names of those it has not (odd widths: no wide)."""
    from native import lowbit
    have = {n: b for n, b in builds.items() if lowbit.fused_built_for(b, bits)}
    return have, [n for n in builds if n not in have]


def check_small(mod, builds: dict) -> list:
    """Every checked build of every TUNED recipe against float64 on the small shapes (module docstring): one row
    per (recipe, group, M) with each build's relative error."""
    from harness.timing import rel_error
    from kernels.lowbit.formats import dequantize_ref, random_quantized
    from native import lowbit
    from native import lowbit_layout as LL
    rows = []
    for name in LL.TUNED:
        fmt = name.split("_", 1)[1]
        for K, g in SMALL_KG:
            qw = random_quantized(K, SMALL_N, fmt, g, torch.float16, seed=K + g, device="cuda")
            w64 = dequantize_ref(qw, device="cuda")
            fn = lowbit.LowbitMatmul(lowbit.pack(qw), mod)
            for M in SMALL_M:
                x = torch.randn(M, K, device="cuda").half()
                ref = x.double() @ w64
                have, _ = for_width(builds, fn.pw.rec.bits)
                errs = {n: rel_error(fn._fused(x, b), ref) for n, b in have.items() if n.startswith("fused")}
                ok = all(e <= TOL for e in errs.values())
                if not ok:
                    print(f"FAIL small {fmt} g{g} M={M}: errors {errs}", flush=True)
                rows.append(dict(fmt=fmt, g=g, K=K, N=SMALL_N, M=M, err=errs, ok=ok))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--points", default=DEFAULT, metavar="FMT,G,K,N,M[;...]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--no-small", action="store_true", help="skip the small-shape check of every build")
    ap.add_argument("--clocks", type=float, default=0.0, metavar="S", help="sustained-run seconds per job (0: none)")
    a = ap.parse_args(argv)
    try:
        points = parse_points(a.points)
        _check_json_path(a.json)
        from native import lowbit_layout as LL
        for p in points:
            if f"f16_{p[0]}" not in LL.TUNED:
                raise ValueError(f"point {p}: the tuning extension has the recipes {list(LL.TUNED)} only")
        if a.rounds < 1 or a.samples < 1:
            raise ValueError("--rounds and --samples must be >= 1")
        if not 0 <= a.clocks <= 60:
            raise ValueError("--clocks must be 0-60 seconds")
    except ValueError as e:
        print(f"config error: {e}")
        return 2
    from harness.timing import Timer, rel_error
    from kernels.lowbit.formats import dequantize_ref, random_quantized
    from native import lowbit
    from native.build import build_tune
    diag = ("nodeq", "noload", "bare")   # wrong on purpose (also as wide_*); the others are checked against float64
    builds = {(n if n.split("_")[-1] in diag else "fused_" + n): b for n, b in lowbit.FUSED_BUILDS.items()}
    mod = build_or_report(build_tune)
    if mod is None:
        return 2
    small = [] if a.no_small else check_small(mod, builds)
    bad_small = sum(not r["ok"] for r in small)
    if small:
        print(f"small shapes: {len(small) - bad_small}/{len(small)} builds x recipes x groups x M ok; worst rel err "
              f"{max(e for r in small for e in r['err'].values()):.2e}", flush=True)
    timer = Timer(samples=a.samples, warmup_ms=10)
    rows, bad = [], bad_small
    for fmt, g, K, N, M in points:
        qw = random_quantized(K, N, fmt, g, torch.float16, seed=K + N, device="cuda")
        w64 = dequantize_ref(qw, device="cuda")
        w16 = w64.to(torch.float16)
        fn = lowbit.LowbitMatmul(lowbit.pack(qw), mod)
        pb, not_built = for_width(builds, fn.pw.rec.bits)
        x = torch.randn(M, K, device="cuda").half()
        ref = x.double() @ w64
        del w64
        errs = {n: rel_error(fn._fused(x, b), ref) for n, b in pb.items() if n.startswith("fused")}
        del ref
        ok = all(e <= TOL for e in errs.values())
        bad += not ok
        jobs = {"cublas": lambda: torch.matmul(x, w16)}
        jobs.update({n: (lambda b=b: fn._fused(x, b)) for n, b in pb.items()})
        ms = {n: [] for n in jobs}
        if ok:
            for _ in range(a.rounds):
                for n, j in jobs.items():
                    ms[n].append(timer(j).median_ms)
        med = {n: statistics.mean(v) for n, v in ms.items() if v}
        clocks = {n: sustained(j, a.clocks) for n, j in jobs.items()} if ok and a.clocks > 0 else {}
        peak_ms = 2 * M * K * N / 989e12 * 1e3
        rows.append(dict(fmt=fmt, g=g, K=K, N=N, M=M, err=errs, ok=ok, ms_rounds=ms, ms=med, tensor_peak_ms=peak_ms,
                         sustained=clocks, not_built={n: "unsupported: even widths only" for n in not_built}))
        if not_built:
            print(f"{fmt} g{g} K={K} N={N} M={M}: not built for {fn.pw.rec.bits} bits (even widths only): "
                  + ", ".join(not_built), flush=True)
        if ok:
            print(f"{fmt:6s} g{g:4d} K={K} N={N} M={M} | tensor peak {peak_ms:.3f} ms | "
                  + " ".join(f"{n} {t:.3f} ms ({med['cublas'] / t:.3f}x)" for n, t in med.items()), flush=True)
            for n, c in clocks.items():
                print(f"    sustained {n:9s} {c['ms_per_call']:.3f} ms/call over {c['calls']} calls | "
                      + (f"SM {c['sm_mhz']:.0f} MHz, {c['power_w']:.0f} W, {c['temp_c']:.0f} C" if c["samples"]
                         else "no nvidia-smi samples"), flush=True)
        else:
            print(f"FAIL {fmt} g{g} K={K} N={N} M={M}: errors {errs}", flush=True)
        del fn, qw, x, w16
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"small": small, "points": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
