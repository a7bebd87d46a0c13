"""Run one suite kernel under Proton's intra-kernel instrumentation and write its profile.

    from kernels.suite import SUITE
    from kernels.suite.proton_run import profile_case
    path = profile_case(SUITE["matmul"], inputs, "out/matmul", data="tree")    # -> out/matmul.hatchet
    path = profile_case(SUITE["matmul"], inputs, "out/matmul", data="trace")   # -> out/matmul.chrome_trace

Needs a CUDA GPU (Proton's instrumentation backend); raises kernels.Unavailable otherwise.

Timing note (measured on the H200, Triton 3.6): inside an instrumentation session every launch is
followed by synchronous host-side processing of the profile buffer (0.2-1.7 s per launch at "llm"
size), so CUDA events around a launch measure that, not the kernel. Time the instrumented kernel by its
CUPTI device duration instead (torch.profiler inside the session works). Once torch.profiler has
subscribed CUPTI in a process, proton.start(backend="cupti") in that process fails
(cuptiSubscribe error 39): keep the two in separate processes or use only one of them.
"""
from __future__ import annotations

import glob
import os

from kernels import Unavailable
from ._common import interpreting


def profile_case(case, inputs, path_stem: str, *, mode=None, data: str = "tree", warmup: bool = True) -> str:
    """Launch case.run(inputs, instrument=True) inside a Proton instrumentation session.
    mode: None (Proton default) or a proton_modes.make_mode(...) value. data: "tree" | "trace".
    Returns the path of the file Proton wrote."""
    import torch
    if interpreting() or not torch.cuda.is_available():
        raise Unavailable("Proton instrumentation needs a CUDA GPU (not the Triton interpreter)")
    import triton.profiler as proton
    import triton.profiler.language as pl
    pl.enable_semantic("triton")
    if warmup:  # compile the uninstrumented variant outside the session
        case.run(inputs, instrument=False)
        torch.cuda.synchronize()
    d = os.path.dirname(path_stem)
    if d:
        os.makedirs(d, exist_ok=True)
    before = set(glob.glob(path_stem + "*"))
    proton.start(path_stem, backend="instrumentation", mode=mode, data=data)
    try:
        case.run(inputs, instrument=True)
        torch.cuda.synchronize()
    finally:
        proton.finalize()
    new = sorted(set(glob.glob(path_stem + "*")) - before) or sorted(glob.glob(path_stem + "*"))
    if not new:
        raise RuntimeError(f"Proton wrote no file for {path_stem}")
    return new[-1]
