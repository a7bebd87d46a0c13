"""Low-bit weight formats: names, semantics, packing, quantization, reference.

Pure compute (torch only); no harness, Hydra or CSV code.

Formats (names follow Tilus)
----------------------------
``uN`` (N = 1..8)
    Unsigned codes q in 0 .. 2^N-1.  w = (q - z) * s, with a per-group zero
    point z and scale s, both stored in the activation dtype.
``iN`` (N = 2..8)
    Symmetric signed codes, N-bit two's complement, q in
    [-(2^(N-1)-1), 2^(N-1)-1] (the pattern -2^(N-1) is never produced by
    ``quantize``/``random_quantized``; if present it decodes to -2^(N-1)).
    w = q * s.  No zero point.
``f{bits}e{E}m{M}`` (E >= 1, M >= 0, bits = 1 + E + M, 3 <= bits <= 8)
    Sign bit (MSB), E exponent bits, M mantissa bits; IEEE-like with bias
    2^(E-1)-1 and subnormals (exponent field 0 -> 2^(1-bias) * m/2^M), but NO
    inf/nan: every code is finite (all-ones exponent is an ordinary binade).
    w = value(q) * s.

Scales are group-wise along K: group_size g in {8, 16, 32, 64, 128, ...}
(must divide K) or -1 = one group per output channel.  ``scales`` (and
``zeros`` for uN) have shape [K // g, N] (or [1, N]) in the activation dtype
(torch.float16 or torch.bfloat16).

Packing (canonical storage, ``QuantizedWeight.packed``)
-------------------------------------------------------
The code matrix q[K, N] (raw N-bit patterns, i.e. iN/eXmY codes as unsigned
bit patterns) is flattened row-major (index i = k * N + n) and written as a
dense little-endian bit stream: bit t of code i is stream bit i*bits + t, and
stream bit u lives in byte u // 8 at bit position u % 8.  Exactly
K * N * bits / 8 bytes (K * N * bits must be a multiple of 8), for every
width, including 3, 5, 6, 7 whose codes straddle bytes.

``nbytes`` = bytes of packed codes + scales + zeros actually stored.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Optional

import torch

__all__ = [
    "WeightFormat", "parse_format", "ALL_FORMAT_NAMES", "QuantizedWeight",
    "pack_bits", "unpack_bits", "quantize", "random_quantized",
    "dequantize_ref", "float_code_values", "codes_of", "ACT_DTYPES",
]

# The project's one map of activation dtype names (harness, baselines and engines read it from here).
ACT_DTYPES = {"f16": torch.float16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
              "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class WeightFormat:
    name: str
    kind: str          # "uint" | "int" | "float"
    bits: int
    exp_bits: int = 0  # floats only
    man_bits: int = 0  # floats only

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1 if self.kind == "float" else 0

    @property
    def has_zero(self) -> bool:
        return self.kind == "uint"

    @property
    def qmax(self) -> float:
        """Largest |value| of a code (before scaling)."""
        if self.kind == "uint":
            return float((1 << self.bits) - 1)
        if self.kind == "int":
            return float((1 << (self.bits - 1)) - 1)
        return float(float_code_values(self).abs().max())

    def __str__(self) -> str:
        return self.name


_VALID = ("u1..u8, i2..i8, or f{bits}e{E}m{M} with 1+E+M == bits, E >= 1, M >= 0, "
          "3 <= bits <= 8 (e.g. f4e2m1, f6e3m2, f8e4m3, f8e5m2)")

ALL_FORMAT_NAMES = ([f"u{b}" for b in range(1, 9)] + [f"i{b}" for b in range(2, 9)] +
                    [f"f{1 + e + m}e{e}m{m}" for b in range(3, 9)
                     for e in range(1, b) for m in [b - 1 - e] if m >= 0])


def parse_format(name) -> WeightFormat:
    """Parse 'u4', 'i8', 'f6e3m2' ... into a WeightFormat; ValueError otherwise."""
    if isinstance(name, WeightFormat):
        return name
    if not isinstance(name, str):
        raise ValueError(f"weight format must be a string, got {name!r}; valid: {_VALID}")
    s = name.strip().lower()
    m = re.fullmatch(r"u(\d+)", s)
    if m:
        b = int(m.group(1))
        if 1 <= b <= 8:
            return WeightFormat(s, "uint", b)
        raise ValueError(f"unsupported weight format {name!r}: uint width must be 1..8; valid: {_VALID}")
    m = re.fullmatch(r"i(\d+)", s)
    if m:
        b = int(m.group(1))
        if 2 <= b <= 8:
            return WeightFormat(s, "int", b)
        raise ValueError(f"unsupported weight format {name!r}: int width must be 2..8; valid: {_VALID}")
    m = re.fullmatch(r"f(\d+)e(\d+)m(\d+)", s)
    if m:
        b, e, mm = (int(g) for g in m.groups())
        if 3 <= b <= 8 and e >= 1 and mm >= 0 and 1 + e + mm == b:
            return WeightFormat(s, "float", b, e, mm)
        raise ValueError(f"unsupported weight format {name!r}: need bits == 1+E+M, E >= 1, "
                         f"3 <= bits <= 8; valid: {_VALID}")
    raise ValueError(f"unknown weight format {name!r}; valid: {_VALID}")


def _act_dtype(act_dtype) -> torch.dtype:
    if isinstance(act_dtype, str):
        if act_dtype in ACT_DTYPES:
            return ACT_DTYPES[act_dtype]
    elif act_dtype in (torch.float16, torch.bfloat16):
        return act_dtype
    raise ValueError(f"activation dtype must be float16 or bfloat16 (f16/bf16), got {act_dtype!r}")


def _check_group(K: int, group_size: int) -> int:
    """Return the number of groups; ValueError if group_size is invalid for K."""
    if not isinstance(group_size, int) or isinstance(group_size, bool):
        raise ValueError(f"group_size must be an int, got {group_size!r}")
    if group_size == -1:
        return 1
    if group_size <= 0:
        raise ValueError(f"group_size must be -1 (per channel) or a positive divisor of K={K}, "
                         f"got {group_size}")
    if K % group_size:
        raise ValueError(f"group_size {group_size} does not divide K={K}; "
                         f"use a divisor of K or -1 (per channel)")
    return K // group_size


def float_code_values(fmt: WeightFormat) -> torch.Tensor:
    """float64 value of every code 0 .. 2^bits-1 of a small-float format."""
    E, M, bias = fmt.exp_bits, fmt.man_bits, fmt.bias
    codes = torch.arange(1 << fmt.bits, dtype=torch.int64)
    sign = (codes >> (E + M)) & 1
    e = (codes >> M) & ((1 << E) - 1)
    m = (codes & ((1 << M) - 1)).double()
    frac = m / (1 << M)
    normal = (1.0 + frac) * torch.pow(2.0, (e - bias).double())
    sub = torch.full_like(frac, 2.0 ** (1 - bias)) * frac
    mag = torch.where(e == 0, sub, normal)
    return torch.where(sign == 1, -mag, mag)


# ----------------------------------------------------------------------------- packing

def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes (any shape, values in 0..2^bits-1) into a dense
    little-endian bit stream (uint8, numel*bits/8 bytes); see module docstring."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    flat = codes.reshape(-1)
    n = flat.numel()
    if (n * bits) % 8:
        raise ValueError(f"{n} codes of {bits} bits = {n * bits} bits is not a whole number of bytes")
    out = torch.empty(n * bits // 8, dtype=torch.uint8, device=flat.device)
    chunk = 1 << 22  # multiple of 8 codes -> whole bytes per chunk
    shifts_b = torch.arange(bits, device=flat.device, dtype=torch.int32)
    shifts_8 = torch.arange(8, device=flat.device, dtype=torch.int32)
    for c0 in range(0, n, chunk):
        c = flat[c0:c0 + chunk].to(torch.int32) & ((1 << bits) - 1)
        bitm = (c[:, None] >> shifts_b) & 1                     # [L, bits]
        by = (bitm.reshape(-1, 8) << shifts_8).sum(1)           # [L*bits/8]
        out[c0 * bits // 8:(c0 + c.numel()) * bits // 8] = by.to(torch.uint8)
    return out


def unpack_bits(packed: torch.Tensor, bits: int, count: Optional[int] = None) -> torch.Tensor:
    """Inverse of pack_bits: uint8 stream -> int32 codes (1-D, ``count`` of them)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    p = packed.reshape(-1)
    total = p.numel() * 8 // bits
    count = total if count is None else count
    if count * bits > p.numel() * 8:
        raise ValueError(f"stream of {p.numel()} bytes holds fewer than {count} codes of {bits} bits")
    out = torch.empty(count, dtype=torch.int32, device=p.device)
    chunk = 1 << 22
    shifts_b = torch.arange(bits, device=p.device, dtype=torch.int32)
    shifts_8 = torch.arange(8, device=p.device, dtype=torch.int32)
    for c0 in range(0, count, chunk):
        c1 = min(count, c0 + chunk)
        b0, b1 = c0 * bits // 8, (c1 * bits + 7) // 8
        bitm = ((p[b0:b1].to(torch.int32)[:, None] >> shifts_8) & 1).reshape(-1)
        bitm = bitm[:(c1 - c0) * bits].reshape(-1, bits)
        out[c0:c1] = (bitm << shifts_b).sum(1).to(torch.int32)
    return out


# ----------------------------------------------------------------------------- container

@dataclass
class QuantizedWeight:
    packed: torch.Tensor            # uint8 [K*N*bits/8], canonical dense stream
    scales: torch.Tensor            # act dtype [K//g, N] or [1, N]
    zeros: Optional[torch.Tensor]   # act dtype, same shape as scales (uint only) or None
    fmt: WeightFormat
    K: int
    N: int
    group_size: int                 # as given (-1 = per channel)
    act_dtype: torch.dtype

    @property
    def group(self) -> int:
        """Effective group length along K (K for per-channel)."""
        return self.K if self.group_size == -1 else self.group_size

    @property
    def nbytes(self) -> int:
        n = self.packed.numel() * self.packed.element_size()
        n += self.scales.numel() * self.scales.element_size()
        if self.zeros is not None:
            n += self.zeros.numel() * self.zeros.element_size()
        return n

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def to(self, device) -> "QuantizedWeight":
        return replace(self, packed=self.packed.to(device), scales=self.scales.to(device),
                       zeros=None if self.zeros is None else self.zeros.to(device))

    def codes(self) -> torch.Tensor:
        """Raw bit-pattern codes, int32 [K, N] (on the weight's device)."""
        return codes_of(self)

    def __repr__(self) -> str:
        return (f"QuantizedWeight({self.fmt.name}, K={self.K}, N={self.N}, g={self.group_size}, "
                f"act={str(self.act_dtype).replace('torch.', '')}, nbytes={self.nbytes})")


def codes_of(qw: QuantizedWeight) -> torch.Tensor:
    return unpack_bits(qw.packed, qw.fmt.bits, qw.K * qw.N).reshape(qw.K, qw.N)


def _validate_shape(K: int, N: int, fmt: WeightFormat, group_size: int) -> int:
    if not (isinstance(K, int) and isinstance(N, int)) or K <= 0 or N <= 0:
        raise ValueError(f"K and N must be positive ints, got K={K!r}, N={N!r}")
    ng = _check_group(K, group_size)
    if (K * N * fmt.bits) % 8:
        raise ValueError(f"K*N*bits = {K}*{N}*{fmt.bits} is not a whole number of bytes")
    return ng


# ----------------------------------------------------------------------------- reference

def dequantize_ref(qw: QuantizedWeight, device="cpu") -> torch.Tensor:
    """Ground truth: float64 [K, N], computed on the CPU by default (``device``
    lets a GPU check compute the same float64 math on the GPU for large shapes)."""
    fmt, K, N = qw.fmt, qw.K, qw.N
    qw = qw.to(device)
    q = codes_of(qw).to(torch.int64)
    g = qw.group
    s = qw.scales.double().repeat_interleave(g, dim=0)  # [K, N]
    if fmt.kind == "uint":
        z = qw.zeros.double().repeat_interleave(g, dim=0)
        return (q.double() - z) * s
    if fmt.kind == "int":
        b = fmt.bits
        qs = torch.where(q >= (1 << (b - 1)), q - (1 << b), q)
        return qs.double() * s
    table = float_code_values(fmt).to(q.device)
    return table[q] * s


# ----------------------------------------------------------------------------- quantize

def quantize(w: torch.Tensor, fmt, group_size: int = 128, act_dtype=torch.float16) -> QuantizedWeight:
    """Round-to-nearest quantization of a float [K, N] weight.

    uN: asymmetric min/max per group (s = (max-min)/(2^N-1), z = -min/s);
    iN: symmetric, s = absmax/(2^(N-1)-1); eXmY: s = absmax/max_value(fmt), then
    nearest representable value.  Scales/zeros are rounded to ``act_dtype``
    first and the codes are chosen against the rounded values.
    """
    fmt = parse_format(fmt)
    act = _act_dtype(act_dtype)
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float tensor [K, N], got shape {tuple(w.shape)} {w.dtype}")
    K, N = w.shape
    ng = _validate_shape(K, N, fmt, group_size)
    dev = w.device
    g = K // ng
    wg = w.detach().double().reshape(ng, g, N)
    if fmt.kind == "uint":
        lo = wg.amin(1).clamp(max=0.0)
        hi = wg.amax(1).clamp(min=0.0)
        qmax = (1 << fmt.bits) - 1
        s = ((hi - lo) / qmax)
        s = torch.where(s > 0, s, torch.ones_like(s)).to(act)
        z = (-lo / s.double()).to(act)
        sd, zd = s.double()[:, None, :], z.double()[:, None, :]
        q = torch.round(wg / sd + zd).clamp(0, qmax).to(torch.int32)
        zeros = z
    elif fmt.kind == "int":
        qmax = (1 << (fmt.bits - 1)) - 1
        s = wg.abs().amax(1) / qmax
        s = torch.where(s > 0, s, torch.ones_like(s)).to(act)
        q = torch.round(wg / s.double()[:, None, :]).clamp(-qmax, qmax).to(torch.int32)
        q = q & ((1 << fmt.bits) - 1)
        zeros = None
    else:
        table = float_code_values(fmt).to(dev)
        s = wg.abs().amax(1) / table.abs().max()
        s = torch.where(s > 0, s, torch.ones_like(s)).to(act)
        v = wg / s.double()[:, None, :]
        # nearest representable: sort the table (drop the duplicate -0), bucketize on midpoints
        vals, order = torch.sort(table)
        keep = torch.ones_like(vals, dtype=torch.bool)
        keep[1:] = vals[1:] != vals[:-1]
        vals, order = vals[keep], order[keep]
        mids = (vals[1:] + vals[:-1]) / 2
        idx = torch.bucketize(v.reshape(-1), mids).reshape(v.shape)
        q = order[idx].to(torch.int32)
        zeros = None
    packed = pack_bits(q.reshape(K, N), fmt.bits)
    return QuantizedWeight(packed, s.contiguous(), None if zeros is None else zeros.contiguous(),
                           fmt, K, N, group_size, act)


def random_quantized(K: int, N: int, fmt, group_size: int = 128, act_dtype=torch.float16,
                     seed: int = 0, device="cpu") -> QuantizedWeight:
    """Random codes (uniform over the valid codes) and random non-trivial scales
    (and zero points for uN); never all zeros.  max|w| is O(1/sqrt(K)) so that
    y = x @ w stays O(1) for x ~ N(0, 1) (formats with E >= 6 have a wider range
    than f16: with f16 scales their largest values can overflow f16)."""
    fmt = parse_format(fmt)
    act = _act_dtype(act_dtype)
    ng = _validate_shape(K, N, fmt, group_size)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    b = fmt.bits
    nbytes = K * N * b // 8
    if fmt.kind == "int":
        # valid codes are [-(2^(b-1)-1), 2^(b-1)-1]: draw them, pack in row chunks
        qmax = (1 << (b - 1)) - 1
        packed = torch.empty(nbytes, dtype=torch.uint8, device=device)
        rows = max(8, (1 << 24) // max(N, 1)) // 8 * 8
        for r0 in range(0, K, rows):
            r1 = min(K, r0 + rows)
            q = torch.randint(-qmax, qmax + 1, (r1 - r0, N), generator=gen, device=device,
                              dtype=torch.int32) & ((1 << b) - 1)
            # r0*N*b is a whole number of bytes whenever r0 is a multiple of 8
            packed[r0 * N * b // 8:r1 * N * b // 8] = pack_bits(q, b)
    else:
        # every bit pattern is a valid code (no inf/nan for floats): random bytes
        packed = torch.randint(0, 256, (nbytes,), generator=gen, device=device, dtype=torch.uint8)
    amp = 1.0 / (fmt.qmax * math.sqrt(K) * 0.5)
    amp = max(amp, 2.0 ** -13 if act == torch.float16 else 2.0 ** -125)  # a normal act-dtype scale
    s = (torch.rand((ng, N), generator=gen, device=device) * 1.0 + 0.5) * amp
    zeros = None
    if fmt.kind == "uint":
        zeros = (torch.rand((ng, N), generator=gen, device=device) * ((1 << b) - 1)).to(act)
    return QuantizedWeight(packed, s.to(act), zeros, fmt, K, N, group_size, act)
