"""The one place that times device work (README.md, "Timing recipe").

Correct before fast: `check_numerics` compares an output with a float64 reference
before anything is timed. Then `Timer` warms up by time, flushes L2 between
samples, times each sample with CUDA events (or CUDA-graph replays) and returns the
median with p10/p90 and the SM clock read while the samples ran.  With ``host_ahead``
(the default) a sleep kernel holds the GPU while the host enqueues all samples, so the
events time the GPU work of a call even where its launch path is slower than its kernels
(small decode shapes); the host time per call is returned apart (``host_ms``), and so is the count
of samples the GPU may have waited on the host in (``exposed``; too many and the timing is run
again with a longer lead). Without a GPU
the same call times with the wall clock and says so in `method`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


class NumericsFail(Exception):
    """An output does not match its float64 reference; the point is not timed."""


def rel_error(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 26) -> float:
    """||out - ref||_F / ||ref||_F in float64 on the output's device (ref is moved there); inf for NaN/inf or
    unwritten output. Summed over slices of `chunk` elements, so the float64 temporaries stay under 0.5 GB.
    (On the CPU, a 12288 x 57344 output took ~9 s per point of tilus_fig14 in copies and host passes.)"""
    o = out.detach()
    r = ref.detach().to(o.device)
    if o.shape != r.shape:
        raise NumericsFail(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    o, r = o.reshape(-1), r.reshape(-1)
    num = torch.zeros((), dtype=torch.float64, device=o.device)
    den = torch.zeros((), dtype=torch.float64, device=o.device)
    for i in range(0, o.numel(), chunk):
        oc = o[i:i + chunk].to(torch.float64)
        if not torch.isfinite(oc).all():
            return float("inf")
        rc = r[i:i + chunk].to(torch.float64)
        num += (oc - rc).square().sum()
        den += rc.square().sum()
    denom = den.sqrt().item() or 1.0
    return num.sqrt().item() / denom


def check_numerics(out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    err = rel_error(out, ref)
    if not err <= tol:
        raise NumericsFail(f"relative error {err:.3g} > tolerance {tol:.3g}")
    return err


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    sm_clock_mhz: float | None
    method: str             # cuda-events | cuda-graph | cpu-wallclock
    host_ms: float | None = None   # median host time of one call (enqueue only); >= median_ms: host-bound
    exposed: int | None = None     # samples the GPU may have waited on the host in (exposed_samples); None: not CUDA


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile q of xs (the p10/p90 of every row)."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def sm_clock_mhz() -> float | None:
    """Current SM clock of device 0 through NVML, or None where NVML is missing."""
    try:
        import pynvml  # nvidia-ml-py
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if torch.cuda.is_available() else 0)
        return float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


class Timer:
    def __init__(self, device: str = "cuda", warmup_ms: float = 25, samples: int = 50,
                 flush_l2: bool = True, flush_mb: int = 256, cuda_graph: bool = False,
                 cpu_samples: int = 3, host_ahead: bool = True):
        self.device = device
        self.host_ahead = host_ahead and device == "cuda"
        self.warmup_ms = warmup_ms
        self.samples = samples if device == "cuda" else cpu_samples
        self.cuda_graph = cuda_graph and device == "cuda"
        self._flush = None
        if device == "cuda" and flush_l2:
            self._flush = torch.empty(flush_mb * 2**20 // 4, dtype=torch.int32, device="cuda")

    @property
    def method(self) -> str:
        if self.device != "cuda":
            return "cpu-wallclock"
        return ("cuda-graph" if self.cuda_graph else "cuda-events") + ("-host-ahead" if self.host_ahead else "")

    def __call__(self, fn: Callable[[], object]) -> Timing:
        if self.device != "cuda":
            return self._time_cpu(fn)
        return self._time_cuda(fn)

    def seconds(self, fn: Callable[[], object]) -> float:
        """Median seconds of fn; the callable kernels' autotuners are given."""
        return self(fn).median_ms / 1e3

    def _time_cpu(self, fn: Callable[[], object]) -> Timing:
        fn()                                   # warm-up (compiles / interprets once)
        ts = []
        for _ in range(self.samples):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(ts), quantile(ts, 0.1), quantile(ts, 0.9), len(ts), None, self.method)

    def _time_cuda(self, fn: Callable[[], object]) -> Timing:
        run = fn
        if self.cuda_graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        warm_host = []
        while True:                            # warm up by time, at least one call
            h0 = time.perf_counter()
            run()
            warm_host.append(time.perf_counter() - h0)
            torch.cuda.synchronize()
            if (time.perf_counter() - t0) * 1e3 >= self.warmup_ms:
                break
        return self._retrying(run, 2 * self.samples * (statistics.median(warm_host) + 50e-6) + 1e-3)

    RETRIES = 2                                # host_ahead: timings run again when too many samples are exposed

    def _retrying(self, run: Callable[[], object], lead_s: float) -> Timing:
        """The samples of run, behind a lead of lead_s seconds (host_ahead); again with a lead 4x longer,
        at most RETRIES times, while too many of them are exposed to the host; the fewest exposed kept.
        Not again where the first sample was exposed: the lead, twice the warm-up's enqueue time, ran
        out before one call was enqueued, so the call waits for the GPU itself (it synchronises) and a
        longer lead would not change it."""
        best = None
        for _ in range(1 + self.RETRIES if self.host_ahead else 1):
            t, first = self._samples(run, lead_s if self.host_ahead else None)
            if best is None or t.exposed <= best.exposed:
                best = t
            if first or not exposed_too_many(t.exposed, t.n):
                break
            lead_s *= 4                        # the host was slower than the warm-up said: a longer lead
        return best

    def _samples(self, run: Callable[[], object], lead_s: float | None) -> tuple[Timing, bool]:
        """One timing of self.samples calls of run, and whether its first sample was exposed."""
        if lead_s is not None:
            # Keep the GPU busy while the host enqueues every sample, so that the events time
            # the GPU work of each call and not the GPU waiting for a slow launch path (the
            # host time per call is reported apart, as host_ms).  The lead covers the samples'
            # enqueue time twice over; a GPU clock below 2 GHz only lengthens it.
            torch.cuda._sleep(int(lead_s * 2e9))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        host = []
        exposed, first = 0, False
        for i, (s, e) in enumerate(zip(starts, ends)):
            if self._flush is not None:
                self._flush.zero_()
            s.record()
            h0 = time.perf_counter()
            run()
            host.append((time.perf_counter() - h0) * 1e3)
            # CUDA events also count time the GPU waits for the host to enqueue the call: if the GPU
            # has passed this sample's start event before the call is fully enqueued, the sample may
            # hold such a wait (the lead ran out, or the call synchronised).  Counted, and retried.
            if s.query():
                exposed += 1
                first = first or i == 0
            e.record()
        clock = sm_clock_mhz()                 # read while the queued samples run
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        return Timing(statistics.median(ts), quantile(ts, 0.1), quantile(ts, 0.9), len(ts), clock, self.method,
                      statistics.median(host), exposed), first


def exposed_too_many(exposed: int, n: int) -> bool:
    """Whether a CUDA timing with `exposed` of its n samples exposed to the host (the GPU had reached the
    sample's start before its call was enqueued) is to be run again: more than a tenth of them, so that
    the median and p10/p90 may carry host waits."""
    return exposed * 10 > n


def measure_read_bandwidth(timer: Timer, gib: float = 4.0) -> float:
    """HBM read bandwidth in TB/s: the time to sum `gib` GiB of f16 (the probe behind the measured H200 facts in results/paper/design_h200.csv)."""
    n = int(gib * 2**30 // 2)
    x = torch.randn(n, dtype=torch.float16, device="cuda")
    t = timer(lambda: x.sum(dtype=torch.float32))
    return 2 * n / (t.median_ms * 1e-3) / 1e12


def device_time(fn: Callable[[], object], samples: int, match: Callable[[str], bool] | None = None,
                warm: bool = True) -> Timing:
    """Kernel device time from CUPTI (torch.profiler): for work whose host side is slow or noisy.

    Proton's instrumentation session post-processes every launch on the host (0.2-1.7 s on the
    H200), so CUDA events around a launch measure the host, not the kernel. Here each of
    `samples` calls is summed over the kernels it launched (those whose name `match` accepts;
    all by default). No L2 flush: the flush kernel would be profiled too; overhead ratios
    compare this timing with itself. `warm=False` skips the warm-up call (the caller already
    ran fn, e.g. for its correctness check).
    """
    from torch.profiler import ProfilerActivity, profile

    if warm:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(samples):
            fn()
        torch.cuda.synchronize()
    clock = sm_clock_mhz()
    ok = match or (lambda name: True)
    evs = sorted((e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                  and ok(e.name)), key=lambda e: e.time_range.start)
    durs = [e.time_range.end - e.time_range.start for e in evs]          # microseconds
    if not durs:
        raise RuntimeError("the profiler saw no matching kernel")
    per_call = len(durs) // samples if len(durs) % samples == 0 else 1
    ts = [sum(durs[i:i + per_call]) / 1e3 for i in range(0, len(durs), per_call)]
    return Timing(statistics.median(ts), quantile(ts, 0.1), quantile(ts, 0.9), len(ts), clock, "cupti-kernel")
