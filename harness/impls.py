"""The harness's view of the weight-only matmul implementations (kernels.baselines.REGISTRY).

Each implementation is registered once, beside its code, in kernels/baselines (name, what it
supports, tolerance, the packages it needs). This module adapts that registry to the harness:

* ``reason(name, precision, M, K, N)``: why it cannot run a point (None: it may), asked by the
  planner once per point (the point's ``skip_reason``);
* ``get(name)(Problem) -> Prepared(fn, config, tolerance)``: prepares it; everything it does
  (repacking, compiling, autotuning) is outside the timing and reported as prepare time;
* ``env_key(name)``: presence and versions of the packages it needs (part of a point's hash, so
  an ``unavailable`` point is final until the environment changes).

``name`` is a registered name (``triton_lowbit``) or a kernel config name (conf/kernel/<name>.yaml,
``triton``) whose ``impl`` is registered. Adding a kernel: one registered function in
kernels/baselines plus conf/kernel/<name>.yaml (name, impl, description).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels import Unavailable
from kernels.lowbit.formats import ACT_DTYPES
from .specs import CONF_DIR, Precision

TORCH_DTYPES = {k: ACT_DTYPES[k] for k in ("f16", "bf16")}     # the names rows use


@dataclass
class Problem:
    M: int
    K: int
    N: int
    precision: Precision          # the weight format this implementation must compute with
    weight: Any                   # torch.Tensor [K, N] (dense) or kernels.lowbit QuantizedWeight, or the `packed`
                                  # an earlier prepared fn of this weight carries (its layout; triton's)
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


def registry() -> dict:
    from kernels.baselines import REGISTRY
    return REGISTRY


def _kernel_impl(name: str) -> str | None:
    """The impl named by conf/kernel/<name>.yaml, if there is one."""
    path = CONF_DIR / "kernel" / f"{name}.yaml"
    if not path.exists():
        return None
    from omegaconf import OmegaConf
    return str(OmegaConf.load(path).get("impl", name))


def resolve(name: str) -> str:
    """The registered implementation behind a registered or kernel-config name."""
    reg = registry()
    if name in reg:
        return name
    impl = _kernel_impl(name)
    if impl in reg:
        return impl
    raise Unavailable(f"no implementation registered as {name!r}"
                      + (f" (conf/kernel/{name}.yaml names impl {impl!r})" if impl else "")
                      + f"; registered: {sorted(reg)}")


def entry(name: str):
    return registry()[resolve(name)]


def is_dense(name: str) -> bool:
    """True for implementations of dense weights (cuBLAS): beside a low-bit precision they run
    the dense weight of the same shape in the activation dtype."""
    return entry(name).dense


def case(precision: Precision, M: int | None = None, K: int | None = None, N: int | None = None):
    from kernels.baselines import Case
    return Case(precision.weight_dtype, precision.act_dtype, precision.group_size, K, N, M)


def reason(name: str, precision: Precision, M: int | None = None, K: int | None = None,
           N: int | None = None) -> str | None:
    """Why `name` cannot compute this point (None: it may). No GPU work, no package import."""
    return entry(name).reason(case(precision, M, K, N))


def env_key(name: str) -> str:
    """Presence and version of every package `name` needs, e.g. 'gemlite=0.6.0.post2' or
    'tilus=missing;apache-tvm-ffi=missing'; '' for what needs only torch/triton (or an unknown name)."""
    from kernels.baselines import package_versions
    try:
        return package_versions(entry(name).packages)
    except Unavailable:
        return ""


def get(name: str) -> Callable[[Problem], Prepared]:
    """prepare(Problem) -> Prepared for a registered (or kernel-config) name; raises Unsupported
    for a problem outside what it supports (the same check as `reason`), Unavailable where its
    package or GPU is missing."""
    e = entry(name)

    def prepare(p: Problem) -> Prepared:
        fn = e.prepare(p.weight, p.act, M=p.M, seconds=p.seconds, tune_per_path=p.tune_per_path)
        chosen = getattr(fn, "chosen_config", None)
        config = (lambda M: str(chosen(M))) if chosen else getattr(fn, "config", e.name)
        return Prepared(fn, config=config, tolerance=e.tolerance)

    return prepare
