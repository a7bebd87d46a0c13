"""CPU tests of kernels/lowbit/formats.py (no GPU, no Triton needed)."""
import math

import pytest
import torch

from kernels.lowbit.formats import (ALL_FORMAT_NAMES, dequantize_ref, float_code_values, pack_bits,
                                    parse_format, quantize, random_quantized, unpack_bits)

FLOATS = ["f3e1m1", "f4e2m1", "f5e2m2", "f5e3m1", "f6e2m3", "f6e3m2", "f7e3m3", "f7e4m2",
          "f8e4m3", "f8e5m2"]


def test_parse_all_names():
    for b in range(1, 9):
        f = parse_format(f"u{b}")
        assert (f.kind, f.bits) == ("uint", b)
    for b in range(2, 9):
        assert parse_format(f"i{b}").kind == "int"
    for name in FLOATS + ["f8e7m0", "f3e2m0"]:
        f = parse_format(name)
        assert f.kind == "float" and f.bits == 1 + f.exp_bits + f.man_bits
    assert parse_format("f6e3m2").bias == 3
    assert "f4e2m1" in ALL_FORMAT_NAMES and "u8" in ALL_FORMAT_NAMES


@pytest.mark.parametrize("bad", ["u0", "u9", "i1", "i9", "f4e2m2", "f9e4m4", "f2e1m0", "f4e0m3",
                                 "q4", "", "int4", 4])
def test_parse_bad(bad):
    with pytest.raises(ValueError) as e:
        parse_format(bad)
    assert "valid" in str(e.value)


def test_float_values_known():
    # f4e2m1 (OCP e2m1 without inf/nan): 0, .5, 1, 1.5, 2, 3, 4, 6
    v = float_code_values(parse_format("f4e2m1"))
    assert v[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert v[8:].tolist() == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    # f8e4m3 without inf/nan: max = 2^8 * 1.875 = 480; min subnormal 2^-9
    v = float_code_values(parse_format("f8e4m3"))
    assert v.max().item() == 480.0 and v[1].item() == 2.0 ** -9
    # f8e5m2: all-ones exponent is finite: 2^16 * 1.75
    assert float_code_values(parse_format("f8e5m2")).max().item() == 2.0 ** 16 * 1.75
    for name in FLOATS:
        assert torch.isfinite(float_code_values(parse_format(name))).all()


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_roundtrip(bits):
    g = torch.Generator().manual_seed(bits)
    n = 8 * 37
    codes = torch.randint(0, 1 << bits, (n,), generator=g)
    p = pack_bits(codes, bits)
    assert p.dtype == torch.uint8 and p.numel() == n * bits // 8
    assert torch.equal(unpack_bits(p, bits, n), codes.to(torch.int32))


def test_pack_order_documented():
    # 3-bit codes 1..8 (mod 8), little-endian bit stream
    codes = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0])
    p = pack_bits(codes, 3)
    stream = sum(int(c) << (3 * i) for i, c in enumerate(codes))
    assert p.tolist() == [(stream >> (8 * i)) & 0xFF for i in range(3)]


def test_pack_errors():
    with pytest.raises(ValueError):
        pack_bits(torch.zeros(3, dtype=torch.int32), 3)   # 9 bits: not whole bytes
    with pytest.raises(ValueError):
        pack_bits(torch.zeros(8, dtype=torch.int32), 9)


# quantize/dequantize error bounds, relative to the per-group scale s:
#   uN, iN: |w - deq| <= s/2 (+ rounding of s, z in the act dtype)   -> bound 0.5*s*(1+2^-6)
#   eXmY  : |w - deq| <= half the local spacing of representable values: <= 2^-(M+1) |w| for
#           normal values and <= 2^(1-bias-M-1)*s in the subnormal range.
@pytest.mark.parametrize("name", ["u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "i2", "i3", "i4",
                                  "i5", "i6", "i7", "i8"] + FLOATS)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_quantize_error_bounds(name, act):
    fmt = parse_format(name)
    K, N, g = 64, 24, 32
    w = torch.randn(K, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.05
    qw = quantize(w, fmt, g, act)
    assert qw.packed.numel() == K * N * fmt.bits // 8
    deq = dequantize_ref(qw)
    assert deq.dtype == torch.float64 and deq.shape == (K, N)
    s = qw.scales.double().repeat_interleave(g, 0)
    err = (deq - w).abs()
    if fmt.kind in ("uint", "int"):
        # the zero point / scale are rounded to the act dtype; allow a little more than s/2
        # (uint: w may sit slightly outside [(0-z)s, (qmax-z)s] after rounding z)
        slack = 0.51 if fmt.kind == "int" else 0.5 + 2.0 ** -6 * (1 << fmt.bits)
        assert (err <= slack * s + 1e-12).all(), (err / s).max()
    else:
        M, bias = fmt.man_bits, fmt.bias
        sub = 2.0 ** (1 - bias - M - 1) * s
        # |w|/s may exceed max_value by the rounding of s (act dtype): clamp error small
        bound = torch.maximum(2.0 ** (-M - 1) * w.abs() * 1.01, sub) + 2.0 ** -7 * w.abs()
        assert (err <= bound + 1e-12).all(), (err / bound).max()
    # re-quantizing the dequantized weight moves it by at most about one step
    qw2 = quantize(deq, fmt, g, act)
    assert ((dequantize_ref(qw2) - deq).abs() <= 1.1 * s + 2.0 ** -6 * deq.abs()).all()


@pytest.mark.parametrize("name", ["u3", "i5", "f6e3m2", "f8e5m2"])
def test_random_quantized(name):
    fmt = parse_format(name)
    qw = random_quantized(128, 40, fmt, 64, torch.bfloat16, seed=7)
    assert qw.scales.shape == (2, 40) and qw.scales.dtype == torch.bfloat16
    assert (qw.scales.float() > 0).all()
    assert (qw.zeros is not None) == (fmt.kind == "uint")
    n = 128 * 40 * fmt.bits // 8 + 2 * 40 * 2 * (2 if fmt.kind == "uint" else 1)
    assert qw.nbytes == n
    deq = dequantize_ref(qw)
    assert deq.abs().max() > 0 and deq.std() > 0
    codes = qw.codes()
    if fmt.kind == "int":   # never the -2^(b-1) pattern
        assert not (codes == (1 << (fmt.bits - 1))).any()
    # same seed -> same weight; per-channel scales shape [1, N]
    assert torch.equal(random_quantized(128, 40, fmt, 64, torch.bfloat16, seed=7).packed, qw.packed)
    assert random_quantized(128, 40, fmt, -1, torch.float16, seed=7).scales.shape == (1, 40)


def test_bad_inputs():
    w = torch.randn(96, 16)
    with pytest.raises(ValueError, match="does not divide"):
        quantize(w, "u4", 64)
    with pytest.raises(ValueError, match="unknown weight format"):
        quantize(w, "x4", 32)
    with pytest.raises(ValueError, match="activation dtype"):
        quantize(w, "u4", 32, torch.float32)
    with pytest.raises(ValueError, match="whole number of bytes"):
        random_quantized(1, 3, "u3", -1)
    with pytest.raises(ValueError):
        quantize(torch.randn(4, 4, 4), "u4", -1)


def test_to_and_nbytes():
    qw = random_quantized(64, 16, "i4", 32, torch.float16)
    assert qw.nbytes == 64 * 16 // 2 + 2 * 16 * 2
    q2 = qw.to("cpu")
    assert q2.nbytes == qw.nbytes and q2.fmt == qw.fmt
    assert math.isclose(qw.group, 32)
