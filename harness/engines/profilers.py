"""Profilers around a timed region: none, Proton, the PyTorch profiler, Nsight Systems.

Pure compute (no Hydra, no CSV). `make_profiler(kind, stem, **options)` returns an object with
`start()` (called just before the region's clock starts), `finalize() -> list[Path]` (called
after the region's clock stopped: stops the profiler, writes its files, returns them; its
duration is the finalize/export time) and `kernel_launches()` (kernels the profile recorded,
where the format says). The options are those of conf/profiler/<name>.yaml.

- proton: `triton.profiler.start(stem, context=..., backend=..., data=...)` then `finalize()`:
  a hatchet tree (`<stem>.hatchet`). Shadow context by default, as the paper's runners.
- torch: `torch.profiler.profile(activities, record_shapes, profile_memory, with_stack)`, the
  artifact's CPU + CUDA activities with shapes and memory; `stop()` and `export_chrome_trace`.
- nsys: the capture range of a process started under `nsys profile --capture-range=cudaProfilerApi`
  (cudaProfilerStart/Stop around the region); nsys writes its report when the process ends, so
  the caller measures that part.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

KINDS = ("none", "proton", "torch", "nsys")


def unavailable_reason(kind: str, device: str) -> str | None:
    """Why a profiler of this kind cannot run here (None = it can)."""
    if kind == "proton" and device != "cuda":
        return "Proton's CUPTI backend profiles CUDA kernels; no GPU on this machine"
    if kind == "nsys":
        if shutil.which("nsys") is None:
            return "nsys (Nsight Systems) is not on the PATH"
        if device != "cuda":
            return "nsys traces CUDA; no GPU on this machine"
    if kind == "proton":
        try:
            import triton.profiler  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"triton.profiler (Proton) does not import: {e}"
    return None


class NoProfiler:
    kind = "none"

    def start(self) -> None:
        pass

    def finalize(self) -> list[Path]:
        return []

    def kernel_launches(self) -> int | None:
        return None


class ProtonProfiler(NoProfiler):
    kind = "proton"

    def __init__(self, stem: Path, context: str = "shadow", backend: str | None = None, data: str = "tree"):
        self.stem, self.context, self.backend, self.data = Path(stem), context, backend, data
        self.session = None
        self.files: list[Path] = []

    def start(self) -> None:
        import triton.profiler as proton
        self.session = proton.start(str(self.stem), context=self.context, backend=self.backend, data=self.data)

    def finalize(self) -> list[Path]:
        import triton.profiler as proton
        proton.finalize(self.session)
        self.files = sorted(p for p in self.stem.parent.glob(self.stem.name + ".*") if p.is_file())
        return self.files

    def kernel_launches(self) -> int | None:
        trees = [p for p in self.files if p.suffix == ".hatchet"]
        return hatchet_kernel_launches(json.loads(trees[0].read_text())) if trees else None


def hatchet_kernel_launches(db) -> int:
    """Kernel launches in a Proton tree: the `count` of every node that carries kernel metrics
    (`time (ns)`, `device_id`, `device_type` on kernel nodes; context frames carry none)."""
    total = 0
    stack = [n for n in (db if isinstance(db, list) else [db]) if isinstance(n, dict) and "frame" in n]
    while stack:
        node = stack.pop()
        m = node.get("metrics", {})
        if "count" in m and ("time (ns)" in m or "device_id" in m or "device_type" in m):
            total += int(m["count"])
        stack.extend(node.get("children", []))
    return total


class TorchProfiler(NoProfiler):
    kind = "torch"

    def __init__(self, stem: Path, activities=("cpu", "cuda"), record_shapes: bool = True,
                 profile_memory: bool = True, with_stack: bool = False):
        import torch
        self.stem = Path(stem)
        have = torch.profiler.supported_activities()
        acts = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        self.activities = [acts[a] for a in activities if acts[a] in have]
        self.ran_activities = [a for a in activities if acts[a] in have]
        self.prof = torch.profiler.profile(activities=self.activities, record_shapes=record_shapes,
                                           profile_memory=profile_memory, with_stack=with_stack)

    def start(self) -> None:
        self.prof.start()

    def finalize(self) -> list[Path]:
        self.prof.stop()
        path = self.stem.with_name(self.stem.name + ".json")
        self.prof.export_chrome_trace(str(path))
        return [path]


class NsysRange(NoProfiler):
    kind = "nsys"

    def start(self) -> None:
        import torch
        torch.cuda.cudart().cudaProfilerStart()

    def finalize(self) -> list[Path]:
        import torch
        torch.cuda.cudart().cudaProfilerStop()
        return []


def make_profiler(kind: str, stem: Path, **options):
    if kind == "none":
        return NoProfiler()
    if kind == "proton":
        return ProtonProfiler(stem, **options)
    if kind == "torch":
        return TorchProfiler(stem, **options)
    if kind == "nsys":
        return NsysRange()
    raise ValueError(f"profiler kind {kind!r}; valid: {', '.join(KINDS)}")


def nsys_command(stem: Path, options: dict) -> list[str]:
    """The `nsys profile` prefix for a process whose region is bracketed by cudaProfilerStart/Stop."""
    return ["nsys", "profile", f"--trace={options.get('trace', 'cuda')}", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "--force-overwrite=true", "-o", str(stem)]
