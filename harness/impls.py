"""Weight-only matmul implementations, one registered function each.

An implementation takes a `Problem` (the weight it must use, in our dense or
quantized form) and returns a `Prepared`: a callable y = f(x) plus the chosen
config and the error tolerance it must meet against the float64 reference.
Everything it does before returning (repacking, compiling, autotuning) is outside
the timing and reported as prepare time. Adding a kernel: one function here plus
one conf/kernel/<name>.yaml.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels import Unavailable, Unsupported
from .specs import Precision

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Problem:
    M: int
    K: int
    N: int
    precision: Precision          # the weight format this implementation must compute with
    weight: Any                   # torch.Tensor [K, N] (dense) or kernels.lowbit QuantizedWeight
    device: str
    seconds: Callable[[Callable[[], object]], float] | None = None   # timer handed to autotuners
    tune_per_path: int = 2        # autotune budget: the first n candidates of each kernel path

    @property
    def act(self) -> torch.dtype:
        return TORCH_DTYPES[self.precision.act_dtype]


@dataclass
class Prepared:
    fn: Callable[[torch.Tensor], torch.Tensor]
    config: str | Callable[[int], str] = ""     # or M -> config chosen for that M (after a first call)
    tolerance: float | None = None     # None: the default for the activation dtype

    def config_for(self, M: int) -> str:
        return self.config(M) if callable(self.config) else self.config


IMPLS: dict[str, Callable[[Problem], Prepared]] = {}


def impl(name: str):
    def deco(f):
        IMPLS[name] = f
        return f
    return deco


@impl("cublas")
def cublas(p: Problem) -> Prepared:
    if p.precision.kind != "dense":
        raise Unsupported("cublas runs dense f16/bf16 weights only")
    w = p.weight
    return Prepared(lambda x: torch.matmul(x, w), config="torch.matmul")


@impl("triton_lowbit")
def triton_lowbit(p: Problem) -> Prepared:
    if p.precision.kind == "dense":
        raise Unsupported("triton_lowbit is a low-bit kernel; dense weights run on cublas")
    from kernels.lowbit import triton_matmul as tm
    pw = tm.prepare(p.weight)
    if p.seconds and p.tune_per_path > 0:     # a small recorded space: the first candidates of each path
        cands, per = [], {}
        for c in tm.configs_for(p.M, p.K, p.N, p.weight.fmt, pw.group):
            per[c.path] = per.get(c.path, 0) + 1
            if per[c.path] <= p.tune_per_path:
                cands.append(c)
        x0 = torch.randn(p.M, p.K, dtype=p.act, device=p.device)
        cfg = tm.autotune(x0, pw, p.seconds, cands)
        desc = f"{tm.config_str(cfg)} | tuned: {tm.tuning_summary(p.M, pw)}"
    else:
        cfg = tm.choose_config(p.M, pw)
        desc = tm.config_str(cfg)
    return Prepared(lambda x: tm.lowbit_matmul(x, pw, cfg), config=desc)


def _baseline(name: str):
    def run(p: Problem) -> Prepared:
        from kernels.baselines import BASELINES
        b = BASELINES[name]
        reason = b.supports(p.precision.weight_dtype, p.precision.group_size, p.precision.act_dtype)
        if reason:
            raise Unsupported(reason)
        fn = b.prepare(p.weight, p.act)
        chosen = getattr(fn, "chosen_config", None)
        config = (lambda M: str(chosen(M))) if chosen else getattr(fn, "config", name)
        return Prepared(fn, config=config, tolerance=getattr(b, "tolerance", None))
    return run


def register_baselines() -> None:
    """Register every baseline of kernels.baselines (tilus, gemlite, torch_int4, ...)."""
    try:
        from kernels.baselines import BASELINES
    except ImportError:
        return
    for name in BASELINES:
        IMPLS.setdefault(name, _baseline(name))


def get(name: str) -> Callable[[Problem], Prepared]:
    register_baselines()
    if name not in IMPLS:
        raise Unavailable(f"no implementation registered as {name!r}; registered: {sorted(IMPLS)}")
    return IMPLS[name]
