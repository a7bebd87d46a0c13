"""CPU mirror of the native low-bit decode kernel's control flow (native/include/lowbit_kernel.cuh).

The kernel cannot run without a GPU; this walks the same schedule in float64 so that everything
but the arithmetic of the tensor cores is checked on the CPU: the packed words (through the
bit-exact recipe emulation of native/lowbit_layout.py), the packed scales and the stage table,
the stream-K ranges of every block, the group flushes and their staged scale slot, the open-group
flush at a range end, the direct store of whole n-blocks, the atomic adds and the counter of
partial ones (at once, or at the block's end: DEFER), and the row mapping of the x split.  Line-by-line correspondence with the kernel
is intended: keep them in step.

    y, stats = emulate_gemv(pack(qw), x, grid=7)    # float64 [M, N] before the cast to the act dtype
"""
from __future__ import annotations

import torch

from native import lowbit_layout as LL

MAXP = 8   # partial pieces a DEFER block keeps before it counts them (lowbit_kernel.cuh)


def _channel_scales(sc: torch.Tensor, nb: int, G: int, zero: bool):
    """(s, z) float64 [256] of n-block nb, group G from the packed scales [nb, W, G, nt, g, S]."""
    v = sc[nb, :, G]                                   # [W, nt, g, S]
    s = v[..., 0:2].permute(0, 1, 3, 2).reshape(-1)    # [W, nt, jn, g] -> n = w*32 + nt*16 + jn*8 + g
    z = v[..., 2:4].permute(0, 1, 3, 2).reshape(-1) if zero else torch.zeros_like(s)
    return s, z


def emulate_gemv(pw, x: torch.Tensor, grid: int, defer: bool = False):
    """y (float64 [M, N], what the kernel rounds to the act dtype) and stats of the schedule.  defer: the
    partial pieces' counts added at the block's end (the kernel's DEFER: bulk variant, 4-bit codes)."""
    rec, L = pw.rec, pw.L
    M = x.shape[0]
    # exact code values + rec.bias [Kpad, Npad]; OFFSET recipes: deq_off()'s, which leave the offset of each
    # pair's k half jk in, and the sum's mma adds OFFA_jk * x beside sum(x), jk = (k % 4) // 2 (the mma's A
    # registers 1 / 3 of rows 8-15 hold the k of jk = 0 / 1: physical k = kg*32 + 8t + 4r + 2jk + {0, 1})
    vals = LL.emulate_values(rec, pw.words, L, off=bool(rec.offs))
    offk = torch.zeros(L.Kpad, dtype=torch.float64)
    if rec.offs:
        offk = torch.tensor(rec.off_groups, dtype=torch.float64)[(torch.arange(L.Kpad) % 4) // 2]
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
    per, rem = divmod(T, grid)
    for b in range(grid):
        f_begin = b * per + min(b, rem)
        f_end = f_begin + per + (1 if b < rem else 0)
        nb, it = divmod(f_begin, L.iters)
        seg_start = it
        total = torch.zeros(MX, LL.BN, dtype=torch.float64)
        acc = torch.zeros_like(total)
        xs = torch.zeros(MX, 1, dtype=torch.float64)
        xo = torch.zeros(MX, 1, dtype=torch.float64)           # OFFSET recipes: sum of offset(k) * x

        pieces = []            # partial pieces whose counts are not added yet

        def publish():
            for pnb, n in pieces:
                counters[pnb] += n
                if counters[pnb] == L.iters:
                    cols = slice(pnb * LL.BN, (pnb + 1) * LL.BN)
                    y[:, cols] = y32[:, cols]
                    y32[:, cols] = 0.0
                    counters[pnb] = 0
                    stats["finished"] += 1
            pieces.clear()

        def flush(sidx, tab):
            nonlocal acc, xs, xo, total
            g0, cnt = tab & 0xFFFF, (tab >> 16) & 0xF
            assert sidx < cnt, f"flush of staged scale slot {sidx}, the stage holds {cnt}"
            s, z = _channel_scales(sc, nb, g0 + sidx, rec.zero)
            z = z + rec.bias                                   # deq() left the magic number in (Recipe.bias)
            total = total + s * (acc - xo) - (s * z) * xs
            acc = torch.zeros_like(acc)
            xs = torch.zeros_like(xs)
            xo = torch.zeros_like(xo)
            stats["flushes"] += 1

        for f in range(f_begin, f_end):
            tab = stab[it]
            fmask = (tab >> 20) & 0xFF
            sidx = 0
            for kg in range(L.chunks):
                k0 = it * L.kstep + kg * LL.KG
                acc = acc + Xp[:, k0:k0 + LL.KG] @ vals[k0:k0 + LL.KG, nb * LL.BN:(nb + 1) * LL.BN]
                xs = xs + Xp[:, k0:k0 + LL.KG].sum(1, keepdim=True)
                xo = xo + Xp[:, k0:k0 + LL.KG] @ offk[k0:k0 + LL.KG, None]
                if (fmask >> kg) & 1:
                    flush(sidx, tab)
                    sidx += 1
            if it == L.iters - 1 or f == f_end - 1:
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
                    if not defer or len(pieces) == MAXP:
                        publish()
                total = torch.zeros_like(total)
            it += 1
            if it == L.iters:
                it, nb, seg_start = 0, nb + 1, 0
        publish()
    assert not y32.any() and not any(counters), "workspace or counters not left at zero"
    return y[:, :L.N], stats


# ----------------------------------------------------------------------------- the fused prefill kernel

def xperm(x: torch.Tensor, Kpad: int) -> torch.Tensor:
    """lowbit_xperm_kernel on the CPU: x [M, K] -> [M, Kpad], within every 32 k output pair 8r + 4jk + t taken from
    input pair 4t + 2r + jk (so logical 16r + 8jk + 2t + e holds physical 8t + 4r + 2jk + e), zero past K."""
    M, K = x.shape
    xz = torch.zeros(M, Kpad, dtype=x.dtype)
    xz[:, :K] = x
    pairs = xz.reshape(M, Kpad // LL.KG, 4, 2, 2, 2)           # [m, c, t, r, jk, e] (input pair 4t + 2r + jk)
    return pairs.permute(0, 1, 3, 4, 2, 5).reshape(M, Kpad)     # [m, c, r, jk, t, e] (output pair 8r + 4jk + t)


def xtiles(xp: torch.Tensor, bm: int = 128) -> torch.Tensor:
    """What lowbit_xperm_kernel writes, from x in the logical k order (xperm) [Mp, Kpad], Mp % bm == Kpad % 128 == 0:
    the fused kernel's ring-slot images, flat -- per (m-tile of bm rows, stage of fk k: bm = 128, fk = 128, or for
    the wide build bm = 256, fk = 64) fk / 64 sub-tiles of bm rows x 64 k, the 16-byte chunk c (8 k) of row rr at
    chunk c ^ (rr % 8) of that row; the same element order as the kernel's thread per 32 k writes."""
    Mp, Kpad = xp.shape
    fk = 64 if bm == 256 else 128
    t = xp.reshape(Mp // bm, bm, Kpad // fk, fk // 64, 8, 8).permute(0, 2, 3, 1, 4, 5)   # [mt, fs, h, rr, c, 8 k]
    src = torch.arange(8)[None, :] ^ (torch.arange(bm)[:, None] % 8)                     # stored chunk j of row rr: c
    return t[:, :, :, torch.arange(bm)[:, None], src].reshape(-1)                        # [mt, fs, h, rr, j, 8 k]


def emulate_fused(pw, x: torch.Tensor) -> torch.Tensor:
    """What lowbit_fused_kernel computes, float64 [M, N] before the final cast, walked the kernel's way: each thread's
    dequantized registers (the recipe emulation) placed at the wgmma's (row, logical k) -- register 8r + 4nt + 2jk + jn,
    half e of chunk c of lane 4g + t, warp w = A row 16 (w % 4) + 8 jn + g of tile nt (channel w*32 + nt*16 + 8jn + g),
    k 16 (2c + r) + 8jk + 2t + e of the stage -- each weight rounded once to the activation dtype after its scale
    (v * s - round(z * s)), times the permuted x (xperm); with one group over K and no zero point the exact values,
    the scale applied to y."""
    rec, L = pw.rec, pw.L
    assert not pw.xsplit and rec.bias == 0
    act = pw.act
    fs_per = L.kstep // 128                                     # fused stages (128 k) per layout stage
    w = pw.words.cpu().to(torch.int64) & 0xFFFFFFFF            # [nb, it, W, vec, 32, 4]
    w = w.permute(0, 1, 2, 4, 3, 5).reshape(L.nblocks, L.iters, LL.WARPS, 32, L.chunks, rec.bits)
    vals = torch.from_numpy(LL.emulate_chunk(rec, w.numpy()))   # [nb, it, W, lane, C, 16 pairs, 2 halves]
    vals = vals.reshape(L.nblocks, L.iters, LL.WARPS, 8, 4, fs_per, 4, 2, 2, 2, 2, 2)
    #                    nb         it       w         g  t  sub     c  r  nt jk jn e  (pair 8r + 4nt + 2jk + jn)
    vals = vals.permute(0, 1, 5, 2, 3, 4, 6, 7, 8, 9, 10, 11).reshape(L.nblocks, L.iters * fs_per, LL.WARPS, 8, 4, 4,
                                                                      2, 2, 2, 2, 2)
    #                    nb fs w g t c r nt jk jn e
    # scale groups: thread t of chunk c reads group (fs*128 + 32c + 8t) // group of its channels
    sc = pw.scales.cpu()                                         # [nb, W, G, nt, g, S] (s_jn0, s_jn1[, z_jn0, z_jn1])
    fs_idx = torch.arange(L.iters * fs_per)[:, None, None]
    kphys = fs_idx * 128 + 32 * torch.arange(4)[None, None, :] + 8 * torch.arange(4)[None, :, None]   # [fs, t, c]
    G = (kphys // L.group).clamp(max=L.ngroups - 1)
    s = sc[..., 0:2]                                             # [nb, W, G, nt, g, jn]
    z = sc[..., 2:4] if rec.zero else torch.zeros_like(s)
    sg = s[:, :, G]                                              # [nb, W, fs, t, c, nt, g, jn]
    zg = z[:, :, G]
    nzs = -(zg.double() * sg.double()).to(act).double()          # round(z * s), negated (exact)
    # to the vals order [nb, fs, W, g, t, c, (r), nt, (jk), jn]
    sg = sg.permute(0, 2, 1, 6, 3, 4, 5, 7).double()[:, :, :, :, :, :, None, :, None, :, None]
    nzs = nzs.permute(0, 2, 1, 6, 3, 4, 5, 7)[:, :, :, :, :, :, None, :, None, :, None]
    post = not rec.zero and L.group >= L.Kpad                   # y = s * (x . v) in f32: no rounding per weight
    wv = vals if post else (vals * sg + nzs).to(act).double()     # else one rounding per weight (fma)
    # A[n, k]: n = nb*256 + w*32 + nt*16 + jn*8 + g; logical k = fs*128 + 32c + 16r + 8jk + 2t + e
    A = wv.permute(0, 2, 7, 9, 3, 1, 5, 6, 8, 4, 10)            # nb w nt jn g | fs c r jk t e
    A = A.reshape(L.Npad, L.Kpad)
    xp = xperm(x.detach().cpu(), L.Kpad).double()
    y = xp @ A.t()
    if post:
        y = y * s[:, :, 0].permute(0, 1, 2, 4, 3).reshape(-1).double()[None]   # [nb, W, nt, jn, g] -> channel
    return y[:, :L.N]
