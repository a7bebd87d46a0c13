"""Layout, support rule and CPU emulation of the `lut` decode variant: u1 weights at M = 1 through a table of partial
sums of x (native/kernels/lowbit_lut.cu; native/NOTES.md section 33).

For each quad of k the kernel tabulates the 16 sums of the subsets of x over the quad; lane n adds, for each nibble
of its column's codes, the entry the nibble selects: sum_k x[k] q[k, n] in one shared-memory lookup per 4 weights.
The zero point enters through the sum of x per group: y[n] = sum_g s[g, n] (sum_{k in g} x[k] q[k, n] - z[g, n]
sum_{k in g} x[k]).

Layout: int32 [units, N, 4], a unit being 128 k (K padded with zero codes to whole units); word i of (unit u, column
n) holds the code of k = 128 u + 32 i + j at bit j, so a lane reads its column's 128 k in one 16-byte load.
"""
from __future__ import annotations

from typing import Optional

import torch

UNIT = 128                 # k per 16-byte load of a column's codes
KS_CHOICES = (256, 512)    # k per block (the launcher's builds)
CT_CHOICES = (1, 2, 4)     # column tiles per block: one table serves them, the next tile's codes load meanwhile
KS_DEFAULT = 256           # with default_ct's tiles: the fastest or within 2% of it of the 6 (ks, ct) pairs at the three
                           # tilus_fig10 shapes and per channel on (8192, 57344) (H100, section 33); 512 with 4 tiles
                           # (88 registers: 2 blocks per SM) was the slowest there
THREADS = 256              # columns per tile (a lane per column)
# the span form (the `lutspan` variant, native/NOTES.md section 34): a lane per unit, a block per SPAN_UNITS units
SPAN_UNITS = 32            # units (of 128 k) per block: 4096 k, a lane each
SPAN_COLS = 4              # columns a warp sums at a time (64 contiguous bytes of codes per lane)
SPAN_CONFIGS = ((1024, 1), (512, 2), (256, 3), (256, 2), (512, 1), (256, 1))   # (threads per block, blocks per SM)
                           # it launches with (64 KB of tables a block: 3 fit an SM; 512 or 1024 threads at 64
                           # registers: 2 or 1, the same 32 warps); default_span picks one per group size


def group_ok(K: int, group: int) -> Optional[str]:
    """None if the kernel takes this (K, group size), else why not (native_lowbit_lut_ok in lowbit_lut.cu)."""
    if group in (-1, K, 32, 64) or (group > 0 and group % 128 == 0 and K % group == 0):
        return None
    return f"group size {group}: the lut kernel takes 32, 64, multiples of 128 or per channel"


def supports(qw) -> Optional[str]:
    """None if the lut variant computes this QuantizedWeight (at M = 1), else why not."""
    if qw.fmt.kind != "uint" or qw.fmt.bits != 1:
        return f"{qw.fmt.name}: the lut kernel is for u1 weights"
    return group_ok(qw.K, qw.group_size)


def units(K: int) -> int:
    return -(-K // UNIT)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int32 codes [K, N] in {0, 1} -> int32 [units, N, 4] (the layout above; on the codes' device)."""
    K, N = codes.shape
    c = torch.zeros(units(K) * UNIT, N, dtype=torch.int64, device=codes.device)
    c[:K] = codes.to(torch.int64)
    c = c.reshape(units(K), 4, 32, N)
    w = (c << torch.arange(32, device=codes.device, dtype=torch.int64).view(1, 1, 32, 1)).sum(2)   # [units, 4, N]
    w = torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)
    return w.permute(0, 2, 1).contiguous()


def unpack(words: torch.Tensor, K: int) -> torch.Tensor:
    """The inverse of pack: int32 codes [K, N]."""
    U, N, _ = words.shape
    w = words.to(torch.int64).permute(0, 2, 1) & 0xFFFFFFFF                                    # [units, 4, N]
    bits = (w.unsqueeze(2) >> torch.arange(32, device=words.device).view(1, 1, 32, 1)) & 1      # [units, 4, 32, N]
    return bits.reshape(U * UNIT, N)[:K].to(torch.int32)


def grid(K: int, N: int, ks: int = KS_DEFAULT, ct: int = 1) -> tuple[int, int]:
    """(blocks along N -- ct column tiles each --, k slices) of a launch."""
    return -(-N // (THREADS * ct)), -(-units(K) // (ks // UNIT))


def default_ct(K: int, N: int, sms: int, ks: int = KS_DEFAULT, group: int = 128) -> int:
    """The most column tiles per block that still leave 4 blocks per SM (what the launch's occupancy needs to hide
    the code loads), else 1; 1 for groups of 32 / 64 k, whose scales per word double-buffered per tile cost more than
    the table they share (H100, section 34: 64.7 against 83.3 us at 4 tiles, (8192, 57344) g32)."""
    if group in (32, 64):
        return 1
    for ct in sorted(CT_CHOICES, reverse=True):
        cols, slices = grid(K, N, ks, ct)
        if cols * slices >= 4 * sms:
            return ct
    return 1


def span_slices(K: int) -> int:
    """The span form's blocks along k (SPAN_UNITS units each)."""
    return -(-units(K) // SPAN_UNITS)


def default_span(group: int) -> tuple[int, int]:
    """lutspan's (threads per block, blocks per SM): 1024 x 1 for groups of whole units -- the fastest of the six at
    the three tilus_fig10 g128 shapes (H100, section 34: 42.4 / 25.0 / 13.5 us; 512 x 2 45.1 / 27.4 / 15.8) --,
    256 x 2 for groups of 32 / 64 k, whose 2-4 slots a column spill at 64 registers (g32: 71.3 us at 256 x 2, 141.4
    at 512 x 2)."""
    return (256, 2) if group in (32, 64) else (1024, 1)


def span_nbx(K: int, N: int, sms: int, bps: int) -> int:
    """The span form's blocks along N per k span: as many as fill one wave of `bps` blocks per SM over the k spans,
    at most one per SPAN_COLS columns."""
    if bps not in {b for _, b in SPAN_CONFIGS}:
        raise ValueError(f"blocks per SM {bps}: the span form takes {sorted({b for _, b in SPAN_CONFIGS})}")
    return max(1, min(-(-N // SPAN_COLS), bps * sms // span_slices(K)))


def span_pack(words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, K: int, group: int):
    """The span form's layout from the lut layout's words [units, N, 4] and the [groups, N] scales and zero points:
    (codes int32 [spans, N / 4, 4, 32, 4] -- span y, 4 columns c, column j of them, lane l = unit 32 y + l, word i --,
    (scale, zero point) pairs [spans, N / 4, 4, 32, slots, 2] in the scales' dtype -- a slot per unit, per word for
    groups of 32 k, per pair of words for 64 --), zero beyond K and N, so that a warp's loads are contiguous."""
    if group_ok(K, group):
        raise ValueError(group_ok(K, group))
    U, N, _ = words.shape
    S, C = span_slices(K), -(-N // SPAN_COLS)
    w = torch.zeros(S * SPAN_UNITS, C * SPAN_COLS, 4, dtype=words.dtype, device=words.device)
    w[:U, :N] = words
    w = w.view(S, SPAN_UNITS, C, SPAN_COLS, 4).permute(0, 2, 3, 1, 4).contiguous()
    wpg = {32: 1, 64: 2}.get(group, 0)
    if wpg:      # slot i of unit u: words 4u + wpg i .. (group (4u + wpg i) / wpg)
        g = (4 * torch.arange(U).view(U, 1) + wpg * torch.arange(4 // wpg).view(1, -1)) // wpg
    else:        # the unit's group (one per channel)
        upg = U if group in (-1, K) else group // UNIT
        g = (torch.arange(U) // upg).view(U, 1)
    inside = g < scales.shape[0]          # words past K (groups of 32 / 64): no group, zero
    g = g.clamp(max=scales.shape[0] - 1).to(scales.device)
    sz = torch.stack([scales[g], zeros[g]], -1) * inside.to(scales.device).view(U, -1, 1, 1)   # [U, slots, N, 2]
    out = torch.zeros(S * SPAN_UNITS, C * SPAN_COLS, sz.shape[1], 2, dtype=scales.dtype, device=scales.device)
    out[:U, :N] = sz.permute(0, 2, 1, 3)
    out = out.view(S, SPAN_UNITS, C, SPAN_COLS, -1, 2).permute(0, 2, 3, 1, 4, 5).contiguous()
    return w, out


def span_unpack(w: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """The inverse of span_pack's codes: the lut layout's words [units, N, 4]."""
    S, C = w.shape[:2]
    return w.permute(0, 3, 1, 2, 4).reshape(S * SPAN_UNITS, C * SPAN_COLS, 4)[:units(K), :N].contiguous()


def _word_sums(words: torch.Tensor, x: torch.Tensor):
    """(sum of x over the k whose code is 1, per code word and column [units * 4, N]; sum of x per word [units * 4]),
    through the kernels' table of the 16 subset sums per quad of k, one lookup per nibble (float32)."""
    U, N, _ = words.shape
    xf = torch.zeros(U * UNIT, dtype=torch.float32)
    xf[:x.numel()] = x.float()
    quads = xf.view(-1, 4)
    e = torch.arange(16).view(16, 1)
    sel = ((e >> torch.arange(4).view(1, 4)) & 1).float()                # [16, 4]
    table = quads @ sel.T                                                 # [quads, 16]
    w = words.to(torch.int64).permute(0, 2, 1).reshape(U * 4, N) & 0xFFFFFFFF   # [words, N]
    nib = (w.unsqueeze(1) >> (4 * torch.arange(8).view(1, 8, 1))) & 15           # [words, 8, N]
    qidx = torch.arange(U * 32).view(U * 4, 8, 1).expand_as(nib)
    return table[qidx, nib].sum(1), xf.view(-1, 32).sum(1)


def span_emulate(w: torch.Tensor, sz: torch.Tensor, x: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """The span kernel's arithmetic on the CPU in float32 from its own layout (x [K] -> y [N]): per lane (unit) and
    column, each (scale, zero point) slot's word sums less the zero point times the slot's sum of x, scaled."""
    U = units(K)
    word_sum, xw = _word_sums(span_unpack(w, K, N), x)                   # [U * 4, N], [U * 4]
    S, C, _, _, slots, _ = sz.shape
    pairs = sz.permute(0, 3, 1, 2, 4, 5).reshape(S * SPAN_UNITS, C * SPAN_COLS, slots, 2)[:U, :N].float()
    per = 4 // slots                                                      # words per slot
    t = word_sum.view(U, slots, per, N).sum(2)                            # [U, slots, N]
    xs = xw.view(U, slots, per).sum(2).unsqueeze(-1)                      # [U, slots, 1]
    s, z = pairs[..., 0].permute(0, 2, 1), pairs[..., 1].permute(0, 2, 1)  # [U, slots, N]
    return (s * (t - z * xs)).sum((0, 1))


def emulate(words: torch.Tensor, x: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, K: int, group: int,
            ks: int = KS_DEFAULT) -> torch.Tensor:
    """The kernel's arithmetic on the CPU in float32 (x [K] -> y [N]): the table per quad, the lookups per nibble, the
    sum of x per word, and the scale applied per group within each slice (per word for groups of 32 / 64 k)."""
    if group_ok(K, group):
        raise ValueError(group_ok(K, group))
    U, N, _ = words.shape
    word_sum, xw = _word_sums(words, x)
    s, z = scales.float(), zeros.float()
    y = torch.zeros(N, dtype=torch.float32)
    if group in (32, 64):
        gi = torch.arange(U * 4) // (group // 32)
        inside = torch.arange(U * 4) * 32 < K
        gi = torch.where(inside, gi, torch.zeros_like(gi))
        contrib = s[gi] * (word_sum - z[gi] * xw.view(-1, 1))
        return (contrib * inside.view(-1, 1)).sum(0)
    upg = U if group in (-1, K) else group // UNIT
    per = ks // UNIT
    for u0 in range(0, U, per):                                           # slices: one block's share each
        ga = torch.zeros(N)
        xg = torch.tensor(0.0)
        for u in range(u0, min(U, u0 + per)):
            ga = ga + word_sum[4 * u:4 * u + 4].sum(0)
            xg = xg + xw[4 * u:4 * u + 4].sum()
            if (u + 1) % upg == 0 or u == min(U, u0 + per) - 1:
                g = u // upg
                y = y + s[g] * (ga - z[g] * xg)
                ga, xg = torch.zeros(N), torch.tensor(0.0)
    return y
