"""Where a row came from: the GPU, driver and library versions, and the code version."""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("harness", "kernels", "native")
CODE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the measuring code (harness/, kernels/, native/ sources), part of every point_hash.

    It changes when any code that could change a number changes, and not with
    docs, configs (those are hashed per point) or results.
    """
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(ROOT)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


@functools.lru_cache(maxsize=None)
def lacks(sha: str, commit: str) -> bool | None:
    """Whether the code at git `sha` lacks `commit` (it is not among sha's ancestors): True for a row measured before
    the commit landed, False for one measured with it; None where git cannot tell (no repository, an unknown sha)."""
    try:
        rc = subprocess.run(["git", "merge-base", "--is-ancestor", commit, sha], cwd=ROOT,
                            capture_output=True, timeout=10).returncode
    except Exception:
        return None
    return {0: False, 1: True}.get(rc)


@functools.lru_cache(maxsize=1)
def collect(device: str) -> dict:
    import torch
    try:
        import triton
        triton_v = triton.__version__
    except Exception:
        triton_v = ""
    info = {
        "torch": torch.__version__,
        "triton": triton_v,
        "git_sha": _git("rev-parse", "--short=12", "HEAD") or "unknown",
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "code_version": code_version(),
        "cuda": torch.version.cuda or "",
        "driver": "",
        "gpu_name": "",
        "device": "cuda" if device == "cuda" else "cpu-interpreter",
    }
    if device == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name()
        try:
            import pynvml
            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:
            info["driver"] = ""
    else:
        import platform
        info["gpu_name"] = f"none (CPU: {platform.processor() or platform.machine()})"
    return info
