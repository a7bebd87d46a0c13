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


def test_exposed_samples_policy():
    """A CUDA timing is run again when more than a tenth of its samples may hold a host wait."""
    from harness.timing import exposed_too_many
    assert not exposed_too_many(0, 50) and not exposed_too_many(5, 50) and exposed_too_many(6, 50)
    assert not exposed_too_many(0, 3) and exposed_too_many(1, 3)
    assert Timer("cpu", cpu_samples=2)(lambda: None).exposed is None     # no events, nothing to count


class _Scripted(Timer):
    """Timer whose samples are a script of exposed counts (the retry loop's own logic; the events need a GPU)."""
    def __init__(self, script, **kw):
        super().__init__("cuda", flush_l2=False, **kw)   # no CUDA call before _samples
        self.script, self.leads = list(script), []

    def _samples(self, run, lead_s):
        from harness.timing import Timing
        self.leads.append(lead_s)
        exposed = self.script.pop(0)
        first = exposed == self.samples            # every sample exposed: the first one too
        return Timing(float(10 + exposed), 1.0, 2.0, self.samples, None, self.method, 0.1, exposed), first


@pytest.mark.parametrize("script,leads,kept", [
    ([0], [0.01], 0),                        # none exposed: one run
    ([5, 0], [0.01], 5),                     # 5 / 50 is not too many
    ([30, 2], [0.01, 0.04], 2),              # retried once with a 4x lead
    ([30, 20, 25], [0.01, 0.04, 0.16], 20),  # at most two retries; the fewest exposed kept
    ([50, 0], [0.01], 50),                   # the first sample exposed: the call synchronises, no retry
])
def test_host_ahead_retries_exposed_timings(script, leads, kept):
    t = _Scripted(script)
    got = t._retrying(lambda: None, 0.01)
    assert t.leads == pytest.approx(leads) and got.exposed == kept


def test_without_host_ahead_a_timing_runs_once():
    t = _Scripted([40, 0], host_ahead=False)
    got = t._retrying(lambda: None, 0.01)
    assert t.leads == [None] and got.exposed == 40
