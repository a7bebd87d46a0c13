"""One profiled measurement of a whole model, in a process of its own.

A profiler leaves a process slower after it stops (seen on the H200: an unprofiled rerun after
the PyTorch profiler was 33-58% slower), so every measurement runs in a fresh process that:

  1. builds the model on the device (random weights) and the workload (LoRA train or infer),
  2. checks the workload on the real model (harness.engines.train: check()),
  3. warms up (at least `warmup` units and `warmup_s` seconds) and, if the caller did not fix it, times one unit to choose the
     region length N = round(target_s / unit time) (the caller then passes N to every other
     process of the same point so that all regions are identical),
  4. times the unprofiled region: N units, a device synchronisation after each (the baseline,
     measured before any profiler touched the process), with the host's counters over the region
     (CPU time, page faults, context switches, hypervisor steal: `time_region`),
  5. starts the profiler (timed apart: start_s), times the same N units, stops the clock, then
     finalizes the profiler (stop + write/export; timed apart: finalize_s) and counts the bytes it wrote,
  6. optionally times N units once more, unprofiled (the slowdown a profiler leaves behind).

Options that act on the host side only (the same for every profiler of a group): `cpus` pins the
process to those CPUs from the start; `gc_freeze` moves every object alive before the baseline out of
the garbage collector's reach (gc.freeze), so that full collections do not rescan the model's objects.

`measure(spec) -> dict` does it in the current process; `run_isolated(spec)` runs it in a fresh
process: a child of a fork server that has imported torch, transformers and peft but never
touched CUDA or a profiler (`launcher="forkserver"`, which saves the ~4 s of imports per process),
or `python -m harness.engines.measure '<json spec>'` (`launcher="subprocess"`, also the way nsys
wraps a process). The fork server is `python -m harness.engines.measure --serve` (class
ForkServer). Failures come back as {"status": oom | numerics_fail | unavailable | error,
"error": one line, "phase": where}. Pure compute: no Hydra, no CSV.
"""
from __future__ import annotations

import atexit
import json
import math
import gc
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULT_MARK = "MEASURE_RESULT "
ROOT = Path(__file__).resolve().parents[2]
# imported once by the fork server (never CUDA, never a profiler): each child starts from here
PRELOAD = ["torch", "transformers", "peft", "harness.engines.model", "harness.engines.train",
           "harness.engines.profilers", "harness.engines.measure",
           "transformers.models.llama.modeling_llama", "transformers.models.mistral.modeling_mistral",
           "transformers.models.gemma3.modeling_gemma3", "transformers.models.qwen3_moe.modeling_qwen3_moe",
           "transformers.models.gpt_oss.modeling_gpt_oss", "transformers.models.phi3.modeling_phi3"]
# also preloaded unless that leaves CUDA unusable in a child (liger-kernel asks torch.cuda.is_available()
# at import, which goes through NVML in the server; the probe below checks it)
PRELOAD_EXTRA = ["triton", "liger_kernel.transformers.monkey_patch"]


def _sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def _steal_s() -> float | None:
    """CPU time the hypervisor took from this machine's CPUs so far (all CPUs, /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


_GC = {"s": 0.0, "full": 0, "t": 0.0}


def _gc_clock(phase: str, info: dict) -> None:
    """gc.callbacks hook: the time this process spends in the garbage collector, and its full collections."""
    if phase == "start":
        _GC["t"] = time.perf_counter()
    else:
        _GC["s"] += time.perf_counter() - _GC["t"]
        _GC["full"] += info.get("generation") == 2


def _host() -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    if _gc_clock not in gc.callbacks:
        gc.callbacks.append(_gc_clock)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "sys_s": ru.ru_stime, "minflt": ru.ru_minflt,
            "majflt": ru.ru_majflt, "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw, "steal_s": _steal_s(),
            "gc_s": _GC["s"], "gc_full": _GC["full"]}


PROBE_ITERS = 50_000


def host_probe(iters: int = PROBE_ITERS) -> float:
    """Seconds for a fixed piece of pure-Python work (bytecode only: no calls, so no profiler hook
    fires in it, and no device work): how fast this host runs Python right now. A few ms."""
    t = time.perf_counter()
    x = 0
    for i in range(iters):
        x = (x * 31 + i) & 0xFFFF
    return time.perf_counter() - t


def time_region(unit, n: int, device: str) -> dict:
    """Time n units (a device synchronisation after each, so each unit has its own time) and what the
    host did meanwhile: `s` (the region: the sum of the units' wall times), `unit_s` (each unit),
    `probe_s` (host_probe before the first unit and after each one, outside the units' times: the
    host's speed along the region), and the host counters' deltas (probes included): process CPU time (`cpu_s`, `sys_s`), page faults (`minflt`, `majflt`), voluntary and
    involuntary context switches (`nvcsw`, `nivcsw`), time in the garbage collector (`gc_s`) and its
    full collections (`gc_full`), and time stolen by the hypervisor from all CPUs (`steal_s`). The counters say whether a slow region was the host's doing."""
    _sync(device)
    h0 = _host()
    units, probes = [], [host_probe()]
    for _ in range(n):
        t = time.perf_counter()
        unit()
        _sync(device)
        units.append(time.perf_counter() - t)
        probes.append(host_probe())               # outside the units' times; the device is idle meanwhile
    h1 = _host()
    out = {"s": sum(units), "unit_s": units, "probe_s": probes}
    for k, v in h1.items():
        out[k] = None if v is None or h0[k] is None else v - h0[k]
    return out


def measure(spec: dict) -> dict:
    """Run the whole procedure of the module docstring in this process; raises on failure."""
    import torch

    from ..specs import ModelCard
    from .model import build_model, tiny_card
    from .profilers import make_profiler
    from .train import apply_liger, make_infer, make_train

    t_enter = time.perf_counter()
    dev = spec["device"]
    res: dict = {"phase": "build"}
    _state["res"] = res
    if spec.get("cpus"):                          # pin this process (and the CUDA driver's threads) to these CPUs
        os.sched_setaffinity(0, [int(c) for c in spec["cpus"]])
        res["cpus"] = sorted(os.sched_getaffinity(0))
    card = ModelCard(**{**spec["card"], "papers": tuple(spec["card"].get("papers", ()))})
    if spec.get("tiny"):
        card = tiny_card(card)
    built = build_model(card, layers=spec.get("layers"), dtype=spec.get("dtype", "bf16"), device=dev,
                        seed=spec.get("seed", 0))
    res.update(layers=built.layers, model_params=built.params, stack="hf")
    if spec.get("liger"):
        res["liger_ops"] = apply_liger(built.model)
    k = dict(spec.get("knobs", {}))
    warmup = int(k.pop("warmup", 1))
    if spec["workload"] == "train":
        wl = make_train(built, spec["batch"], spec["seq_len"], seed=spec.get("seed", 0), **k)
        res["stack"] = "hf+peft"
    elif spec["workload"] == "infer":
        wl = make_infer(built, spec["batch"], spec["seq_len"], seed=spec.get("seed", 0), **k)
    else:
        raise ValueError(f"workload {spec['workload']!r}; valid: train, infer")
    if spec.get("liger"):
        res["stack"] += "+liger"
    res["experts_impl"] = getattr(built.model.config, "_experts_implementation", None)
    res["info"] = wl.info
    res["phase"] = "check"
    res["check"] = wl.check()
    res["phase"] = "warmup"
    t_warm, done = time.perf_counter(), 0
    while done < warmup or time.perf_counter() - t_warm < float(spec.get("warmup_s", 0.0)):
        wl.unit()                     # at least `warmup` units and `warmup_s` seconds: GPU clocks ramp up,
        done += 1                     # the allocator and Triton's kernel cache settle before the baseline
        _sync(dev)
    res["warmup_units"] = done
    n = spec.get("units")
    if not n:
        one = time_region(wl.unit, 1, dev)["s"]
        n = max(1, min(int(spec.get("max_units", 64)), round(float(spec["target_s"]) / max(one, 1e-9))))
        res["calibration_unit_s"] = one
    res["units"] = n
    if spec.get("gc_freeze"):                     # objects alive now are never scanned again by the collector
        gc.collect()
        gc.freeze()
    res["ready_s"] = time.perf_counter() - t_enter
    res["phase"] = "baseline"
    res["baseline"] = time_region(wl.unit, n, dev)
    res["baseline_s"] = res["baseline"]["s"]

    prof_spec = spec.get("profiler") or {"kind": "none"}
    out_dir = Path(spec.get("out_dir") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    prof = make_profiler(prof_spec["kind"], out_dir / spec.get("stem", "profile"), **prof_spec.get("options", {}))
    res["phase"] = "profiled"
    _sync(dev)
    t = time.perf_counter()
    prof.start()                                  # outside the region, as the paper's runners start it
    res["start_s"] = time.perf_counter() - t
    res["region"] = time_region(wl.unit, n, dev)
    res["region_s"] = res["region"]["s"]
    res["region_end_wall"] = time.time()
    res["phase"] = "finalize"
    t = time.perf_counter()
    files = prof.finalize()
    res["finalize_s"] = time.perf_counter() - t
    res["files"] = {str(p): p.stat().st_size for p in files if p.exists()}
    res["profile_bytes"] = sum(res["files"].values()) if files else None
    res["kernel_launches"] = prof.kernel_launches()
    if getattr(prof, "ran_activities", None) is not None:
        res["activities"] = prof.ran_activities
    if spec.get("residual"):
        res["phase"] = "residual"
        res["residual_s"] = time_region(wl.unit, n, dev)["s"]
    if dev == "cuda":
        from ..timing import sm_clock_mhz
        res["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
        res["sm_clock_mhz"] = sm_clock_mhz()
    res["phase"] = "done"
    res["status"] = "ok"
    return res


_state: dict = {}


def classify(e: BaseException) -> tuple[str, str]:
    """(status, one-line message) for an exception raised while measuring."""
    import torch

    from kernels import Unavailable, Unsupported
    from ..timing import NumericsFail
    msg = " ".join(f"{type(e).__name__}: {e}".split())[:400]
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return "oom", msg
    if isinstance(e, NumericsFail):
        return "numerics_fail", str(e)
    if isinstance(e, Unavailable):
        return "unavailable", str(e)
    if isinstance(e, Unsupported):
        return "unsupported", str(e)
    return "error", msg


def measure_safely(spec: dict) -> dict:
    _state.clear()
    try:
        return measure(spec)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a status
        status, msg = classify(e)
        phase = _state.get("res", {}).get("phase", "start")
        return {"status": status, "error": msg, "phase": phase}


class ForkServer:
    """A process that has imported `PRELOAD` (never CUDA, never a profiler) and forks one child per
    measurement: `python -m harness.engines.measure --serve`, one JSON request per line on its stdin,
    one `RESULT_MARK` + JSON result line per request on its stdout. The child's own output goes to
    stderr; its result comes back through a pipe; a child past its timeout is killed.

    CUDA must not be initialised in the server (a child of a process that called cuInit cannot use
    the GPU): the server runs with PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch.cuda.is_available() through
    NVML), and before the first GPU measurement a probe child touches the GPU; if that fails,
    `usable()` says why and the caller starts plain processes instead."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.probed: str | None = None         # "" = the GPU works in a child; else why not
        self.preload = "full"                  # full = PRELOAD + PRELOAD_EXTRA; base = PRELOAD

    def _start(self) -> None:
        env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "HARNESS_MEASURE_PRELOAD": self.preload,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.engines.measure", "--serve"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        atexit.register(self.close)

    def _ask(self, req: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK):])
        code = self.proc.wait()
        self.proc = None
        return {"status": "error", "phase": "unknown", "error": f"the measurement fork server exited (code {code})"}

    def usable(self, device: str) -> str:
        """"" when a forked child can run on `device`, else the reason it cannot."""
        if self.proc is None and self.probed is None:
            self.preload = "full" if device == "cuda" else "base"    # liger-kernel only runs on a GPU
        if device != "cuda":
            return ""
        if self.probed is None:
            res = self._ask({"probe": "cuda", "timeout_s": 120})
            if res.get("status") != "ok" and self.preload == "full":    # try again without the extras
                self.close()
                self.preload = "base"
                res = self._ask({"probe": "cuda", "timeout_s": 120})
            self.probed = "" if res.get("status") == "ok" else f"fork server probe: {res.get('error')}"
            if self.probed:
                print(f"warning: {self.probed}; measuring in plain subprocesses instead", file=sys.stderr)
        return self.probed

    def run(self, spec: dict, timeout_s: float) -> dict:
        return self._ask({"spec": spec, "timeout_s": timeout_s})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def _probe_cuda() -> dict:
    import torch
    x = torch.arange(4.0, device="cuda")
    torch.cuda.synchronize()
    return {"status": "ok" if float(x.sum()) == 6.0 else "error", "error": "", "phase": "probe"}


def serve() -> int:
    """The fork server's loop (see ForkServer)."""
    import importlib
    import select
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the caller's: it closes our stdin, we stop
    extra = PRELOAD_EXTRA if os.environ.get("HARNESS_MEASURE_PRELOAD", "full") == "full" else []
    for m in PRELOAD + extra:
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001 - a module that does not import here is imported (or fails) in the child
            pass
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the child: measure, send the result, leave
            os.close(r)
            os.dup2(2, 1)                              # library prints go to stderr, never to the protocol
            try:
                res = _probe_cuda() if "probe" in req else measure_safely(req["spec"])
            except BaseException as e:  # noqa: BLE001
                res = {"status": "error", "error": " ".join(f"{type(e).__name__}: {e}".split())[:300], "phase": "probe"}
            res = _jsonable(res)
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(res))
            sys.stderr.flush()
            os._exit(0)
        os.close(w)
        chunks, deadline = [], time.monotonic() + float(req["timeout_s"])
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                break
            b = os.read(r, 1 << 16)
            if not b:
                break
            chunks.append(b)
        os.close(r)
        _, st = os.waitpid(pid, 0)
        try:
            res = json.loads(b"".join(chunks))
        except ValueError:
            res = None
        if res is not None:
            pass
        elif time.monotonic() >= deadline:
            res = {"status": "timeout", "phase": "unknown", "error": f"no result within {req['timeout_s']:g} s"}
        else:
            how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit code {os.WEXITSTATUS(st)}"
            res = {"status": "error", "phase": "unknown", "error": f"measurement process died without a result ({how})"}
        try:
            out.write(RESULT_MARK + json.dumps(res) + "\n")
            out.flush()
        except BrokenPipeError:                         # the caller is gone
            return 0
    return 0


_SERVER = ForkServer()


def _run_subprocess(spec: dict, timeout_s: float, prefix: list[str] | None = None) -> dict:
    cmd = [*(prefix or []), sys.executable, "-m", "harness.engines.measure", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout_s:g} s", "phase": "unknown"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        return {"status": "error", "phase": "unknown",
                "error": f"measurement process exited with code {r.returncode} and no result: {tail}"[:400]}
    res = json.loads(lines[-1][len(RESULT_MARK):])
    res["exit_wall"] = time.time()
    return res


def run_isolated(spec: dict, launcher: str = "forkserver", timeout_s: float = 600,
                 prefix: list[str] | None = None) -> dict:
    """`measure(spec)` in a fresh process; the result dict (status ok or the failure), plus
    `process_s` (the whole process's wall time as the caller saw it) and `launcher` (what ran it)."""
    if launcher not in ("forkserver", "subprocess"):
        raise ValueError(f"launcher {launcher!r}; valid: forkserver, subprocess")
    t = time.perf_counter()
    note = _SERVER.usable(spec["device"]) if launcher == "forkserver" and not prefix else ""
    fork = launcher == "forkserver" and not prefix and not note
    res = _SERVER.run(spec, timeout_s) if fork else _run_subprocess(spec, timeout_s, prefix)
    res["process_s"] = time.perf_counter() - t
    res["launcher"] = "forkserver" if fork else "subprocess"
    if note:
        res["launcher_note"] = note
    return res


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m harness.engines.measure '<json spec>' | --serve  (see the module docstring)")
        return 2
    res = measure_safely(json.loads(argv[0]))
    print(RESULT_MARK + json.dumps(_jsonable(res)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
