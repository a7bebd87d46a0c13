"""Build / compile-check the native instrumented CUDA kernels.

build()          -> the torch extension module (torch.utils.cpp_extension.load, sm_90), cached per process.
                    Raises kernels.Unavailable with a reason when there is no CUDA GPU or no nvcc.
compile_check()  -> runs the local `nvcc -arch=sm_90 -c` over every native/kernels/*.cu (no GPU needed);
                    returns {file: (ok, message)}.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kernels import Unavailable

ROOT = Path(__file__).resolve().parent
INCLUDE = ROOT / "include"
KERNEL_SOURCES = sorted((ROOT / "kernels").glob("*.cu"))
ARCH = "sm_90"
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo", f"-I{INCLUDE}"]
_MODULE = None


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def compile_check(arch: str = ARCH, sources=None, timeout: float = 120.0) -> dict:
    """Compile each .cu to an object file with the local nvcc (both the instrumented and the plain
    template instantiations are built, since every launcher references both)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in (sources or KERNEL_SOURCES):
            src = Path(src)
            cmd = [nvcc, f"-arch={arch}", *NVCC_FLAGS, "-c", str(src), "-o", str(Path(tmp) / (src.stem + ".o"))]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            results[src.name] = (p.returncode == 0, (p.stderr or p.stdout).strip())
    return results


def build(verbose: bool = False):
    """Build (once per process) and return the extension module with matmul / softmax / layer_norm / calibrate."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import torch
    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU visible to torch")
    if find_nvcc() is None:
        raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (9, 0):
        raise Unavailable(f"native kernels are built for sm_90; this GPU is sm_{major}{minor}")
    from torch.utils.cpp_extension import load
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    build_dir = Path(os.environ.get("NATIVE_BUILD_DIR", ROOT.parent / "build" / "native"))
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        _MODULE = load(name="native_instr", sources=[str(ROOT / "bindings.cpp"), *map(str, KERNEL_SOURCES)],
                       extra_include_paths=[str(INCLUDE)],
                       extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", "-gencode=arch=compute_90,code=sm_90"],
                       extra_cflags=["-O3"], build_directory=str(build_dir), verbose=verbose)
    except Exception as e:  # compiler missing pieces, ninja absent, ...
        raise Unavailable(f"building the native extension failed: {e}") from e
    return _MODULE
