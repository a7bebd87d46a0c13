"""Map the proton_fig15 sweep axes to the `mode=` argument of
`triton.profiler.start(..., backend="instrumentation", mode=...)` (Triton 3.6 Proton).

Proton parses a mode string "default:key=value:key=value" (see triton/profiler/hooks/instrumentation.py):
  buffer_size   bytes of the per-CTA profile buffer (0 = Proton picks from free shared memory)
  granularity   "warp" (one record stream per warp, the default) or "cta" (one per block); also
                "warp_2/4/8", "warp_group", "warp_group_2/4/8"
  optimizations comma list of "clock32" (32-bit clock reads instead of 64-bit) and "time_shift"
                (subtract the instrumentation's own cost from the timestamps); also "sched_stores"
  buffer_strategy "circular" (default, keep the newest records) or "flush"
  buffer_type   "shared" (default) or "global"
Pure: no triton import unless `as_object=True`.

Measured on the H200 with Triton 3.6.0: granularity="cta" fails to compile for every Triton-DSL kernel
tried (layer_norm, fused_softmax, topk, persistent_matmul: "PassManager::run failed" in
ConvertProtonNvidiaGPUToLLVM); "warp" with clock32 / time_shift / buffer_size work.
"""
from __future__ import annotations

GRANULARITIES = ("cta", "warp", "warp_2", "warp_4", "warp_8", "warp_group", "warp_group_2",
                 "warp_group_4", "warp_group_8")
BUFFER_STRATEGIES = ("circular", "flush")
BUFFER_TYPES = ("shared", "global")


def mode_string(buffer_size: int = 0, granularity: str = "warp", clock32: bool = False,
                time_shift: bool = False, *, buffer_strategy: str = "circular",
                buffer_type: str = "shared", sched_stores: bool = False) -> str:
    """The mode string for proton.start(mode=...). All defaults -> "default" (Proton's default mode)."""
    if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 0:
        raise ValueError(f"buffer_size must be an int >= 0 (bytes, 0 = auto), got {buffer_size!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if buffer_strategy not in BUFFER_STRATEGIES:
        raise ValueError(f"buffer_strategy must be one of {BUFFER_STRATEGIES}, got {buffer_strategy!r}")
    if buffer_type not in BUFFER_TYPES:
        raise ValueError(f"buffer_type must be one of {BUFFER_TYPES}, got {buffer_type!r}")
    parts = ["default"]
    if buffer_size:
        parts.append(f"buffer_size={buffer_size}")
    if granularity != "warp":
        parts.append(f"granularity={granularity}")
    if buffer_strategy != "circular":
        parts.append(f"buffer_strategy={buffer_strategy}")
    if buffer_type != "shared":
        parts.append(f"buffer_type={buffer_type}")
    opts = [name for name, on in (("clock32", clock32), ("time_shift", time_shift),
                                  ("sched_stores", sched_stores)) if on]
    if opts:
        parts.append("optimizations=" + ",".join(opts))
    return ":".join(parts)


def make_mode(buffer_size: int = 0, granularity: str = "warp", clock32: bool = False,
              time_shift: bool = False, *, as_object: bool = False, **extra):
    """mode= argument for proton.start: the string form, or (as_object=True) a
    triton.profiler.mode.Default instance built from the same settings."""
    s = mode_string(buffer_size, granularity, clock32, time_shift, **extra)
    if not as_object:
        return s
    from triton.profiler import mode as _mode  # needs Triton's compiled Proton bindings
    opts = dict(kv.split("=", 1) for kv in s.split(":")[1:])
    kwargs = {"granularity": opts.get("granularity", "warp"),
              "buffer_strategy": opts.get("buffer_strategy", "circular"),
              "buffer_type": opts.get("buffer_type", "shared"),
              "buffer_size": int(opts.get("buffer_size", 0)),
              "optimizations": opts.get("optimizations", "")}
    return _mode.Default(**kwargs)


def parse_mode_string(s: str) -> dict:
    """Inverse of mode_string (for tests and for labelling result rows)."""
    name, *rest = s.split(":")
    if name != "default":
        raise ValueError(f"not a default-mode string: {s!r}")
    opts = dict(kv.split("=", 1) for kv in rest)
    optim = [o for o in opts.get("optimizations", "").split(",") if o]
    return {"buffer_size": int(opts.get("buffer_size", 0)), "granularity": opts.get("granularity", "warp"),
            "clock32": "clock32" in optim, "time_shift": "time_shift" in optim,
            "buffer_strategy": opts.get("buffer_strategy", "circular"),
            "buffer_type": opts.get("buffer_type", "shared"), "sched_stores": "sched_stores" in optim}
