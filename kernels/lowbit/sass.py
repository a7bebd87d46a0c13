"""Instruction mix of the low-bit kernel's main loop, compiled for sm_90 without a GPU.

    python -m kernels.lowbit.sass u4 dot:n64k128s1w4p3 [--group 128] [--json]

Compiles ``triton_matmul._mm_small_kernel`` for one weight format and config with Triton's
bundled ptxas (target sm_90, arguments 16-byte aligned as at run time), disassembles it with
the bundled cuobjdump and reports the instructions of the innermost loop: the count per
weight is what NOTES.md's issue-rate arithmetic uses.  Needs TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch


def _bin_dir() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_sm90(name: str, cfg, group: int = 128):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.lowbit import packed
    from kernels.lowbit import triton_matmul as tm
    from kernels.lowbit.formats import random_quantized

    qw = random_quantized(256, 64, name, group, torch.float16, seed=0)
    pw = tm.prepare(qw)
    words = {1: "*i8", 2: "*i16", 4: "*i32"}
    pb = list(pw.part_bits) + [pw.part_bits[0]] * (3 - len(pw.part_bits))
    sig = {"x_ptr": "*fp16", "p0": words[pb[0]], "p1": words[pb[1]], "p2": words[pb[2]], "s_ptr": "*fp16",
           "z_ptr": "*fp16", "MAGIC": "i32", "y_ptr": "*fp16", "M": "i32", "N": "i32", "KW": "i32",
           "stride_xm": "i32", "stride_ym": "i32"}
    asm = ""
    if cfg.x2 and packed.supported(pw.fmt.kind, pw.fmt.bits):
        asm = (packed.asm if cfg.path == "dot" else packed.asm_dot8)(pw.fmt.kind, pw.fmt.bits)
    consts = dict(tm._consts(pw), TN=tm.LAYOUT_TN, TKW=tm.LAYOUT_TKW, G=group if group > 0 else 8192, PACKED=bool(asm), ASM=asm,
                  BM=cfg.bm if cfg.path == "dot" else 1, BN=cfg.bn, BK=cfg.bk, KSPLIT=8192,
                  USE_DOT=cfg.path == "dot", XW=cfg.xw, ATOMIC=False, INTERP=False)
    sig.update({k: "constexpr" for k in consts})
    names = list(sig)
    aligned = ["x_ptr", "p0", "p1", "p2", "s_ptr", "z_ptr", "y_ptr", "N", "KW", "stride_xm", "stride_ym"]
    src = ASTSource(tm._mm_small_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.warps, "num_stages": cfg.stages})


def main_loop(sass: str) -> list:
    """Opcodes of the longest backward-branch loop (the K loop)."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = [(int(m.group(1), 16), a) for a, t in ins for m in [re.search(r"BRA (0x[0-9a-f]+)", t)]
             if m and int(m.group(1), 16) < a]
    lo, hi = max(loops, key=lambda l: l[1] - l[0])
    return [t.split()[1] if t.startswith("@") else t.split()[0] for a, t in ins if lo <= a <= hi]


def loop_stats(name: str, cfg, group: int = 128) -> dict:
    k = compile_sm90(name, cfg, group)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(_bin_dir() / "cuobjdump"), "-sass", str(p)], capture_output=True,
                              text=True, check=True).stdout
    body = main_loop(sass)
    per_thread = cfg.bn * cfg.bk // (32 * cfg.warps)
    return {"format": name, "config": str(cfg), "instructions": len(body), "weights_per_thread": per_thread,
            "per_weight": len(body) / per_thread, "shared_bytes": k.metadata.shared,
            "ops": dict(collections.Counter(body).most_common())}


def main(argv=None):
    from kernels.lowbit.triton_matmul import parse_config
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format")
    ap.add_argument("config")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    st = loop_stats(a.format, parse_config(a.config), a.group)
    if a.json:
        print(json.dumps(st))
    else:
        print(f"{st['format']} {st['config']}: {st['instructions']} instructions per iteration, "
              f"{st['weights_per_thread']} weights per thread -> {st['per_weight']:.2f} per weight, "
              f"{st['shared_bytes']} B shared")
        print(", ".join(f"{k} {v}" for k, v in list(st["ops"].items())[:20]))


if __name__ == "__main__":
    main()
