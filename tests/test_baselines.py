"""CPU tests of the implementations in kernels/baselines: the registry, what each supports,
clean Unavailable without a GPU, the plain Triton baseline against float64 in the interpreter,
and (when tilus is installed) that the Tilus kernels transpile on the CPU."""
import pytest
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines import REGISTRY, Case, Impl
from kernels.lowbit.formats import ALL_FORMAT_NAMES, dequantize_ref, random_quantized

EXPECTED = {"native", "cublas", "triton_lowbit", "triton_plain", "tilus", "torch_int4", "fp8", "gemlite",
            "marlin", "bitblas", "quantllm"}
NO_CUDA = not torch.cuda.is_available()


def test_registry():
    assert set(REGISTRY) == EXPECTED
    for name, b in REGISTRY.items():
        assert isinstance(b, Impl) and b.name == name
        assert callable(b.prepare_fn) and callable(b.supports)
        assert b.tolerance is None or 0 < b.tolerance < 1
    assert REGISTRY["fp8"].tolerance > REGISTRY["tilus"].tolerance  # fp8 activations change the math
    assert [n for n, b in REGISTRY.items() if b.dense] == ["cublas"]
    assert REGISTRY["gemlite"].packages == ("gemlite",)


def _table(name, group, act, K=None, N=None, M=None):
    return {f for f in ALL_FORMAT_NAMES if REGISTRY[name].reason(Case(f, act, group, K, N, M)) is None}


def test_supports_returns_none_or_reason():
    for b in REGISTRY.values():
        for f in ALL_FORMAT_NAMES + ["u9", "i1", "f9e4m4", "bogus", "f16", "bf16"]:
            for g in (-1, 16, 32, 64, 128, 256):
                for act in ("f16", "bf16", "f32"):
                    r = b.reason(Case(f, act, g, 8192, 8192, 16))
                    assert r is None or (isinstance(r, str) and r), (b.name, f, g, act)
        assert b.reason(Case("bogus", "f16", 128)) is not None
        assert b.reason(Case("u4", "f32", 128)) is not None


def test_dense_only_cublas():
    assert REGISTRY["cublas"].reason(Case("f16", "f16")) is None
    assert REGISTRY["cublas"].reason(Case("bf16", "bf16")) is None
    assert "dense" in REGISTRY["cublas"].reason(Case("u4", "f16", 128))
    for name in EXPECTED - {"cublas"}:
        assert "dense" in REGISTRY[name].reason(Case("f16", "f16")), name


def test_tilus_table():
    ints = {f"u{b}" for b in range(1, 9)} | {f"i{b}" for b in range(2, 9)}
    floats = {"f3e1m1", "f4e2m1", "f5e2m2", "f5e3m1", "f6e2m3", "f6e3m2", "f6e4m1",
              "f7e2m4", "f7e3m3", "f7e4m2", "f8e4m3"}
    for g in (-1, 32, 64, 128):
        for act in ("f16", "bf16"):
            assert _table("tilus", g, act) == ints | floats
            assert _table("tilus", g, act, 8192, 57344, 12288) == ints | floats   # prefill: dequantize + cuBLAS
    assert "E=5" in REGISTRY["tilus"].reason(Case("f8e5m2", "f16", 128))
    assert REGISTRY["tilus"].reason(Case("u4", "f16", 16)) is not None
    assert "K % 32" in REGISTRY["tilus"].reason(Case("u4", "f16", -1, 8200, 64))


def test_triton_plain_table():
    want = {"u1", "u2", "u4", "u8", "i2", "i4", "i8"}
    for g in (-1, 32, 64, 128):
        for act in ("f16", "bf16"):
            assert _table("triton_plain", g, act, 8192, 57344, 1) == want
    assert _table("triton_plain", 16, "f16") == set()
    assert "32-bit words" in REGISTRY["triton_plain"].reason(Case("f6e3m2", "f16", -1))


def test_torch_int4_table():
    for g in (32, 64, 128, 256):
        assert _table("torch_int4", g, "bf16") == {"u4", "i4"}
        assert _table("torch_int4", g, "f16") == set()
    assert _table("torch_int4", -1, "bf16") == set()
    assert _table("torch_int4", 128, "bf16", K=8200, N=64) == set()


def test_fp8_table():
    assert _table("fp8", -1, "f16") == {"f8e4m3", "f8e5m2"}
    assert _table("fp8", -1, "bf16") == {"f8e4m3", "f8e5m2"}
    assert _table("fp8", 128, "f16") == set()


def test_gemlite_table():
    want = {"u1", "u2", "u4", "u8", "i2", "i4", "i8"}
    for g in (-1, 32, 128):
        assert _table("gemlite", g, "f16") == want
        assert _table("gemlite", g, "bf16") == want


def test_external_tables():
    assert _table("marlin", 128, "f16") == {"i4"}      # dense Marlin: w = (u - 8) * s, no zero points
    assert _table("marlin", -1, "f16") == {"i4"}
    assert _table("marlin", 64, "f16") == set()
    assert _table("marlin", 128, "bf16") == set()
    assert _table("quantllm", -1, "f16") == {"f6e3m2", "f5e2m2"}
    assert _table("quantllm", 128, "f16") == set()
    assert {"u1", "u2", "u4", "u8", "i4"} <= _table("bitblas", 128, "f16")


@pytest.mark.skipif(not NO_CUDA, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("name,fmt,g,act", [
    ("tilus", "i4", 128, torch.float16),
    ("tilus", "u3", -1, torch.bfloat16),
    ("torch_int4", "u4", 128, torch.bfloat16),
    ("fp8", "f8e4m3", -1, torch.bfloat16),
    ("gemlite", "u4", 64, torch.float16),
])
def test_unavailable_without_cuda(name, fmt, g, act):
    qw = random_quantized(256, 64, fmt, g, act, seed=1)
    with pytest.raises(Unavailable):
        REGISTRY[name].prepare(qw, act)


@pytest.mark.parametrize("name,fmt,g", [("marlin", "i4", 128), ("bitblas", "u4", 128), ("quantllm", "f6e3m2", -1)])
def test_external_unavailable_names_every_route(name, fmt, g):
    from kernels.baselines.external import ROUTES
    qw = random_quantized(256, 256, fmt, g, torch.float16, seed=2)
    try:
        REGISTRY[name].prepare(qw, torch.float16)
    except Unavailable as e:
        msg = str(e)
        assert msg.startswith(name)
        for route in ROUTES[name]:
            assert route.label in msg, (route.label, msg)
    else:                                   # a route loaded: only where a GPU and the package are present
        assert not NO_CUDA


def test_unsupported_before_unavailable():
    qw = random_quantized(64, 64, "u3", 32, torch.float16, seed=3)
    for name in ("torch_int4", "fp8", "gemlite", "triton_plain", "marlin", "quantllm"):
        with pytest.raises(Unsupported):
            REGISTRY[name].prepare(qw, torch.float16)
    qw = random_quantized(64, 64, "i4", 32, torch.float16, seed=3)
    with pytest.raises(Unsupported):  # weight scales f16, activations bf16
        REGISTRY["tilus"].prepare(qw, torch.bfloat16)


def test_package_versions():
    import importlib.metadata
    from kernels.baselines import package_versions
    assert package_versions(("torch", "no-such-package-xyz")) == \
        f"torch={importlib.metadata.version('torch')};no-such-package-xyz=missing"
    assert package_versions(()) == ""


# ---------------------------------------------------------------- triton_plain in the interpreter

def _check(fn, qw, M, act, tol):
    x = torch.randn(M, qw.K, dtype=act, generator=torch.Generator().manual_seed(M))
    assert x.abs().sum() > 0
    ref = x.double() @ dequantize_ref(qw)
    y = fn(x)
    assert y.shape == (M, qw.N) and y.dtype == act
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < tol, err
    return err


@pytest.mark.parametrize("fmt,g,act,M,K,N", [
    ("u4", 128, torch.float16, 1, 256, 64),
    ("u8", -1, torch.float16, 16, 256, 128),
    ("i4", -1, torch.bfloat16, 3, 256, 128),
    ("u1", 64, torch.float16, 5, 256, 64),
    ("u2", 32, torch.bfloat16, 1, 128, 96),     # N not a multiple of the tile: masked columns
    ("i2", 128, torch.float16, 1, 256, 64),
    ("i8", 32, torch.float16, 40, 128, 64),     # a GEMM tile (BM 64)
])
def test_triton_plain_matches_float64(fmt, g, act, M, K, N):
    qw = random_quantized(K, N, fmt, g, act, seed=11)
    fn = REGISTRY["triton_plain"].prepare(qw, act, M=M)
    _check(fn, qw, M, act, 2e-3 if act == torch.float16 else 1e-2)
    assert fn.chosen_config(M).startswith("bm")


def test_triton_plain_words_round_trip():
    from kernels.baselines.triton_plain import pack_words
    from kernels.lowbit.formats import codes_of
    for fmt in ("u1", "u2", "u4", "u8", "i4"):
        qw = random_quantized(128, 48, fmt, 32, torch.float16, seed=4)
        w = pack_words(qw).to(torch.int64) & 0xFFFFFFFF
        b = qw.fmt.bits
        P = 32 // b
        codes = torch.stack([(w >> (j * b)) & ((1 << b) - 1) for j in range(P)], dim=1).reshape(128, 48)
        assert torch.equal(codes, codes_of(qw).to(torch.int64))


def test_triton_plain_tunes_with_the_callers_timer():
    from kernels.baselines.triton_plain import candidates, config_str
    qw = random_quantized(256, 64, "u4", 128, torch.float16, seed=6)
    timed = []

    def seconds(f):                       # a stand-in timer: count calls, prefer the 2nd candidate
        f()
        timed.append(1)
        return 1.0 if len(timed) != 2 else 0.5
    fn = REGISTRY["triton_plain"].prepare(qw, torch.float16, M=1, seconds=seconds, tune_per_path=3)
    _check(fn, qw, 1, torch.float16, 2e-3)
    cands = candidates(1, 256, 128)[:3]
    assert len(timed) == len(cands) == 3
    assert fn.chosen_config(1).startswith(config_str(cands[1]) + " | tuned: ")
    assert all(c[0] <= 32 for c in candidates(16, 8192, 128))
    assert all(c[0] >= 64 for c in candidates(2048, 8192, 128)) and len(candidates(4096, 8192, 128)) == 5


# ---------------------------------------------------------------- Tilus (transpile only, no GPU)

@pytest.fixture(scope="module")
def tilus_sm90():
    tilus = pytest.importorskip("tilus", reason="tilus not installed")
    from tilus.target import nvgpu_sm90, set_current_target

    set_current_target(nvgpu_sm90)  # no GPU needed to transpile
    return tilus


@pytest.mark.parametrize("fmt,act,g,zeros", [
    ("i4", "f16", 128, False), ("u4", "bf16", 128, True), ("f6e3m2", "f16", -1, False),
    ("u1", "f16", 32, True), ("i7", "bf16", 64, False), ("f8e4m3", "bf16", -1, False),
])
def test_tilus_script_transpiles_on_cpu(tilus_sm90, tmp_path, fmt, act, g, zeros):
    tilus = tilus_sm90
    tilus.option.cache_dir(str(tmp_path))
    from kernels.baselines.tilus_baseline import tilus_dtype
    from kernels.baselines.tilus_kernel import (TUNING_SPACE, TilusWeightDequant, TilusWeightOnlyMatmul,
                                                TilusWeightRepack)
    from kernels.lowbit.formats import parse_format

    a_t = tilus.float16 if act == "f16" else tilus.bfloat16
    w_t = tilus_dtype(parse_format(fmt))
    assert w_t.nbits == parse_format(fmt).bits
    K, N = 1024, 2048
    group = K if g == -1 else g
    mm = TilusWeightOnlyMatmul(group, a_t, w_t, zeros)
    ji = mm._jit_instance_for(16, N, K, 0, 0, 0, 0, 0)
    assert len(ji.transpiled_programs) == len(TUNING_SPACE) <= 6, ji.failed_scheduling[:1]
    rp = TilusWeightRepack(a_t, w_t)
    assert len(rp._jit_instance_for(K, N, 0, 0).transpiled_programs) == 1
    dq = TilusWeightDequant(group, a_t, w_t, zeros)      # the prefill path (M > 256)
    assert len(dq._jit_instance_for(K, N, 0, 0, 0, 0).transpiled_programs) == 1


def test_tilus_cache_points_come_from_the_experiment_sweeps():
    from harness.tilus_cache import points
    p9 = points(("tilus_fig10",))
    assert {(K, N) for *_, K, N in p9} == {(8192, 8192), (8192, 57344), (28672, 8192)}
    assert {f for f, *_ in p9} == {"u8", "f6e3m2", "u4", "u2", "u1", "i4"} and len(p9) == 18
    assert all(g == (-1 if f.startswith("f") else 128) and act == "f16" for f, g, act, _, _ in p9)
    both = points(("tilus_fig10", "tilus_fig14"))
    assert both[:18] == p9 and len(both) == len(set(both))      # fig14's points are fig10's large shape


# ---------------------------------------------------------------- external packages: repacking on the CPU

def test_marlin_perm_is_the_mma_b_fragment_layout():
    """Each lane's 8 nibbles are the B operand of mma.m16n8k16 (PTX ISA): rows (lane % 4) * 2 + {0, 1, 8, 9}
    of column lane // 4, for the two n8 halves of a 16x16 sub-tile, over the 4 sub-tiles of a 16x64 tile."""
    from kernels.baselines.external import marlin_perms
    perm, sp, sps = marlin_perms()
    assert sorted(perm.tolist()) == list(range(1024))
    assert sorted(sp.tolist()) == list(range(64)) and sorted(sps.tolist()) == list(range(32))
    undo = [0, 4, 1, 5, 2, 6, 3, 7]          # inverse of the nibble interleave 0 2 4 6 1 3 5 7
    for lane in range(32):
        for j in range(4):
            chunk = perm[(lane * 4 + j) * 8:(lane * 4 + j) * 8 + 8][undo]
            cells = {(int(p) % 256 // 16, int(p) % 16) for p in chunk}       # (row k, column n) in the sub-tile
            r, c = lane % 4, lane // 4
            assert cells == {(k, n) for k in (2 * r, 2 * r + 1, 2 * r + 8, 2 * r + 9) for n in (c, c + 8)}
            assert {int(p) // 256 for p in chunk} == {j}


@pytest.mark.parametrize("g", [128, -1])
def test_marlin_pack_round_trip(g):
    from kernels.baselines.external import marlin_pack, marlin_perms
    K, N = 256, 512
    u = torch.randint(0, 16, (K, N), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    s = torch.rand(K // 128 if g == 128 else 1, N).to(torch.float16)
    B, sp = marlin_pack(u, s, g)
    assert B.shape == (K // 16, N * 2) and B.dtype == torch.int32 and sp.shape == s.shape
    perm, scale_perm, scale_perm_single = marlin_perms()
    w = torch.stack([(B.to(torch.int64) >> (4 * i)) & 15 for i in range(8)], dim=2).reshape(K // 16, N * 16)
    w = w.reshape(-1, 1024)[:, torch.argsort(perm)].reshape(K // 16, N // 16, 16, 16)
    assert torch.equal(w.permute(0, 2, 1, 3).reshape(K, N), u.to(torch.int64))
    sperm = scale_perm if g == 128 else scale_perm_single
    assert torch.equal(sp.reshape(-1, sperm.numel())[:, torch.argsort(sperm)].reshape(s.shape), s)


@pytest.mark.parametrize("fmt", ["f6e3m2", "f5e2m2"])
def test_quantllm_packing_and_values_match_our_format(fmt):
    """torchao's FP6-LLM tensor-core packing round-trips our codes, and its floatx values are ours."""
    floatx = pytest.importorskip("torchao.prototype.dtypes.floatx.floatx_tensor_core_layout",
                                 reason="torchao (0.8-0.15) not installed")
    from torchao.prototype.custom_fp_utils import _floatx_unpacked_to_f32
    from kernels.lowbit.formats import codes_of, float_code_values, parse_format
    f = parse_format(fmt)
    assert torch.equal(_floatx_unpacked_to_f32(torch.arange(1 << f.bits, dtype=torch.uint8), f.exp_bits,
                                               f.man_bits).double(), float_code_values(f))
    qw = random_quantized(128, 256, fmt, -1, torch.float16, seed=9)
    codes = codes_of(qw).t().contiguous().to(torch.uint8)             # [N, K], torchao's W layout
    packed = floatx.pack_tc_floatx(codes, f.bits)
    assert packed.numel() == codes.numel() * f.bits // 8
    assert torch.equal(floatx.unpack_tc_floatx(packed, f.bits), codes)


_SM90 = r'''
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.baselines import triton_plain as tp
bits, act = int(sys.argv[1]), sys.argv[2]
sig = {"x_ptr": act, "w_ptr": "*i32", "s_ptr": act, "z_ptr": act, "y_ptr": act, "M": "i32", "N": "i32", "K": "i32",
       "stride_xm": "i32", "stride_wk": "i32", "stride_sg": "i32", "stride_ym": "i32"}
for BM, BN, BK, warps, stages in tp.TUNING_SPACE:
    consts = dict(GROUP=128, PER_CHANNEL=False, BITS=bits, SIGNED=False, HAS_ZEROS=True, BM=BM, BN=BN, BK=BK,
                  GROUP_M=tp.GROUP_M, DEQ_F32=False)
    s = dict(sig, **{k: "constexpr" for k in consts})
    names = list(s)
    aligned = [k for k in sig if k != "M"]
    src = ASTSource(tp._plain_kernel, s, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    print(k.metadata.shared)
'''


@pytest.mark.parametrize("bits,act", [(4, "*fp16"), (8, "*bf16")])
def test_triton_plain_tuning_space_compiles_for_sm90(bits, act):
    """Every tile of the tuning space compiles for an H100/H200 (Triton's bundled ptxas, no GPU) and fits
    in its 227 KB of shared memory per block."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from kernels.baselines.triton_plain import TUNING_SPACE
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _SM90, str(bits), act], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    smem = [int(v) for v in r.stdout.split()]
    assert len(smem) == len(TUNING_SPACE) and 0 < max(smem) <= 227 * 1024
