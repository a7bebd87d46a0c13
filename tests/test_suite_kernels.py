"""CPU tests of the instrumented Triton kernel suite (run with TRITON_INTERPRET=1)."""
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 (CPU interpreter) or a CUDA GPU")

from kernels import Unsupported  # noqa: E402
from kernels.suite import SUITE, KernelCase, profile_flag  # noqa: E402
from kernels.suite.proton_modes import GRANULARITIES, make_mode, mode_string, parse_mode_string  # noqa: E402

EXPECTED = {"fused_softmax", "grouped_gemm", "layer_norm", "low_memory_dropout", "matmul", "swiglu", "topk",
            "persistent_matmul", "moe_matmul", "fused_attention"}
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") else "cpu"


def test_registry_complete():
    assert set(SUITE) == EXPECTED
    for name, case in SUITE.items():
        assert isinstance(case, KernelCase) and case.name == name
        assert set(case.sizes) == {"tiny", "llm"} and case.scopes
        assert {"atol", "rtol"} <= set(case.tolerance)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kernel_matches_reference_tiny(name):
    case = SUITE[name]
    inputs = case.make_inputs("tiny", DEVICE, seed=3)
    for v in inputs.values():  # random data, never all zeros
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            assert v.abs().sum() > 0
    out = case.run(inputs)
    ok, err = case.check(inputs, out)
    assert ok, f"{name}: max abs error {err}"
    flops, nbytes = case.flops_bytes(inputs)
    assert flops > 0 and nbytes > 0


@pytest.mark.parametrize("name", ["matmul", "layer_norm"])
def test_instrument_flag_is_off_in_interpreter(name):
    # instrument=True must run in the interpreter (scopes compiled out) and give the same result
    case = SUITE[name]
    inputs = case.make_inputs("tiny", DEVICE, seed=1)
    if DEVICE == "cpu":
        assert profile_flag(True) is False
    assert torch.equal(case.run(inputs, instrument=True), case.run(inputs, instrument=False))


def test_seeds_give_different_data():
    a = SUITE["matmul"].make_inputs("tiny", DEVICE, seed=0)["a"]
    b = SUITE["matmul"].make_inputs("tiny", DEVICE, seed=1)["a"]
    assert not torch.equal(a, b)


def test_dropout_mask_is_real():
    case = SUITE["low_memory_dropout"]
    inputs = case.make_inputs("tiny", DEVICE, seed=0)
    out = case.run(inputs)
    frac = (out == 0).float().mean().item()
    assert 0.03 < frac < 0.2  # p = 0.1
    assert torch.equal(out, case.run(inputs))  # same seed, same mask


def test_unknown_size():
    with pytest.raises(Unsupported):
        SUITE["matmul"].make_inputs("huge", DEVICE, 0)


# ---------------------------------------------------------------- proton_modes

def test_mode_default():
    assert mode_string() == "default"
    assert make_mode(0, "warp", False, False) == "default"


@pytest.mark.parametrize("bs,gran,c32,ts", [(0, "cta", False, False), (4096, "warp", True, False),
                                             (1024, "cta", True, True), (65536, "warp", False, True)])
def test_mode_roundtrip(bs, gran, c32, ts):
    s = make_mode(bs, gran, c32, ts)
    assert s.startswith("default")
    p = parse_mode_string(s)
    assert (p["buffer_size"], p["granularity"], p["clock32"], p["time_shift"]) == (bs, gran, c32, ts)


def test_mode_string_format():
    assert make_mode(1024, "cta", True, True) == "default:buffer_size=1024:granularity=cta:optimizations=clock32,time_shift"
    assert make_mode(0, "warp", False, True) == "default:optimizations=time_shift"


def test_mode_object_matches_proton():
    pytest.importorskip("triton.profiler.mode")
    try:
        obj = make_mode(2048, "cta", True, True, as_object=True)
    except ImportError:
        pytest.skip("triton built without Proton")
    assert obj.buffer_size == 2048
    assert "granularity=GRANULARITY.CTA" in str(obj)
    assert [str(o) for o in obj.optimizations] == ["clock32", "time_shift"]
    # Proton's own string parser accepts our string
    from triton.profiler.hooks.instrumentation import _interpret_mode
    parsed = _interpret_mode(make_mode(2048, "cta", True, True))
    assert str(parsed) == str(obj)


@pytest.mark.parametrize("bad", [dict(buffer_size=-1), dict(granularity="block"), dict(buffer_size=1.5)])
def test_mode_rejects(bad):
    with pytest.raises(ValueError):
        make_mode(**bad)


def test_granularities_cover_warp_and_cta():
    assert {"warp", "cta"} <= set(GRANULARITIES)
