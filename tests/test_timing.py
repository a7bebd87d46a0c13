"""The timing module on the CPU path, and the numerics gate that runs before any timing."""
import math
import time

import pytest
import torch

from harness.timing import NumericsFail, Timer, check_numerics, quantile, rel_error


def test_cpu_timer_measures_a_known_duration():
    t = Timer("cpu", cpu_samples=5)(lambda: time.sleep(0.004))
    assert t.method == "cpu-wallclock" and t.n == 5 and t.sm_clock_mhz is None
    assert 3.9 <= t.p10_ms <= t.median_ms <= t.p90_ms < 40


def test_quantiles_interpolate():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.5) == 3.0 and quantile(xs, 0.1) == pytest.approx(1.4) and quantile(xs, 0.9) == pytest.approx(4.6)


def test_rel_error_and_gate():
    ref = torch.randn(8, 16, dtype=torch.float64)
    out = (ref * (1 + 1e-4)).to(torch.float16)
    assert rel_error(out, ref) < 1e-3
    assert check_numerics(out, ref, 2e-3) < 2e-3
    with pytest.raises(NumericsFail, match="relative error"):
        check_numerics(out + 1, ref, 2e-3)
    bad = out.clone()
    bad[0, 0] = float("nan")
    assert math.isinf(rel_error(bad, ref))
    with pytest.raises(NumericsFail):
        check_numerics(bad, ref, 1.0)
    with pytest.raises(NumericsFail, match="shape"):
        rel_error(out[:4], ref)


def test_cuda_timer_is_not_built_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert Timer("cpu").method == "cpu-wallclock"
