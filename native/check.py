"""GPU self-check of the native low-bit kernels: every recipe and variant against float64, then a few timings.

    python -m native.check [--quick] [--json out.json]

1. correctness: every weight format x {f16, bf16} x group {per channel, 128} x M {1, 5, 16, 40}
   on a small shape with K and N padding (K = 1000, N = 700: 3 n-blocks, a partial stage), plus
   group sizes 32 / 64 / 96 / 256 / 8 (the prefill path), grids 1 / 3 / auto (direct stores, stream-K
   pieces) and the 8192-class shapes of tilus_fig10 for u4 / i4 / f6e3m2 / u1: relative Frobenius
   error against x(float64) @ dequantize_ref(W) on fresh random inputs (harness tolerances:
   f16 2e-3, bf16 1e-2); the workspace must be back at zero after every call; on the prefill path every candidate
   (each chunking, and the fused kernel where it is built) is checked, not only the one `auto` chose, and on the
   decode path every variant `timed` chooses from (LowbitMatmul.decode_candidates), not only the one it chose.  Floats with >= 6
   exponent bits and f16 activations get the smallest f16 scales (narrow_scales); a case whose exact
   output is beyond the activation dtype's range (f8e7m0 with f16) is skipped with the reason
   (unrepresentable), not failed.
2. the instrumented decode kernel (f16 u4): the decoded profile (scopes, dropped records).
   The row kernels (native softmax, layer_norm) at widths 1 .. 8192 -- multiples of 8 (the 16-byte path), odd
   widths and rows that start off a 16-byte boundary (the 2-byte path) -- plain and in every instrumentation
   mode, against float64 on fresh random inputs, and each instrumented launch's profile decoded (no missing
   block, no unmatched record, the records every block should hold).
3. timing (CUDA events, 256 MB L2 flush, median of 30): decode at K = 8192, N = 57344 for the
   fig10 formats, M = 1 and 16, and prefill at M = 2048 against torch.matmul on the f16 weight;
   fraction of the floor = (weight + scale bytes) / (4 GiB read bandwidth measured here).
Prints one line per failure and a summary; --json writes everything.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import torch

from kernels.lowbit.formats import ALL_FORMAT_NAMES, dequantize_ref, random_quantized
from native import lowbit

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
ACTS = {"f16": torch.float16, "bf16": torch.bfloat16}


def rel_err(y, ref):
    y = y.double()
    if not torch.isfinite(y).all():
        return math.inf
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def workspace_clean() -> bool:
    return all(not t.any() for ws in lowbit._WORKSPACE.values() for t in ws)


def _error(e: BaseException) -> str:
    """'Type: message (file:line)': the raising line too, so that a bare assert is still identifiable."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def unrepresentable(ref: torch.Tensor, dt: torch.dtype) -> Optional[str]:
    """Why the exact result cannot be checked in the output dtype (None: it can).  Random codes of the
    floats with >= 6 exponent bits (f7e6m0: max 2^32, f8e6m1, f8e7m0: 2^64) with f16 scales (>= 2^-24)
    give outputs beyond f16's 65504 whatever the kernel does; kernels/lowbit and tests/test_lowbit_triton.py
    check these formats with bf16 only.  The rule is general: any case whose float64 reference is not
    finite in the output dtype is skipped, not failed."""
    big = float(ref.abs().max())
    lim = torch.finfo(dt).max
    if not big < lim:
        return f"the exact output reaches |y| = {big:.3g}, beyond the {dt} range ({lim:.5g}): not representable"
    return None


def narrow_scales(qw, seed: int = 0):
    """Floats whose range is wider than f16 (>= 6 exponent bits) with f16 scales: the smallest scales f16
    has (1-3 x 2^-24, subnormal), so that the output stays representable where it can (f7e6m0, f8e6m1:
    |y| ~ 2e4 at K = 1000); f8e7m0 (max 2^64) cannot and is skipped by `unrepresentable`.  Everything
    else unchanged."""
    if qw.act_dtype != torch.float16 or qw.fmt.kind != "float" or qw.fmt.exp_bits < 6:
        return qw
    gen = torch.Generator(device=qw.scales.device).manual_seed(seed)
    s = torch.randint(1, 4, tuple(qw.scales.shape), generator=gen, device=qw.scales.device) * 2.0 ** -24
    return dataclasses.replace(qw, scales=s.to(torch.float16))


def check_case(fmt, act, g, K, N, Ms, grid=None, seed=0):
    dt = ACTS[act]
    out = []
    try:
        qw = narrow_scales(random_quantized(K, N, fmt, g, dt, seed=seed, device="cuda"), seed)
        w64 = dequantize_ref(qw, device="cuda")
        fn = lowbit.prepare(qw, dt, M=Ms[0], grid=grid)
    except Exception as e:  # noqa: BLE001 - report, continue
        return [dict(fmt=fmt, act=act, g=g, K=K, N=N, M=None, grid=grid, ok=False, err=None, error=_error(e))]
    for M in Ms:
        r = dict(fmt=fmt, act=act, g=g, K=K, N=N, M=M, grid=grid, path="decode" if fn.decode_ok(M) else "prefill")
        try:
            x = torch.randn(M, K, device="cuda", dtype=torch.float32).to(dt)
            ref = x.double() @ w64
            why = unrepresentable(ref, dt)
            if why:
                r.update(ok=True, skipped=why, err=None)
                out.append(r)
                continue
            y = fn(x)
            torch.cuda.synchronize()
            e = rel_err(y, ref)
            clean = workspace_clean()
            ok = e <= TOL[dt] and clean and tuple(y.shape) == (M, N)
            if not fn.decode_ok(M):   # every prefill candidate `auto` may choose at some shape, the fused kernel too
                r["candidates"] = {name: rel_err(fn._prefill(x, sched), ref) for name, sched in
                                   fn.prefill_schedules().items()}
                ok = ok and all(v <= TOL[dt] for v in r["candidates"].values())
            else:   # every decode variant `timed` may choose (fn ran only the one it timed fastest)
                r["candidates"] = {}
                for v in fn.decode_candidates(M):
                    name = lowbit.VARIANT_NAMES[v]
                    r["candidates"][name] = rel_err(lowbit.LowbitMatmul(fn.pw, fn.mod, grid, name)(x), ref)
                    torch.cuda.synchronize()
                    clean = clean and workspace_clean()
                ok = ok and clean and all(v <= TOL[dt] for v in r["candidates"].values())
            r.update(ok=ok, err=e, clean=clean, config=fn.chosen_config(M))
        except Exception as ex:  # noqa: BLE001
            r.update(ok=False, err=None, error=_error(ex))
            lowbit._reset_workspace(torch.device("cuda"))
        out.append(r)
    return out


# other group sizes (format, activation, group, K): K = 1152 (a partial stage for the 256-k stages of u1 / u2), and
# groups of 256 over two 128-k stages (u8: the regs kernel's sum of x carried across stages at M 9-16)
GROUP_CASES = [("u4", "f16", 32, 1152), ("u2", "f16", 64, 1152), ("i5", "bf16", 96, 1152), ("u4", "f16", 8, 1152),
               ("f8e5m2", "f16", 64, 1152), ("u1", "bf16", 32, 1152), ("u8", "f16", 256, 1280)]


def correctness(quick: bool):
    cases = []
    fmts = ALL_FORMAT_NAMES if not quick else ["u1", "u2", "u3", "u4", "u8", "i4", "i8", "f3e1m1", "f4e2m1",
                                               "f6e3m2", "f8e4m3", "f8e5m2", "f7e6m0"]
    for act in ("f16", "bf16"):
        for fmt in fmts:
            for g in (-1, 128):
                cases += check_case(fmt, act, g, 1000 if g == -1 else 1024, 700, [1, 5, 16, 40], seed=len(cases))
    for fmt, act, g, K in GROUP_CASES:
        cases += check_case(fmt, act, g, K, 600, [1, 9, 16], seed=len(cases))
    for grid in (1, 3):
        cases += check_case("u4", "f16", 128, 2048, 1024, [1, 16], grid=grid)
        cases += check_case("f8e5m2", "f16", -1, 2048, 1024, [4, 12], grid=grid)
    for fmt, g in [("u4", 128), ("i4", 128), ("f6e3m2", -1), ("u1", 128)]:
        cases += check_case(fmt, "f16", g, 8192, 8192, [1, 16])
    cases += check_case("u4", "f16", 128, 28672, 8192, [1, 16])
    return cases


def profiled():
    from native import decode
    qw = random_quantized(8192, 57344, "u4", 128, torch.float16, seed=1, device="cuda")
    fn = lowbit.prepare(qw, torch.float16)
    x = torch.randn(1, 8192, device="cuda").half()
    y, buf = fn.profiled(x, 1024)
    torch.cuda.synchronize()
    e = rel_err(y, x.double() @ dequantize_ref(qw, device="cuda"))
    p = decode.decode(buf.cpu().numpy().view("uint32"), lowbit.SCOPES, "native_lowbit")
    return {"ok": e <= 2e-3 and p.missing_blocks == 0 and p.unmatched == 0, "err": e, "dropped": p.dropped,
            "missing_blocks": p.missing_blocks, "unmatched": p.unmatched, "blocks": len(p.headers),
            "scopes": p.scope_totals()}


# (rows, cols, offset): offset > 0 starts the rows `offset` fp16 values past a 16-byte boundary
ROW_CASES = [(3, 1, 0), (5, 7, 0), (4, 100, 0), (7, 1000, 0), (3, 4104, 0), (9, 8192, 0), (2, 8191, 0),
             (6, 1000, 1), (4, 8192, 3)]


def _row_inputs(name: str, rows: int, cols: int, offset: int, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def t(shape, scale=1.0, shift=0.0):  # fp16 values `offset` elements into a fresh allocation
        n = math.prod(shape)
        buf = torch.empty(n + offset, dtype=torch.float16, device="cuda")
        buf[offset:] = (torch.randn(n, generator=g, device="cuda") * scale + shift).half()
        return buf[offset:].view(shape)
    if name == "softmax":
        return {"x": t((rows, cols), 3.0)}
    return {"x": t((rows, cols), 1.5, 0.3), "weight": t((cols,), 0.2, 1.0), "bias": t((cols,), 0.1), "eps": 1e-5}


def _row_reference(name: str, inp: dict) -> torch.Tensor:
    x = inp["x"].double()
    if name == "softmax":
        return torch.softmax(x, dim=-1)
    return torch.nn.functional.layer_norm(x, (x.shape[1],), inp["weight"].double(), inp["bias"].double(), inp["eps"])


def row_kernels():
    """The native row kernels against float64 (ROW_CASES x plain and every mode) and their decoded profiles."""
    from native import decode
    from native import native_kernels as nk
    out = []
    for name in ("softmax", "layer_norm"):
        for rows, cols, offset in ROW_CASES:
            inp = _row_inputs(name, rows, cols, offset, seed=len(out))
            ref = _row_reference(name, inp)
            for mode in (None, *nk.MODES):
                case = {"kernel": name, "rows": rows, "cols": cols, "offset": offset, "mode": mode or "plain"}
                try:
                    y, raw = nk.run(name, inp, instrument=mode is not None, buffer_records=16, mode=mode or "staged")
                    torch.cuda.synchronize()
                    case["err"] = rel_err(y, ref)
                    ok = case["err"] <= TOL[torch.float16]
                    if raw is not None:
                        p = decode.decode(raw, nk.SCOPES[name], kernel=nk.KERNEL_NAMES[name])
                        counts = {k: int(v.get("count", 0)) for k, v in p.scope_totals().items()}
                        recording = rows * (1 if mode == "warp0" else nk.THREADS[name] // 32)
                        case.update(missing_blocks=p.missing_blocks, unmatched=p.unmatched, dropped=p.dropped,
                                    counts=counts)
                        ok = ok and p.missing_blocks == 0 and p.unmatched == 0 and p.dropped == 0 and \
                            counts == {s: recording for s in nk.SCOPES[name]}
                    case["ok"] = ok
                except Exception as e:  # noqa: BLE001
                    case.update(ok=False, error=_error(e))
                out.append(case)
    return out


def _time(fn, samples=30):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(samples):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def timing():
    src = torch.empty(1 << 31, dtype=torch.float16, device="cuda")
    src.normal_()
    ms = _time(lambda: src.sum(), 10)
    bw = src.numel() * 2 / (ms * 1e-3)
    del src
    rows = []
    K, N = 8192, 57344
    wd = (torch.randn(K, N, device="cuda") / K ** 0.5).half()
    x16 = {M: torch.randn(M, K, device="cuda").half() for M in (1, 16, 2048)}
    cub = {M: _time(lambda M=M: torch.matmul(x16[M], wd)) for M in x16}
    del wd
    for fmt, g in [("i4", 128), ("u4", 128), ("u8", 128), ("f6e3m2", -1), ("u2", 128), ("u1", 128), ("f8e5m2", -1)]:
        qw = random_quantized(K, N, fmt, g, torch.float16, seed=2, device="cuda")
        fn = lowbit.prepare(qw, torch.float16)
        for M in (1, 16, 2048):
            if M == 2048 and fmt not in ("u4", "f6e3m2"):
                continue
            t = _time(lambda: fn(x16[M]))
            floor = (qw.nbytes + 2 * M * (K + N)) / bw * 1e3
            rows.append({"fmt": fmt, "M": M, "ms": t, "floor_ms": floor, "frac_floor": floor / t, "cublas_ms": cub[M],
                         "speedup_vs_cublas": cub[M] / t, "config": fn.chosen_config(M)})
            print(f"  {fmt:7s} M={M:5d} {t * 1e3:8.1f} us  floor {floor * 1e3:6.1f} us ({floor / t:5.1%})  "
                  f"cuBLAS f16 {cub[M] * 1e3:8.1f} us ({cub[M] / t:4.2f}x)  {fn.chosen_config(M)}", flush=True)
        del fn, qw
    return {"read_bw_tbs": bw / 1e12, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="13 formats instead of all 42 (the full sweep takes ~30 s)")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    from kernels import Unavailable
    from native.build import build
    try:
        build()
    except Unavailable as e:
        print(f"unavailable: {e}")
        return 2
    print(f"built in {time.time() - t0:.1f} s", flush=True)
    t1 = time.time()
    cases = correctness(a.quick)
    bad = [c for c in cases if not c.get("ok")]
    for c in bad:
        print("FAIL", json.dumps(c), flush=True)
    worst = {}
    for c in cases:
        if c.get("err") is not None:
            key = (c["act"], c.get("path"))
            worst[key] = max(worst.get(key, 0.0), c["err"])
    skipped = [c for c in cases if c.get("skipped")]
    if skipped:
        print(f"skipped {len(skipped)} (output not representable in the activation dtype): "
              + ", ".join(sorted({f"{c['fmt']}/{c['act']}" for c in skipped})), flush=True)
    print(f"correctness: {len(cases) - len(bad) - len(skipped)}/{len(cases) - len(skipped)} ok "
          f"({len(skipped)} skipped) in {time.time() - t1:.1f} s; worst rel err "
          + ", ".join(f"{k[0]}/{k[1]} {v:.2e}" for k, v in sorted(worst.items())), flush=True)
    rows = row_kernels()
    bad += [c for c in rows if not c["ok"]]
    for c in rows:
        if not c["ok"]:
            print("FAIL", json.dumps(c, default=str), flush=True)
    print(f"row kernels (softmax, layer_norm): {sum(c['ok'] for c in rows)}/{len(rows)} ok; worst rel err "
          f"{max(c.get('err', math.inf) for c in rows):.2e}", flush=True)
    prof = None
    try:
        prof = profiled()
        print(f"instrumented u4 decode: ok={prof['ok']} err={prof['err']:.2e} blocks={prof['blocks']} "
              f"dropped={prof['dropped']} scopes={ {k: round(v.get('normalized_cycles', 0)) for k, v in prof['scopes'].items()} }",
              flush=True)
    except Exception as e:  # noqa: BLE001
        prof = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print("FAIL instrumented:", prof["error"], flush=True)
    tim = None
    if not a.no_timing:
        tim = timing()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "row_kernels": rows, "profiled": prof, "timing": tim}, f, indent=1, default=str)
    print(f"total {time.time() - t0:.1f} s")
    return 1 if bad or not prof.get("ok") else 0


if __name__ == "__main__":
    sys.exit(main())
