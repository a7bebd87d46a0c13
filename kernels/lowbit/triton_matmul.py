"""Triton weight-only low-bit matmul: y[M, N] = x[M, K] @ dequant(W)[K, N].

Every format of ``formats`` (u1..u8, i2..i8, f{b}e{E}m{M}), f16/bf16
activations, any group size that is a multiple of 8 (or -1).

Kernel layout (``prepare``, once, outside timing)
-------------------------------------------------
The 8 codes of 8 consecutive k (k = 8*kw + j) of one column n form a "chunk": a
dense little-endian stream of 8*b bits, slot t at stream bits [t*b, t*b+b); code k
sits in slot ``packed.SLOT[k]`` (= k//2 + 4*(k%2), so the packed dequantization yields
consecutive k pairs).  The chunk (b bytes) is split into power-of-two words (PARTS:
b=3 -> 16+8 bits, 5 -> 32+8, 6 -> 32+16, 7 -> 32+16+8, 8 -> 32+32; 1, 2, 4 -> one
8/16/32-bit word); word i of every chunk is stored in its own int8/int16/int32 array,
in blocks of TKW=16 word rows (128 k) x TN=64 columns that are contiguous in memory
(row-major inside: a word row's 64 columns, then the next row; the blocks of a 64-column
strip in K order), so a CTA streams contiguous memory and a thread's consecutive columns
are one vector load.  Total bytes = K*N*b/8 exactly (no
inflation) + scales (+ zeros).

Dequantization without int->float conversions: on the GPU with f16 activations, uint
1/2/4/8 and int 2/4/8 codes go through ``packed`` (LOP3 + HFMA2, two weights per
instruction).  Everything else (and the interpreter) uses the f32 route (details above
``_sh``): uint/int codes are OR-ed into the mantissa of 1.0 (v = 1 + u/2^B, int as
offset binary), floats are placed into an f32 bit pattern (value * 2^(bias-127),
subnormal codes as f32 denormals, which Triton does not flush).

Paths (``Config.path``)
-----------------------
* ``fma`` (M == 1, decode): each program owns BN columns and a K range (split-K
  over programs when N is small), streams its weight bytes exactly once and
  prefetches the next tile's words and scales into registers before computing the
  current one.  Packed formats: per chunk the 8 codes minus zero point are dotted with
  x in f16x2 (``packed.asm_dot8``) and scaled in f32; others: an f32 FMA chain
  t += x_j * v_j, then acc += t*S + sum(x)*C (the group scale once per 8 codes).
* ``dot`` (M <= 256, decode / small batch): y^T = W^T x^T with the dequantized tile as
  the tl.dot A operand (wgmma N = BM), or with ``xw`` y = x @ W (the tile as the B
  operand, from shared memory); x padded to BM (16/32/64...) rows; Triton's cp.async
  pipelining (``stages``).
* ``deq_mm`` (large M, prefill): a Triton kernel dequantizes W to the activation
  dtype, then torch.matmul (cuBLAS); the dequantization is part of the call and
  therefore of any timing of it.
Split-K (``split_k`` > 1) accumulates into an f32 buffer with atomics, then casts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
import triton
import triton.language as tl

from kernels import Unsupported
from kernels.lowbit import packed
from kernels.lowbit.formats import QuantizedWeight, WeightFormat, unpack_bits

__all__ = ["Config", "PreparedWeight", "prepare", "lowbit_matmul", "configs_for",
           "choose_config", "autotune", "tuning_summary", "config_str", "parse_config", "dequantize", "PARTS"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

PARTS = {1: (1,), 2: (2,), 3: (2, 1), 4: (4,), 5: (4, 1), 6: (4, 2), 7: (4, 2, 1), 8: (4, 4)}
_WORD_DTYPE = {1: torch.int8, 2: torch.int16, 4: torch.int32}
SMALL_M = 16
LAYOUT_TN, LAYOUT_TKW = 64, 16     # word layout blocks: 64 columns x 128 k (when N, K/8 divide)
_KOF = tuple(packed.SLOT.index(j) for j in range(8))    # code (k within the chunk) held by slot j


# ----------------------------------------------------------------------------- layout

@dataclass
class PreparedWeight:
    parts: List[torch.Tensor]       # per part: K/8 * N int8/int16/int32 words, blocked (see _word_offsets)
    part_bits: tuple
    scales: torch.Tensor            # [K//g, N] act dtype
    zeros: Optional[torch.Tensor]   # [K//g, N] act dtype (uint) or None
    fmt: WeightFormat
    K: int
    N: int
    group: int                      # effective group length (K for per-channel)
    group_size: int                 # as given
    act_dtype: torch.dtype
    fold: bool = False              # floats: 2^(127-bias) folded into the f32 scale (no overflow)
    tn: int = 64                    # layout block: tn columns x tkw word rows, contiguous in memory
    tkw: int = 16
    launches: dict = field(default_factory=dict, repr=False, compare=False)   # see lowbit_matmul

    @property
    def nbytes(self) -> int:
        n = sum(p.numel() * p.element_size() for p in self.parts)
        n += self.scales.numel() * self.scales.element_size()
        if self.zeros is not None:
            n += self.zeros.numel() * self.zeros.element_size()
        return n

    @property
    def device(self):
        return self.scales.device


def prepare(qw: QuantizedWeight) -> PreparedWeight:
    """Canonical dense stream -> kernel layout (same number of bytes)."""
    fmt, K, N = qw.fmt, qw.K, qw.N
    if K % 8:
        raise Unsupported(f"K={K} is not a multiple of 8 (kernel layout packs 8 k per word)")
    if qw.group % 8:
        raise Unsupported(f"group size {qw.group_size} is not a multiple of 8")
    pb = PARTS[fmt.bits]
    dev = qw.packed.device
    KW = K // 8
    tn = LAYOUT_TN if N % LAYOUT_TN == 0 else N
    tkw = LAYOUT_TKW if KW % LAYOUT_TKW == 0 else KW
    parts = [torch.empty((KW, N), dtype=_WORD_DTYPE[p], device=dev) for p in pb]
    rows = max(8, ((1 << 23) // max(N, 1)) // 8 * 8)
    b = fmt.bits
    for r0 in range(0, K, rows):
        r1 = min(K, r0 + rows)
        codes = unpack_bits(qw.packed[r0 * N * b // 8:r1 * N * b // 8], b, (r1 - r0) * N)
        codes = codes.reshape((r1 - r0) // 8, 8, N).to(torch.int64)
        o = 0   # stream bit where word i starts; code j is at stream bits [j*b, j*b+b)
        for i, p in enumerate(pb):
            wbits = 8 * p
            word = torch.zeros(((r1 - r0) // 8, N), dtype=torch.int64, device=dev)
            for j in range(8):        # slot j of the chunk holds code k = _KOF[j] (packed.SLOT)
                lo, hi = max(j * b, o), min(j * b + b, o + wbits)
                if lo < hi:
                    word += ((codes[:, _KOF[j], :] >> (lo - j * b)) & ((1 << (hi - lo)) - 1)) << (lo - o)
            word = torch.where(word >= (1 << (wbits - 1)), word - (1 << wbits), word)
            parts[i][r0 // 8:r1 // 8] = word.to(_WORD_DTYPE[p])
            o += wbits
    # [KW, N] -> blocks of tkw word rows x tn columns, each block contiguous (row-major inside:
    # a word row's tn columns, then the next row); blocks of one column strip in K order
    parts = [w.reshape(KW // tkw, tkw, N // tn, tn).permute(2, 0, 1, 3).contiguous().reshape(-1) for w in parts]
    fold = False
    if fmt.kind == "float":
        smax = float(qw.scales.abs().max().float()) if qw.scales.numel() else 0.0
        fold = smax * 2.0 ** (127 - fmt.bias) < 2.0 ** 126
    return PreparedWeight(parts, pb, qw.scales.contiguous(),
                          None if qw.zeros is None else qw.zeros.contiguous(),
                          fmt, K, N, qw.group, qw.group_size, qw.act_dtype, fold, tn, tkw)


# ----------------------------------------------------------------------------- kernels
#
# Value construction without int->float conversions (all exact):
#   uint/int: the code u (int: offset binary u = q + 2^(B-1), via XOR) is OR-ed into the
#     top of the mantissa of 1.0:  v = 1 + u/2^B  (bits 0x3F800000 | u << (23-B)), and
#     w = v*S + C with S = 2^B*s, C = -(2^B + z)*s  (int: C = -(2^B + 2^(B-1))*s).
#     The constant's rounding error is ~2^(B-23) s, far below a quantization step.
#   float: the code is placed with its sign at bit 31 and arithmetic-shifted right by
#     8-E so that the E exponent bits are the low bits of the f32 exponent; the sign
#     copies are cleared.  The f32 is value(code) * 2^(bias-127) (e=0 -> f32 denormal,
#     which Triton does not flush), times FSCALE = 2^(127-bias).
# MAGIC (0x3F800000, or 0x3FC00000 for int) is a runtime argument so that ptxas fuses
# the mask and the magic into one 3-input LOP3.


@triton.jit
def _sh(w, D: tl.constexpr):
    """Logical shift of uint32 words by a compile-time amount (D > 0: left, D < 0: right)."""
    if D > 0:
        r = w << D
    elif D < 0:
        r = w >> (-D)
    else:
        r = w
    return r


@triton.constexpr_function
def _seg_shift(J, B, O, L, DST):
    """Shift that moves stream bit J*B (held in the word covering stream bits [O, O+L)
    at bit J*B-O) to bit DST."""
    return DST - (J * B - O)


@triton.constexpr_function
def _seg_mask(J, B, O, L, DST):
    """Mask (after the shift) of the bits of code J that the word [O, O+L) holds; 0 if none."""
    lo = max(J * B, O)
    hi = min(J * B + B, O + L)
    if lo >= hi:
        return 0
    return ((1 << (hi - lo)) - 1) << (DST + lo - J * B)


@triton.jit
def _code(w0, w1, w2, J: tl.constexpr, B: tl.constexpr, L0: tl.constexpr, L1: tl.constexpr,
          L2: tl.constexpr, DST: tl.constexpr):
    """Code J of the 8-code chunks (words w0|w1|w2 = a dense stream of 8*B bits, code J at
    stream bits [J*B, J*B+B)), placed at bits [DST, DST+B), other bits zero.
    One shift + one AND per word the code touches (at most 2)."""
    M0: tl.constexpr = _seg_mask(J, B, 0, L0, DST)
    M1: tl.constexpr = _seg_mask(J, B, L0, L1, DST)
    M2: tl.constexpr = _seg_mask(J, B, L0 + L1, L2, DST)
    q = w0 & 0
    if M0 != 0:
        q = q | (_sh(w0, _seg_shift(J, B, 0, L0, DST)) & M0)
    if M1 != 0:
        q = q | (_sh(w1, _seg_shift(J, B, L0, L1, DST)) & M1)
    if M2 != 0:
        q = q | (_sh(w2, _seg_shift(J, B, L0 + L1, L2, DST)) & M2)
    return q


@triton.jit
def _place8(w0, w1, w2, B: tl.constexpr, L0: tl.constexpr, L1: tl.constexpr, L2: tl.constexpr,
            DST: tl.constexpr):
    """Words [R, C] -> the 8 codes [R, C, 8] placed at DST, the 8 codes of a chunk in one
    thread and contiguous along k (tl.join puts the new dim in-thread)."""
    c0 = _code(w0, w1, w2, 0, B, L0, L1, L2, DST)     # c_k = slot packed.SLOT[k]
    c1 = _code(w0, w1, w2, 4, B, L0, L1, L2, DST)
    c2 = _code(w0, w1, w2, 1, B, L0, L1, L2, DST)
    c3 = _code(w0, w1, w2, 5, B, L0, L1, L2, DST)
    c4 = _code(w0, w1, w2, 2, B, L0, L1, L2, DST)
    c5 = _code(w0, w1, w2, 6, B, L0, L1, L2, DST)
    c6 = _code(w0, w1, w2, 3, B, L0, L1, L2, DST)
    c7 = _code(w0, w1, w2, 7, B, L0, L1, L2, DST)
    a = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(a, (w0.shape[0], w0.shape[1], 8))


@triton.jit
def _val(q, MAGIC, KIND: tl.constexpr, EXPB: tl.constexpr):
    """Placed code bits -> f32: uint/int 1 + u/2^B; float value * 2^(bias-127)."""
    if KIND == 0:
        v = (q | MAGIC).to(tl.float32, bitcast=True)
    elif KIND == 1:
        v = (q ^ MAGIC).to(tl.float32, bitcast=True)
    else:
        CLR: tl.constexpr = ((1 << (8 - EXPB)) - 1) << (23 + EXPB)
        t = q.to(tl.int32, bitcast=True) >> (8 - EXPB)
        v = (t & ~CLR).to(tl.float32, bitcast=True)
    return v


@triton.jit
def _load_words(p0, p1, p2, k0, n, msk, KW, TN: tl.constexpr, TKW: tl.constexpr, P1: tl.constexpr,
                P2: tl.constexpr, BKW: tl.constexpr):
    """Word tile [BKW, BN] of word rows k0/8 .., columns n.  Layout (``prepare``): blocks of TKW
    rows x TN columns, each contiguous (row-major: a row's TN words, then the next row), the
    blocks of a TN-column strip in K order: a CTA streams contiguous memory."""
    kw = tl.multiple_of(k0 // 8, BKW if BKW < TKW else TKW) + tl.arange(0, BKW)
    offs = ((n[None, :] // TN) * (KW * TN) + (kw[:, None] // TKW) * (TN * TKW)
            + (kw[:, None] % TKW) * TN + n[None, :] % TN)
    w0 = tl.load(p0 + offs, mask=msk, other=0).to(tl.uint32)
    w1 = w0
    w2 = w0
    if P1 > 0:
        w1 = tl.load(p1 + offs, mask=msk, other=0).to(tl.uint32)
    if P2 > 0:
        w2 = tl.load(p2 + offs, mask=msk, other=0).to(tl.uint32)
    return w0, w1, w2


@triton.jit
def _load_sc(s_ptr, z_ptr, k0, n, nmask, N, G: tl.constexpr, KIND: tl.constexpr, B: tl.constexpr,
             FSCALE: tl.constexpr, BK: tl.constexpr, QCODE: tl.constexpr = False):
    """Per-tile factors (S, C), f32, shape [1, BN] (tile in one group) or [BK/8, BN]:
    uint/int: w = v*S + C;  float: w = (v*FSCALE)*S, C unused.  QCODE (the packed M = 1
    path, integer codes q): w = (q - C) * S, S = s, C = z (uint; 0 for int)."""
    if G % BK == 0:
        srow = k0 // G
        s = tl.load(s_ptr + srow * N + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if KIND == 0:
            z = tl.load(z_ptr + srow * N + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    else:
        srow = (k0 + tl.arange(0, BK // 8) * 8) // G
        soff = srow[:, None] * N + n[None, :]
        s = tl.load(s_ptr + soff, mask=nmask[None, :], other=0.0).to(tl.float32)
        if KIND == 0:
            z = tl.load(z_ptr + soff, mask=nmask[None, :], other=0.0).to(tl.float32)
    if QCODE:   # w = (q - z) * s: S = s, C = z (f16-exact, the asm subtracts it)
        S = s
        if KIND == 0:
            C = z
        else:
            C = s * 0
    elif KIND == 0:
        S = s * (1 << B)
        C = -(z + (1 << B)) * s
    elif KIND == 1:
        S = s * (1 << B)
        C = s * (-((1 << B) + (1 << (B - 1))))
    else:
        S = s
        C = s
    return S, C


@triton.jit
def _load_sz16(s_ptr, z_ptr, k0, n, nmask, N, G: tl.constexpr, KIND: tl.constexpr, BK: tl.constexpr):
    """Packed path: the scale s and zs = -z*s (uint; rounded to f16 once per group and
    column), f16, shape [1, BN] (tile in one group) or [BK/8, BN]."""
    if G % BK == 0:
        soff = (k0 // G) * N + n[None, :]
    else:
        soff = ((k0 + tl.arange(0, BK // 8) * 8) // G)[:, None] * N + n[None, :]
    s = tl.load(s_ptr + soff, mask=nmask[None, :], other=0.0)
    zs = s
    if KIND == 0:
        z = tl.load(z_ptr + soff, mask=nmask[None, :], other=0.0)
        zs = (-(z.to(tl.float32) * s.to(tl.float32))).to(tl.float16)
    return s.to(tl.float16), zs


@triton.jit
def _x8(t):
    """[R, C] -> [R, C, 8] copies, the 8 in one thread and consecutive (join puts the new dim in-thread)."""
    a = tl.join(t, t)
    a = tl.join(a, a)
    a = tl.join(a, a)
    return tl.reshape(a, (t.shape[0], t.shape[1], 8))


@triton.jit
def _deq_packed(w0, w1, s16, zs16, ASM: tl.constexpr):
    """Words [R, C] (w1: the second word, B = 8) -> f16 [R, C, 8] in k order, two weights per
    instruction (kernels/lowbit/packed.py; one asm block per chunk, pack=8: output register o
    holds k = 2o, 2o + 1)."""
    R: tl.constexpr = w0.shape[0]
    C: tl.constexpr = w0.shape[1]
    s8 = _x8(tl.broadcast_to(s16, (R, C)))
    z8 = _x8(tl.broadcast_to(zs16, (R, C)))
    return tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r," + "r," * 23 + "r",
                                     [_x8(w0.to(tl.int32, bitcast=True)), _x8(w1.to(tl.int32, bitcast=True)),
                                      s8, z8], tl.float16, True, 8)


@triton.jit
def _dequant_tile(p0, p1, p2, s_ptr, z_ptr, MAGIC, k0, n, nmask, N, KW, TN: tl.constexpr, TKW: tl.constexpr,
                  G: tl.constexpr, KIND: tl.constexpr, B: tl.constexpr,
                  P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
                  EXPB: tl.constexpr, FSCALE: tl.constexpr, FOLD: tl.constexpr, BK: tl.constexpr,
                  PACKED: tl.constexpr = False, ASM: tl.constexpr = ""):
    """Rows k0 .. k0+BK, columns n -> the dequantized weight [BK//8, BN, 8] (k = k0 + 8*kw + j),
    the 8 codes of a word in one thread: f32, or f16 when PACKED (GPU, f16, uint/int of
    1, 2, 4, 8 bits: dequantized two per instruction, packed.py)."""
    w0, w1, w2 = _load_words(p0, p1, p2, k0, n, nmask[None, :], KW, TN, TKW, P1, P2, BK // 8)
    if PACKED:
        s16, zs16 = _load_sz16(s_ptr, z_ptr, k0, n, nmask, N, G, KIND, BK)
        w = _deq_packed(w0, w1, s16, zs16, ASM)
    else:
        if KIND == 2:
            DST: tl.constexpr = 32 - B
        else:
            DST: tl.constexpr = 23 - B
        q = _place8(w0, w1, w2, B, 8 * P0, 8 * P1, 8 * P2, DST)
        v = _val(q, MAGIC, KIND, EXPB)
        S, C = _load_sc(s_ptr, z_ptr, k0, n, nmask, N, G, KIND, B, FSCALE, BK)
        if KIND == 2:
            if FOLD:
                w = v * (S * FSCALE)[:, :, None]
            else:
                w = (v * FSCALE) * S[:, :, None]
        else:
            w = v * S[:, :, None] + C[:, :, None]
    return w


@triton.jit
def _mm_small_kernel(x_ptr, p0, p1, p2, s_ptr, z_ptr, MAGIC, y_ptr, M, N, KW, stride_xm, stride_ym,
                     TN: tl.constexpr, TKW: tl.constexpr,
                     G: tl.constexpr, KIND: tl.constexpr, B: tl.constexpr,
                     P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
                     EXPB: tl.constexpr, FSCALE: tl.constexpr, FOLD: tl.constexpr,
                     PACKED: tl.constexpr, ASM: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KSPLIT: tl.constexpr,
                     USE_DOT: tl.constexpr, XW: tl.constexpr, ATOMIC: tl.constexpr, INTERP: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < N
    kbeg = pid_k * KSPLIT
    kend = kbeg + KSPLIT
    BKW: tl.constexpr = BK // 8
    if USE_DOT and XW:
        # y[BM, BN] = x[BM, BK] @ W[BK, BN]: the dequantized tile is the B operand, stored to
        # shared memory with k contiguous (16-byte stores) and read by ldmatrix / wgmma
        m = pid_m * BM + tl.arange(0, BM)
        mmask = m < M
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(kbeg, kend, BK):
            w = _dequant_tile(p0, p1, p2, s_ptr, z_ptr, MAGIC, k0, n, nmask, N, KW, TN, TKW, G, KIND, B, P0, P1, P2,
                              EXPB, FSCALE, FOLD, BK, PACKED, ASM)
            wk = tl.reshape(tl.permute(w.to(x_ptr.dtype.element_ty), (0, 2, 1)), (BK, BN))
            xk = k0 + tl.arange(0, BK)
            xa = tl.load(x_ptr + m[:, None] * stride_xm + xk[None, :], mask=mmask[:, None], other=0.0)
            if INTERP:  # the interpreter's bf16 tl.dot is wrong; values are exact in f32 too
                wk = wk.to(tl.float32)
                xa = xa.to(tl.float32)
            acc = tl.dot(xa, wk, acc)
    elif USE_DOT:
        # y^T[BN, BM] = W^T[BN, BK] @ x^T[BK, BM]: the dequantized tile is the A operand,
        # k contiguous per thread (row-major A: vector smem stores)
        m = pid_m * BM + tl.arange(0, BM)
        mmask = m < M
        accT = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(kbeg, kend, BK):
            w = _dequant_tile(p0, p1, p2, s_ptr, z_ptr, MAGIC, k0, n, nmask, N, KW, TN, TKW, G, KIND, B, P0, P1, P2,
                              EXPB, FSCALE, FOLD, BK, PACKED, ASM)
            wt = tl.reshape(tl.permute(w.to(x_ptr.dtype.element_ty), (1, 0, 2)), (BN, BK))
            xk = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + m[None, :] * stride_xm + xk[:, None], mask=mmask[None, :], other=0.0)
            if INTERP:  # the interpreter's bf16 tl.dot is wrong; values are exact in f32 too
                wt = wt.to(tl.float32)
                xt = xt.to(tl.float32)
            accT = tl.dot(wt, xt, accT)
        acc = tl.trans(accT)
    else:
        # M == 1 on CUDA cores: per k-row of 8 codes an FMA chain t += x_j * v_j, the
        # group scale applied once per 8 codes (acc += t*S + sum(x)*C); the next tile's
        # words and scales are loaded before this one is computed (register prefetch).
        m = tl.arange(0, 1)
        mmask = m < M
        kw = tl.arange(0, BKW)
        if KIND == 2:
            DST: tl.constexpr = 32 - B
        else:
            DST: tl.constexpr = 23 - B
        acc2 = tl.zeros([BKW, BN], dtype=tl.float32)
        w0n, w1n, w2n = _load_words(p0, p1, p2, kbeg, n, nmask[None, :], KW, TN, TKW, P1, P2, BKW)
        Sn, Cn = _load_sc(s_ptr, z_ptr, kbeg, n, nmask, N, G, KIND, B, FSCALE, BK, PACKED)
        for k0 in range(kbeg, kend, BK):
            w0 = w0n
            w1 = w1n
            w2 = w2n
            S = Sn
            C = Cn
            kn = k0 + BK
            w0n, w1n, w2n = _load_words(p0, p1, p2, kn, n, nmask[None, :] & (kn < kend), KW, TN, TKW, P1, P2, BKW)
            Sn, Cn = _load_sc(s_ptr, z_ptr, tl.minimum(kn, kend - BK), n, nmask, N, G, KIND, B, FSCALE, BK, PACKED)
            if PACKED:   # codes minus zero point dotted with x in f16x2 (packed.asm_dot8); scale per chunk in f32
                xp = x_ptr.to(tl.pointer_type(tl.int32)) + k0 // 2 + kw * 4
                t = tl.inline_asm_elementwise(
                    ASM, "=f,r,r,r,r,r,r,h",
                    [w0.to(tl.int32, bitcast=True), w1.to(tl.int32, bitcast=True), tl.load(xp)[:, None],
                     tl.load(xp + 1)[:, None], tl.load(xp + 2)[:, None], tl.load(xp + 3)[:, None],
                     tl.broadcast_to(C, (BKW, BN)).to(tl.float16)],
                    tl.float32, True, 1)
                acc2 += t * S
            else:
                t = tl.zeros([BKW, BN], dtype=tl.float32)
                xs = tl.zeros([BKW], dtype=tl.float32)
                for j in tl.static_range(8):
                    v = _val(_code(w0, w1, w2, j // 2 + 4 * (j % 2), B, 8 * P0, 8 * P1, 8 * P2, DST),
                             MAGIC, KIND, EXPB)
                    if KIND == 2:
                        v = v * FSCALE
                    xj = tl.load(x_ptr + k0 + kw * 8 + j).to(tl.float32)
                    t += v * xj[:, None]
                    xs += xj
                if KIND == 2:
                    acc2 += t * S
                else:
                    acc2 += t * S + xs[:, None] * C
        acc = tl.sum(acc2, axis=0)[None, :]
    yp = y_ptr + m[:, None] * stride_ym + n[None, :]
    msk = mmask[:, None] & nmask[None, :]
    if ATOMIC:
        tl.atomic_add(yp, acc, mask=msk)
    else:
        tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=msk)


@triton.jit
def _dequant_kernel(p0, p1, p2, s_ptr, z_ptr, MAGIC, w_ptr, N, KW, TN: tl.constexpr, TKW: tl.constexpr,
                    G: tl.constexpr, KIND: tl.constexpr, B: tl.constexpr,
                    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
                    EXPB: tl.constexpr, FSCALE: tl.constexpr, FOLD: tl.constexpr,
                    PACKED: tl.constexpr, ASM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < N
    k0 = pid_k * BK
    w = _dequant_tile(p0, p1, p2, s_ptr, z_ptr, MAGIC, k0, n, nmask, N, KW, TN, TKW, G, KIND, B, P0, P1, P2,
                      EXPB, FSCALE, FOLD, BK, PACKED, ASM)
    kw = tl.arange(0, BK // 8)
    j = tl.arange(0, 8)
    kk = k0 + kw[:, None] * 8 + j[None, :]
    tl.store(w_ptr + kk[:, None, :] * N + n[None, :, None], w.to(w_ptr.dtype.element_ty),
             mask=nmask[None, :, None])


# ----------------------------------------------------------------------------- configs

@dataclass(frozen=True)
class Config:
    path: str            # "dot" | "fma" | "deq_mm"
    bn: int = 128        # columns per program
    bk: int = 128        # k per loop step (multiple of 8; >= 16 for dot)
    split_k: int = 1     # programs along K (> 1: f32 atomics + a cast)
    warps: int = 4
    stages: int = 3      # software pipelining depth (dot path; fma prefetches one tile itself)
    bm: int = 16         # rows of x per program (dot path; M > bm adds programs along M)
    x2: bool = True      # dot / deq_mm: packed f16x2 dequantization where it applies (packed.py)
    xw: bool = False     # dot path: y = x @ W (W the B operand, from shared memory) instead of y^T = W^T x^T

    def __str__(self) -> str:
        h = "" if self.x2 else "h0"
        if self.path == "deq_mm":
            return f"deq_mm:n{self.bn}k{self.bk}w{self.warps}{h}"
        s = f"{self.path}:n{self.bn}k{self.bk}s{self.split_k}w{self.warps}p{self.stages}"
        if self.path == "dot":
            s += ("" if self.bm == 16 else f"m{self.bm}") + ("x1" if self.xw else "") + h
        return s


def config_str(cfg: Config) -> str:
    """Short, stable description: '<path>:n<BN>k<BK>s<split_k>w<warps>p<stages>[m<BM>][x1][h0]',
    e.g. 'fma:n64k128s1w4p1', 'dot:n64k128s1w4p3', 'dot:n128k128s1w8p3m64x1', 'deq_mm:n64k64w4h0'
    (x1: y = x @ W orientation; h0: packed f16x2 dequantization off)."""
    return str(cfg)


def parse_config(s: str) -> Config:
    """Inverse of config_str."""
    import re
    path, rest = s.split(":")
    vals = dict((k, int(v)) for k, v in re.findall(r"([a-z])(\d+)", rest))
    return Config(path, vals.get("n", 128), vals.get("k", 128), vals.get("s", 1),
                  vals.get("w", 4), vals.get("p", 1 if path == "deq_mm" else 3), vals.get("m", 16),
                  bool(vals.get("h", 1)), bool(vals.get("x", 0)))


MAX_DOT_M = 256


def _valid(cfg: Config, M: int, K: int, group: int) -> bool:
    if cfg.path == "deq_mm":
        return K % cfg.bk == 0 and cfg.bk % 8 == 0
    if cfg.path == "fma" and M != 1:
        return False
    if cfg.path == "dot" and (M > MAX_DOT_M or cfg.bm not in (16, 32, 64, 128)):
        return False
    if cfg.path not in ("dot", "fma"):
        return False
    ks = K // cfg.split_k
    return (K % cfg.split_k == 0 and ks % cfg.bk == 0 and cfg.bk % 8 == 0
            and (cfg.bk >= 16 or cfg.path == "fma") and cfg.bn >= 16)


def _split(K: int, N: int, bn: int, bk: int, nsm: int = 132) -> int:
    """Split K until there are >= 2 programs per SM (small N)."""
    sk = 1
    while triton.cdiv(N, bn) * sk < 2 * nsm and K % (sk * 2 * bk) == 0 and sk < 16:
        sk *= 2
    return sk


def configs_for(M: int, K: int, N: int, fmt=None, group: int = 128) -> List[Config]:
    """Small tuning space for one problem (valid configs only).  The first entry of each
    path is the default (best measured on an H200 at K=8192, N=57344, see NOTES.md)."""
    out: List[Config] = []
    if M == 1:
        for bn, bk, w in [(128, 128, 4), (64, 128, 4), (256, 64, 8), (64, 64, 2), (128, 64, 4),
                          (256, 32, 4), (128, 32, 2)]:
            out.append(Config("fma", bn, bk, _split(K, N, bn, bk), w, 1))
    if M <= MAX_DOT_M:
        bm = 16 if M <= 16 else (32 if M <= 32 else 64)
        # (bn, bk, warps, stages, bm, xw): y^T = W^T x^T (wgmma N = bm, the weight tile from
        # registers) or y = x @ W (with bm = 64: wgmma with both operands in shared memory)
        for bn, bk, w, st, m, xw in [(64, 64, 4, 4, bm, False), (64, 128, 4, 3, bm, True),
                                     (64, 128, 4, 3, bm, False), (128, 128, 8, 3, bm, False),
                                     (64, 256, 4, 3, bm, False), (128, 128, 8, 3, max(bm, 64), True)]:
            out.append(Config("dot", bn, bk, _split(K, N, bn, bk), w, st, m, xw=xw))
    if M > 16:
        for bn, bk, w in [(64, 64, 4), (128, 32, 4)]:
            out.append(Config("deq_mm", bn, bk, 1, w, 1))
    out = [c for c in out if _valid(c, M, K, group)]
    if not out:   # K not a multiple of the tiles above (K % 8 == 0 always holds)
        out = [c for c in (Config("fma", 64, 8, 1, 4, 1), Config("deq_mm", 64, 8, 1, 4, 1))
               if _valid(c, M, K, group)]
    return out


_TUNED: Dict[tuple, Config] = {}
TUNE_LOG: Dict[tuple, list] = {}      # problem key -> [(config, seconds)] of the last autotune


def _key(M: int, pw: PreparedWeight):
    mb = 1 if M == 1 else (SMALL_M if M <= SMALL_M else 1 << (M - 1).bit_length())
    return (mb, pw.K, pw.N, pw.fmt.name, pw.group, pw.act_dtype)


def choose_config(M: int, pw: PreparedWeight) -> Config:
    """Tuned config if ``autotune`` ran for this problem, else a heuristic."""
    c = _TUNED.get(_key(M, pw))
    if c is not None and _valid(c, M, pw.K, pw.group):
        return c
    want = "fma" if M == 1 else ("dot" if M <= 64 else "deq_mm")
    cands = configs_for(M, pw.K, pw.N, pw.fmt, pw.group)
    for c in cands:
        if c.path == want:
            return c
    if cands:
        return cands[0]
    raise Unsupported(f"no config tiles M={M}, K={pw.K}, N={pw.N}, group {pw.group_size}")


def autotune(x: torch.Tensor, pw: PreparedWeight, timer: Callable[[Callable[[], object]], float],
             configs: Optional[Sequence[Config]] = None) -> Config:
    """Time each config with the caller's ``timer(fn) -> seconds``; remember and return the best."""
    M = x.shape[0]
    cands = list(configs) if configs is not None else configs_for(M, pw.K, pw.N, pw.fmt, pw.group)
    best, best_t, log = None, float("inf"), []
    for c in cands:
        if not _valid(c, M, pw.K, pw.group):
            continue
        try:
            lowbit_matmul(x, pw, c)
            t = timer(lambda c=c: lowbit_matmul(x, pw, c))
        except Unsupported:
            continue
        log.append((c, t))
        if t < best_t:
            best, best_t = c, t
    if best is None:
        raise Unsupported(f"no valid config for M={M}, K={pw.K}, N={pw.N}, {pw.fmt.name}")
    _TUNED[_key(M, pw)] = best
    TUNE_LOG[_key(M, pw)] = log
    return best


def tuning_summary(M: int, pw: PreparedWeight) -> str:
    """'cfg=12.3us cfg=...' for every config ``autotune`` timed for this problem, fastest first."""
    log = sorted(TUNE_LOG.get(_key(M, pw), []), key=lambda ct: ct[1])
    return " ".join(f"{c}={t * 1e6:.1f}us" for c, t in log)


# ----------------------------------------------------------------------------- entry point

def _consts(pw: PreparedWeight):
    f = pw.fmt
    pb = tuple(pw.part_bits) + (0,) * (3 - len(pw.part_bits))
    kind = {"uint": 0, "int": 1, "float": 2}[f.kind]
    fscale = float(2.0 ** (127 - f.bias)) if f.kind == "float" else 1.0
    return dict(G=pw.group, KIND=kind, B=f.bits, P0=pb[0], P1=pb[1], P2=pb[2],
                EXPB=f.exp_bits, FSCALE=fscale, FOLD=pw.fold, TN=pw.tn, TKW=pw.tkw)


def _ptrs(pw: PreparedWeight):
    ps = list(pw.parts) + [pw.parts[0]] * (3 - len(pw.parts))
    z = pw.zeros if pw.zeros is not None else pw.scales
    magic = 0x3F800000 | (1 << 22) if pw.fmt.kind == "int" else 0x3F800000
    return ps[0], ps[1], ps[2], pw.scales, z, magic


def _packed_asm(pw: PreparedWeight, dot8: bool = False) -> str:
    """PTX of the packed f16x2 dequantization if it applies (GPU, f16 activations, uint 1/2/4/8,
    int 2/4/8 bits), else ''; dot8: the M = 1 variant (codes dotted with x).  The interpreter
    cannot run inline PTX."""
    if INTERPRET or pw.act_dtype != torch.float16 or not packed.supported(pw.fmt.kind, pw.fmt.bits):
        return ""
    return (packed.asm_dot8 if dot8 else packed.asm)(pw.fmt.kind, pw.fmt.bits)


def dequantize(pw: PreparedWeight, bn: int = 64, bk: int = 64, warps: int = 4, x2: bool = True) -> torch.Tensor:
    """W in the activation dtype [K, N] (Triton)."""
    K, N = pw.K, pw.N
    if K % bk:
        bk = 8 if K % 16 else 16
    w = torch.empty((K, N), dtype=pw.act_dtype, device=pw.device)
    grid = (K // bk, triton.cdiv(N, bn))
    asm = _packed_asm(pw) if x2 else ""
    _dequant_kernel[grid](*_ptrs(pw), w, N, K // 8, **_consts(pw), PACKED=bool(asm), ASM=asm, BN=bn, BK=bk,
                          num_warps=warps)
    return w


def lowbit_matmul(x: torch.Tensor, pw: PreparedWeight, config: Optional[Config] = None) -> torch.Tensor:
    """y = x @ dequant(W); x [M, K] (f16/bf16, = the weight's activation dtype) -> y [M, N]."""
    if x.dim() != 2 or x.shape[1] != pw.K:
        raise ValueError(f"x must be [M, K={pw.K}], got {tuple(x.shape)}")
    if x.dtype != pw.act_dtype:
        raise ValueError(f"x dtype {x.dtype} != the weight's activation dtype {pw.act_dtype}")
    if x.device != pw.device:
        raise ValueError(f"x on {x.device}, weight on {pw.device}")
    M, K = x.shape
    N = pw.N
    if isinstance(config, str):
        config = parse_config(config)
    cfg = config or choose_config(M, pw)
    if not _valid(cfg, M, K, pw.group):
        raise Unsupported(f"config {cfg} cannot tile M={M}, K={K}, group {pw.group_size}")
    if M == 0:
        return torch.empty((0, N), dtype=x.dtype, device=x.device)
    if cfg.path == "deq_mm":
        return torch.matmul(x, dequantize(pw, cfg.bn, cfg.bk, cfg.warps, cfg.x2))
    if x.stride(1) != 1:
        x = x.contiguous()
    atomic = cfg.split_k > 1
    if atomic:
        y = torch.zeros((M, N), dtype=torch.float32, device=x.device)
    else:
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    bm = cfg.bm if cfg.path == "dot" else 1
    grid = (triton.cdiv(N, cfg.bn), cfg.split_k, triton.cdiv(M, bm))
    args = (x, *_ptrs(pw), y, M, N, K // 8, x.stride(0), y.stride(0))
    # Host time matters at decode sizes (a 20 us kernel): after the first call of a (config, M,
    # stride) the compiled kernel is launched directly, without Triton's argument binding and
    # specialization (same kernel: the key holds everything it was specialized on).
    key = (cfg, M, x.stride(0), x.data_ptr() % 16 == 0, str(x.device))
    hit = None if INTERPRET else pw.launches.get(key)
    if hit is not None:
        compiled, consts = hit
        compiled[grid](*args, *consts)
    else:
        asm = (_packed_asm(pw) if cfg.path == "dot" else _packed_asm(pw, dot8=True)) if cfg.x2 else ""
        consts = dict(_consts(pw), PACKED=bool(asm), ASM=asm, BM=bm, BN=cfg.bn, BK=cfg.bk,
                      KSPLIT=K // cfg.split_k, USE_DOT=cfg.path == "dot", XW=cfg.xw, ATOMIC=atomic,
                      INTERP=INTERPRET)
        compiled = _mm_small_kernel[grid](*args, **consts, num_warps=cfg.warps, num_stages=cfg.stages)
        if not INTERPRET and compiled is not None:
            names = _mm_small_kernel.arg_names[len(args):]
            pw.launches[key] = (compiled, tuple(consts[n] for n in names))
    return y.to(x.dtype) if atomic else y
