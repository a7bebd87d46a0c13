"""One registration per weight-only matmul implementation (as tritonbench's ``@register_benchmark``).

Each implementation registers, in one place, beside its code::

    @register("gemlite", supports=supports, tolerance=2e-2, packages=("gemlite",))
    def prepare_gemlite(qw, act_dtype, **hints): ...

* ``supports(case) -> None | str``: what it can compute, asked once per point at plan time
  (no GPU, no package import); the string is the reason it cannot;
* ``tolerance``: relative Frobenius error against the float64 reference its output must meet
  (None: the default for the activation dtype);
* ``packages``: the distributions it imports (their presence and versions: ``env_key``);
* ``dense``: it takes the dense [K, N] weight in the activation dtype, not a ``QuantizedWeight``.

``prepare(weight, act_dtype, M=..., seconds=..., tune_per_path=...) -> fn(x) -> y[M, N]`` does
all repacking, compiling and tuning (``seconds(fn) -> float`` is the caller's timer for
autotuners, None where there is none); it raises ``kernels.Unavailable`` when its package or
GPU is missing and ``kernels.Unsupported`` only for what a package refuses at run time.
``fn`` may carry ``fn.config`` (str) or ``fn.chosen_config(M)``, and ``fn.packed``: the weight in the
implementation's own layout, which does not depend on M; handed back as ``weight``, it prepares another M
without packing again (``triton_lowbit``).

Pure compute: nothing here knows about the harness (harness/impls.py adapts it).
"""
from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Callable, Optional

from kernels import Unsupported


@dataclass(frozen=True)
class Case:
    """What a caller asks an implementation to compute."""
    weight: str               # weight format (u4, i8, f6e3m2, ...) or f16 / bf16 for dense weights
    act: str                  # activation dtype: f16 | bf16
    group_size: int = -1      # -1: one scale per output channel
    K: Optional[int] = None
    N: Optional[int] = None
    M: Optional[int] = None   # None: any batch size


@dataclass(frozen=True)
class Impl:
    name: str
    prepare_fn: Callable
    supports: Callable[[Case], Optional[str]]
    tolerance: Optional[float]
    packages: tuple = ()
    dense: bool = False

    def reason(self, case: Case) -> Optional[str]:
        """None if this implementation can compute ``case``, else why not."""
        return self.supports(case)

    def prepare(self, weight, act_dtype, **hints):
        """Check ``supports`` (the same check the planner made), then prepare."""
        from kernels.baselines._common import act_name

        K, N = (weight.shape if self.dense else (weight.K, weight.N))
        if self.dense:
            case = Case(act_name(weight.dtype), act_name(act_dtype), -1, int(K), int(N), hints.get("M"))
        else:
            case = Case(weight.fmt.name, act_name(act_dtype), weight.group_size, K, N, hints.get("M"))
        why = self.reason(case)
        if why:
            raise Unsupported(why)
        if not self.dense and act_name(weight.act_dtype) != case.act:
            raise Unsupported(f"weight scales are {act_name(weight.act_dtype)}, activations requested {case.act}")
        return self.prepare_fn(weight, act_dtype, **hints)


REGISTRY: dict[str, Impl] = {}


def register(name: str, *, supports: Callable[[Case], Optional[str]], tolerance: Optional[float],
             packages: tuple = (), dense: bool = False):
    """Decorator: register ``prepare`` under ``name`` (one registration per implementation)."""
    def deco(prepare):
        if name in REGISTRY:
            raise ValueError(f"implementation {name!r} is registered twice")
        REGISTRY[name] = Impl(name, prepare, supports, tolerance, tuple(packages), dense)
        return prepare
    return deco


def package_versions(packages) -> str:
    """'gemlite=0.6.0.post2;tilus=missing': presence and version of each distribution."""
    out = []
    for p in packages:
        try:
            out.append(f"{p}={importlib.metadata.version(p)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{p}=missing")
    return ";".join(out)
