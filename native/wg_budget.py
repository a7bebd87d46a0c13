"""Instruction budget of a wgmma decode loop (M <= 16), compiled for sm_90a without a GPU.

    python -m native.wg_budget [--json]

Compiles native/probes/wgdec_budget.cu (a steady decode loop on wgmma.m64n16k16 with the weights dequantized in
registers, in the modes that file describes) with the local nvcc, disassembles it with the cuobjdump that Triton
bundles, and counts the longest loop's instructions per weight, as native.sass does for the mma.sync decode loops.
The loop holds two stages; a lane dequantizes 32 channels x KSTEP k / 32 lanes = KSTEP weights per stage.  Also
reports the ptxas serialization warnings (C7514) per function, and the wgmma ptxas replaced by placeholders because
their results were dead (none, for a probe that counts what it should).  native/NOTES.md section 40 uses these numbers.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
from pathlib import Path

from native import lowbit_layout as LL
from native.sass import available, compile_sass, main_loop, weights_per_lane

SOURCE = Path(__file__).parent / "probes" / "wgdec_budget.cu"
MODES = {0: "perch", 1: "fold", 2: "scale"}


def loop_stats(tmp: Path | None = None) -> list:
    """One row per (recipe, mode, drain) instantiation of the probe: the loop's instruction count, per weight, the
    opcode mix, and whether ptxas serialized its wgmma."""
    recs = {r.name: r for r in LL.all_recipes()}
    with tempfile.TemporaryDirectory() as d:
        funcs, ptxas = compile_sass(SOURCE, Path(tmp or d), ["-Xptxas", "-v"])
    serialized = set(re.findall(r"C7514\).*?function '(\w+)'", ptxas))
    out = []
    for name, f in funcs:
        m = re.search(r"wgdec_budget_kernelINS_\d+rec_(\w+?)ELi(\d)ELb([01])E", name)
        if not m:
            continue
        rec = recs[m.group(1)]
        body = main_loop(f)
        wpl = 2 * weights_per_lane(rec.kstep)  # two stages per loop
        # wgmma of the tile's shape in the function, and the placeholders ptxas leaves where it found a wgmma's
        # accumulators dead (a probe whose fold lost its result would count too few instructions)
        out.append({"recipe": rec.name, "mode": MODES[int(m.group(2))], "drain": m.group(3) == "1",
                    "instructions": len(body), "weights_per_lane": wpl, "per_weight": len(body) / wpl,
                    "wgmma": len(re.findall(r"HGMMA\.64x16x16\.F32", f)),
                    "dead_wgmma": len(re.findall(r"HGMMA\.\w+\.\w+ RZ, gdesc\[URZ\]", f)),
                    "serialized": name in serialized, "ops": dict(collections.Counter(body).most_common())})
    return sorted(out, key=lambda s: (s["recipe"], s["mode"], s["drain"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not available():
        print("unavailable: needs nvcc and the cuobjdump Triton bundles")
        return 2
    for s in loop_stats():
        if a.json:
            print(json.dumps(s))
            continue
        tag = f"{s['recipe']} {s['mode']}{' drain' if s['drain'] else ''}{' (serialized: C7514)' if s['serialized'] else ''}"
        print(f"{tag}: {s['instructions']} instructions per loop (2 stages) / {s['weights_per_lane']} weights per lane"
              f" = {s['per_weight']:.2f} per weight"
              f" ({s['wgmma']} wgmma m64n16k16, {s['dead_wgmma']} dead)")
        print("   ", ", ".join(f"{k} {v}" for k, v in list(s["ops"].items())[:16]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
