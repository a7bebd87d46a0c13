"""Take the native instrumentation header's cost apart (issue 13), ~1 minute on an H200.

    python -m native.instr_diag --json OUT [--kernels matmul,softmax,layer_norm,lowbit_lean,lowbit_bulk,...]
                                [--rounds 3]

For each kernel (proton_fig15's inputs at the 'llm' size) the plain build and the instrumented build in
every mode of native_kernels.MODES, AB_MODES and DIAG_MODES are timed in turn, `--rounds` times, with the
harness's Timer (CUDA events, 256 MB L2 flush, median of `--samples`); each mode's ratio to the plain
time of the same round, and the spread of those ratios over the rounds.  The diagnostic modes leave one
part of the header out (instrument.cuh INSTR_DIAG_*): `staged_nostore` no global stores (every store
issued predicated off, everything it would store computed), `staged_nogtime` no %globaltimer reads,
`staged_norecord` no enter / exit records (begin / end only), `staged_bare` none of the three (the
header's clock reads and end()'s arithmetic only).  So staged - nostore is what the stores' memory traffic
costs, staged - nogtime the timer reads, staged - norecord the in-kernel records, and bare what is left.
`staged_v1` (native_kernels.AB_MODES) is the previous staged design, for the A/B against `staged`.
`lowbit_lean` / `lowbit_bulk` / `lowbit_regs`: the u4 decode (M=1, K=8192, N=57344) in that decode variant,
plain against its instrumented builds (staged and warp0: native.lowbit.PROF_MODES).  Before timing, the plain
output and every mode's output are checked against the float64 reference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

KERNELS = ("matmul", "softmax", "layer_norm", "lowbit_lean", "lowbit_bulk", "lowbit_regs")
# the low-bit decode (u4 M=1, K=8192, N=57344) in a given decode variant; its instrumented builds: lowbit.PROF_MODES
LOWBIT_VARIANTS = {"lowbit_lean": "lean", "lowbit_bulk": "bulk", "lowbit_regs": "regs"}
TOL = 2e-3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--buffer-records", type=int, default=1024)
    a = ap.parse_args(argv)
    from native.tune import _check_json_path
    try:
        _check_json_path(a.json)
        from native.native_kernels import check_capacity
        for flag, v, lo in (("--rounds", a.rounds, 1), ("--samples", a.samples, 1)):
            if v < lo:
                raise ValueError(f"{flag} must be >= {lo}, got {v}")
        try:
            check_capacity(a.buffer_records)
        except ValueError as e:
            raise ValueError(f"--buffer-records: {e}") from None
    except ValueError as e:
        print(f"config error: {e}")
        return 2
    import torch
    from harness.timing import Timer
    from native import native_kernels as nk
    from native.check import rel_err
    from native.lowbit import PROF_MODES as LOWBIT_PROF_MODES
    kernels = [k for k in a.kernels.split(",") if k]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        print(f"unknown kernels {bad}: choose from {KERNELS}")
        return 2
    if not torch.cuda.is_available():
        print("unavailable: needs a CUDA GPU")
        return 2
    t0 = time.time()
    modes = [*nk.MODES, *nk.AB_MODES, *nk.DIAG_MODES]
    timer = Timer(samples=a.samples, warmup_ms=10)
    out = {"modes": modes, "rounds": a.rounds, "samples": a.samples, "buffer_records": a.buffer_records,
           "kernels": {}}
    failed = False
    for name in kernels:
        kname, kmodes, extra = name, modes, {}
        if name in LOWBIT_VARIANTS:
            kname, kmodes, extra = "lowbit", list(LOWBIT_PROF_MODES), {"variant": LOWBIT_VARIANTS[name]}
        inputs = nk.make_inputs(kname, "llm", "cuda", seed=0, **extra)
        ref = nk.reference(kname, inputs).double()
        words, blocks, warps = max(nk.buffer_words(kname, inputs, a.buffer_records, m) for m in kmodes)
        buf = torch.zeros(words, dtype=torch.int32, device="cuda")
        runs = {"plain": lambda: nk.run(kname, inputs)}
        for m in kmodes:
            runs[m] = lambda m=m: nk.run(kname, inputs, True, a.buffer_records, host=False, buffer=buf, clear=False,
                                         mode=m)
        errs = {key: rel_err(fn()[0], ref) for key, fn in runs.items()}
        ok = all(e <= TOL for e in errs.values())
        rec = {"blocks": blocks, "warps": warps, "rel_err": errs, "ok": ok, "ms": {k: [] for k in runs}}
        if ok:
            for _ in range(a.rounds):
                for key, fn in runs.items():
                    rec["ms"][key].append(timer(fn).median_ms)
            plain = rec["ms"]["plain"]
            rec["ratio"] = {}
            for m in kmodes:
                rs = [t / p for t, p in zip(rec["ms"][m], plain)]
                rec["ratio"][m] = {"median": statistics.median(rs), "min": min(rs), "max": max(rs)}
            line = " | ".join(f"{m} {rec['ratio'][m]['median']:.3f} ({rec['ratio'][m]['min']:.3f}-"
                              f"{rec['ratio'][m]['max']:.3f})" for m in kmodes)
            print(f"{name:11s} plain {statistics.median(plain) * 1e3:7.1f} us, {blocks} blocks | {line}", flush=True)
        else:
            failed = True
            print(f"{name}: FAIL rel err {errs}", flush=True)
        out["kernels"][name] = rec
        del buf, inputs, ref
        torch.cuda.empty_cache()
    out["seconds"] = time.time() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"total {out['seconds']:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
