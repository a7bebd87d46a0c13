"""Packed f16x2 dequantization (PTX) for uint/int codes of 1, 2, 4 or 8 bits, f16 activations.

The f32 dequantization of ``triton_matmul`` costs ~6 instructions per weight, which makes
the kernel issue-bound below ~6 bits (NOTES.md).  Here two weights are dequantized per
instruction, the way Marlin and Tilus do it in CUDA / their own IR:

1. one LOP3 puts two codes into the mantissas of two f16 ``1024.0`` (0x6400): a lane then
   holds ``1024 + 2^p * u``, exact, where ``p`` is the code's bit position in its 16-bit
   lane (int: the sign bit is flipped in the same LOP3, so ``u = q + 2^(B-1)``, offset binary);
2. one ``fma.rn.f16x2`` by ``2^-p`` and ``-(1024 * 2^-p + offset)`` gives the integer code
   ``q`` (uint) or ``q`` (int), exact in f16;
3. one ``fma.rn.f16x2`` ``q * s + zs`` (uint, ``zs = -z * s`` rounded to f16 once per group
   and column) or ``mul.rn.f16x2`` ``q * s`` (int).

A chunk (8 codes of 8 consecutive k of one column, slot j at stream bits [jB, jB+B), the
layout of ``triton_matmul.prepare``) gives four f16x2 registers: output o takes slots o (low
lane) and o + 4 (high lane).  ``prepare`` stores code k in slot ``SLOT[k] = k//2 + 4*(k%2)``,
so output o holds k = 2o and 2o + 1, the order in which the f16 pairs are stored to shared
memory as one 16-byte vector (no repacking).  Getting the codes to their lanes costs one PRMT per
chunk (B = 1, 2), one shift per chunk (B = 4) or one PRMT per output (B = 8), so the whole
dequantization is 13 (B = 1, 2, 4) or 16 (B = 8) instructions per 8 weights.

``recipe`` returns the per-output plan as data (a test emulates it on every code with
numpy); ``asm`` renders it as the PTX that ``tl.inline_asm_elementwise`` runs with
``pack=8`` over [R, C, 8] tensors (``CONSTRAINTS``: 4 f16x2 outputs; inputs w0 x 8 registers,
w1 x 8, (s, s) x 4, (zs, zs) x 4, all copies of one value per chunk).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional

import numpy as np

MAGIC = 0x64006400          # f16x2 (1024.0, 1024.0)
LUT_OR = 0xEA               # lop3: (a & b) | c
LUT_XOR = 0x6A              # lop3: (a & b) ^ c
BITS = (1, 2, 4, 8)
SLOT = tuple(k // 2 + 4 * (k % 2) for k in range(8))     # chunk slot of code k (k = 2*o + lane)
KINDS = ("uint", "int")


def supported(kind: str, bits: int) -> bool:
    return kind in KINDS and bits in BITS and not (kind == "int" and bits == 1)


def _h2(lo: float, hi: float) -> int:
    """f16x2 bit pattern (low lane = lo)."""
    a = np.array([lo, hi], dtype=np.float16).view(np.uint16)
    return int(a[0]) | (int(a[1]) << 16)


@dataclass(frozen=True)
class Output:
    src: str                  # "d" (the chunk word after the per-chunk step), "h" (d >> 8), "p" (PRMT of w0, w1)
    sel: Optional[int]        # PRMT selector for src == "p"
    pos: tuple                # (p_low_lane, p_high_lane): bit position of the code in its lane
    mask: int
    y: int                    # third LOP3 operand
    lut: int
    scale: int                # f16x2 (2^-p0, 2^-p1)
    offset: int               # f16x2 -(1024 * 2^-p + off)


@dataclass(frozen=True)
class Recipe:
    kind: str
    bits: int
    pre: Optional[str]        # per-chunk step: "prmt:<sel>" (B = 1, 2), "shr8" (B = 4), None (B = 8)
    outputs: List[Output]


def recipe(kind: str, bits: int) -> Recipe:
    if not supported(kind, bits):
        raise ValueError(f"packed f16x2 dequantization covers uint 1/2/4/8 and int 2/4/8 bits, not {kind}{bits}")
    B = bits
    off = (1 << (B - 1)) if kind == "int" else 0
    pre = {1: "prmt:0x0000", 2: "prmt:0x0100", 4: "shr8", 8: None}[B]
    outs = []
    for o in range(4):
        sel = None
        if B == 1:      # every byte = the chunk byte: low lane code o at bit o, high lane code 4+o at bit 4+o
            src, pos = "d", (o, 4 + o)
        elif B == 2:    # byte 0 = codes 0-3, byte 2 = codes 4-7
            src, pos = "d", (2 * o, 2 * o)
        elif B == 4:    # codes 0-3 at bits 0,4,8,12, codes 4-7 at 16..28; outputs 2, 3 from w >> 8
            src, pos = ("d" if o < 2 else "h"), (4 * (o % 2),) * 2
        else:           # PRMT byte o of w0 into byte 0, byte o of w1 into byte 2
            src, sel, pos = "p", ((4 + o) << 8) | o, (0, 0)
        m = (1 << B) - 1
        mask = (m << pos[0]) | (m << (16 + pos[1]))
        if kind == "int":
            y = MAGIC | (1 << (pos[0] + B - 1)) | (1 << (16 + pos[1] + B - 1))
            lut = LUT_XOR
        else:
            y, lut = MAGIC, LUT_OR
        scale = _h2(2.0 ** -pos[0], 2.0 ** -pos[1])
        offset = _h2(-(1024.0 * 2.0 ** -pos[0] + off), -(1024.0 * 2.0 ** -pos[1] + off))
        assert pos[0] + B <= 10 and pos[1] + B <= 10     # the code stays inside the f16 mantissa
        outs.append(Output(src, sel, pos, mask, y, lut, scale, offset))
    return Recipe(kind, B, pre, outs)


def _codes_ptx(r: Recipe, W0: str, W1: str, use) -> list:
    """PTX that leaves output o's two integer codes in register q (f16x2, exact), followed by
    the lines ``use(o)`` returns for consuming them."""
    lines = []
    if r.pre and r.pre.startswith("prmt:"):
        lines.append(f"prmt.b32 d, {W0}, {W0}, {r.pre[5:]};")
    elif r.pre == "shr8":
        lines += [f"mov.b32 d, {W0};", f"shr.b32 h, {W0}, 8;"]
    for o, out in enumerate(r.outputs):
        src = out.src
        if src == "p":
            lines.append(f"prmt.b32 d, {W0}, {W1}, {out.sel:#x};")
            src = "d"
        lines += [f"lop3.b32 t, {src}, {out.mask:#x}, {out.y:#x}, {out.lut:#x};",
                  f"mov.b32 k1, {out.scale:#x};",
                  f"mov.b32 k2, {out.offset:#x};",
                  "fma.rn.f16x2 q, t, k1, k2;"] + use(o)
    return lines


@lru_cache(maxsize=None)
def asm(kind: str, bits: int) -> str:
    """PTX for tl.inline_asm_elementwise(pack=8): $0..$3 = outputs (f16x2, k = 2o, 2o + 1),
    $4 = w0, $12 = w1 (B = 8), $20 = (s, s), $24 = (zs, zs); the other inputs are copies."""
    scale = (lambda o: [f"fma.rn.f16x2 ${o}, q, $20, $24;"]) if kind == "uint" else \
        (lambda o: [f"mul.rn.f16x2 ${o}, q, $20;"])
    body = _codes_ptx(recipe(kind, bits), "$4", "$12", scale)
    return "\n".join(["{", ".reg .b32 d, h, t, q, k1, k2;", *body, "}"])


CONSTRAINTS = "=r,=r,=r,=r," + ",".join(["r"] * 24)


@lru_cache(maxsize=None)
def asm_dot8(kind: str, bits: int) -> str:
    """PTX for the M = 1 path, tl.inline_asm_elementwise(pack=1) over [R, C] chunks:
    $0 (f32) = sum over the chunk's 8 k of (q_k - z) * x_k, with $1 = w0, $2 = w1 (B = 8),
    $3..$6 = the x pairs (x_2o, x_2o+1) as f16x2 and $7 = the zero point z (f16; uint only).
    q_k is the integer code (exact in f16), q_k - z is rounded once (as the dequantized weight
    would be); the 8 products are summed in f16x2 (4 HFMA2), the two lanes in f32.  The
    caller applies the group scale per chunk in f32: y += s * t."""
    def dot(o):
        zero = ["sub.rn.f16x2 q, q, zz;"] if kind == "uint" else []
        return zero + [f"mul.rn.f16x2 a, q, ${3 + o};" if o == 0 else f"fma.rn.f16x2 a, q, ${3 + o}, a;"]

    head = ["{", ".reg .b32 d, h, t, q, k1, k2, a, zz;", ".reg .f16 lo, hi;", ".reg .f32 fl, fh;"]
    if kind == "uint":
        head.append("mov.b32 zz, {$7, $7};")
    tail = ["mov.b32 {lo, hi}, a;", "cvt.f32.f16 fl, lo;", "cvt.f32.f16 fh, hi;", "add.f32 $0, fl, fh;", "}"]
    return "\n".join(head + _codes_ptx(recipe(kind, bits), "$1", "$2", dot) + tail)


CONSTRAINTS_DOT8 = "=f,r,r,r,r,r,r,h"


# ----------------------------------------------------------------------------- emulation

def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    src = np.stack([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)])
    out = np.zeros_like(a)
    for i in range(4):
        out |= src[(sel >> (4 * i)) & 0x7] << (8 * i)
    return out


def _f16x2(u32: np.ndarray) -> np.ndarray:
    return u32.astype(np.uint32).view(np.uint16).reshape(-1, 2).view(np.float16).astype(np.float32)


def emulate_codes(r: Recipe, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """The integer codes q [n, 8] by slot (output o lane e -> slot o + 4e) that the recipe's
    first two steps produce from uint32 words (numpy; the f16 arithmetic is exact)."""
    w0 = w0.astype(np.uint64) & 0xFFFFFFFF
    w1 = w1.astype(np.uint64) & 0xFFFFFFFF
    if r.pre and r.pre.startswith("prmt:"):
        d = _prmt(w0, w0, int(r.pre[5:], 16))
    else:
        d = w0
    h = w0 >> 8
    out = np.zeros((w0.shape[0], 8), dtype=np.float32)
    for o, op in enumerate(r.outputs):
        src = {"d": d, "h": h}.get(op.src)
        if op.src == "p":
            src = _prmt(w0, w1, op.sel)
        t = (src & op.mask) | op.y if op.lut == LUT_OR else (src & op.mask) ^ op.y
        v = _f16x2(t.astype(np.uint32))
        sc = _f16x2(np.array([op.scale], dtype=np.uint32))[0]
        of = _f16x2(np.array([op.offset], dtype=np.uint32))[0]
        q = v * sc + of                      # exact: every term is a small integer or power of two
        out[:, o] = q[:, 0]
        out[:, o + 4] = q[:, 1]
    return out
