"""How fast one call can read N bytes under the harness's timer (L2 flush, CUDA events): the practical ceiling that
issue 13's floor (bytes over a 4 GiB read's rate) leaves out (native/NOTES.md section 37).

Readers, each checked before it is timed, all timed in alternating rounds at every size:
  flat1 / flat8  the plainest fast reader (native `stream_read_xor`: flat 16-byte loads, 4 in flight per thread) at
                 one wave of 1024-thread blocks / 8 blocks of 256 threads per SM, checked by the XOR of every word;
  cublas         cuBLAS f16 GEMV, x[1, 8192] @ W[8192, N'] with W of as many bytes (the harness's read_ref shape),
                 checked against float64.
Per reader a least-squares fit t = fixed + bytes / rate over the sizes, and each time as a fraction of the floor.

    python -m native.read_ceiling [--mb 8,16,32,64,128,256,512,1024,2048] [--samples 40] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from native.lut_tune import check_run_args, layout_xor

DEFAULT_MB = "8,16,32,64,128,256,512,1024,2048"
MAX_MB = 4096
K_REF = 8192   # the cuBLAS reference's depth (the tilus_fig10 / fig11 K)
FLAT = {"flat1": (1, 1024), "flat8": (8, 256)}   # name -> (blocks per SM, threads per block)


def parse_sizes(text: str) -> list[int]:
    """"8,16,..." (MB, 1e6 bytes) -> sorted distinct sizes; ValueError naming the offending entry."""
    out = set()
    for s in (q.strip() for q in text.split(",") if q.strip()):
        try:
            mb = int(s)
        except ValueError:
            raise ValueError(f"size {s!r}: expected a whole number of MB") from None
        if not 1 <= mb <= MAX_MB:
            raise ValueError(f"size {mb} MB: outside 1 .. {MAX_MB}")
        out.add(mb)
    if not out:
        raise ValueError("no sizes")
    return sorted(out)


def half_words(mb: int) -> int:
    """int32 words in each of the reader's two buffers for a size of `mb` MB in all: whole 16-byte words, together at
    least mb * 1e6 bytes (exactly, where mb * 1e6 is a multiple of 32)."""
    return 4 * -(-mb * 10**6 // 32)


def fit(nbytes: list[float], us: list[float]) -> tuple[float, float]:
    """Least squares t = fixed + bytes / rate over the points: (fixed us, rate TB/s); rate inf for a flat line.
    Needs two distinct sizes."""
    import numpy as np
    x, y = np.asarray(nbytes, dtype=float), np.asarray(us, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("a fit needs at least two distinct sizes")
    slope, fixed = np.polyfit(x, y, 1)   # us per byte, us
    return float(fixed), (float("inf") if slope <= 0 else 1e-6 / slope)   # 1 / slope bytes per us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default=DEFAULT_MB, help="sizes in MB (1e6 bytes), comma separated")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="alternating timing rounds")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        sizes = parse_sizes(a.mb)
    except ValueError as e:
        ap.error(str(e))
    if len(sizes) < 2:
        ap.error("--mb: at least two sizes (the fit)")
    check_run_args(ap, a)
    import torch
    if not torch.cuda.is_available():
        print("native.read_ceiling: no CUDA GPU visible", file=sys.stderr)
        return 2
    from harness.benchmarks.matmul import read_ref_n
    from harness.timing import Timer, measure_read_bandwidth
    from kernels import Unavailable
    from native.build import build
    try:
        mod = build()
    except Unavailable as e:
        print(f"native.read_ceiling: {e}", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    timer = Timer(samples=a.samples)
    bw = measure_read_bandwidth(timer)
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, 4 GiB read {bw:.2f} TB/s (the floor's rate)", flush=True)
    rows, bad = [], 0
    for mb in sizes:
        words = half_words(mb)
        g = torch.Generator(device="cuda").manual_seed(mb)
        buf = torch.randint(-2**31, 2**31 - 1, (2 * words,), generator=g, device="cuda", dtype=torch.int32)
        lo, hi = buf[:words], buf[words:]
        want, nbytes = layout_xor(buf), buf.nbytes
        fns = {}
        for name, (per_sm, threads) in FLAT.items():
            out = torch.zeros(1, dtype=torch.int32, device="cuda")
            mod.stream_read_xor(lo, hi, out, per_sm * sms, threads)
            got = int(out.item()) & 0xFFFFFFFF
            bad += got != want
            if got == want:
                fns[name] = lambda o=out, b=per_sm * sms, t=threads: mod.stream_read_xor(lo, hi, o, b, t)
            else:
                print(f"  {mb} MB {name}: xor {got:08x}, want {want:08x}: FAIL, not timed", flush=True)
        n = read_ref_n(nbytes, K_REF)
        w = (torch.randn(K_REF, n, generator=g, device="cuda") / K_REF ** 0.5).half()
        x = torch.randn(1, K_REF, generator=g, device="cuda").half()
        ref = x.double() @ w.double()
        e = float((torch.matmul(x, w).double() - ref).norm() / ref.norm())
        del ref
        bad += not e < 2e-3
        if e < 2e-3:
            fns["cublas"] = lambda: torch.matmul(x, w)
        else:
            print(f"  {mb} MB cublas: error {e:.2e}: FAIL, not timed", flush=True)
        res = {k: [] for k in fns}
        for _ in range(a.rounds):
            for k, f in fns.items():
                res[k].append(timer(f))
        floor_us = nbytes / (bw * 1e12) * 1e6
        line = [f"{nbytes / 1e6:7.1f} MB floor {floor_us:7.1f} us"]
        for k, ts in res.items():
            med = statistics.median(t.median_ms * 1e3 for t in ts)
            by = w.nbytes if k == "cublas" else nbytes
            line.append(f"{k} {med:7.1f} us ({100 * by / (bw * 1e12) * 1e6 / med:4.0f}%)")
            rows.append(dict(mb=mb, reader=k, bytes=by, floor_us=by / (bw * 1e12) * 1e6, median_us=med,
                             rounds_us=[t.median_ms * 1e3 for t in ts], p10_us=[t.p10_ms * 1e3 for t in ts],
                             p90_us=[t.p90_ms * 1e3 for t in ts]))
        print("  " + " | ".join(line), flush=True)
        del buf, lo, hi, w, x, fns
        torch.cuda.empty_cache()
    fits = {}
    for k in {r["reader"] for r in rows}:
        pts = [r for r in rows if r["reader"] == k]
        if len({r["bytes"] for r in pts}) >= 2:
            fixed, rate = fit([r["bytes"] for r in pts], [r["median_us"] for r in pts])
            fits[k] = dict(fixed_us=fixed, rate_tbs=rate)
            print(f"  fit {k}: t = {fixed:.1f} us + bytes / {rate:.2f} TB/s ({100 * rate / bw:.0f}% of the 4 GiB "
                  f"read's rate)", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), read_bw_tbs=bw, rows=rows, fits=fits), fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
