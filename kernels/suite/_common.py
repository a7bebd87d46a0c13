"""Shared pieces of the instrumented Triton kernel suite (pure compute, no harness imports)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernels import Unsupported

SIZES = ("tiny", "llm")


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def profile_flag(instrument: bool) -> bool:
    """Value of the kernels' PROFILE constexpr: Proton scopes raise in the interpreter, so never there."""
    return bool(instrument) and not interpreting()


def check_size(size: str) -> None:
    if size not in SIZES:
        raise Unsupported(f"size {size!r} not in {SIZES}")


def generator(device, seed: int) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    return g


def randn(shape, *, dtype, device, gen, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Random normal data created on `device` (never zeros), then cast."""
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (t * scale + shift).to(dtype)


def compare(out: torch.Tensor, ref: torch.Tensor, tolerance: dict) -> tuple[bool, float]:
    """(within tolerance?, max abs error) comparing in float64 on the output's device."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    if o.shape != r.shape:
        return False, float("inf")
    if o.numel() == 0:
        return True, 0.0
    err = (o - r).abs()
    ok = bool(torch.all(err <= tolerance["atol"] + tolerance["rtol"] * r.abs()).item())
    return ok, float(err.max().item())


@dataclass(frozen=True)
class KernelCase:
    """One kernel of the suite. Every callable is pure compute on torch tensors.

    make_inputs(size, device, seed) -> dict   size in {"tiny", "llm"}
    run(inputs, instrument=False) -> tensor   launches the Triton kernel (PROFILE constexpr = instrument,
                                              forced False under TRITON_INTERPRET=1)
    reference(inputs) -> tensor               torch float32/float64 reference from the same inputs
    flops_bytes(inputs) -> (flops, bytes)     useful work and minimal DRAM traffic of one launch
    """
    name: str
    description: str
    sizes: dict  # size name -> human description of the shape (e.g. which model card it comes from)
    scopes: tuple  # Proton scope names the kernel opens when instrumented
    make_inputs: Callable[..., dict]
    run: Callable[..., Any]
    reference: Callable[[dict], torch.Tensor]
    flops_bytes: Callable[[dict], tuple]
    tolerance: dict = field(default_factory=lambda: {"atol": 1e-2, "rtol": 1e-2})

    def check(self, inputs: dict, out: torch.Tensor | None = None) -> tuple[bool, float]:
        """Run (unless `out` is given) and compare with the reference: (ok, max abs error)."""
        if out is None:
            out = self.run(inputs)
        return compare(out, self.reference(inputs), self.tolerance)


def nbytes(*tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
