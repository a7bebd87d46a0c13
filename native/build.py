"""Build / compile-check the native CUDA kernels (instrumented suite kernels and the low-bit matmul).

build()          -> the torch extension module (torch.utils.cpp_extension.load with ninja, sm_90a), built
                    once per process into build/native (NATIVE_BUILD_DIR); ninja rebuilds only the sources
                    that changed (the compile cache).  Raises kernels.Unavailable with a reason when there is
                    no CUDA GPU or no nvcc.
compile_check()  -> runs the local `nvcc -gencode=arch=compute_90a,code=sm_90a -c` over native/kernels/*.cu
                    (no GPU needed); returns {file: (ok, message)}.
check_bindings() -> g++ -fsyntax-only of bindings.cpp against the installed torch headers (CPU wheels carry
                    the ATen CUDA headers; the CUDA math-library headers they include are stubbed).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernels import Unavailable

ROOT = Path(__file__).resolve().parent
INCLUDE = ROOT / "include"
KERNEL_SOURCES = sorted((ROOT / "kernels").glob("*.cu"))
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo", "-diag-suppress", "177", f"-I{INCLUDE}"]
_MODULE = None


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def compile_check(sources=None, timeout: float = 900.0, extra=(), jobs: int | None = None,
                  link: bool = False) -> dict:
    """Compile each .cu to an object file with the local nvcc (every template instantiation the file
    defines is built: both instrumentation variants of the suite kernels, every low-bit recipe of a part).
    link=True also links the objects into one shared library (entry "link"): a symbol defined in a header
    that several translation units include fails there, as it does in the real build."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    srcs = [Path(s) for s in (sources or KERNEL_SOURCES)]
    if link:
        extra = (*extra, "-Xcompiler", "-fPIC")
    with tempfile.TemporaryDirectory() as tmp:
        def one(src: Path):
            cmd = [nvcc, GENCODE, *NVCC_FLAGS, *extra, "-c", str(src), "-o", str(Path(tmp) / (src.stem + ".o"))]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            return src.name, (p.returncode == 0, (p.stderr or p.stdout).strip())
        with ThreadPoolExecutor(jobs or max(1, os.cpu_count() or 1)) as ex:
            res = dict(ex.map(one, srcs))
        if link and all(ok for ok, _ in res.values()):
            objs = [str(Path(tmp) / (s.stem + ".o")) for s in srcs]
            p = subprocess.run([nvcc, GENCODE, "-shared", *objs, "-o", str(Path(tmp) / "linked.so")],
                               capture_output=True, text=True, timeout=timeout)
            res["link"] = (p.returncode == 0, (p.stderr or p.stdout).strip())
        return res


REGS_PER_SM = 65536        # sm_90: 64K 32-bit registers per SM, allocated per warp in units of 256 (8 per thread)


def kernel_registers(ptxas_log: str) -> dict[str, int]:
    """Registers per thread of every kernel in the log of `nvcc -Xptxas -v` (compile_check(extra=("-Xptxas",
    "-v")) returns it as each file's message), by mangled name."""
    out, name = {}, None
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name] = int(m.group(1))
            name = None
    return out


def blocks_per_sm(registers: int, threads: int) -> int:
    """Resident blocks per SM that the register file allows (sm_90 allocation granularity)."""
    per_thread = -(-registers // 8) * 8
    return REGS_PER_SM // (per_thread * threads)


_STUBS = {  # the CUDA math-library types torch's ATen CUDA headers name (headers absent without the full toolkit)
    "cusparse.h": "typedef struct cusparseContext *cusparseHandle_t;\n",
    "cublas_v2.h": "typedef struct cublasContext *cublasHandle_t;\ntypedef int cublasStatus_t;\n",
    "cublasLt.h": "typedef struct cublasLtContext *cublasLtHandle_t;\n",
    "cusolverDn.h": "typedef struct cusolverDnContext *cusolverDnHandle_t;\ntypedef int cusolverStatus_t;\n",
    "cusolver_common.h": "",
    "c10/cuda/impl/cuda_cmake_macros.h": "",
}


def check_bindings(timeout: float = 300.0) -> tuple[bool, str]:
    """Syntax-check bindings.cpp with g++ against torch's headers (no CUDA libraries needed)."""
    import torch.utils.cpp_extension as ext
    cxx = shutil.which("g++") or shutil.which("c++")
    nvcc = find_nvcc()
    if cxx is None or nvcc is None:
        raise Unavailable("g++ and nvcc (for the CUDA runtime headers) are needed")
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), str(Path(nvcc).resolve().parent.parent),
             "/usr/local/cuda"]
    cuda_inc = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime_api.h").exists()),
                    None)
    if cuda_inc is None:
        raise Unavailable("CUDA runtime headers (cuda_runtime_api.h) not found; set CUDA_HOME")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in _STUBS.items():
            f = Path(tmp) / name
            f.parent.mkdir(parents=True, exist_ok=True)
            if not (cuda_inc / name).exists():
                f.write_text(text)
        inc = [f"-I{p}" for p in ext.include_paths()] + [f"-I{sysconfig.get_paths()['include']}",
                                                       f"-I{cuda_inc}", f"-I{tmp}", f"-I{INCLUDE}"]
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-w", *inc, "-DTORCH_EXTENSION_NAME=native_ext",
               str(ROOT / "bindings.cpp")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode == 0, (p.stderr or p.stdout).strip()


def build(verbose: bool = False):
    """Build (once per process) and return the extension module: the suite kernels (matmul / softmax /
    layer_norm / calibrate) and the low-bit matmul (lowbit_gemv / lowbit_dequant / lowbit_xsplit)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import torch
    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU visible to torch")
    if find_nvcc() is None:
        raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        raise Unavailable(f"native kernels are built for sm_90a (Hopper); this GPU is sm_{major}{minor}")
    from torch.utils.cpp_extension import load
    build_dir = Path(os.environ.get("NATIVE_BUILD_DIR", ROOT.parent / "build" / "native"))
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        _MODULE = load(name="native_ext", sources=[str(ROOT / "bindings.cpp"), *map(str, KERNEL_SOURCES)],
                       extra_include_paths=[str(INCLUDE)],
                       extra_cuda_cflags=[*NVCC_FLAGS, *extra_flags(), GENCODE], extra_cflags=["-O3"],
                       build_directory=str(build_dir), verbose=verbose)
    except Exception as e:  # compiler missing pieces, ninja absent, ...
        raise Unavailable(f"building the native extension failed: {e}") from e
    return _MODULE


def extra_flags() -> list:
    """NATIVE_EXTRA_NVCC_FLAGS (space-separated), for an A/B build of one kernel option in its own build directory
    (e.g. NATIVE_EXTRA_NVCC_FLAGS=-DSOME_OPTION=0 NATIVE_TUNE_BUILD_DIR=build/native_tune_opt0; native/NOTES.md section
    24 measured an L2 prefetch this way): the rows of such a build do not match the committed code, so they go to
    check files, never to figure rows."""
    return os.environ.get("NATIVE_EXTRA_NVCC_FLAGS", "").split()


_TUNE_MODULE = None
SUITE_SOURCES = [ROOT / "kernels" / f for f in ("matmul.cu", "softmax.cu", "layer_norm.cu", "calibrate.cu")]


def tune_sources(out_dir: Path) -> list:
    """The sources of the small tuning extension: bindings, the suite kernels (bindings.cpp binds them), the
    dispatchers restricted to the TUNED recipes and one generated translation unit per TUNED recipe (all its
    decode variants, its dequantize kernel and its fused prefill kernel), so that the build runs in parallel."""
    from native import lowbit_layout as LL
    out_dir.mkdir(parents=True, exist_ok=True)
    srcs = [ROOT / "bindings.cpp", *SUITE_SOURCES, ROOT / "kernels" / "lowbit_dispatch.cu",
            ROOT / "kernels" / "lowbit_fused.cu", ROOT / "kernels" / "lowbit_lut.cu"]
    for name in LL.TUNED:
        f = out_dir / f"tune_{name}.cu"
        text = (f'#include "lowbit_launch.cuh"\n#include "lowbit_fused.cuh"\nLOWBIT_DEFINE(rec_{name})\n'
                f'LOWBIT_FUSED_DEFINE(rec_{name})\n')
        if not f.exists() or f.read_text() != text:   # unchanged text keeps ninja's cache
            f.write_text(text)
        srcs.append(f)
    return srcs


TUNE_FLAGS = ["-DLOWBIT_DISPATCH_LIST=LOWBIT_RECIPES_TUNED", "-DLOWBIT_FUSED_BOTH_G"]   # fused: both group sizes


def build_tune(verbose: bool = False):
    """The extension native/tune.py uses: the same bindings, only the TUNED recipes (lowbit_layout.TUNED) with
    every decode variant; ~1/7 of the full build (build/native_tune, NATIVE_TUNE_BUILD_DIR)."""
    global _TUNE_MODULE
    if _TUNE_MODULE is not None:
        return _TUNE_MODULE
    import torch
    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU visible to torch")
    if find_nvcc() is None:
        raise Unavailable("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    from torch.utils.cpp_extension import load
    build_dir = Path(os.environ.get("NATIVE_TUNE_BUILD_DIR", ROOT.parent / "build" / "native_tune"))
    srcs = tune_sources(build_dir / "src")
    try:
        _TUNE_MODULE = load(name="native_tune_ext", sources=[str(s) for s in srcs],
                            extra_include_paths=[str(INCLUDE)],
                            extra_cuda_cflags=[*NVCC_FLAGS, *TUNE_FLAGS, *extra_flags(), GENCODE], extra_cflags=["-O3"],
                            build_directory=str(build_dir), verbose=verbose)
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"building the native tuning extension failed: {e}") from e
    return _TUNE_MODULE


if __name__ == "__main__":  # python -m native.build [--check]: compile everything here (no GPU needed)
    if "--check" in sys.argv:
        res = compile_check()
        bad = {k: m for k, (ok, m) in res.items() if not ok}
        print(f"{len(res) - len(bad)}/{len(res)} sources compiled for sm_90a")
        for k, m in bad.items():
            print(k, m[-2000:])
        ok, msg = check_bindings()
        print("bindings.cpp:", "ok" if ok else msg[-2000:])
        sys.exit(1 if bad or not ok else 0)
    build(verbose=True)
    print("built")
