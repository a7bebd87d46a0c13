"""Python launchers of the native instrumented CUDA kernels.

    from native import native_kernels as nk
    inputs = nk.make_inputs("matmul", "llm", "cuda", seed=0)       # same inputs as kernels.suite
    out, raw = nk.run("matmul", inputs, instrument=True, buffer_records=2048)
    from native import decode
    prof = decode.decode(raw, nk.SCOPES["matmul"], kernel="native_matmul")

run() returns (output tensor, raw profile buffer as a numpy uint32 array, or None when not
instrumented). Kernels: matmul (fp16 x fp16 -> fp32, M,N % 128 == 0, K % 32 == 0), softmax and
layer_norm (fp16, cols <= 8192), calibrate (inputs {"spin_cycles", "blocks", "threads"}).
Instrumentation modes (native/include/instrument.cuh; the buffer layout is the same in all):
"staged" (default: records batched 16 at a time in registers, one store per lane per batch), "warp0" (only
warp 0 of each block records; the other warps skip the header's work and write nothing), "direct" (every
record stored to global memory by lane 0, the original design);
"staged_v1" the previous staged design (shared-memory batches), for A/B timing.
"""
from __future__ import annotations

import numpy as np

from kernels import Unsupported

# scope id -> name, in id order, matching the enums in native/kernels/*.cu
SCOPES = {
    "matmul": ("loop", "load", "mma", "store"),
    "softmax": ("load", "reduce", "store"),
    "layer_norm": ("load", "stats", "normalize_store"),
    "calibrate": ("spin",),
}
# the low-bit decode kernels (scopes: native.lowbit.SCOPES): name -> the decode variant their inputs default to;
# lowbit_regs is the variant `timed` runs at this point
LOWBIT_KERNELS = {"lowbit": "auto", "lowbit_regs": "regs"}
SCOPES.update({k: ("wait", "compute", "output") for k in LOWBIT_KERNELS})
# the low-bit decode kernel's case: u4, group 128, f16, M = 1 (tilus_fig10's gate_up shape at llm size)
LOWBIT_SHAPES = {"tiny": (1, 256, 256), "llm": (1, 8192, 57344)}   # M, K, N
KERNEL_NAMES = {k: f"native_{k}" for k in SCOPES}
_SUITE_NAME = {"matmul": "matmul", "softmax": "fused_softmax", "layer_norm": "layer_norm"}
THREADS = {"matmul": 256, "softmax": 256, "layer_norm": 256}
MODES = {"direct": 0, "staged": 1, "warp0": 2}   # INSTR_MODE_* of instrument.cuh
# staged mode with parts of the header left out (INSTR_DIAG_* of instrument.cuh): timing only, their
# buffers do not decode (native/instr_diag.py takes the header's cost apart with them)
DIAG_MODES = {"staged_nostore": 0x11, "staged_nogtime": 0x21, "staged_norecord": 0x41, "staged_bare": 0x71}
# the previous staged design (INSTR_OPT_V1: instrument_v1.cuh), to time beside "staged" in one run (native.instr_diag);
# its buffer is staged's (same words, same decoder).  To be dropped once measured.
AB_MODES = {"staged_v1": 0x101}


def suite_case(name: str):
    from kernels.suite import SUITE
    return SUITE[_SUITE_NAME[name]]


def make_inputs(name: str, size: str, device, seed: int = 0, variant: str | None = None) -> dict:
    """Inputs for a native kernel: the suite case's inputs ('tiny' is too small for matmul tiles;
    use size='llm' or build your own multiples of 128).  variant (lowbit only): the decode variant
    (native.lowbit.VARIANT_CHOICES; default auto: the instrumentation study keeps one fixed kernel, not the
    per-shape timed choice of the harness's `native` rows)."""
    if name == "calibrate":
        return {"spin_cycles": 1_000_000, "blocks": 264, "threads": 128}
    if name in LOWBIT_KERNELS:
        import torch
        from kernels.lowbit.formats import random_quantized
        from native import lowbit
        variant = variant or LOWBIT_KERNELS[name]
        if variant not in lowbit.VARIANT_CHOICES:
            raise ValueError(f"decode variant {variant!r}: one of {list(lowbit.VARIANT_CHOICES)}")
        M, K, N = LOWBIT_SHAPES[size]
        qw = random_quantized(K, N, "u4", 128, torch.float16, seed=seed, device=device)
        g = torch.Generator(device=device).manual_seed(seed + 1)
        return {"weight": qw, "x": torch.randn(M, K, generator=g, device=device).to(torch.float16),
                "variant": variant}
    return suite_case(name).make_inputs(size, device, seed)


def reference(name: str, inputs: dict):
    if name in LOWBIT_KERNELS:
        from kernels.lowbit.formats import dequantize_ref
        qw = inputs["weight"]
        return inputs["x"].double() @ dequantize_ref(qw, device=qw.packed.device)
    return suite_case(name).reference(inputs)


def lowbit_fn(inputs: dict):
    """The prepared native low-bit matmul of a 'lowbit' input dict (packed and built once, cached in it)."""
    if "fn" not in inputs:
        import torch
        from native import lowbit
        # the inputs' decode variant (default auto: bulk for u4 since 2 Dec 2026, lean before); its instrumented
        # build is the same variant (profiled() runs variant_num(M, prof=True)). Until 1 Dec 2026 the instrumented
        # build was base only while the plain call ran lean, so the overhead ratio held lean's speedup too
        # (0.0933 / 0.0773 ms = 1.21x on the H200, against 1.12x when both were base)
        inputs["fn"] = lowbit.prepare(inputs["weight"], torch.float16, M=inputs["x"].shape[0],
                                      variant=inputs.get("variant", "auto"))
    return inputs["fn"]


def buffer_words(name: str, inputs: dict, buffer_records: int, mode: str = "staged") -> tuple[int, int, int]:
    """(total uint32 words, blocks, warps per block) of the profile buffer for this launch (mode: the low-bit
    kernel's grid depends on its instrumented build's occupancy)."""
    from native.decode import block_words
    if name == "matmul":
        m, n = inputs["a"].shape[0], inputs["b"].shape[1]
        blocks, warps = (m // 128) * (n // 128), 8
    elif name in ("softmax", "layer_norm"):
        blocks, warps = inputs["x"].shape[0], 8
    elif name == "calibrate":
        blocks, warps = inputs["blocks"], (inputs["threads"] + 31) // 32
    elif name in LOWBIT_KERNELS:
        from native.decode import block_words as bw
        fn = lowbit_fn(inputs)
        words = fn.buffer_words(inputs["x"].shape[0], buffer_records, mode)
        return words, words // bw(8, buffer_records), 8
    else:
        raise Unsupported(f"unknown native kernel {name!r}")
    return blocks * block_words(warps, buffer_records), blocks, warps


def check_capacity(buffer_records: int) -> None:
    """Records per warp of an instrumented launch: at least one register batch and a multiple of 4 (instrument.cuh
    INSTR_MIN_CAPACITY, INSTR_CAPACITY_ALIGN: whole 32-byte sectors per store), which the launchers enforce too."""
    from native.decode import CAPACITY_ALIGN, MIN_CAPACITY
    if isinstance(buffer_records, bool) or not isinstance(buffer_records, int) or buffer_records < MIN_CAPACITY \
            or buffer_records % CAPACITY_ALIGN:
        raise ValueError(f"buffer_records must be an integer >= {MIN_CAPACITY} (one register batch) and a multiple "
                         f"of {CAPACITY_ALIGN} (whole 32-byte sectors), got {buffer_records!r}")


def fitted_capacity(raw) -> int:
    """The smallest capacity the launchers accept that holds every record of the launch that wrote `raw` (a profile
    buffer of any capacity: each warp header counts the records written, dropped ones too): the most records a warp
    wrote, rounded up to whole register batches (>= INSTR_MIN_CAPACITY, a multiple of INSTR_CAPACITY_ALIGN)."""
    from native.decode import MIN_CAPACITY, warp_record_counts
    counts = warp_record_counts(raw)
    most = int(counts.max()) if counts.size else 0
    return max(MIN_CAPACITY, -(-most // MIN_CAPACITY) * MIN_CAPACITY)


def mode_id(mode: str) -> int:
    ids = {**MODES, **AB_MODES, **DIAG_MODES}
    if mode not in ids:
        raise ValueError(f"unknown instrumentation mode {mode!r}; valid: {sorted(ids)}")
    return ids[mode]


def run(name: str, inputs: dict, instrument: bool = False, buffer_records: int = 1024, *,
        host: bool = True, buffer=None, clear: bool = True, mode: str = "staged"):
    """Launch native kernel `name`. With instrument=True the instrumented instantiation writes
    `buffer_records` records per warp (circular) into a profile buffer (allocated here unless
    `buffer`, an int32 cuda tensor of at least buffer_words(...)[0] words, is given; clear=False skips
    zeroing a given buffer -- for timing loops: staged and direct launches rewrite every header and count, but
    warp0's idle warps write nothing, so a buffer to decode must start zeroed).
    Returns (output, raw): raw is a numpy uint32 copy (host=True) or the device tensor (host=False)."""
    import torch
    from native.build import build
    if name not in SCOPES:
        raise Unsupported(f"unknown native kernel {name!r}")
    if instrument:
        check_capacity(buffer_records)
    if name in LOWBIT_KERNELS:
        return _run_lowbit(inputs, instrument, buffer_records, host=host, buffer=buffer, clear=clear, mode=mode)
    mod = build()
    if instrument:
        words, _, _ = buffer_words(name, inputs, buffer_records)
        if buffer is None:
            prof = torch.zeros(words, dtype=torch.int32, device="cuda")
        else:
            if buffer.numel() < words:
                raise ValueError(f"profile buffer too small: {buffer.numel()} < {words} words")
            prof = buffer
            if clear:
                prof[:words].zero_()
    else:
        prof = torch.empty(0, dtype=torch.int32, device="cuda")
    cap = int(buffer_records) if instrument else 0
    md = mode_id(mode)

    if name == "matmul":
        a, b = inputs["a"].contiguous(), inputs["b"].contiguous()
        m, k = a.shape
        n = b.shape[1]
        if m % 128 or n % 128 or k % 32:
            raise Unsupported(f"native matmul needs M, N % 128 == 0 and K % 32 == 0, got {m}x{n}x{k}")
        out = torch.empty((m, n), dtype=torch.float32, device=a.device)
        mod.matmul(a, b, out, prof, cap, md)
    elif name == "softmax":
        x = inputs["x"].contiguous()
        if x.shape[1] > 8192:
            raise Unsupported("native softmax supports cols <= 8192")
        out = torch.empty_like(x)
        mod.softmax(x, out, prof, cap, md)
    elif name == "layer_norm":
        x = inputs["x"].contiguous()
        if x.shape[1] > 8192:
            raise Unsupported("native layer_norm supports cols <= 8192")
        out = torch.empty_like(x)
        mod.layer_norm(x, inputs["weight"].contiguous(), inputs["bias"].contiguous(), out, float(inputs["eps"]),
                       prof, cap, md)
    else:  # calibrate
        out = torch.zeros(inputs["blocks"], dtype=torch.int64, device="cuda")
        mod.calibrate(int(inputs["spin_cycles"]), int(inputs["blocks"]), int(inputs["threads"]), out, prof, cap, md)
    if not instrument:
        return out, None
    if host:
        torch.cuda.synchronize()
        return out, prof[:buffer_words(name, inputs, buffer_records)[0]].cpu().numpy().view(np.uint32)
    return out, prof


def _run_lowbit(inputs: dict, instrument: bool, buffer_records: int, *, host: bool, buffer, clear: bool, mode: str):
    """The low-bit decode kernel (native/lowbit.py): its instrumented builds are lowbit.PROF_MODES (profiled raises
    Unsupported for another mode)."""
    import torch
    fn = lowbit_fn(inputs)
    if not instrument:
        return fn(inputs["x"]), None
    out, prof = fn.profiled(inputs["x"], buffer_records, buffer=buffer, clear=clear, mode=mode)
    if host:
        torch.cuda.synchronize()
        return out, prof.cpu().numpy().view(np.uint32)
    return out, prof
