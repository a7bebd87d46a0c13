"""CPU tests of the baseline adapters: support tables, clean Unavailable without a GPU,
and (when tilus is installed) that the Tilus kernels transpile to a program on the CPU."""
import pytest
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines import BASELINES, Baseline
from kernels.lowbit.formats import ALL_FORMAT_NAMES, random_quantized

EXPECTED = {"tilus", "torch_int4", "fp8", "gemlite", "marlin", "bitblas", "quantllm"}
NO_CUDA = not torch.cuda.is_available()


def test_registry():
    assert set(BASELINES) == EXPECTED
    for name, b in BASELINES.items():
        assert isinstance(b, Baseline) and b.name == name
        assert callable(b.prepare) and callable(b.supports)
        assert 0 < b.tolerance < 1
    assert BASELINES["fp8"].tolerance > BASELINES["tilus"].tolerance  # fp8 activations change the math


def _table(name, group, act):
    return {f for f in ALL_FORMAT_NAMES if BASELINES[name].supports(f, group, act) is None}


def test_supports_returns_none_or_reason():
    for b in BASELINES.values():
        for f in ALL_FORMAT_NAMES + ["u9", "i1", "f9e4m4", "bogus"]:
            for g in (-1, 16, 32, 64, 128, 256):
                for act in ("f16", "bf16", torch.float16, torch.bfloat16, "f32"):
                    r = b.supports(f, g, act)
                    assert r is None or (isinstance(r, str) and r), (b.name, f, g, act)
        assert b.supports("bogus", 128, "f16") is not None
        assert b.supports("u4", 128, "f32") is not None


def test_tilus_table():
    ints = {f"u{b}" for b in range(1, 9)} | {f"i{b}" for b in range(2, 9)}
    floats = {"f3e1m1", "f4e2m1", "f5e2m2", "f5e3m1", "f6e2m3", "f6e3m2", "f6e4m1",
              "f7e2m4", "f7e3m3", "f7e4m2", "f8e4m3"}
    for g in (-1, 32, 64, 128):
        for act in ("f16", "bf16"):
            assert _table("tilus", g, act) == ints | floats
    assert "e5" in BASELINES["tilus"].supports("f8e5m2", 128, "f16").replace("E=5", "e5")
    assert BASELINES["tilus"].supports("u4", 16, "f16") is not None


def test_torch_int4_table():
    for g in (32, 64, 128, 256):
        assert _table("torch_int4", g, "bf16") == {"u4", "i4"}
        assert _table("torch_int4", g, "f16") == set()
    assert _table("torch_int4", -1, "bf16") == set()


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
    assert _table("marlin", 128, "f16") == {"u4", "i4"}
    assert "f6e3m2" in _table("quantllm", -1, "f16")


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
        BASELINES[name].prepare(qw, act)


@pytest.mark.parametrize("name", ["marlin", "bitblas", "quantllm"])
def test_external_unavailable(name):
    qw = random_quantized(64, 64, "i4", 32, torch.float16, seed=2)
    with pytest.raises(Unavailable) as e:
        BASELINES[name].prepare(qw, torch.float16)
    assert name in str(e.value)


def test_unsupported_before_unavailable():
    qw = random_quantized(64, 64, "u3", 32, torch.float16, seed=3)
    for name in ("torch_int4", "fp8", "gemlite"):
        with pytest.raises(Unsupported):
            BASELINES[name].prepare(qw, torch.float16)
    qw = random_quantized(64, 64, "i4", 32, torch.float16, seed=3)
    with pytest.raises(Unsupported):  # weight scales f16, activations bf16
        BASELINES["tilus"].prepare(qw, torch.bfloat16)


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
    from kernels.baselines.tilus_kernel import TUNING_SPACE, TilusWeightOnlyMatmul, TilusWeightRepack
    from kernels.lowbit.formats import parse_format

    a_t = tilus.float16 if act == "f16" else tilus.bfloat16
    w_t = tilus_dtype(parse_format(fmt))
    assert w_t.nbits == parse_format(fmt).bits
    K, N = 1024, 2048
    mm = TilusWeightOnlyMatmul(K if g == -1 else g, a_t, w_t, zeros)
    ji = mm._jit_instance_for(16, N, K, 0, 0, 0, 0, 0)
    assert len(ji.transpiled_programs) == len(TUNING_SPACE) <= 6, ji.failed_scheduling[:1]
    rp = TilusWeightRepack(a_t, w_t)
    assert len(rp._jit_instance_for(K, N, 0, 0).transpiled_programs) == 1


def test_tilus_cache_points_come_from_the_experiment_sweeps():
    from harness.tilus_cache import points
    p9 = points(("tilus_fig10",))
    assert {(K, N) for *_, K, N in p9} == {(8192, 8192), (8192, 57344), (28672, 8192)}
    assert {f for f, *_ in p9} == {"u8", "f6e3m2", "u4", "u2", "u1", "i4"} and len(p9) == 18
    assert all(g == (-1 if f.startswith("f") else 128) and act == "f16" for f, g, act, _, _ in p9)
    both = points(("tilus_fig10", "tilus_fig14"))
    assert both[:18] == p9 and len(both) == len(set(both))      # fig13's points are fig9's large shape
