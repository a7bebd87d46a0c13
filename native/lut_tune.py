"""GPU comparison of the lut decode variants' launch configurations -- lut: k per block x column tiles per block;
lutspan: threads per block x blocks per SM -- beside the regs variant, u1 at M = 1 (native/NOTES.md sections 33 and 34). Each
configuration is checked against float64 first, then all are timed in alternating rounds with the harness's Timer
(L2 flush, CUDA events).

`--probe` adds the span form's memory side alone (`lowbit_lut_span_probe`: lutspan's grid at 1024 x 1, its loads of
codes and slots with 1 or 2 chunks in flight per warp, no tables or lookups; two other walks of the same bytes and
the codes without the slots: PROBES; native/NOTES.md section 36) at the points with groups of whole units, each first
checked to have read every word once (the XOR of what it reads), with the rate it reads its bytes at; and beside
them two yardsticks on the same bytes: the plainest fast reader (flat 16-byte loads: FLAT) and cuBLAS f16.

    python -m native.lut_tune [--points "8192,57344,128;28672,8192,128;8192,8192,128;8192,57344,-1"] [--samples 40]
                              [--probe]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

DEFAULT_POINTS = "8192,57344,128;28672,8192,128;8192,8192,128;8192,57344,-1"


# the probes: name -> (chunks in flight per warp, a contiguous run of chunks per warp, waves of 1024-thread blocks,
# the slots read beside the codes)
PROBES = {"probe1": (1, False, 1, True), "probe2": (2, False, 1, True), "probe1c": (1, True, 1, True),
          "probe1w4": (1, False, 4, True), "probe1n": (1, False, 1, False)}
# the yardsticks timed beside them on the same bytes (codes and slots): the plainest fast reader (stream_read_xor:
# flat, 16-byte loads, 4 in flight per thread) at blocks per SM x threads, and cuBLAS f16 on as many bytes (the
# harness's read_ref)
FLAT = {"flat1": (1, 1024), "flat8": (8, 256)}


def parse_points(text: str) -> list[tuple[int, int, int]]:
    """"K,N,GROUP;..." -> [(K, N, group)]; ValueError with the offending point."""
    out = []
    for p in (q for q in text.split(";") if q.strip()):
        parts = p.split(",")
        try:
            K, N, g = (int(v) for v in parts)
        except ValueError:
            raise ValueError(f"point {p!r}: expected K,N,GROUP (integers)") from None
        from native.lowbit_lut import group_ok
        if K <= 0 or N <= 0:
            raise ValueError(f"point {p!r}: K and N must be positive")
        if group_ok(K, g):
            raise ValueError(f"point {p!r}: {group_ok(K, g)}")
        out.append((K, N, g))
    if not out:
        raise ValueError("no points")
    return out


def check_run_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The timing tools' common arguments (--samples, --rounds, --json), refused through ap.error (exit 2) before any
    GPU work."""
    if a.samples < 1 or a.rounds < 1:
        ap.error("--samples and --rounds must be at least 1")
    if a.json and os.path.isdir(a.json):
        ap.error(f"--json {a.json}: is a directory, not a file")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: its folder does not exist")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=DEFAULT_POINTS, help="K,N,GROUP;... (u1 weights, f16 activations, M = 1)")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="alternating timing rounds")
    ap.add_argument("--json", default=None)
    ap.add_argument("--probe", action="store_true", help="also time the span form's loads alone (see above)")
    a = ap.parse_args(argv)
    try:
        points = parse_points(a.points)
    except ValueError as e:
        ap.error(str(e))
    check_run_args(ap, a)
    import torch
    from harness.timing import Timer
    from kernels import Unavailable
    from kernels.lowbit.formats import dequantize_ref, random_quantized
    from native import lowbit
    from native.lowbit_lut import CT_CHOICES, KS_CHOICES, SPAN_CONFIGS
    if not torch.cuda.is_available():
        print("native.lut_tune: no CUDA GPU visible", file=sys.stderr)
        return 2
    timer, rows, bad = Timer(samples=a.samples), [], 0
    probe_bytes: dict[str, int] = {}   # the readers' names -> the bytes each reads
    for K, N, g in points:
        qw = random_quantized(K, N, "u1", g, torch.float16, seed=K + N + g, device="cuda")
        x = torch.randn(1, K, dtype=torch.float16, device="cuda")
        ref = x.double() @ dequantize_ref(qw, device="cuda")
        try:
            regs = lowbit.prepare(qw, torch.float16, variant="regs")
        except Unavailable as e:
            print(f"native.lut_tune: {e}", file=sys.stderr)
            return 2
        fns = {"regs": regs}
        print(f"K={K} N={N} g={g}: default ks {regs.lut_ks} ct {regs.lut_ct}, span {regs.span_cfg}", flush=True)
        configs = [("lut", f"ks{ks}ct{ct}", dict(lut_ks=ks, lut_ct=ct))
                   for ks, ct in itertools.product(KS_CHOICES, CT_CHOICES)]
        configs += [("lutspan", f"span{th}x{b}", dict(span_cfg=(th, b))) for th, b in SPAN_CONFIGS]
        for variant, name, attrs in configs:
            f = lowbit.LowbitMatmul(regs.pw, regs.mod, None, variant)
            for k, v in attrs.items():
                setattr(f, k, v)
            for _ in range(2):   # twice: the shared workspace must come back zeroed
                y = f(x)
            e = float((y.double() - ref).norm() / ref.norm())
            ok = e < 2e-3 and bool(torch.isfinite(y).all())
            bad += not ok
            print(f"  {name} err {e:.2e} {'ok' if ok else 'FAIL'} | {f.chosen_config(1)}", flush=True)
            if ok:
                fns[name] = f
        if a.probe and g in (32, 64):
            print(f"  probes: not run at g{g} (the probe reads one (scale, zero point) slot per unit)", flush=True)
        elif a.probe:
            bad += _add_probes(fns, probe_bytes, regs, K, N)
        res = {k: [] for k in fns}
        for _ in range(a.rounds):
            for k, f in fns.items():
                res[k].append(timer(lambda: f(x)))
        for k, ts in res.items():
            print(f"  {k:10s} us " + " / ".join(f"{t.median_ms * 1e3:.1f} ({t.p10_ms * 1e3:.1f}-{t.p90_ms * 1e3:.1f})"
                                                for t in ts), flush=True)
            if k in probe_bytes:
                nbytes = probe_bytes[k]
                print(f"  {k:10s} reads {nbytes / 1e6:.1f} MB at "
                      + " / ".join(f"{nbytes / t.median_ms / 1e9:.2f}" for t in ts) + " TB/s", flush=True)
            rows.append(dict(K=K, N=N, group=g, config=k, median_us=[t.median_ms * 1e3 for t in ts],
                             p10_us=[t.p10_ms * 1e3 for t in ts], p90_us=[t.p90_ms * 1e3 for t in ts]))
        del qw, fns, regs
        probe_bytes.clear()
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"points": rows}, fh, indent=1)
    return 1 if bad else 0


def layout_xor(t) -> int:
    """The XOR of every 32-bit word of a tensor's bytes (what a reader that reads each word once XORs together):
    the probes' and the flat reader's check value."""
    import numpy as np
    a = t.contiguous().cpu().numpy().view(np.uint8).ravel()
    if a.size % 4:
        raise ValueError(f"{a.size} bytes: not whole 32-bit words")
    return int(np.bitwise_xor.reduce(a.view(np.uint32))) if a.size else 0


def _add_probes(fns: dict, nbytes: dict, regs, K: int, N: int) -> int:
    """fns[name] for each of PROBES: the span probe (lutspan's 1024 x 1 grid and walk -- or a contiguous run of chunks
    per warp, or 4 waves of blocks -- with 1 / 2 chunks in flight per warp, the codes alone or with the slots), and
    for each of FLAT and cuBLAS the same bytes read by a yardstick; each first checked (the probes and FLAT to XOR
    every word they read once, cuBLAS against float64); nbytes[name] = the bytes it reads. Returns the number that
    failed its check."""
    import torch
    from harness.benchmarks.matmul import read_ref_n
    from native.lowbit_lut import SPAN_COLS, span_nbx
    words, sz = regs.pw.span
    xor_codes, xor_slots = layout_xor(words), layout_xor(sz)
    bad = 0
    for name, (ahead, contig, waves, slots) in PROBES.items():
        want = xor_codes ^ (xor_slots if slots else 0)
        nbx = min(-(-N // SPAN_COLS), waves * span_nbx(K, N, regs.sms, 1))
        out = torch.zeros(1, dtype=torch.int32, device=words.device)
        regs.mod.lowbit_lut_span_probe(words, sz, out, K, nbx, ahead, contig, slots)
        got = int(out.item()) & 0xFFFFFFFF
        ok = got == want
        bad += not ok
        walk = "a contiguous run" if contig else "lutspan walk"
        print(f"  {name:9s} xor {got:08x} (want {want:08x}) {'ok' if ok else 'FAIL'} | 1024 threads, grid {nbx} x "
              f"spans, {ahead} chunk(s) in flight per warp, {walk}, {'codes and slots' if slots else 'codes only'}, "
              "no lookups", flush=True)
        if ok:
            fns[name] = (lambda _x, o=out, n=nbx, a=ahead, c=contig, s=slots:
                         regs.mod.lowbit_lut_span_probe(words, sz, o, K, n, a, c, s))
            nbytes[name] = words.nbytes + (sz.nbytes if slots else 0)
    want = xor_codes ^ xor_slots
    for name, (per_sm, threads) in FLAT.items():
        out = torch.zeros(1, dtype=torch.int32, device=words.device)
        regs.mod.stream_read_xor(words, sz, out, per_sm * regs.sms, threads)
        got = int(out.item()) & 0xFFFFFFFF
        ok = got == want
        bad += not ok
        print(f"  {name:9s} xor {got:08x} (want {want:08x}) {'ok' if ok else 'FAIL'} | the same bytes read flat, "
              f"{per_sm * regs.sms} x {threads} threads, 16-byte loads, 4 in flight per thread", flush=True)
        if ok:
            fns[name] = lambda _x, o=out, b=per_sm * regs.sms, t=threads: regs.mod.stream_read_xor(words, sz, o, b, t)
            nbytes[name] = words.nbytes + sz.nbytes
    n = read_ref_n(words.nbytes + sz.nbytes, K)
    g = torch.Generator(device="cuda").manual_seed(K + n)
    w = (torch.randn(K, n, generator=g, device="cuda") / K ** 0.5).half()
    x = torch.randn(1, K, generator=g, device="cuda").half()
    ref = x.double() @ w.double()
    e = float((torch.matmul(x, w).double() - ref).norm() / ref.norm())
    ok = e < 2e-3
    bad += not ok
    print(f"  cublas    err {e:.2e} {'ok' if ok else 'FAIL'} | cuBLAS f16 x[1,{K}] @ W[{K},{n}] (the same bytes)",
          flush=True)
    if ok:
        fns["cublas"] = lambda _x: torch.matmul(x, w)
        nbytes["cublas"] = w.nbytes
    return bad


if __name__ == "__main__":
    sys.exit(main())
