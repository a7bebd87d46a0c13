"""Weight-only matmul implementations y = x @ dequant(W), one registration each.

``REGISTRY`` (``kernels.baselines.registry``) maps a name to an ``Impl``: what it supports
(``supports(Case)``, asked at plan time), its tolerance against the float64 reference, the
packages it needs, and ``prepare``. Importing this package registers every implementation;
their packages are imported lazily, inside prepare. Pure compute: nothing here knows about
the harness (``harness/impls.py`` adapts it).

``qw`` is a ``kernels.lowbit.formats.QuantizedWeight`` (dense implementations take the [K, N]
weight in the activation dtype); x is [M, K] in the activation dtype.
"""
from kernels import Unavailable, Unsupported  # noqa: F401  (re-exported for callers)
from kernels.baselines.registry import REGISTRY, Case, Impl, package_versions, register  # noqa: F401
from kernels.baselines import (dense, external, fp8, gemlite_baseline, tilus_baseline,  # noqa: F401,E402
                               native_lowbit, torch_int4, triton_lowbit, triton_plain)

__all__ = ["REGISTRY", "Case", "Impl", "register", "package_versions"]
