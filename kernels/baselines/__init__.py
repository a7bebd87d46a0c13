"""Baseline implementations of the weight-only low-bit matmul y = x @ dequant(W).

Every baseline is a ``Baseline`` in ``BASELINES``:

* ``supports(fmt_name, group_size, act_dtype) -> None | str``: cheap static check
  (no GPU, no package import), the reason when unsupported;
* ``prepare(qw, act_dtype) -> callable(x) -> y[M, N]``: all repacking, compiling and
  tuning of the first batch size happen here; raises ``kernels.Unsupported`` for a
  problem it cannot compute and ``kernels.Unavailable`` when its package or GPU is
  missing (packages are imported lazily, inside prepare);
* ``tolerance``: relative Frobenius error against the float64 reference
  (``kernels.lowbit.formats.dequantize_ref``) that its output must meet.

``qw`` is a ``kernels.lowbit.formats.QuantizedWeight``; x is [M, K] in the
activation dtype on the GPU. Pure compute: nothing here knows about the harness.
"""
from dataclasses import dataclass, field
from typing import Callable, Optional

from kernels import Unavailable, Unsupported  # noqa: F401  (re-exported for callers)
from kernels.baselines import external, fp8, gemlite_baseline, tilus_baseline, torch_int4


@dataclass(frozen=True)
class Baseline:
    name: str
    prepare: Callable
    supports: Callable[..., Optional[str]]
    tolerance: float
    description: str = field(default="", compare=False)


prepare_tilus = tilus_baseline.prepare_tilus
prepare_torch_int4 = torch_int4.prepare_torch_int4
prepare_fp8 = fp8.prepare_fp8
prepare_gemlite = gemlite_baseline.prepare_gemlite
prepare_marlin = external.make_prepare("marlin")
prepare_bitblas = external.make_prepare("bitblas")
prepare_quantllm = external.make_prepare("quantllm")

BASELINES: dict = {
    b.name: b
    for b in [
        Baseline("tilus", prepare_tilus, tilus_baseline.supports, tilus_baseline.TOLERANCE,
                 "weight-only matmul written in Tilus 0.2.0 (ours): u1-u8, i2-i8, small floats"),
        Baseline("torch_int4", prepare_torch_int4, torch_int4.supports, torch_int4.TOLERANCE,
                 "torch._weight_int4pack_mm (tinygemm), u4/i4, bf16"),
        Baseline("fp8", prepare_fp8, fp8.supports, fp8.TOLERANCE,
                 "torch._scaled_mm, fp8 weights AND fp8-quantized activations (changes the math)"),
        Baseline("gemlite", prepare_gemlite, gemlite_baseline.supports, gemlite_baseline.TOLERANCE,
                 "gemlite 0.6 A16Wn Triton kernels, 8/4/2/1-bit integers"),
        Baseline("marlin", prepare_marlin, external.make_supports("marlin"), external.TOLERANCE,
                 external.PACKAGES["marlin"][1]),
        Baseline("bitblas", prepare_bitblas, external.make_supports("bitblas"), external.TOLERANCE,
                 external.PACKAGES["bitblas"][1]),
        Baseline("quantllm", prepare_quantllm, external.make_supports("quantllm"), external.TOLERANCE,
                 external.PACKAGES["quantllm"][1]),
    ]
}

__all__ = ["Baseline", "BASELINES"] + [f"prepare_{n}" for n in
                                      ("tilus", "torch_int4", "fp8", "gemlite", "marlin", "bitblas", "quantllm")]
