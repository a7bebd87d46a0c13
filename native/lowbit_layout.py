"""Weight layout and dequantization recipes of the native low-bit matmul (native/kernels/lowbit*.cu).

Pure Python + torch (CPU or GPU tensors) + numpy; no harness imports. This module is the single
source of truth for

1. the *recipe* of every (weight format, tensor-core dtype): for each of the 16 A-fragment
   registers ("pairs") that one thread builds from ``bits`` 32-bit words, which word, which
   shift and which mask deliver each code bit into an f16/bf16 bit pattern (one LOP3 per
   piece, one SHF per distinct (word, shift) != 0, shared between pairs), and the one fma
   that turns the pattern into the exact code value (``c1``, ``c2``, per half);
2. the permuted weight layout that ``pack`` writes (each thread's words are exactly its
   m16n8k16 A fragments, so no shared-memory round trip), the scale layout and the
   per-iteration group table;
3. the C++ header the kernels compile (``render_header``; committed as
   native/kernels/lowbit_recipes.cuh, a test checks it is up to date);
4. a bit-exact emulation (``emulate_values``) of what the kernel computes from the packed
   words, checked against kernels.lowbit.formats for every format.

Values (exact in the tensor-core dtype, before scales):

* uint b: the code q (0 .. 2^b-1); int b: stored offset-binary u = q ^ 2^(b-1), value q;
  float with E = 1: sign-magnitude is re-encoded offline as offset binary of the integer
  (1-2s)*em, value (1-2s)*em*2^(1-M) (exactly the format's value); these three use the
  magic-number construction: the code's bits are OR-ed into the mantissa of 1024.0 (f16,
  0x6400) or 128.0 (bf16, 0x4300) at bit p, and fma(t, 2^-p, -(magic*2^-p + offset)) is exact.
  bf16 holds only 7 mantissa bits: 8-bit codes are split into two 4-bit terms added with one
  more fma (16*hi + lo).
* OFFSET recipes (f16 u1 / u2 / u4, ``_pack_offset``): each code sits at mantissa bit P of an f16
  of exponent 10 - P, one LOP3 gives 2^(10 - P) + code, and the decode kernels' ``deq_off()`` stops
  there: the offset (one per k half) is taken out in f32 by the zero point's sum-of-x mma.
* float with E >= 2: the code is placed as an f16 (E <= 4) or bf16 bit pattern (exponent and
  mantissa at the bottom of the target's exponent/mantissa fields, sign at bit 15), which is
  value * 2^(bias - bias_target) exactly (subnormal codes become target subnormals), then
  fma(t, 2^(bias_target - bias), 0) gives the value exactly.  f16 activations with E >= 5
  (e.g. f8e5m2: its top binade would be f16 inf) use the bf16 recipe with x split into two
  bf16 rows (x = hi + lo exactly) in the kernel ("xsplit").

Fragment layout (m16n8k16, A = W^T tile [16 n x 16 k], B = x^T tile [16 k x 8 m]): thread
(g = lane / 4, t = lane % 4) owns, in k-block r of kgroup kg (32 k), A rows n = g, g+8 and
physical k = kg*32 + 8t + 4r + {0,1,2,3} (the mma's logical k order is permuted so that the
B fragment x[m][8t .. 8t+8) is one 16-byte load for two k-blocks).  Pair i of a recipe chunk
(i = 8r + 4nt + 2jk + jn) is the register for n16 tile nt, rows n = g + 8*jn, k = ... + 2*jk +
{0 (low half), 1 (high half)}.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from kernels.lowbit.formats import ALL_FORMAT_NAMES, QuantizedWeight, WeightFormat, float_code_values, parse_format

# ----------------------------------------------------------------------------- tiling constants
KG = 32              # k per kgroup: one 16-byte x load per m-row, two mma k-blocks, one recipe chunk
NT = 2               # n16 tiles per warp
WARPS = 8            # warps per block
BN = WARPS * NT * 16  # 256 output channels per block
PAIRS = 16           # A registers per recipe chunk (4 mma: 2 k-blocks x 2 n16 tiles)
SCALE_SLOTS = 8      # most scale groups a stage can touch (group sizes >= 32 -> <= kstep/32; the kernel's SCP)


def kstep_for(bits: int) -> int:
    """k per pipeline stage: 256 for 1-2 bit codes (the per-stage cost is fixed, their bytes are few), else 128."""
    return 256 if bits <= 2 else 128


@dataclass(frozen=True)
class Target:
    name: str        # "f16" | "bf16"
    mant: int        # mantissa bits
    bias: int        # exponent bias
    magic: int       # 16-bit pattern of 2^mant (1024.0 / 128.0)

    @property
    def magic_value(self) -> float:
        return float(1 << self.mant)


F16 = Target("f16", 10, 15, 0x6400)
BF16 = Target("bf16", 7, 127, 0x4300)
TARGETS = {"f16": F16, "bf16": BF16}


def enc(v: float, tgt: Target) -> int:
    """16-bit pattern of v in the target dtype; ValueError unless v is exactly representable."""
    if tgt.name == "f16":
        h = np.array([v], dtype=np.float64).astype(np.float16)
        if float(h[0]) != v:
            raise ValueError(f"{v!r} is not exact in f16")
        return int(h.view(np.uint16)[0])
    f = np.array([v], dtype=np.float32)
    if float(f[0]) != v:
        raise ValueError(f"{v!r} is not exact in bf16")
    bits = int(f.view(np.uint32)[0])
    if bits & 0xFFFF:
        raise ValueError(f"{v!r} is not exact in bf16")
    return bits >> 16


def dec(bits, tgt: Target) -> np.ndarray:
    """float64 values of 16-bit patterns (array-like of ints)."""
    b = np.asarray(bits, dtype=np.uint32) & 0xFFFF
    if tgt.name == "f16":
        return b.astype(np.uint16).view(np.float16).astype(np.float64)
    return (b << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def exact_in(v: np.ndarray, tgt: Target) -> np.ndarray:
    """Elementwise: is v exactly representable in the target dtype."""
    v = np.asarray(v, dtype=np.float64)
    if tgt.name == "f16":
        with np.errstate(over="ignore"):
            r = v.astype(np.float16).astype(np.float64)
    else:
        f = v.astype(np.float32)
        ok32 = f.astype(np.float64) == v
        r = np.where(ok32 & ((f.view(np.uint32) & 0xFFFF) == 0), v, np.nan)
    return r == v


# ----------------------------------------------------------------------------- recipes

@dataclass(frozen=True)
class Piece:
    word: int        # word index within the chunk (0 .. bits-1)
    shift: int       # > 0: logical right shift, < 0: left shift, 0: none
    mask: int        # 16-bit mask of destination bits (applied to both halves)


@dataclass(frozen=True)
class Term:
    magic: int                  # 16-bit pattern the pieces are OR-ed into
    pieces: tuple               # Piece, ...
    c1: int                     # 16-bit target pattern (same in both halves)
    c2: int
    bits: tuple                 # code bits this term delivers
    dest: tuple                 # destination bit (within the half) of each code bit
    src: tuple                  # (word, source bit within the half) of each code bit

    @property
    def identity(self) -> bool:
        """fma(v, c1, c2) = v: the pieces' bit pattern is already the term's value (no instruction)."""
        return self.c2 == 0 and self.c1 in (0x3C00, 0x3F80)


@dataclass(frozen=True)
class Recipe:
    fmt: str                    # weight format name
    target: str                 # "f16" | "bf16": the tensor-core dtype
    bits: int                   # words per chunk (= code width)
    kind: str                   # "int" (magic-number terms) | "float" (bit-pattern term)
    zero: bool                  # uint: a per-group zero point (the kernel sums x per group)
    pairs: tuple                # 16 tuples of Term
    bias: float = 0.0           # what the tensor cores see is value + bias: uint recipes leave the magic number
                                # in (the kernel adds bias to the zero point, which it subtracts times sum(x)
                                # anyway), so a code whose bits sit at the mantissa's bottom needs no fma
    offs: tuple = ()            # OFFSET recipes: per pair, the power of two that deq_off() leaves in (value + offs[i]);
                                # it depends on the pair's k half jk only (see _pack_offset)

    @property
    def off_groups(self) -> tuple:
        """OFFSET recipes: the offset of the pairs of k half jk = 0 and 1 (the same in both k-blocks)."""
        return tuple(self.offs[2 * jk] for jk in (0, 1))

    def cost_off(self) -> dict:
        """deq_off()'s instructions per chunk: one LOP3 per pair and one SHF per distinct (word, shift) != 0."""
        shifts = {(p.word, p.shift) for terms in self.pairs for t in terms for p in t.pieces if p.shift}
        total = PAIRS + len(shifts)
        return {"lop3": PAIRS, "shift": len(shifts), "fma": 0, "total": total, "per_weight": total / 32}

    def deq_cost(self) -> dict:
        """What the decode kernels spend per chunk: deq_off() for OFFSET recipes, else deq()."""
        return self.cost_off() if self.offs else self.cost()

    @property
    def name(self) -> str:
        return f"{self.target}_{self.fmt}"

    @property
    def kstep(self) -> int:
        return kstep_for(self.bits)

    def cost(self) -> dict:
        """Dequantization instructions per chunk (16 pairs = 32 weights), as the compiler should emit them."""
        shifts = {(p.word, p.shift) for terms in self.pairs for t in terms for p in t.pieces if p.shift}
        lop = sum(len(t.pieces) for terms in self.pairs for t in terms)
        fma = sum(not t.identity for terms in self.pairs for t in terms)
        add = sum(len(terms) - 1 for terms in self.pairs)
        total = lop + len(shifts) + fma + add
        return {"lop3": lop, "shift": len(shifts), "fma": fma + add, "total": total, "per_weight": total / 32}


def stored_kind(fmt: WeightFormat) -> str:
    """How the codes are stored and decoded: 'uint', 'int' (offset binary), 'e1' (E = 1 float as
    offset binary of (1-2s)*em), 'float' (bit pattern)."""
    if fmt.kind == "float":
        return "e1" if fmt.exp_bits == 1 else "float"
    return fmt.kind


def target_for(fmt: WeightFormat, act: str) -> tuple[Target, bool]:
    """(tensor-core dtype, xsplit) for a format and activation dtype ('f16' | 'bf16')."""
    if act == "bf16":
        return BF16, False
    if fmt.kind == "float" and fmt.exp_bits >= 5:
        return BF16, True
    return F16, False


def _term_specs(fmt: WeightFormat, tgt: Target, fold: bool = False):
    """Per term: (code bits, dest(cb, p), candidate p's, magic, constants(p) -> (c1, c2)).  fold (uint, one term):
    the term's value is magic + code (Recipe.bias): at p = 0 the fma is the identity."""
    b = fmt.bits
    sk = stored_kind(fmt)
    if sk == "float":
        E, M = fmt.exp_bits, fmt.man_bits
        if tgt.name == "f16" and E > 4:
            raise ValueError(f"{fmt.name}: E = {E} does not fit the f16 exponent (use bf16 / xsplit)")
        base = tgt.mant - M
        c1 = enc(2.0 ** (tgt.bias - fmt.bias), tgt)

        def dest(cb, p, base=base, E=E, M=M):
            return 15 if cb == b - 1 else base + cb
        return [(tuple(range(b)), dest, (0,), 0, lambda p: (c1, 0))]
    # integer-valued: uint, int (offset binary), e1
    off = 0 if sk == "uint" else (1 << (b - 1))
    unit = 2.0 ** (1 - fmt.man_bits) if sk == "e1" else 1.0
    mv = tgt.magic_value
    if b <= tgt.mant:
        parts = [(0, b)]
    else:                       # bf16, 8-bit codes: 16*hi + lo
        parts = [(0, 4), (4, 4)]
    specs = []
    for lo, w in parts:
        o = off if lo == 0 else 0

        def consts(p, lo=lo, o=o):
            c1 = enc(2.0 ** (lo - p) * unit, tgt)
            if fold:                # (magic + code * 2^p) * 2^-p + magic * (1 - 2^-p) = magic + code
                return c1, enc(mv * (1.0 - 2.0 ** -p), tgt)
            c2 = enc(-(mv * 2.0 ** (lo - p) + o) * unit, tgt)
            return c1, c2

        def dest(cb, p, lo=lo):
            return p + cb - lo
        specs.append((tuple(range(lo, lo + w)), dest, tuple(range(tgt.mant - w + 1)), tgt.magic, consts))
    return specs


def _free_runs(used: int) -> int:
    runs, prev = 0, True
    for x in range(16):
        free = not (used >> x) & 1
        if free and prev:
            runs += 1
        prev = not free
    return runs


def _capacity(used: int, s: int, bits_, dest, ps) -> int:
    """How many more whole copies of a term fit into a word's free bits at shift s (a new shift
    is worth paying for when it serves many later pairs)."""
    n = 0
    for p in ps:
        m = 0
        for cb in bits_:
            x = dest(cb, p) + s
            if not 0 <= x < 16:
                break
            m |= 1 << x
        else:
            if not used & m:
                used |= m
                n += 1
    return n


def fold_ok(fmt: WeightFormat, tgt: Target) -> bool:
    """uint codes of 2 or more bits that fit one term (all but bf16 u8): their recipe can leave the magic number
    in.  Not u1: its packing with it (31 instructions per 32 weights against 33) was 4-5% slower at M=1 on the
    H200 (native/NOTES.md section 15).  Used where FOLD_BIAS."""
    return stored_kind(fmt) == "uint" and 2 <= fmt.bits <= tgt.mant


# Leave the magic number in where fold_ok (Recipe.bias)?  Off: measured on the H200 (native/NOTES.md section 15)
# u4 1-3% and u2 M=16 2-3% faster, u8 within 1%, but per channel (groups of 8192 k) the f32 accumulation of
# bias * sum(x) lost 0.2-0.9% (u2-u4) until stage_table flushed every stage, and that version did not get its GPU
# run.  The packing, the kernel's bias and the per-stage flush are in place and tested on the CPU.
FOLD_BIAS = False


# OFFSET recipes (native/NOTES.md section 29): f16 uint codes of these widths are placed high in the mantissa by
# a few shifts of each word (right shifts; < 0: left), so that one LOP3 per pair gives 2^(10 - P) + code, P the
# code's lowest mantissa bit: the first P of the width's pair for the pairs of k half jk = 0, the second for jk = 1.
# The decode kernels' deq_off() stops there (no fma) and subtract the offsets with the mma that sums x for the zero
# point already (its A rows 8-15 carry the offsets: one constant A tile for every k-block, as the tile of ones was);
# every other kernel runs deq(), one exact fma more per pair.  The offset is at most ~128x the codes' mean (u1 at
# P = 8: 4 over 0.5; u2 / u4 at P = 2: 256 over 1.5 / 7.5; 8-bit codes at P = 0: 1024 over ~128), so the codes'
# part of the f32 accumulators keeps >= ~17 of its 24 bits; native.check's per-channel cases hold it.
OFFSET = True
OFFSET_SHIFTS = {1: ((-8, -6, -4, -2, 0, 2, 4, 6), (8, 9)),   # width: (shifts of each word, the two P)
                 2: ((-2, 0, 6, 8), (2, 6)),
                 4: ((-2, 6), (2, 6)),
                 8: ((0, 6), (0, 2))}


# The formats that get it: measured against the previous recipes on the H200 (native/NOTES.md section 29): u1 / u2 / u4
# 2-9% faster at every tilus_fig10 point; the same packing for i2 / i4 (no zero point: the offsets' sum adds an mma per
# k-block) and u8 / i8 measured -2.5% to +7% (i4 M = 16 +5-7%), so it stays an option for those (offset_packable).
OFFSET_FORMATS = ("u1", "u2", "u4")


def offset_packable(fmt: WeightFormat, tgt: Target) -> bool:
    """Formats _pack_offset can pack: f16 uint and int (offset binary) codes of the OFFSET_SHIFTS widths."""
    return tgt.name == "f16" and stored_kind(fmt) in ("uint", "int") and fmt.bits in OFFSET_SHIFTS


def offset_ok(fmt: WeightFormat, tgt: Target) -> bool:
    """Formats that get an OFFSET recipe (OFFSET, OFFSET_FORMATS)."""
    return OFFSET and fmt.name in OFFSET_FORMATS and offset_packable(fmt, tgt)


def _pack_offset(fmt_name: str, target: str) -> Recipe:
    """The OFFSET packing: code j of word w at bits b j of each half, shifted by s (OFFSET_SHIFTS) to P = b j - s;
    the codes of each P fill whole (k-block r, k half jk) groups of four pairs (n16 tile nt, row half jn), the
    groups in order of P.  deq() turns 2^(10 - P) + code into the value (code - 2^(b-1) for int: offset binary) with
    one fma (c1 = 1, c2 = -(2^(10 - P) + that offset)); Recipe.offs is what deq_off() leaves in over the value."""
    fmt = parse_format(fmt_name)
    tgt = TARGETS[target]
    b = fmt.bits
    if not offset_packable(fmt, tgt):
        raise ValueError(f"{fmt_name}/{target}: no OFFSET packing")
    shifts, ps = OFFSET_SHIFTS[b]
    slots: dict = {P: [] for P in ps}
    seen = set()
    for w in range(b):
        for s in shifts:
            for j in range(16 // b):
                P = b * j - s
                if P in slots and P + b <= tgt.mant and (w, j) not in seen:
                    seen.add((w, j))
                    slots[P].append((w, s, j))
    if len(seen) != 16 or any(len(v) != 8 for v in slots.values()):
        raise RuntimeError(f"{fmt_name}: OFFSET_SHIFTS {OFFSET_SHIFTS[b]} do not put 8 codes at each P")
    pairs: list = [None] * PAIRS
    ob = float(1 << (b - 1)) if stored_kind(fmt) == "int" else 0.0
    for jk, P in enumerate(ps):
        off = 2.0 ** (tgt.mant - P)
        for m, (w, s, j) in enumerate(slots[P]):      # (k-block r, n16 tile nt, row half jn)
            r, nt, jn = m >> 2, (m >> 1) & 1, m & 1
            t = Term(enc(off, tgt), (Piece(w, s, ((1 << b) - 1) << P),), enc(1.0, tgt), enc(-off - ob, tgt),
                     tuple(range(b)), tuple(P + cb for cb in range(b)), tuple((w, b * j + cb) for cb in range(b)))
            pairs[8 * r + 4 * nt + 2 * jk + jn] = (t,)
    offs = tuple(float(dec(t[0].magic, tgt)[()]) + ob for t in pairs)
    return Recipe(fmt.name, target, b, "int", stored_kind(fmt) == "uint", tuple(pairs), 0.0, offs)


@lru_cache(maxsize=None)
def build_recipe(fmt_name: str, target: str) -> Recipe:
    """The OFFSET packing where offset_ok; else the cheaper of the packings with and without the magic number
    left in (fold_ok formats, FOLD_BIAS), else the packing without it."""
    fmt = parse_format(fmt_name)
    if offset_ok(fmt, TARGETS[target]):
        return _pack_offset(fmt_name, target)
    plain = _pack(fmt_name, target, False)
    if not (FOLD_BIAS and fold_ok(fmt, TARGETS[target])):
        return plain
    folded = _pack(fmt_name, target, True)
    return folded if folded.cost()["total"] < plain.cost()["total"] else plain


def _pack(fmt_name: str, target: str, fold: bool) -> Recipe:
    """Greedy packing: pair by pair, term by term, place the code bits into (word, shift) slots,
    preferring one piece per term, then the fewest new instructions (a (word, shift) not yet paid for; with
    fold an fma that is not the identity), then placements that keep the words' free bits contiguous."""
    fmt = parse_format(fmt_name)
    tgt = TARGETS[target]
    b = fmt.bits
    specs = _term_specs(fmt, tgt, fold)
    used = [0] * b
    paid: set = set()
    pairs = []
    for _ in range(PAIRS):
        terms = []
        for bits_, dest, ps, magic, consts in specs:
            remaining = list(bits_)
            p = None
            placed: dict = {}
            while remaining:
                best = None
                for pc in (ps if p is None else (p,)):
                    ds = {cb: dest(cb, pc) for cb in remaining}
                    for w in range(b):
                        for s in range(-15, 16):
                            cov = [cb for cb in remaining
                                   if 0 <= ds[cb] + s < 16 and not (used[w] >> (ds[cb] + s)) & 1]
                            if not cov:
                                continue
                            nu = used[w]
                            for cb in cov:
                                nu |= 1 << (ds[cb] + s)
                            new = bool(s) and (w, s) not in paid
                            cap = _capacity(nu, s, bits_, dest, ps) if new else 0
                            cost = int(new) + int(fold and pc != 0)
                            key = (len(cov) < len(remaining), cost, -len(cov), -cap, _free_runs(nu), w, abs(s), s, pc)
                            if best is None or key < best[0]:
                                best = (key, pc, w, s, cov)
                if best is None:
                    raise RuntimeError(f"{fmt_name}/{target}: no room for code bits {remaining}")
                _, pc, w, s, cov = best
                p = pc
                for cb in cov:
                    d = dest(cb, pc)
                    used[w] |= 1 << (d + s)
                    placed[cb] = (w, s, d)
                if s:
                    paid.add((w, s))
                remaining = [cb for cb in remaining if cb not in cov]
            groups: dict = {}
            for cb, (w, s, d) in placed.items():
                groups.setdefault((w, s), 0)
                groups[(w, s)] |= 1 << d
            pieces = tuple(Piece(w, s, m) for (w, s), m in sorted(groups.items()))
            c1, c2 = consts(p)
            terms.append(Term(magic, pieces, c1, c2, tuple(bits_), tuple(dest(cb, p) for cb in bits_),
                              tuple((placed[cb][0], placed[cb][2] + placed[cb][1]) for cb in bits_)))
        pairs.append(tuple(terms))
    if any(u != 0xFFFF for u in used):
        raise RuntimeError(f"{fmt_name}/{target}: words not fully used: {[hex(u) for u in used]}")
    kind = "float" if stored_kind(fmt) == "float" else "int"
    return Recipe(fmt.name, target, b, kind, fmt.kind == "uint", tuple(pairs), tgt.magic_value if fold else 0.0)


def recipe_for(fmt, act: str) -> tuple[Recipe, bool]:
    """(recipe, xsplit) for a weight format and an activation dtype name."""
    fmt = parse_format(fmt)
    tgt, xsplit = target_for(fmt, act)
    return build_recipe(fmt.name, tgt.name), xsplit


def all_recipes() -> list[Recipe]:
    """Every recipe any (format, act) needs, in a stable order."""
    out, seen = [], set()
    for act in ("f16", "bf16"):
        for name in ALL_FORMAT_NAMES:
            r, _ = recipe_for(name, act)
            if r.name not in seen:
                seen.add(r.name)
                out.append(r)
    return out


# ----------------------------------------------------------------------------- stored codes and values

def stored_codes(fmt: WeightFormat, q: torch.Tensor) -> torch.Tensor:
    """Raw bit-pattern codes (int32/int64 tensor) -> the codes the layout stores."""
    b = fmt.bits
    sk = stored_kind(fmt)
    q = q.to(torch.int64) & ((1 << b) - 1)
    if sk == "int":
        return q ^ (1 << (b - 1))
    if sk == "e1":
        s = q >> (b - 1)
        em = q & ((1 << (b - 1)) - 1)
        return (em * (1 - 2 * s)) + (1 << (b - 1))
    return q


def code_values(fmt: WeightFormat) -> np.ndarray:
    """float64 value (before scales, zero point excluded) of every raw code 0 .. 2^b-1."""
    b = fmt.bits
    codes = np.arange(1 << b)
    if fmt.kind == "uint":
        return codes.astype(np.float64)
    if fmt.kind == "int":
        return np.where(codes >= (1 << (b - 1)), codes - (1 << b), codes).astype(np.float64)
    return float_code_values(fmt).numpy()


# ----------------------------------------------------------------------------- emulation of the recipe

def _sh32(w: np.ndarray, s: int) -> np.ndarray:
    if s > 0:
        return w >> np.uint64(s)
    if s < 0:
        return (w << np.uint64(-s)) & np.uint64(0xFFFFFFFF)
    return w


def emulate_chunk(rec: Recipe, words: np.ndarray) -> np.ndarray:
    """What the kernel's dequantization computes: words [..., bits] (uint32) -> values
    [..., 16 pairs, 2 halves] float64.  Checks, like the GPU would silently not, that every
    fma result is exact in the target dtype (raises AssertionError otherwise)."""
    tgt = TARGETS[rec.target]
    w = np.asarray(words).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    out = np.zeros(w.shape[:-1] + (PAIRS, 2), dtype=np.float64)
    for i, terms in enumerate(rec.pairs):
        total = None
        for t in terms:
            acc = np.full(w.shape[:-1], t.magic | (t.magic << 16), dtype=np.uint64)
            for pc in t.pieces:
                m = np.uint64(pc.mask | (pc.mask << 16))
                acc = (_sh32(w[..., pc.word], pc.shift) & m) | acc
            halves = np.stack([acc & np.uint64(0xFFFF), acc >> np.uint64(16)], axis=-1)
            v = dec(halves, tgt) * dec(t.c1, tgt) + dec(t.c2, tgt)
            assert exact_in(v, tgt).all(), f"{rec.name} pair {i}: fma result not exact in {tgt.name}"
            total = v if total is None else total + v
            assert exact_in(total, tgt).all(), f"{rec.name} pair {i}: term sum not exact in {tgt.name}"
        out[..., i, :] = total
    return out


def emulate_chunk_off(rec: Recipe, words: np.ndarray) -> np.ndarray:
    """What an OFFSET recipe's deq_off() computes: (shifted word | EXP) & (mask | magic) per pair, EXP the f16
    exponent field (render_recipe) -> values [..., 16 pairs, 2 halves] float64: stored code + 2^(10 - P), which is
    the code's value + rec.offs[pair]."""
    tgt = TARGETS[rec.target]
    w = np.asarray(words).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    out = np.zeros(w.shape[:-1] + (PAIRS, 2), dtype=np.float64)
    for i, (t,) in enumerate(rec.pairs):
        (pc,) = t.pieces
        keep = np.uint64((pc.mask | t.magic) * 0x10001)
        v = (_sh32(w[..., pc.word], pc.shift) | np.uint64(OFF_EXP)) & keep
        out[..., i, :] = dec(np.stack([v & np.uint64(0xFFFF), v >> np.uint64(16)], axis=-1), tgt)
    return out


def pack_chunk(rec: Recipe, codes: torch.Tensor) -> torch.Tensor:
    """Stored codes [..., 16 pairs, 2 halves] (int64) -> words [..., bits] (int64, 32-bit values)."""
    words = [torch.zeros(codes.shape[:-2], dtype=torch.int64, device=codes.device) for _ in range(rec.bits)]
    for i, terms in enumerate(rec.pairs):
        for t in terms:
            for cb, (w, sb) in zip(t.bits, t.src):
                for h in (0, 1):
                    words[w] |= ((codes[..., i, h] >> cb) & 1) << (sb + 16 * h)
    return torch.stack(words, dim=-1)


# ----------------------------------------------------------------------------- full layout

@dataclass
class Layout:
    """Shapes of the packed weight for one (K, N, group, stage depth)."""
    K: int
    N: int
    Kpad: int
    Npad: int
    kstep: int          # k per stage
    iters: int          # stages per n-block
    nblocks: int
    group: int          # effective group length in k (Kpad for per channel)
    ngroups: int        # groups stored (covers Kpad)
    per_channel: bool

    @property
    def chunks(self) -> int:
        return self.kstep // KG

    @staticmethod
    def of(K: int, N: int, group_size: int, kstep: int = 128) -> "Layout":
        Kpad = -(-K // kstep) * kstep
        Npad = -(-N // BN) * BN
        per_channel = group_size == -1 or group_size >= K
        g = Kpad if per_channel else group_size
        ngroups = -(-Kpad // g)
        return Layout(K, N, Kpad, Npad, kstep, Kpad // kstep, Npad // BN, g, ngroups, per_channel)

    def sub(self, nblocks: int) -> "Layout":
        """The same layout restricted to `nblocks` n-blocks."""
        return Layout(self.Kpad, nblocks * BN, self.Kpad, nblocks * BN, self.kstep, self.iters, nblocks,
                      self.group, self.ngroups, self.per_channel)


def _fragment_view(u: torch.Tensor, L: Layout) -> torch.Tensor:
    """[Kpad, Npad] -> [nblocks, iters, WARPS, 32 lanes, CHUNKS, 16 pairs, 2 halves] (the kernel's order)."""
    x = u.reshape(L.iters, L.chunks, 4, 2, 2, 2, L.nblocks, WARPS, NT, 2, 8)
    #            it      kg      t  r  jk h   nb         w      nt  jn g
    x = x.permute(6, 0, 7, 10, 2, 1, 3, 8, 4, 9, 5)
    #            nb it w  g   t  kg r  nt jk jn h
    return x.reshape(L.nblocks, L.iters, WARPS, 32, L.chunks, PAIRS, 2)


def _fragment_unview(v: torch.Tensor, L: Layout) -> torch.Tensor:
    """Inverse of _fragment_view."""
    x = v.reshape(L.nblocks, L.iters, WARPS, 8, 4, L.chunks, 2, NT, 2, 2, 2)
    x = x.permute(1, 5, 4, 6, 8, 10, 0, 2, 7, 9, 3)
    return x.reshape(L.Kpad, L.Npad)


def fragment_nk(L: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) of every slot of _fragment_view (for tests): two int64 tensors of its shape."""
    kk = torch.arange(L.Kpad)[:, None].expand(L.Kpad, L.Npad)
    nn = torch.arange(L.Npad)[None, :].expand(L.Kpad, L.Npad)
    return _fragment_view(nn.contiguous(), L), _fragment_view(kk.contiguous(), L)


def pack_codes(rec: Recipe, codes: torch.Tensor, L: Layout, nb_chunk: int = 8) -> torch.Tensor:
    """Raw codes [K, N] -> int32 words [nblocks, iters, WARPS, chunks*bits/4 (16-byte vectors), 32 lanes, 4]:
    lane l's stage data is chunks*bits*4 bytes, word c*bits + j of chunk c at vector (c*bits+j)//4.
    Padding codes are 0 (k >= K meets x = 0; n >= N is never stored)."""
    fmt = parse_format(rec.fmt)
    dev = codes.device
    u = torch.zeros(L.Kpad, L.Npad, dtype=torch.int64, device=dev)
    u[:L.K, :L.N] = stored_codes(fmt, codes)
    assert L.kstep == rec.kstep
    out = torch.empty(L.nblocks, L.iters, WARPS, L.chunks * rec.bits // 4, 32, 4, dtype=torch.int32, device=dev)
    for nb0 in range(0, L.nblocks, nb_chunk):
        nb1 = min(L.nblocks, nb0 + nb_chunk)
        frag = _fragment_view(u[:, nb0 * BN:nb1 * BN].contiguous(), L.sub(nb1 - nb0))
        words = pack_chunk(rec, frag)                                # [nb, it, w, 32, C, bits]
        words = words.reshape(nb1 - nb0, L.iters, WARPS, 32, L.chunks * rec.bits // 4, 4)  # word c*bits+j -> vector, elem
        words = words.permute(0, 1, 2, 4, 3, 5)
        words = torch.where(words >= (1 << 31), words - (1 << 32), words)
        out[nb0:nb1] = words.to(torch.int32)
    return out


def emulate_values(rec: Recipe, words: torch.Tensor, L: Layout, off: bool = False) -> torch.Tensor:
    """Inverse of pack_codes through the recipe emulation: float64 [Kpad, Npad] values
    (what the tensor cores see, before scales and zero points); off: through deq_off() (OFFSET recipes:
    value + the pair's offset)."""
    w = words.cpu().to(torch.int64) & 0xFFFFFFFF
    w = w.permute(0, 1, 2, 4, 3, 5).reshape(L.nblocks, L.iters, WARPS, 32, L.chunks, rec.bits)
    vals = (emulate_chunk_off if off else emulate_chunk)(rec, w.numpy())   # [..., C, 16, 2]
    return _fragment_unview(torch.from_numpy(vals), L)


# ----------------------------------------------------------------------------- scales and group table

def scale_bytes(zero: bool) -> int:
    """Bytes per (group, warp): 2 tiles x 8 rows g x (s_g, s_g+8[, z_g, z_g+8]) x 2 bytes."""
    return 2 * 8 * (4 if zero else 2) * 2


def pack_scales(qw: QuantizedWeight, L: Layout) -> torch.Tensor:
    """[ngroups, N] scales (+ zeros) -> [nblocks, WARPS, ngroups, 2 nt, 8 g, S] in the act dtype,
    S = (s_g, s_g+8) or (s_g, s_g+8, z_g, z_g+8); padding groups / channels are 0."""
    dev = qw.scales.device
    ng_src = qw.scales.shape[0]
    s = torch.zeros(L.ngroups, L.Npad, dtype=qw.act_dtype, device=dev)
    s[:ng_src, :L.N] = qw.scales
    parts = [s]
    if qw.zeros is not None:
        z = torch.zeros_like(s)
        z[:ng_src, :L.N] = qw.zeros
        parts.append(z)
    out = []
    for p in parts:
        v = p.reshape(L.ngroups, L.nblocks, WARPS, NT, 2, 8)          # n = nb*256 + w*32 + nt*16 + jn*8 + g
        out.append(v.permute(1, 2, 0, 3, 5, 4))                       # nb, w, G, nt, g, jn
    return torch.cat(out, dim=-1).contiguous()


def stage_table(L: Layout, flush_each_stage: bool = False) -> torch.Tensor:
    """int32 [iters]: bits 0-15 = first group of the stage (G0), 16-19 = groups the stage touches,
    20-27 = flush mask (bit q: a group ends after kgroup q of the stage).  flush_each_stage (recipes with a
    Recipe.bias): the partial sums are also flushed at the end of every stage, so that the f32 accumulators
    never carry bias * sum(x) for more than one stage -- with the bias (1024) left in and groups of a whole row,
    the tensor cores' f32 accumulation over 8192 k lost up to 0.4% (u2 per channel on the H200); flushing a
    group in pieces is exact (the flush is linear), ~20 instructions per stage more where groups are longer."""
    out = []
    g = L.group
    for it in range(L.iters):
        k0 = it * L.kstep
        g0 = k0 // g
        g1 = (k0 + L.kstep - 1) // g
        mask = (1 << (L.chunks - 1)) if flush_each_stage else 0
        if not L.per_channel:
            for q in range(L.chunks):
                if (k0 + (q + 1) * KG) % g == 0:
                    mask |= 1 << q
        cnt = g1 - g0 + 1
        if cnt > SCALE_SLOTS or g0 >= (1 << 16):
            raise ValueError(f"stage {it} touches groups {g0}..{g1} (group size {g}, kstep {L.kstep}): the decode "
                             f"kernel stages at most {SCALE_SLOTS} groups of index < 65536 (group_ok: "
                             f"{group_ok(L.K, g)})")
        out.append(g0 | (cnt << 16) | (mask << 20))
    return torch.tensor(out, dtype=torch.int32)


def decode_fc(kstep: int, K: int, group: int) -> int:
    """The decode build a launch runs (mirror of lowbit_kernel.cuh decode_fc): the stage's chunks where every group
    ends with a stage (K whole stages, groups a multiple of the stage or one per channel: group = K), 4 for groups of
    128 k in 256-k stages (K whole stages), else 0 (the group ends read from the stage table at run time)."""
    if K % kstep or group <= 0 or K % group:
        return 0
    if group % kstep == 0:
        return kstep // KG
    return 4 if kstep % group == 0 and group == 4 * KG else 0


def stage_slots(table: torch.Tensor) -> int:
    """Scale groups to stage per warp: the most any stage touches."""
    return int(((table >> 16) & 0xF).max())


def group_ok(K: int, group_size: int) -> Optional[str]:
    """None if the decode kernel takes this group size, else why not (the dequantize + matmul path
    still does: every multiple of 8)."""
    if group_size == -1 or group_size >= K:
        return None
    if group_size % KG:
        return f"group size {group_size} is not a multiple of {KG}"
    return None


# ----------------------------------------------------------------------------- C++ header

def _cexpr_word(pc: Piece) -> str:
    w = f"w[{pc.word}]"
    if pc.shift > 0:
        return f"({w} >> {pc.shift})"
    if pc.shift < 0:
        return f"({w} << {-pc.shift})"
    return w


def _cexpr_piece(pc: Piece, bits: int) -> str:
    m = pc.mask | (pc.mask << 16)
    return f"({_cexpr_word(pc)} & 0x{m:08x}u)"


OFF_EXP = 0x7C007C00     # deq_off(): the f16 exponent fields, OR-ed in so that one AND keeps mask and magic


def _render_off_pairs(rec: Recipe, ex: str, line) -> list:
    """An OFFSET recipe's pairs: each shifted word once (const), then per pair or_and(copy, ex, mask | magic)."""
    copies: dict = {}
    for (t,) in rec.pairs:
        copies.setdefault((t.pieces[0].word, t.pieces[0].shift), f"c{len(copies)}")
    out = [f"    const uint32_t {n} = {_cexpr_word(Piece(w, s, 0))};" for (w, s), n in copies.items()]
    for i, (t,) in enumerate(rec.pairs):
        pc = t.pieces[0]
        out.append(line(i, f"or_and({copies[(pc.word, pc.shift)]}, {ex}, 0x{(pc.mask | t.magic) * 0x10001:08x}u)"))
    return out


def render_recipe(rec: Recipe) -> str:
    fn = "hfma2_f16" if rec.target == "f16" else "hfma2_bf16"
    one = 0x3C00 if rec.target == "f16" else 0x3F80
    xs = any(recipe_for(n, "f16") == (rec, True) for n in ALL_FORMAT_NAMES)
    lines = [f"// {rec.fmt} on {rec.target} tensor cores: {rec.cost()['total']} instructions per 32 weights "
             f"({rec.cost()['lop3']} lop3, {rec.cost()['shift']} shifts, {rec.cost()['fma']} fma)",
             f"struct rec_{rec.name} {{",
             f"  static constexpr const char *NAME = \"{rec.name}\";",
             f"  static constexpr int BITS = {rec.bits};",
             f"  static constexpr int KSTEP = {rec.kstep};   // k per pipeline stage",
             f"  static constexpr bool ZERO = {'true' if rec.zero else 'false'};",
             f"  static constexpr bool BF16 = {'true' if rec.target == 'bf16' else 'false'};",
             f"  static constexpr bool XSPLIT = {'true' if xs else 'false'};   // also serves f16 activations (x split)",
             f"  static constexpr bool PROF = {'true' if rec.name in PROFILED else 'false'};   // instrumented variant built",
             f"  static constexpr bool TUNE = {'true' if rec.name in TUNED else 'false'};   // decode variants 1, 2, 3 built",
             f"  static constexpr bool BULK = {'true' if rec.name in BULK else 'false'};   // decode variant 3 built",
             f"  static constexpr uint32_t MAGIC = 0x{(OFF_EXP if rec.offs else TARGETS[rec.target].magic * 0x10001):08x}u;  "
             "// pass to deq() through a register",
             f"  static constexpr float BIAS = {rec.bias:.1f}f;   // deq() gives value + BIAS (added to the zero point)",
             f"  static constexpr bool OFFS = {'true' if rec.offs else 'false'};   // deq_off() built (an OFFSET recipe)"]
    if rec.offs:
        c = rec.cost_off()
        og = rec.off_groups
        lines += [f"  // offsets of the pairs of k half jk = 0, 1 (f16x2): {', '.join(f'{o:g}' for o in og)}"]
        lines += [f"  static constexpr uint32_t OFFA{G} = 0x{enc(o, TARGETS[rec.target]) * 0x10001:08x}u;"
                  for G, o in enumerate(og)]
        lines += [f"  // deq_off: value + offset per pair, {c['total']} instructions per 32 weights ({c['lop3']} lop3, "
                  f"{c['shift']} shifts); ex = 0x{OFF_EXP:08x}u through a register",
                  "  __device__ __forceinline__ static void deq_off(const uint32_t *w, uint32_t *a, uint32_t ex) {"]
        lines += _render_off_pairs(rec, "ex", lambda i, e: f"    a[{i}] = {e};")
        lines += ["  }"]
    lines += ["  __device__ __forceinline__ static void deq(const uint32_t *w, uint32_t *a, uint32_t magic) {"]
    if rec.offs:                # deq_off()'s LOP3 (magic = MAGIC = OFF_EXP), then the fma that takes the offset out
        lines += _render_off_pairs(rec, "magic", lambda i, e: f"    a[{i}] = {fn}({e}, 0x{rec.pairs[i][0].c1 * 0x10001:08x}u, "
                                                              f"0x{rec.pairs[i][0].c2 * 0x10001:08x}u);")
    for i, terms in enumerate(rec.pairs if not rec.offs else ()):
        vals = []
        for t in terms:
            # the magic comes in as a runtime value (`magic`, in a register), so that ptxas fuses
            # mask and magic into one 3-input LOP3 (two immediates do not fit one LOP3)
            expr = " | ".join([_cexpr_piece(pc, rec.bits) for pc in t.pieces] + (["magic"] if t.magic else []))
            if t.identity:
                vals.append(f"({expr})")
            else:
                vals.append(f"{fn}({expr}, 0x{t.c1 | (t.c1 << 16):08x}u, 0x{t.c2 | (t.c2 << 16):08x}u)")
        if len(vals) == 1:
            lines.append(f"    a[{i}] = {vals[0]};")
        else:
            lines.append(f"    a[{i}] = {fn}({vals[1]}, 0x{one | (one << 16):08x}u, {vals[0]});")
    lines += ["  }", "};"]
    return "\n".join(lines)


PROFILED = ("f16_u4",)   # recipes built with the in-kernel instrumentation too (proton_fig15)
# recipes built with the decode-kernel variants 1 and 2 too (lowbit_kernel.cuh; timed by native/tune.py)
TUNED = ("f16_u1", "f16_u2", "f16_u4", "f16_u8", "f16_i4", "f16_f6e3m2")
# recipes built with the bulk decode variant (3) too, and with regs (4) where f16: every f16 recipe (the TUNED ones, the
# 5-8 bit ones since section 12, the other 2-4 bit ones since section 30), and the bf16 recipes that serve f16
# activations with x split (bulk at MT = 2 and 4; native/NOTES.md section 30)
BULK = TUNED + tuple(f"f16_{f}" for f in ("u3", "i2", "i3", "f3e1m1", "f3e2m0", "f4e1m2", "f4e2m1", "f4e3m0",
                                         "u5", "u6", "u7", "i5", "i6", "i7", "i8", "f5e1m3", "f5e2m2", "f5e3m1",
                                         "f5e4m0", "f6e1m4", "f6e2m3", "f6e4m1", "f7e1m5", "f7e2m4", "f7e3m3",
                                         "f7e4m2", "f8e1m6", "f8e2m5", "f8e3m4", "f8e4m3")) + \
    tuple(f"bf16_{f}" for f in ("f6e5m0", "f7e5m1", "f7e6m0", "f8e5m2", "f8e6m1", "f8e7m0"))
PARTS = 8                # translation units the instantiations are spread over (parallel build)


def render_header() -> str:
    recs = all_recipes()
    head = ["// GENERATED by native/lowbit_layout.py (render_header); do not edit.",
            "// Dequantization recipes of the native low-bit kernels: one struct per (tensor-core dtype, format).",
            "// deq(w, a, magic): w = the chunk's BITS words of one thread, a[i] = A-fragment register i (f16x2 / bf16x2),",
            "// magic = MAGIC (the caller passes it through a register).",
            "#pragma once",
            "#include <cstdint>",
            "#include \"lowbit_common.cuh\"",
            "",
            "namespace lowbit {",
            ""]
    body = [render_recipe(r) + "\n" for r in recs]
    lists = ["#define LOWBIT_RECIPES(X) " + " ".join(f"X(rec_{r.name})" for r in recs),
             "#define LOWBIT_RECIPES_TUNED(X) " + " ".join(f"X(rec_{r.name})" for r in recs if r.name in TUNED)]
    for part in range(PARTS):
        lists.append(f"#define LOWBIT_RECIPES_PART{part}(X) " +
                     " ".join(f"X(rec_{r.name})" for i, r in enumerate(recs) if i % PARTS == part))
    return "\n".join(head + body + ["}  // namespace lowbit", ""] + lists) + "\n"
