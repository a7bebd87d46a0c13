"""Native CUDA C++ weight-only low-bit matmul y[M, N] = x[M, K] @ dequant(W)[K, N] (issue 13).

Pure compute (no harness imports), in the style of kernels/baselines:

    from kernels.baselines import Case
    from native import lowbit
    lowbit.supports(Case("u4", "f16", 128, K, N))   # None, or why not (no GPU work, no build)
    fn = lowbit.prepare(qw, torch.float16, M=1)     # packs the weight, builds the extension
    y = fn(x)                                       # [M, N] in the activation dtype

Every format of kernels/lowbit (u1-u8 with zero points, i2-i8, every eXmY float), f16 and bf16
activations, group sizes that are multiples of 8 or per channel.

* M <= 16 ("decode"; group size -1 or a multiple of 32): one launch of the decode kernel
  (native/include/lowbit_kernel.cuh): mma.sync m16n8k16 on the packed weights (layout and
  dequantization recipes: native/lowbit_layout.py), stream-K over all SMs.  f16 activations
  with floats of >= 5 exponent bits (f8e5m2 ...) run on bf16 tensor cores with x split into
  two exact bf16 rows (one more small launch).
* otherwise ("prefill"): one of two paths, timed per shape. The fused kernel (native/include/lowbit_fused.cuh:
  wgmma with the weights dequantized in registers, after a small permute of x), where it is built (every recipe
  in its own tensor-core dtype). Or the native dequantize kernel writes W^T in the activation dtype,
  chunk by chunk of output channels, on a side stream into two buffers shared per device, while
  cuBLAS (torch.mm) multiplies the previous chunk straight into its columns of a row-major y
  (leading dimension N; until 1 Dec 2026 the product was y^T, returned as a transposed view that
  the model then had to copy). The chunking (PREFILL_SCHEDULES: the whole weight, halves, ...,
  a ramp of growing chunks) is timed on the first call of each (recipe, M, K, N) and the fastest
  kept ("auto"; `prefill=` fixes one).

The decode kernel's f32 workspace and n-block counters are shared per device and stay zero
between launches (the kernel re-zeroes what it used); calls must not run concurrently on
several streams of one device.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Optional

import torch

from kernels import Unavailable, Unsupported
from native import lowbit_layout as LL
from native import lowbit_lut as LUT_LAYOUT

TOLERANCE = None          # the harness's default per activation dtype: products are exact, sums f32
DECODE_MAX_M = 16
# Prefill schedules: the output channels' n-blocks (256 each) cut into chunks; the side stream dequantizes one chunk
# while cuBLAS multiplies the previous one, so the first chunk's dequantize is exposed, and every chunk is one GEMM
# of M x chunk width (narrow chunks fill fewer waves of the GPU). Fractions of the weight per chunk; "auto" times
# them all on the first call of each (recipe, M, K, N) and keeps the fastest (PREFILL_TUNE_ROUNDS rounds).
PREFILL_SCHEDULES = {"whole": (1,), "halves": (1, 1), "quarters": (1,) * 4, "eighths": (1,) * 8,
                     "ramp": (1, 1, 2, 4), "ramp16": (1, 1, 2, 4, 8)}
# "fused": one launch of the fused kernel (native/include/lowbit_fused.cuh: wgmma with the weights dequantized in
# registers, no W^T written), where it is built for the recipe (every recipe in its own tensor-core dtype: not the
# x-split ones); "auto" times it beside the schedules.
FUSED = "fused"
PREFILL_CHOICES = ("auto", *PREFILL_SCHEDULES, FUSED)
# the fused kernel's builds (FusedParams::build = G | DIAG << 4 | OPT << 8, lowbit_fused.cuh): G 32-k chunks per wgmma
# group; hoist: G = 1 with each stage's words read into registers at once; the diagnostic ones (wrong results on
# purpose: native.fused_diag) leave out the dequantize (nodeq), the copies into the ring (noload) or both (bare).
# The full extension has the default (build 0 = hoist), the tuning extension (build_tune) every one.
# wide (even widths): a block is half an n-block x 256 tokens, warpgroup h dequantizing only n16 tile h of each warp's
# 32 channels and issuing m64n256k16 (half the dequantize per tensor-core cycle); wide_* its diagnostic builds.
FUSED_WIDE = 2 << 8
FUSED_BUILDS = {"g1": 1, "g2": 2, "nodeq": 1 | 1 << 4, "noload": 1 | 2 << 4, "bare": 1 | 3 << 4, "hoist": 1 | 1 << 8,
                "wide": 1 | FUSED_WIDE, "wide_nodeq": 1 | 1 << 4 | FUSED_WIDE, "wide_noload": 1 | 2 << 4 | FUSED_WIDE,
                "wide_bare": 1 | 3 << 4 | FUSED_WIDE}

PREFILL_CAPTURE_DEFAULT = "eighths"   # under a CUDA-graph capture without a timed choice (the path until 2 Dec 2026)
PREFILL_TUNE_ROUNDS = 3
SCOPES = ("wait", "compute", "output")   # instrumented decode kernel (lowbit_kernel.cuh enum)
WARPS_PER_BLOCK = LL.WARPS


def fused_bm(build: int) -> int:
    """The m-tile of a fused build (rows of one x image, lowbit::fused_bm): 256 for the wide builds, else 128."""
    return 256 if build & FUSED_WIDE else 128


def fused_built_for(build: int, bits: int) -> bool:
    """Whether the tuning extension has this build for a width (the wide ones: even widths only)."""
    return not (build & FUSED_WIDE) or bits % 2 == 0


def supports(case) -> Optional[str]:
    """None if the native kernels compute this case (kernels.baselines.Case), else why not."""
    from kernels.baselines._common import lowbit_case
    fmt, why = lowbit_case(case)
    if why:
        return why
    g = case.group_size
    if g != -1 and (g <= 0 or g % 8):
        return f"group size {g} is not -1 or a positive multiple of 8"
    if case.K is not None and case.K % 8:
        return f"K={case.K} is not a multiple of 8 (x is staged in 16-byte chunks)"
    if case.K is not None and g not in (-1, None) and case.K % g:
        return f"group size {g} does not divide K={case.K}"
    return None


# ----------------------------------------------------------------------------- packed weight

@dataclass
class PackedWeight:
    rec: LL.Recipe
    xsplit: bool
    L: LL.Layout
    words: torch.Tensor       # int32 [nblocks, iters, WARPS, vec, 32, 4]
    scales: torch.Tensor      # act dtype [nblocks, WARPS, ngroups, 2, 8, 2|4]
    stab: torch.Tensor        # int32 [iters]
    slots: int
    qw: object                # the QuantizedWeight without its code stream (scales / zeros / group feed the dequantize
                              # kernel; the codes live on in `words` only, so a caller may free its own copy)
    act: torch.dtype
    lut: Optional[torch.Tensor] = None   # u1: the codes again in the lut variant's layout (native/lowbit_lut.py)
    span: Optional[tuple] = None         # u1: (codes, (scale, zero point) pairs) in the lutspan variant's layout

    @property
    def decode_group_ok(self) -> bool:
        return LL.group_ok(self.L.K, self.qw.group_size) is None


def pack(qw) -> PackedWeight:
    """The kernel layout of a QuantizedWeight (on the weight's device; pure data movement)."""
    act = "bf16" if qw.act_dtype == torch.bfloat16 else "f16"
    rec, xsplit = LL.recipe_for(qw.fmt, act)
    L = LL.Layout.of(qw.K, qw.N, qw.group_size, rec.kstep)
    codes = qw.codes()
    words = LL.pack_codes(rec, codes, L)
    dev = qw.packed.device
    if LL.group_ok(qw.K, qw.group_size) is None:
        stab = LL.stage_table(L, flush_each_stage=rec.bias != 0)   # (stage_table: why)
        slots = LL.stage_slots(stab)
    else:  # groups the decode kernel cannot stage (< 32 k, e.g. 8: up to 16 per stage): the prefill path only
        stab, slots = torch.zeros(L.iters, dtype=torch.int32), 0
    meta = replace(qw, packed=torch.empty(0, dtype=qw.packed.dtype, device=dev))
    lut = LUT_LAYOUT.pack(codes) if LUT_LAYOUT.supports(qw) is None else None
    span = LUT_LAYOUT.span_pack(lut, qw.scales, qw.zeros, qw.K, qw.group_size) if lut is not None else None
    return PackedWeight(rec, xsplit, L, words, LL.pack_scales(qw, L), stab.to(dev), slots, meta, qw.act_dtype, lut,
                        span)


# ----------------------------------------------------------------------------- device state

_WORKSPACE: dict = {}


def _workspace(dev: torch.device, floats: int, counters: int):
    """The shared zero f32 workspace and counters of a device (grown, never shrunk)."""
    key = (dev.type, dev.index)
    y32, cnt = _WORKSPACE.get(key, (None, None))
    if y32 is None or y32.numel() < floats:
        y32 = torch.zeros(max(floats, 1 << 16), dtype=torch.float32, device=dev)
    if cnt is None or cnt.numel() < counters:
        cnt = torch.zeros(max(counters, 1024), dtype=torch.int32, device=dev)
    _WORKSPACE[key] = (y32, cnt)
    return y32, cnt


_CHUNK_BUFS: dict = {}
_DECODE_TUNED: dict = {}    # _decode_key -> (variant number, {variant name: median ms})
_REGS_GRID: dict = {}      # (device, recipe, M, iters, nblocks, slots) -> the regs variant's grid there (0: none)
_FLUSH: dict = {}


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    """A buffer of twice the device's L2 size (at least 64 MB) that the decode tuner zeroes before each launch."""
    if dev.index not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (50 << 20)
        _FLUSH[dev.index] = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=dev)
    return _FLUSH[dev.index]


_PREFILL_TUNED: dict = {}   # _prefill_key -> (schedule name, {name: median ms})


def _chunk_buffers(dev: torch.device, dtype: torch.dtype, stream, elems: int) -> list:
    """The prefill path's two dequantize buffers of a device, dtype and stream (flat; grown, never shrunk).
    Shared by every weight: a call's side stream first waits for the stream's earlier work (its reads of them)."""
    key = (dev.index, dtype, stream.cuda_stream)
    bufs = _CHUNK_BUFS.get(key)
    if bufs is None or bufs[0].numel() < elems:
        _CHUNK_BUFS[key] = None
        bufs = _CHUNK_BUFS[key] = [torch.empty(elems, dtype=dtype, device=dev) for _ in range(2)]
    return bufs


def _check_prefill(prefill: str) -> None:
    if prefill not in PREFILL_CHOICES:
        raise ValueError(f"prefill schedule {prefill!r}: one of {list(PREFILL_CHOICES)}")


def chunk_sizes(parts: tuple, nblocks: int) -> tuple:
    """n-blocks per chunk of a schedule's weight fractions `parts` for a weight of `nblocks` n-blocks: at most
    nblocks chunks (the widest kept), each >= 1 n-block, summing to nblocks, the last chunk taking the rounding."""
    parts = tuple(parts[-min(len(parts), nblocks):])
    total = sum(parts)
    sizes = [max(1, round(nblocks * f / total)) for f in parts[:-1]]
    while sum(sizes) > nblocks - 1:          # only when rounding up left the last chunk nothing
        sizes[sizes.index(max(sizes))] -= 1
    return (*sizes, nblocks - sum(sizes))


def prefill_schedules(nblocks: int) -> dict:
    """The candidate schedules (PREFILL_SCHEDULES) as n-blocks per chunk: name -> chunk_sizes(...), leaving out
    names whose chunks come out the same as an earlier name's."""
    out = {}
    for name, parts in PREFILL_SCHEDULES.items():
        sched = chunk_sizes(parts, nblocks)
        if sched not in out.values():
            out[name] = sched
    return out


def _reset_workspace(dev: torch.device):
    for t in _WORKSPACE.get((dev.type, dev.index), ()):
        t.zero_()


def _mt(pw: PackedWeight, M: int) -> int:
    """m16n8 tiles of the decode variant for M rows (the variants native/include/lowbit_launch.cuh builds)."""
    if pw.xsplit:
        return 2 if 2 * M <= 16 else 4
    if pw.rec.target == "bf16":
        return 2
    return 1 if M <= 8 else 2


# native/include/lowbit_kernel.cuh (GemvParams::variant); regs: native/include/lowbit_regs.cuh (mt1 and mt2)
# bulk1: bulk's kernel launched with one block per SM (its grid where bulk fits two; native/NOTES.md section 30)
# lut: u1 at M = 1 through a table of partial sums of x (native/kernels/lowbit_lut.cu, its own layout; section 33),
# a kernel of its own, not GemvParams::variant, and without an instrumented build; lutspan: its span form (a lane per
# 128 k, a block per 4096 k: the same layout; section 34)
DECODE_VARIANTS = {"base": 0, "lean": 1, "lean3": 2, "bulk": 3, "regs": 4, "bulk1": 5, "lut": 6, "lutspan": 7}
REGS = DECODE_VARIANTS["regs"]                           # mt1: x whole in shared memory (where it fits); mt2: an x ring
BULK1 = DECODE_VARIANTS["bulk1"]
LUT = DECODE_VARIANTS["lut"]
LUTSPAN = DECODE_VARIANTS["lutspan"]
LUT_VARIANTS = (LUT, LUTSPAN)                            # the table-lookup kernels (u1, M = 1; native/lowbit_lut.py)
PROF_VARIANTS = {0, 1, 3, REGS, BULK1}                   # those with an instrumented build (native/include/lowbit_launch.cuh)
PROF_MODES = {"staged": 1, "warp0": 2}                   # its instrumentation modes (INSTR_MODE_* of instrument.cuh)


def prof_mode(mode: str) -> int:
    """The instrumented build's mode id (PROF_MODES); Unsupported for a mode it is not built in."""
    if mode not in PROF_MODES:
        raise Unsupported(f"the instrumented low-bit kernel is built for modes {list(PROF_MODES)}, not {mode!r}")
    return PROF_MODES[mode]
VARIANT_NAMES = {v: k for k, v in DECODE_VARIANTS.items()}
TUNED_RECIPES = LL.TUNED                                  # f16 recipes built with variants lean / lean3 too
BULK_RECIPES = LL.BULK                                    # recipes built with bulk (every f16 one, the x-split bf16 ones)
# The default, "auto": per (recipe, mt) the variant the H200 runs measured fastest (native/NOTES.md sections 9
# and 12), lean for the other TUNED recipes, bulk for the other BULK recipes, base for the rest: base for u1 at
# M > 8 (mt2: lean 0-3.4% slower in both flushes, its loop no shorter); bulk (one TMA copy of a stage's weights)
# for u8 and f6e3m2 (6-19% faster than lean at all 12 points of 3 shapes x M 1 / 16) and u2 (faster at 4 of 6
# points, 0.2-2.3% slower at the other 2); 4-bit stays on lean (bulk 1.6-13% slower at 11 of the 12 points of u4 and
# i4, a tie at the 12th) -- until bulk's 4-bit build counted its partial pieces at the block's end (DEFER in
# lowbit_kernel.cuh; section 13): then bulk was faster than lean at 10 of the 12 u4 / i4 points (by 2-10%), behind
# at (8192, 8192) M=16 only, so 4-bit runs bulk too. The 3-bit recipes u3, i3 and f3e1m1 stay on base, which they ran
# before bulk was built for them (section 30; measured on an H100 only: bulk 1.4-5.5% slower than base at all four
# 3-bit points). Every variant stays selectable. (regs, the fastest at most 2-4 bit points, is not auto's: at one
# tile it needs x whole in shared memory, which not every K allows.)
AUTO_VARIANT = {("f16_u1", 2): "base", ("f16_u2", 1): "bulk", ("f16_u2", 2): "bulk",
                ("f16_u8", 1): "bulk", ("f16_u8", 2): "bulk", ("f16_f6e3m2", 1): "bulk", ("f16_f6e3m2", 2): "bulk",
                ("f16_u4", 1): "bulk", ("f16_u4", 2): "bulk", ("f16_i4", 1): "bulk", ("f16_i4", 2): "bulk",
                **{(f"f16_{f}", mt): "base" for f in ("u3", "i3", "f3e1m1") for mt in (1, 2)}}
# "timed" (the default since 2 Dec 2026): the fastest of decode_candidates() timed on the first call at each (recipe,
# tiles, K, N) -- the static table above is per recipe and tiles only, and e.g. bulk's 4-bit build is 7-12% slower
# than lean at (8192, 8192) M=16 while faster at most other shapes (section 13) -- auto's choice inside a CUDA-graph
# capture before any timing.
DEFAULT_VARIANT = "timed"
VARIANT_CHOICES = ("timed", "auto", *DECODE_VARIANTS)
DECODE_TUNE_ROUNDS = 5


def variant_for(pw: "PackedWeight", variant: str, mt: int = 1, prof: bool = False) -> int:
    """The variant number the decode kernel of this weight runs with mt m16n8 tiles (native/lowbit._mt):
    "auto" resolves per (recipe, mt) (AUTO_VARIANT, then lean for TUNED and bulk for BULK recipes); lean and
    lean3 exist for the TUNED recipes, bulk, bulk1 and regs for the f16 BULK ones (regs at mt = 1 and 2), bulk and
    bulk1 for the BULK bf16 recipes that serve f16 activations with x split; anything else falls back to base.
    prof: the instrumented build of that same variant (built for PROF_VARIANTS), so an instrumented call times the
    plain call's kernel plus its records."""
    name = pw.rec.name
    if variant == "timed":   # without a timing (LowbitMatmul.variant_num holds the timed choices): auto's
        variant = "auto"
    if variant == "auto":
        variant = AUTO_VARIANT.get((name, mt), "lean" if name in TUNED_RECIPES else "bulk")
    v = DECODE_VARIANTS[variant]
    if v in LUT_VARIANTS:
        v = v if pw.lut is not None and mt == 1 else 0   # (prof: no instrumented build, raises below)
    else:
        built = BULK_RECIPES if v in (3, REGS, BULK1) else TUNED_RECIPES
        f16 = pw.rec.target == "f16"
        v = v if (name in built and (f16 or (pw.xsplit and v in (3, BULK1)))) else 0
    if prof and v not in PROF_VARIANTS:
        raise Unsupported(f"the instrumented decode kernel is built for the variants "
                          f"{[VARIANT_NAMES[p] for p in sorted(PROF_VARIANTS)]}, not {VARIANT_NAMES[v]!r}")
    return v


def _median_ms(calls: dict, rounds: int, before=None, dev=None) -> dict:
    """{name: median ms} of each call over `rounds` alternating rounds after one warm-up round (dropped), CUDA
    events around each call; before(): run ahead of each call, outside the events (an L2 flush)."""
    evs = []
    for r in range(rounds + 1):
        for name, call in calls.items():
            if before is not None:
                before()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            if r:
                evs.append((name, a, b))
    torch.cuda.synchronize(dev)
    return {name: statistics.median(a.elapsed_time(b) for n, a, b in evs if n == name) for name in calls}


def decode_candidates(pw: "PackedWeight", mt: int) -> list:
    """The variant numbers "timed" chooses from with mt tiles: auto's, then base, lean, bulk, bulk1 and regs where
    this recipe is built with them (each has an instrumented build, so profiled() runs the plain call's kernel).
    LowbitMatmul.decode_candidates also drops regs where its x does not fit in shared memory (one tile: x whole) and
    bulk1 where bulk runs one block per SM anyway."""
    out = []
    for name in ("auto", "base", "lean", "bulk", "bulk1", "regs"):
        v = variant_for(pw, name, mt)
        if v not in out:
            out.append(v)
    return out


class LowbitMatmul:
    """fn(x) -> y for one packed weight (what `prepare` returns)."""

    def __init__(self, pw: PackedWeight, mod, grid: Optional[int] = None, variant: str = DEFAULT_VARIANT,
                 prefill: str = "auto"):
        if variant not in VARIANT_CHOICES:
            raise ValueError(f"decode variant {variant!r}: one of {list(VARIANT_CHOICES)}")
        _check_prefill(prefill)
        self.pw, self.mod, self.grid = pw, mod, grid
        if prefill == FUSED and not self.fused_ok():
            raise Unsupported(f"the fused prefill kernel is not built for {pw.rec.name}"
                              f"{' with x split (f16 activations)' if pw.xsplit else ''}")
        self.prefill = prefill
        self.variant = variant
        self.dev = pw.words.device
        self.sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
        self._empty = torch.empty(0, dtype=torch.int32, device=self.dev)
        self._side = None
        self._grids: dict = {}
        self.lut_ks = LUT_LAYOUT.KS_DEFAULT   # k per block of the lut variant (LUT_LAYOUT.KS_CHOICES)
        self.lut_ct = LUT_LAYOUT.default_ct(pw.L.K, pw.L.N, self.sms, self.lut_ks, pw.qw.group_size)   # its tiles
        self.span_cfg = LUT_LAYOUT.default_span(pw.qw.group_size)   # lutspan's (threads, blocks per SM)

    # -- decode ------------------------------------------------------------------------------
    def decode_ok(self, M: int) -> bool:
        return M <= DECODE_MAX_M and self.pw.decode_group_ok

    def variant_num(self, M: int, prof: bool = False) -> int:
        """The decode variant (GemvParams::variant) this weight runs at M rows (prof: its instrumented build);
        "timed": the one timed fastest at this (recipe, tiles, K, N), or auto's until it has been timed."""
        if self.variant == "timed":
            got = _DECODE_TUNED.get(self._decode_key(M))
            if got is not None:
                if prof and got[0] not in PROF_VARIANTS:
                    raise Unsupported(f"the timed decode variant here is {VARIANT_NAMES[got[0]]!r}, which has no "
                                      f"instrumented build (variants with one: "
                                      f"{[VARIANT_NAMES[p] for p in sorted(PROF_VARIANTS)]})")
                return got[0]
            return variant_for(self.pw, "auto", _mt(self.pw, M), prof)
        v = variant_for(self.pw, self.variant, _mt(self.pw, M), prof)
        if not self._launchable(M, v):     # regs where x does not fit: auto's choice
            v = variant_for(self.pw, "auto", _mt(self.pw, M), prof)
        return v

    def _decode_key(self, M: int) -> tuple:
        """What a timing holds for: (recipe, tiles, K, N, group, grid) and, where regs is a candidate, its grid at M
        (x whole in shared memory: its occupancy falls with M, e.g. u4 K = 8192 2 -> 1 block per SM at M = 8, where
        regs ran 106.5 us against bulk's 93.6 while faster at M = 1 and 4), so M = 1 and M = 8 are timed apart."""
        pw, L = self.pw, self.pw.L
        mt = _mt(pw, M)
        regs = self._regs_grid(M) if REGS in decode_candidates(pw, mt) else 0
        return (self.dev.index, pw.rec.name, pw.xsplit, mt, L.K, L.N, pw.qw.group_size, self.grid, regs,
                self._launchable(M, LUT) and (self.lut_ks, self.lut_ct, self.span_cfg))

    def decode_candidates(self, M: int) -> list:
        """decode_candidates(pw, tiles) that launch at M rows, and the lut variants where they do (u1, M = 1)."""
        out = [v for v in decode_candidates(self.pw, _mt(self.pw, M)) if self._launchable(M, v)]
        return out + [v for v in LUT_VARIANTS if self._launchable(M, v)]

    def _launchable(self, M: int, v: int) -> bool:
        """Whether variant v launches at M rows as a kernel of its own: regs at one tile holds x whole in shared memory
        (MX rows of the padded K), which does not fit every (M, K) -- the launcher's grid query fails there; bulk1 is
        bulk where bulk runs one block per SM anyway."""
        if v == BULK1:
            return not self.grid and self._grid_query(M, 0, 3, grid=0) > self.sms
        if v in LUT_VARIANTS:
            return M == 1 and self.pw.lut is not None
        return v != REGS or self._regs_grid(M) > 0

    def _regs_grid(self, M: int) -> int:
        """The regs variant's one-wave grid (SMs x occupancy) at M rows; 0 where it does not launch."""
        key = (self.dev.index, self.pw.rec.name, M, self.pw.L.iters, self.pw.L.nblocks, self.pw.slots)
        if key not in _REGS_GRID:
            try:
                _REGS_GRID[key] = self._grid_query(M, 0, REGS, grid=0)
            except RuntimeError:
                _REGS_GRID[key] = 0
        return _REGS_GRID[key]

    def _tune_decode(self, x: torch.Tensor) -> tuple:
        """(fastest variant number, {variant name: median ms}): each candidate DECODE_TUNE_ROUNDS times in
        alternating rounds after a warm-up round, each launch after an L2 flush (a zeroed buffer of twice the
        L2 size, as the harness's timer flushes), CUDA events."""
        cands = self.decode_candidates(x.shape[0])
        if len(cands) == 1:          # a recipe built with one variant: nothing to time
            return cands[0], {}
        flush = _flush_buffer(self.dev)
        ms = _median_ms({VARIANT_NAMES[v]: (lambda v=v: self._gemv(x, v=v)) for v in cands}, DECODE_TUNE_ROUNDS,
                        before=flush.zero_, dev=self.dev)
        return min(cands, key=lambda v: ms[VARIANT_NAMES[v]]), ms

    def _gemv(self, x: torch.Tensor, prof: Optional[torch.Tensor] = None, cap: int = 0, grid: int = 0,
              pmode: int = 0, v: Optional[int] = None):
        pw, L = self.pw, self.pw.L
        M = x.shape[0]
        if v is None:
            if prof is None and self.variant == "timed" and self._decode_key(M) not in _DECODE_TUNED \
                    and not torch.cuda.is_current_stream_capturing():
                _DECODE_TUNED[self._decode_key(M)] = self._tune_decode(x)
            v = self.variant_num(M, prof is not None)
        if v in LUT_VARIANTS:
            return self._lut(x, v)
        y = torch.empty(M, L.N, dtype=pw.act, device=self.dev)
        xin = x
        if pw.xsplit:
            xin = torch.empty(2 * M, L.K, dtype=torch.bfloat16, device=self.dev)
            self.mod.lowbit_xsplit(x, xin)
        y32, cnt = _workspace(self.dev, M * L.Npad, L.nblocks)
        try:
            used = self.mod.lowbit_gemv(pw.rec.name, _mt(pw, M), pw.xsplit, pmode if prof is not None else 0,
                                        pw.words, pw.scales,
                                        pw.stab, xin, y, y32, cnt, M, L.K, L.N, L.Npad, L.iters, L.nblocks,
                                        L.ngroups, pw.slots, self._empty if prof is None else prof, cap, self.sms,
                                        grid or self.grid or 0, v)
        except Exception:
            _reset_workspace(self.dev)     # a failed launch may have left partial sums behind
            raise
        self._grids[M] = used
        return y

    def _lut(self, x: torch.Tensor, v: int) -> torch.Tensor:
        """A lut variant (u1, M = 1): one launch of native/kernels/lowbit_lut.cu (v: LUT or LUTSPAN)."""
        pw, L = self.pw, self.pw.L
        y = torch.empty(1, L.N, dtype=pw.act, device=self.dev)
        cols, _ = self._lut_grid(v)
        ws, cnt = _workspace(self.dev, L.N, cols)
        try:
            if v == LUTSPAN:
                self.mod.lowbit_lut_span(x, pw.span[0], pw.span[1], y, ws, cnt, pw.qw.group_size, cols,
                                         self.span_cfg[0])
            else:
                self.mod.lowbit_lut(x, pw.lut, pw.qw.scales, pw.qw.zeros, y, ws, cnt, pw.qw.group_size, self.lut_ks,
                                    self.lut_ct)
        except Exception:
            _reset_workspace(self.dev)
            raise
        return y

    def _lut_grid(self, v: int) -> tuple[int, int]:
        """A lut variant's launch: (blocks along N, k slices)."""
        K, N = self.pw.L.K, self.pw.L.N
        if v == LUTSPAN:
            return LUT_LAYOUT.span_nbx(K, N, self.sms, self.span_cfg[1]), LUT_LAYOUT.span_slices(K)
        return LUT_LAYOUT.grid(K, N, self.lut_ks, self.lut_ct)

    def grid_for(self, M: int, prof: int = 0) -> int:
        """Blocks the decode launch uses for M rows (occupancy x SMs, at most the work items); prof: 0 the plain
        kernel, else the instrumented one in that instrumentation mode (PROF_MODES); the lut variant: its column
        tiles x k slices."""
        v = self.variant_num(M, bool(prof))
        if v in LUT_VARIANTS:
            cols, slices = self._lut_grid(v)
            return cols * slices
        return self._grid_query(M, prof, v)

    def _grid_query(self, M: int, prof: int, v: int, grid: Optional[int] = None) -> int:
        """The launcher's grid for variant v (grid None: this weight's fixed grid, if any; 0: SMs x occupancy)."""
        pw, L = self.pw, self.pw.L
        MX = 2 * M if pw.xsplit else M
        return self.mod.lowbit_gemv_grid(pw.rec.name, _mt(pw, M), pw.xsplit, int(prof), pw.act == torch.bfloat16, MX,
                                         pw.slots, L.iters, L.nblocks, self.sms,
                                         (self.grid or 0) if grid is None else grid, v)

    def profiled(self, x: torch.Tensor, buffer_records: int, buffer: Optional[torch.Tensor] = None,
                 clear: bool = True, mode: str = "staged"):
        """Decode with the instrumented kernel (native/include/instrument.cuh; f16 u4 only) in instrumentation
        mode `mode` (PROF_MODES: staged, or warp0 -- only warp 0 of a block records, so the buffer must start
        zeroed: clear=False only for timing loops): (y, profile buffer as an int32 cuda tensor of
        buffer_words(...) words)."""
        pm = prof_mode(mode)
        x = self._x(x)
        if not self.decode_ok(x.shape[0]):
            raise Unsupported("the instrumented low-bit kernel is the decode kernel (M <= 16)")
        from native.native_kernels import check_capacity
        check_capacity(buffer_records)
        if self.variant == "timed" and self._decode_key(x.shape[0]) not in _DECODE_TUNED:
            self._gemv(x)   # time the variants first: the instrumented build is the plain call's variant
        words = self.buffer_words(x.shape[0], buffer_records, mode)
        if buffer is None:
            buffer = torch.zeros(words, dtype=torch.int32, device=self.dev)
        elif buffer.numel() < words or buffer.dtype != torch.int32 or buffer.device != self.dev:
            raise ValueError(f"profile buffer: {words} int32 words on {self.dev} needed")
        elif clear:
            buffer[:words].zero_()
        y = self._gemv(x, buffer, buffer_records, grid=self.grid_for(x.shape[0], prof=pm), pmode=pm)
        return y, buffer[:words]

    def buffer_words(self, M: int, buffer_records: int, mode: str = "staged") -> int:
        """Words of the profile buffer of an instrumented launch in `mode` (its grid: that build's occupancy)."""
        from native.decode import block_words
        return self.grid_for(M, prof=prof_mode(mode)) * block_words(WARPS_PER_BLOCK, buffer_records)

    # -- prefill -----------------------------------------------------------------------------
    def fused_ok(self) -> bool:
        """Whether the fused prefill kernel is built for this weight's recipe and dtype (not for x split)."""
        return not self.pw.xsplit and self.mod.lowbit_fused_built(self.pw.rec.name, self.pw.act == torch.bfloat16)

    def prefill_schedules(self) -> dict:
        """The candidate prefill paths: name -> n-blocks per chunk (PREFILL_SCHEDULES, deduplicated), and FUSED ->
        FUSED where the fused kernel is built."""
        out = prefill_schedules(self.pw.L.nblocks)
        if self.fused_ok():
            out[FUSED] = FUSED
        return out

    def prefill_schedule(self, x: torch.Tensor) -> tuple:
        """(name, n-blocks per chunk) this call's M runs: the fixed `prefill` choice, or ("auto") the fastest of
        the candidates timed on the first call at this (recipe, M, K, N) -- whichever measures faster, as the
        issue asks -- or, inside a CUDA-graph capture (no timing possible), PREFILL_CAPTURE_DEFAULT."""
        if self.prefill == FUSED:
            return FUSED, FUSED
        if self.prefill != "auto":
            return self.prefill, chunk_sizes(PREFILL_SCHEDULES[self.prefill], self.pw.L.nblocks)
        cands = self.prefill_schedules()
        key = self._prefill_key(x.shape[0])
        got = _PREFILL_TUNED.get(key)
        if got is None:
            if torch.cuda.is_current_stream_capturing():
                return PREFILL_CAPTURE_DEFAULT, chunk_sizes(PREFILL_SCHEDULES[PREFILL_CAPTURE_DEFAULT],
                                                            self.pw.L.nblocks)
            got = _PREFILL_TUNED[key] = self._tune_prefill(x, cands)
        return got[0], cands[got[0]]

    def _prefill_key(self, M: int) -> tuple:
        pw, L = self.pw, self.pw.L
        return (self.dev.index, pw.rec.name, str(pw.act), M, L.K, L.N, pw.qw.group_size)

    def _tune_prefill(self, x: torch.Tensor, cands: dict) -> tuple:
        """(fastest name, {name: median ms}): every candidate run PREFILL_TUNE_ROUNDS + 1 times in alternating
        rounds on this x (the first round warms cuBLAS' heuristics and is dropped), CUDA events."""
        ms = _median_ms({name: (lambda s=sched: self._prefill(x, s)) for name, sched in cands.items()},
                        PREFILL_TUNE_ROUNDS, dev=self.dev)
        return min(ms, key=ms.get), ms

    def _prefill(self, x: torch.Tensor, sched: Optional[tuple] = None) -> torch.Tensor:
        """y [M, N] row-major: the weight dequantized chunk by chunk of n-blocks (`sched`) on a side stream into
        two shared buffers (double-buffered) while cuBLAS multiplies the previous chunk into its columns of y
        (y[:, n0:n1] = x @ chunk^T, written in place with leading dimension N: no transposed result, no copy)."""
        pw, L, qw = self.pw, self.pw.L, self.pw.qw
        if sched is None:
            sched = self.prefill_schedule(x)[1]
        if sched == FUSED:
            return self._fused(x)
        M = x.shape[0]
        y = torch.empty(M, L.N, dtype=pw.act, device=self.dev)
        main = torch.cuda.current_stream(self.dev)
        if self._side is None:
            self._side = torch.cuda.Stream(self.dev)
        side = self._side
        side.wait_stream(main)   # also orders this call's writes into the shared buffers after earlier reads
        bufs = _chunk_buffers(self.dev, pw.act, main, max(sched) * LL.BN * L.K)
        zeros = qw.zeros if qw.zeros is not None else self._empty
        group = L.K if L.per_channel else qw.group_size
        done = []
        nb0 = 0
        for i, nb in enumerate(sched):
            n0, n1 = nb0 * LL.BN, min(L.N, (nb0 + nb) * LL.BN)
            buf = bufs[i % 2][:nb * LL.BN * L.K].view(nb * LL.BN, L.K)
            with torch.cuda.stream(side):
                if i >= 2:
                    side.wait_event(done[i - 2])
                self.mod.lowbit_dequant(pw.rec.name, pw.words, qw.scales, zeros, buf, L.K, L.N, L.iters, nb0, nb,
                                        group)
                ready = torch.cuda.Event()
                ready.record(side)
            main.wait_event(ready)
            torch.mm(x, buf[:n1 - n0].t(), out=y[:, n0:n1])
            ev = torch.cuda.Event()
            ev.record(main)
            done.append(ev)
            nb0 += nb
        return y

    def _fused(self, x: torch.Tensor, build: int = 0) -> torch.Tensor:
        """y [M, N] row-major from the fused kernel: x permuted into the layout's k order (and zero-padded to Kpad)
        by one small kernel (rows padded to a multiple of the build's m-tile bm, 128 or 256, with zeros), then one
        launch of n-blocks x ceil(M / bm) blocks (twice that for the wide builds). build: FUSED_BUILDS[name] (0: the
        extension's default; the tuning extension has them all)."""
        pw, L = self.pw, self.pw.L
        bm = fused_bm(build)
        xp = torch.empty(-(-x.shape[0] // bm) * bm, L.Kpad, dtype=pw.act, device=self.dev)   # rows past M: zero
        self.mod.lowbit_xperm(x, xp, bm)
        y = torch.empty(x.shape[0], L.N, dtype=pw.act, device=self.dev)
        self.mod.lowbit_fused(pw.rec.name, pw.words, pw.scales, xp, y, L.N, L.iters, L.nblocks, L.ngroups, L.group, build)
        return y

    # -- call --------------------------------------------------------------------------------
    def _x(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.pw.act or x.dim() != 2 or x.shape[1] != self.pw.L.K:
            raise ValueError(f"x must be [M, {self.pw.L.K}] {self.pw.act}, got {tuple(x.shape)} {x.dtype}")
        x = x.contiguous()
        return x if x.data_ptr() % 16 == 0 else x.clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = self._x(x)
        if self.decode_ok(x.shape[0]):
            return self._gemv(x)
        return self._prefill(x)

    def chosen_config(self, M: int) -> str:
        pw, L = self.pw, self.pw.L
        if self.decode_ok(M):
            v = self.variant_num(M)
            vname = f" {VARIANT_NAMES[v]}" if v else ""
            tuned = _DECODE_TUNED.get(self._decode_key(M)) if self.variant == "timed" else None
            if tuned and tuned[1]:
                vname += " (timed ms: " + ", ".join(f"{n} {t:.4g}" for n, t in tuned[1].items()) + ")"
            if v in LUT_VARIANTS:
                cols, slices = self._lut_grid(v)
                if v == LUTSPAN:
                    th, bps = self.span_cfg
                    return (f"native decode{vname} {pw.rec.name} span {th} threads x {bps} blocks/SM grid"
                            f"{cols * slices} ({cols} column ranges x {slices} spans of 4096 k, a lane per 128 k) | "
                            f"one table lookup per 4 weights")
                return (f"native decode{vname} {pw.rec.name} ks{self.lut_ks} ct{self.lut_ct} grid{cols * slices} "
                        f"({cols} x {self.lut_ct} column tiles x {slices} k slices) | one table lookup per 4 weights")
            grid = self._grids.get(M) or self.grid_for(M)
            return (f"native decode{vname} {pw.rec.name}{' xsplit' if pw.xsplit else ''} mt{_mt(pw, M)} kstep{L.kstep} "
                    f"grid{grid} ({L.nblocks}x{L.iters} stages, stream-K) | dequant {pw.rec.deq_cost()['per_weight']:.2f}"
                    f" instr/weight")
        why = "" if M > DECODE_MAX_M else f" (group size {pw.qw.group_size}: {LL.group_ok(L.K, pw.qw.group_size)})"
        tuned = _PREFILL_TUNED.get(self._prefill_key(M)) if self.prefill == "auto" else None
        if self.prefill == "auto" and tuned is None:
            return f"native dequantize+cublas {pw.rec.name} schedule auto (not yet timed at M={M}){why}"
        name = tuned[0] if tuned else self.prefill
        timed = (" | timed ms: " + ", ".join(f"{n} {v:.4g}" for n, v in tuned[1].items())) if tuned else ""
        if name == FUSED:
            return (f"native fused wgmma prefill {pw.rec.name} ({L.nblocks} n-blocks x {-(-M // 128)} m-tiles of 128)"
                    f"{timed}{why}")
        sched = chunk_sizes(PREFILL_SCHEDULES[name], L.nblocks)
        return (f"native dequantize+cublas {pw.rec.name} schedule {name} ({len(sched)} chunks of "
                f"{'/'.join(map(str, sched))} n-blocks){timed}{why}")


def prepare(qw, act_dtype, M: int = 1, seconds=None, grid: Optional[int] = None, variant: str = DEFAULT_VARIANT,
            mod=None, prefill: str = "auto", **hints) -> LowbitMatmul:
    """Pack the weight and build the extension; returns fn(x) -> y (raises Unavailable without a
    Hopper GPU / nvcc, Unsupported for what `supports` rejects). variant: the decode variant (VARIANT_CHOICES);
    prefill: the prefill schedule (PREFILL_CHOICES; "auto" times the candidates on the first call per M)."""
    _check_prefill(prefill)   # before the build
    from kernels.baselines._common import act_dtype_of
    from native.build import build
    act = act_dtype_of(act_dtype)
    if act is None or act != qw.act_dtype:
        raise Unsupported(f"activations {act_dtype} do not match the weight's scales ({qw.act_dtype})")
    if qw.K % 8 or (qw.group_size != -1 and qw.group_size % 8):
        raise Unsupported(f"native low-bit kernels need K and the group size to be multiples of 8 "
                          f"(K={qw.K}, group {qw.group_size})")
    if not torch.cuda.is_available() or qw.packed.device.type != "cuda":
        raise Unavailable("the native low-bit kernels need a CUDA GPU (their layout, recipes and schedule are "
                          "checked on the CPU by tests/test_native_lowbit.py)")
    mod = mod if mod is not None else build()
    return LowbitMatmul(pack(qw), mod, grid, variant, prefill)
