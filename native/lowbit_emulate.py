"""CPU mirror of the native low-bit decode kernel's control flow (native/include/lowbit_kernel.cuh).

The kernel cannot run without a GPU; this walks the same schedule in float64 so that everything
but the arithmetic of the tensor cores is checked on the CPU: the packed words (through the
bit-exact recipe emulation of native/lowbit_layout.py), the packed scales and the stage table,
the stream-K ranges of every block (and the chunks the dynamic variants take at run time, in a random
order), the group flushes and their staged scale slot, the open-group
flush at a range end, the direct store of whole n-blocks, the atomic adds and the counts (at the block's end) of
partial ones, and the row mapping of the x split.  Line-by-line correspondence with the kernel
is intended: keep them in step.

    y, stats = emulate_gemv(pack(qw), x, grid=7)    # float64 [M, N] before the cast to the act dtype
"""
from __future__ import annotations

import torch

from native import lowbit_layout as LL

MAXP = 8   # partial pieces a block keeps before it counts them (lowbit_kernel.cuh)


def _channel_scales(sc: torch.Tensor, nb: int, G: int, zero: bool):
    """(s, z) float64 [256] of n-block nb, group G from the packed scales [nb, W, G, nt, g, S]."""
    v = sc[nb, :, G]                                   # [W, nt, g, S]
    s = v[..., 0:2].permute(0, 1, 3, 2).reshape(-1)    # [W, nt, jn, g] -> n = w*32 + nt*16 + jn*8 + g
    z = v[..., 2:4].permute(0, 1, 3, 2).reshape(-1) if zero else torch.zeros_like(s)
    return s, z


def dyn_split(T: int, g: int, S: int, eighths: int = 5, div: int = 8):
    """(dyn_static, dyn_chunk, dyn_base) of the dynamic variants (lowbit_launch.cuh dyn_split); chunk 0: static."""
    share = T // g
    if share < 2 * S or eighths == 8:
        return 0, 0, 0
    st = max(S, share * eighths // 8)
    return st, max(S, share // div), g * st


def block_ranges(T: int, grid: int, dyn=None, seed: int = 0) -> list:
    """Per block, the list of (begin, end) flat-stage ranges it computes.  dyn = (dyn_static, dyn_chunk,
    dyn_base) with chunk > 0: the dynamic variants -- each block's static range, then chunks taken from one
    counter in an order the hardware picks (here: random, seeded); a block takes its next chunk when it starts
    the previous one (the first at its start) and stops at the first empty one."""
    if not dyn or not dyn[1]:
        per, rem = divmod(T, grid)
        return [[(b * per + min(b, rem), b * per + min(b, rem) + per + (1 if b < rem else 0))] for b in range(grid)]
    st, chunk, base = dyn
    assert st >= 1 and base == grid * st <= T
    ranges = [[(b * st, (b + 1) * st)] for b in range(grid)]
    gen = torch.Generator().manual_seed(seed)
    waiting, counter = list(range(grid)), 0
    while waiting:
        b = waiting[int(torch.randint(len(waiting), (1,), generator=gen))]
        s = base + counter
        counter += chunk
        if s >= T:
            waiting.remove(b)
        else:
            ranges[b].append((s, min(s + chunk, T)))
    return ranges


def emulate_gemv(pw, x: torch.Tensor, grid: int, dyn=None, seed: int = 0):
    """y (float64 [M, N], what the kernel rounds to the act dtype) and stats of the schedule.  dyn: the
    dynamic variants' split (dyn_split), ranges taken in a random order (block_ranges)."""
    rec, L = pw.rec, pw.L
    M = x.shape[0]
    vals = LL.emulate_values(rec, pw.words, L)                 # exact code values [Kpad, Npad]
    xc = x.detach().cpu()
    if pw.xsplit:                                              # xsplit_kernel: hi = bf16(x), lo = bf16(x - hi)
        hi = xc.to(torch.bfloat16)
        lo = (xc.float() - hi.float()).to(torch.bfloat16)
        assert torch.equal(hi.double() + lo.double(), xc.double()), "x split is not exact"
        X = torch.cat([hi, lo]).double()
    else:
        X = xc.double()
    MX = X.shape[0]
    Xp = torch.zeros(MX, L.Kpad, dtype=torch.float64)
    Xp[:, :L.K] = X
    sc = pw.scales.detach().cpu().double()
    stab = [int(v) for v in pw.stab.cpu()]
    y32 = torch.zeros(M, L.Npad, dtype=torch.float64)
    counters = [0] * L.nblocks
    y = torch.full((M, L.Npad), float("nan"), dtype=torch.float64)
    stats = {"direct": 0, "atomic_pieces": 0, "finished": 0, "flushes": 0, "open_flushes": 0}
    T = L.nblocks * L.iters
    grid = min(grid, T)
    all_ranges = block_ranges(T, grid, dyn, seed)
    covered = sorted(r for rs in all_ranges for r in rs)
    assert [a for a, _ in covered] == [0] + [e for _, e in covered[:-1]] and covered[-1][1] == T, "ranges do not tile"
    for b in range(grid):
        rs = all_ranges[b]
        f, fend = rs[0]
        ri = 0
        nb, it = divmod(f, L.iters)
        seg_start = it
        total = torch.zeros(MX, LL.BN, dtype=torch.float64)
        acc = torch.zeros_like(total)
        xs = torch.zeros(MX, 1, dtype=torch.float64)

        pieces = []            # partial pieces, counted at the block's end (or when MAXP are pending)

        def publish():
            for pnb, n in pieces:
                counters[pnb] += n
            for pnb, _ in pieces:
                if counters[pnb] == L.iters:
                    cols = slice(pnb * LL.BN, (pnb + 1) * LL.BN)
                    y[:, cols] = y32[:, cols]
                    y32[:, cols] = 0.0
                    counters[pnb] = 0
                    stats["finished"] += 1
            pieces.clear()

        def flush(sidx, tab):
            nonlocal acc, xs, total
            g0, cnt = tab & 0xFFFF, (tab >> 16) & 0xF
            assert sidx < cnt, f"flush of staged scale slot {sidx}, the stage holds {cnt}"
            s, z = _channel_scales(sc, nb, g0 + sidx, rec.zero)
            total = total + s * acc - (s * z) * xs
            acc = torch.zeros_like(acc)
            xs = torch.zeros_like(xs)
            stats["flushes"] += 1

        while True:
            tab = stab[it]
            fmask = (tab >> 20) & 0xFF
            sidx = 0
            for kg in range(L.chunks):
                k0 = it * L.kstep + kg * LL.KG
                acc = acc + Xp[:, k0:k0 + LL.KG] @ vals[k0:k0 + LL.KG, nb * LL.BN:(nb + 1) * LL.BN]
                xs = xs + Xp[:, k0:k0 + LL.KG].sum(1, keepdim=True)
                if (fmask >> kg) & 1:
                    flush(sidx, tab)
                    sidx += 1
            if it == L.iters - 1 or f == fend - 1:
                if not (fmask >> (L.chunks - 1)) & 1:
                    flush(sidx, tab)
                    stats["open_flushes"] += 1
                cols = slice(nb * LL.BN, (nb + 1) * LL.BN)
                if not pw.xsplit and seg_start == 0 and it == L.iters - 1:
                    y[:, cols] = total[:M]
                    stats["direct"] += 1
                else:
                    for m in range(MX):
                        mo = m - M if (pw.xsplit and m >= M) else m
                        y32[mo, cols] += total[m]
                    pieces.append((nb, it - seg_start + 1))
                    stats["atomic_pieces"] += 1
                    if len(pieces) == MAXP:
                        publish()
                total = torch.zeros_like(total)
            it += 1
            if it == L.iters:
                it, nb, seg_start = 0, nb + 1, 0
            f += 1
            if f == fend:          # the block's next range (variants 4, 5), or its end
                ri += 1
                if ri == len(rs):
                    break
                f, fend = rs[ri]
                nb, it = divmod(f, L.iters)
                seg_start = it
        if pieces:
            publish()
    assert not y32.any() and not any(counters), "workspace or counters not left at zero"
    return y[:, :L.N], stats
