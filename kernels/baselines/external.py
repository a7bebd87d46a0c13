"""``marlin``, ``bitblas``, ``quantllm``: kernels from packages we cannot install here.

Each prepare tries to import its package and raises ``Unavailable`` with the reason.
None of them is installable in this project's environments (no wheels for this
torch/CUDA, no package index on the GPU machine), so no adapter is wired; if one
of them does import, prepare says so (still ``Unavailable``) rather than guessing an
API it was never tested against.
"""
import importlib

from kernels import Unavailable
from kernels.baselines._common import act_dtype_of, parse_fmt

TOLERANCE = 2e-2

# name -> (candidate import names, what the kernel covers per its paper/README)
PACKAGES = {
    "marlin": (("marlin",), "Marlin (IST-DASLab): i4/u4 weights, f16 activations, group 128 or per channel"),
    "bitblas": (("bitblas",), "BitBLAS / Ladder (Microsoft): u/i 1..8 bits and some small floats"),
    "quantllm": (("fp6_llm", "quant_llm", "quantllm"),
                 "QuantLLM / FP6-LLM (usyd-fsalab): f6e3m2 and f5e2m2 weights, f16 activations, per channel"),
}

_STATIC = {
    "marlin": lambda f, g, a: None if (f.name in ("u4", "i4") and g in (128, -1)
                                       and act_dtype_of(a) == __import__("torch").float16)
    else "Marlin takes u4/i4 weights, group 128 or per channel, f16 activations",
    "bitblas": lambda f, g, a: None if (act_dtype_of(a) is not None and (f.kind != "float" or f.name in
                                        ("f4e2m1", "f8e4m3", "f8e5m2")))
    else "BitBLAS takes u/i 1..8 bits or f4e2m1/f8e4m3/f8e5m2 weights, f16/bf16 activations",
    "quantllm": lambda f, g, a: None if (f.name in ("f6e3m2", "f5e2m2") and g == -1
                                         and act_dtype_of(a) == __import__("torch").float16)
    else "QuantLLM takes f6e3m2 / f5e2m2 weights, per channel, f16 activations",
}


def make_supports(name):
    def supports(fmt_name, group_size, act_dtype):
        fmt = parse_fmt(fmt_name)
        if fmt is None:
            return f"unknown weight format {fmt_name!r}"
        return _STATIC[name](fmt, group_size, act_dtype)

    return supports


def find_package(name):
    """(module name that imported, None) or (None, reasons)."""
    reasons = []
    for mod in PACKAGES[name][0]:
        try:
            importlib.import_module(mod)
            return mod, None
        except Exception as e:
            reasons.append(f"import {mod}: {type(e).__name__}: {e}")
    return None, "; ".join(reasons)


def make_prepare(name):
    def prepare(qw, act_dtype):
        mod, why = find_package(name)
        if mod is None:
            raise Unavailable(f"{name} is not installed ({why}); {PACKAGES[name][1]}")
        raise Unavailable(f"{name}: package {mod!r} imports, but no adapter is wired for it in this harness yet")

    prepare.__name__ = f"prepare_{name}"
    return prepare
