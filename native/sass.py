"""Instruction mix of the native low-bit decode kernel's main loop, compiled for sm_90a without a GPU.

    python -m native.sass f16_u4 f16_u1 f16_f6e3m2 [--json]

Compiles the recipes' decode instantiations with the local nvcc and LOWBIT_SASS_STEADY (the
range-end output code compiled out, one group flush per stage: the executed path of a stage for
group sizes >= the stage depth), disassembles them with the cuobjdump that Triton bundles and
counts the longest loop's instructions per weight (a lane dequantizes KSTEP weights per stage:
KSTEP/32 chunks x 16 pairs x 2; the regs variant's loop, lowbit_regs.cuh, holds its ring's D stages).
The same arithmetic as kernels/lowbit/sass.py; native/NOTES.md uses these numbers.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

from native import build
from native import lowbit
from native import lowbit_layout as LL


def weights_per_lane(kstep: int) -> int:
    """Weights one thread dequantizes per stage: kstep/32 chunks x 16 pairs x 2."""
    return kstep // LL.KG * LL.PAIRS * 2


def regs_depth(bits: int, kstep: int, mt: int = 1) -> int:
    """Register stages of the regs variant's ring (native/include/lowbit_regs.cuh regs_depth): ~48 words per lane at
    one tile, ~32 at two, 2 to 4 stages."""
    return min(4, max(2, (32 if mt == 2 else 48) // (kstep // LL.KG * bits)))


def _cuobjdump() -> str:
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def main_loop(sass: str) -> list:
    """Opcodes of the longest backward-branch loop (branches placed after the first EXIT are left out: ptxas puts
    the retry of an mbarrier wait there, as a stub that jumps back into the middle of the loop)."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    end = next((a for a, t in ins if re.match(r"(@!?U?P\w+\s+)?EXIT\b", t)), None)
    loops = [(int(m.group(1), 16), a) for a, t in ins for m in [re.search(r"BRA (0x[0-9a-f]+)", t)]
             if m and int(m.group(1), 16) < a and (end is None or a < end)]
    lo, hi = max(loops, key=lambda l: l[1] - l[0])
    return [(t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0] for a, t in ins if lo <= a <= hi]


def compile_sass(src: Path, out_dir: Path, flags=()) -> tuple[list, str]:
    """`src` compiled for sm_90a with the extension's flags (and `flags`) into a cubin in `out_dir`, disassembled:
    [(mangled function name, its SASS text)] and ptxas' messages (stderr)."""
    cub = Path(out_dir) / (Path(src).stem + ".cubin")
    p = subprocess.run([build.find_nvcc(), build.GENCODE, *build.NVCC_FLAGS, *flags, "-cubin", str(src), "-o", str(cub)],
                       check=True, capture_output=True, text=True)
    sass = subprocess.run([_cuobjdump(), "-sass", str(cub)], capture_output=True, text=True, check=True).stdout
    return [(f.split("\n")[0].strip(), f) for f in re.split(r"\n\s*Function : ", sass)[1:]], p.stderr


def available() -> bool:
    """Whether the SASS counters can run here: the local nvcc and the cuobjdump Triton bundles."""
    return build.find_nvcc() is not None and Path(_cuobjdump()).exists()


def loop_stats(recipes, tmp: Path | None = None) -> list:
    recs = {r.name: r for r in LL.all_recipes()}
    out = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(tmp or d)
        src = d / "sass_check.cu"
        src.write_text('#include "lowbit_launch.cuh"\n' + "".join(f"LOWBIT_DEFINE(rec_{r})\n" for r in recipes))
        funcs, _ = compile_sass(src, d, [*build.extra_flags(), "-DLOWBIT_SASS_STEADY"])
    for name, f in funcs:
        m = re.search(r"lowbit_gemv_kernelINS_\d+rec_(\w+?)ELi(\d)ELb([01])ELb([01])ELb([01])E(?:Li(\d)E)?(?:Li(\d)E)?"
                      r"(?:Li(\d)E)?", name)
        # regs: f16 out; the last template argument of both kernels is FC (lowbit_kernel.cuh group_ends: 0 = the
        # stage's group ends read at run time, else known at compile time)
        r = re.search(r"lowbit_regs_kernelINS_\d+rec_(\w+?)ELi(\d)ELb([01])ELi(\d)ELi(\d)E", name)
        if m:
            rec, stages = recs[m.group(1)], 1
            s = {"mt": int(m.group(2)), "out_bf16": m.group(3) == "1", "xsplit": m.group(4) == "1",
                 "prof": m.group(5) == "1", "variant": int(m.group(6) or 0), "prof_mode": int(m.group(7) or 1),
                 "fc": int(m.group(8) or 0)}
        elif r:   # its loop is unrolled by the register ring's depth: that many stages per iteration
            rec = recs[r.group(1)]
            stages = regs_depth(rec.bits, rec.kstep, int(r.group(2)))
            s = {"mt": int(r.group(2)), "out_bf16": False, "xsplit": False, "prof": r.group(3) == "1",
                 "variant": lowbit.REGS, "prof_mode": int(r.group(4)), "fc": int(r.group(5))}
        else:
            continue
        body = main_loop(f)
        wpl = weights_per_lane(rec.kstep) * stages
        out.append({"recipe": rec.name, **s, "instructions": len(body), "stages_per_loop": stages,
                    "weights_per_lane": wpl, "per_weight": len(body) / wpl,
                    "dequant_per_weight": rec.deq_cost()["per_weight"],
                    "ops": dict(collections.Counter(body).most_common())})
    return sorted(out, key=lambda s: (s["recipe"], s["mt"], s["xsplit"], s["prof"], s["variant"], s["prof_mode"],
                                      s["fc"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="+", help="recipe names, e.g. f16_u4 bf16_u8 (native/lowbit_layout.py)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    known = {r.name for r in LL.all_recipes()}
    bad = [r for r in a.recipes if r not in known]
    if bad:
        print(f"config error: unknown recipes {bad}; known: {', '.join(sorted(known))}")
        return 2
    if not available():
        print("unavailable: needs nvcc and the cuobjdump Triton bundles")
        return 2
    for s in loop_stats(a.recipes):
        if a.json:
            print(json.dumps(s))
            continue
        prof = (" prof" + (" warp0" if s["prof_mode"] == 2 else "")) if s["prof"] else ""
        tag = (f"{s['recipe']} mt{s['mt']}{' xsplit' if s['xsplit'] else ''}{prof}"
               f"{' v' + str(s['variant']) if s['variant'] else ''}{' fc' + str(s['fc']) if s['fc'] else ''}")
        print(f"{tag}: {s['instructions']} instructions per loop ({s['stages_per_loop']} stages) / "
              f"{s['weights_per_lane']} weights per lane = "
              f"{s['per_weight']:.2f} per weight (dequantization {s['dequant_per_weight']:.2f})")
        print("   ", ", ".join(f"{k} {v}" for k, v in list(s["ops"].items())[:16]))


if __name__ == "__main__":
    raise SystemExit(main())
