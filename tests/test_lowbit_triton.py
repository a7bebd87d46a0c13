"""kernels/lowbit/triton_matmul.py vs the float64 reference.

On a CPU machine run with TRITON_INTERPRET=1 (small shapes; the whole file takes
well under two minutes).  Error bound, the same for every weight type because the
kernels dequantize exactly in f32 before rounding to the activation dtype:
    |y - y_ref| <= 2.5 u * (|x| @ |W|) + 1e-6,   u = 2^-11 (f16), 2^-8 (bf16)
(rounding of each dequantized w to the act dtype, f32 accumulation, rounding of y).
"""
import os

import pytest
import torch

import kernels
from kernels.lowbit.formats import ALL_FORMAT_NAMES, dequantize_ref, parse_format, quantize, random_quantized
from kernels.lowbit.triton_matmul import (Config, autotune, choose_config, config_str, configs_for,
                                          lowbit_matmul, parse_config, prepare, tuning_summary)

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _check(x, qw, y):
    W = dequantize_ref(qw)
    xd = x.double().cpu()
    ref = xd @ W
    bound = 2.5 * U[qw.act_dtype] * (xd.abs() @ W.abs()) + 1e-6
    assert y.shape == ref.shape and y.dtype == qw.act_dtype
    err = (y.double().cpu() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max():.3g}"
    assert ref.abs().max() > 0


def _x(M, K, act, seed=0):
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(act).to(DEV)


SMALL = [Config("fma", 16, 32, 1), Config("dot", 16, 32, 2), Config("dot", 32, 64, 1)]


@pytest.mark.parametrize("name", [n for n in ALL_FORMAT_NAMES])
def test_every_format_small_m(name):
    K, N = 64, 48
    wide = parse_format(name).exp_bits >= 6   # range wider than f16: bf16 only
    for act, g in ((torch.bfloat16 if wide else torch.float16, 32), (torch.bfloat16, -1)):
        qw = random_quantized(K, N, name, g, act, seed=3, device=DEV)
        pw = prepare(qw)
        assert pw.nbytes == qw.nbytes   # layout transform: no inflation
        for M, cfg in ((1, SMALL[0]), (1, SMALL[1]), (5, SMALL[2])):
            x = _x(M, K, act)
            _check(x, qw, lowbit_matmul(x, pw, cfg))


CASES = [(1, Config("fma", 32, 64, 2)), (16, Config("dot", 16, 64, 1)), (3, Config("dot", 32, 16, 4)),
         (24, None), (17, Config("deq_mm", 32, 16)), (40, Config("dot", 16, 32, 1, bm=16)),
         (9, Config("dot", 32, 32, 1, x2=False)), (2, Config("dot", 32, 32, 2, 4, 2, 64, xw=True))]


@pytest.mark.parametrize("name", ["u1", "u3", "u4", "i4", "i6", "u7", "f4e2m1", "f6e3m2", "f8e4m3", "i8"])
@pytest.mark.parametrize("g", [8, 16, 32, 64, -1])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_group_sizes_and_paths(name, g, act):
    K, N = 128, 24
    qw = random_quantized(K, N, name, g, act, seed=5, device=DEV)
    pw = prepare(qw)
    # every path for f16 g=32/-1; otherwise a rotating subset (keeps the file fast)
    idx = list(range(len(CASES))) if act == torch.float16 and g in (32, -1) else \
        [(sum(map(ord, name)) + g + i) % len(CASES) for i in (0, 3)]
    for i in sorted(set(idx)):
        M, cfg = CASES[i]
        x = _x(M, K, act, seed=M)
        _check(x, qw, lowbit_matmul(x, pw, cfg))


@pytest.mark.parametrize("name", ["u4", "i7", "u1"])
def test_several_layout_blocks(name):
    # K, N spanning 2 x 2 layout blocks (TKW=16 word rows x TN=64 columns, row-major inside),
    # tiles smaller and larger than a block, with split-K
    K, N = 256, 128
    qw = random_quantized(K, N, name, 64, torch.float16, seed=7, device=DEV)
    pw = prepare(qw)
    assert (pw.tn, pw.tkw) == (64, 16) and pw.nbytes == qw.nbytes
    for M, cfg in ((1, Config("fma", 32, 64, 2)), (1, Config("fma", 128, 128, 1)), (4, Config("dot", 64, 128, 1)),
                   (16, Config("dot", 32, 32, 4))):
        x = _x(M, K, torch.float16, seed=M)
        _check(x, qw, lowbit_matmul(x, pw, cfg))


def test_quantized_real_weights_and_large_scales():
    # quantize() output (not random codes); and scales large enough that the float
    # path cannot fold 2^(127-bias) into the f32 scale
    K, N = 64, 32
    w = torch.randn(K, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for name in ("u4", "i3", "f4e2m1", "f3e1m1", "f5e3m1"):
        for scale in (0.02, 300.0):
            qw = quantize(w * scale, name, 32, torch.float16).to(DEV)
            pw = prepare(qw)
            if name.startswith("f") and scale > 1:
                assert not pw.fold
            x = _x(2, K, torch.float16) * 0.01
            _check(x, qw, lowbit_matmul(x, pw, Config("dot", 32, 32, 1)))
            _check(x[:1], qw, lowbit_matmul(x[:1], pw, Config("fma", 32, 32, 1)))


def test_default_config_and_autotune():
    K, N = 128, 64
    qw = random_quantized(K, N, "u4", 64, torch.float16, seed=1, device=DEV)
    pw = prepare(qw)
    for M in (1, 16, 40, 100):
        x = _x(M, K, torch.float16)
        c = choose_config(M, pw)
        _check(x, qw, lowbit_matmul(x, pw))
        assert config_str(c) == str(c) and ":" in str(c)
    x = _x(1, K, torch.float16)
    cands = [c for c in configs_for(1, K, N, pw.fmt, pw.group)][:3]
    assert cands
    calls = []

    def timer(fn):   # fake timer: prefers the last candidate
        fn()
        calls.append(1)
        return 1.0 / len(calls)

    best = autotune(x, pw, timer, configs=cands)
    assert best == cands[-1] and choose_config(1, pw) == best
    summary = tuning_summary(1, pw)                      # every timed candidate, fastest first
    assert summary.split()[0].startswith(str(best) + "=") and len(summary.split()) == len(cands)
    for c in (Config("dot", 64, 64, 2, 4, 4, 64, x2=False, xw=True), Config("deq_mm", 64, 32, 1, 4, 1, x2=False)):
        assert parse_config(str(c)) == c
    assert str(Config("dot", 128, 64, 2, 4, 3)) == "dot:n128k64s2w4p3"
    assert str(Config("deq_mm", 64, 64, 1, 4, 1)) == "deq_mm:n64k64w4"
    for c in configs_for(1, 8192, 57344, pw.fmt, 128) + configs_for(64, 8192, 4096, pw.fmt, 128):
        assert parse_config(str(c)) == c


def test_bad_inputs():
    qw = random_quantized(64, 16, "u4", 32, torch.float16, device=DEV)
    pw = prepare(qw)
    with pytest.raises(ValueError, match="dtype"):
        lowbit_matmul(_x(1, 64, torch.bfloat16), pw)
    with pytest.raises(ValueError, match="K=64"):
        lowbit_matmul(_x(1, 32, torch.float16), pw)
    with pytest.raises(kernels.Unsupported):
        lowbit_matmul(_x(1, 64, torch.float16), pw, Config("dot", 16, 48, 1))   # 48 does not tile 64
    with pytest.raises(kernels.Unsupported):
        lowbit_matmul(_x(2, 64, torch.float16), pw, Config("fma", 16, 32, 1))   # fma is M == 1 only
    with pytest.raises(kernels.Unsupported, match="multiple of 8"):
        prepare(random_quantized(12, 16, "u4", -1, torch.float16))             # K % 8
    with pytest.raises(kernels.Unsupported, match="multiple of 8"):
        prepare(random_quantized(24, 16, "u4", 12, torch.float16))             # group % 8
