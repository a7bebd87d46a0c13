"""Build the dense Marlin kernel (IST-DASLab's, as the marlin-kernels 0.2.0 sdist ships it) for one
torch build, without a GPU, into a small wheel ``marlin-kernels-dense`` that registers
``torch.ops.marlin_dense.gemm``.

    python -m kernels.baselines.build_marlin --sdist marlin-kernels-0.2.0.tar.gz \\
        --torch-wheel torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl --out .whl

Why: marlin-kernels publishes no wheels (0.3.x sdists hold no CUDA sources) and the GPU
machine has no package index, so its source is compiled here against the headers and
libraries of the exact torch that machine runs (PyPI's torch 2.11.0 is the +cu130 build).
Only ``marlin/dense/marlin_cuda_kernel.cu`` is compiled (one include swapped: ATen's
CUDAContext.h pulls cuBLAS/cuSPARSE headers this toolkit lacks; the kernel needs only the
current stream), with our own op registration (no pybind11, so no Python ABI): the library
loads with ``torch.ops.load_library`` under any Python. Needs nvcc (>= the torch's CUDA) and g++.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

NAME, VERSION = "marlin_kernels_dense", "0.2.0"
KERNEL = "marlin-kernels-0.2.0/marlin_kernels/marlin/dense/marlin_cuda_kernel.cu"

REGISTRATION = r"""
#include <torch/library.h>
#include <torch/all.h>
torch::Tensor marlin_gemm(torch::Tensor& a, torch::Tensor& b_q_weight, torch::Tensor& b_scales,
                          torch::Tensor& workspace, int64_t size_m, int64_t size_n, int64_t size_k);
static torch::Tensor gemm(torch::Tensor a, torch::Tensor b_q_weight, torch::Tensor b_scales,
                          torch::Tensor workspace, int64_t size_m, int64_t size_n, int64_t size_k) {
  return marlin_gemm(a, b_q_weight, b_scales, workspace, size_m, size_n, size_k);
}
TORCH_LIBRARY(marlin_dense, m) {
  m.def("gemm(Tensor a, Tensor b_q_weight, Tensor b_scales, Tensor workspace, "
        "int size_m, int size_n, int size_k) -> Tensor");
}
TORCH_LIBRARY_IMPL(marlin_dense, CUDA, m) { m.impl("gemm", &gemm); }
"""

INIT = '''"""The dense Marlin kernel (marlin-kernels 0.2.0 source) built for torch {torch}: torch.ops.marlin_dense.gemm."""
from pathlib import Path

import torch

TORCH = "{torch}"
if torch.__version__ != TORCH:
    raise ImportError(f"marlin_kernels_dense was built for torch {{TORCH}}, this is torch {{torch.__version__}}")
torch.ops.load_library(str(Path(__file__).with_name("_C.so")))
'''


def run(cmd):
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build(sdist: Path, torch_wheel: Path, out: Path, arch: str = "90", nvcc: str = "nvcc",
          cuda_home: str = os.environ.get("CUDA_HOME", "/usr/local/cuda")) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="marlin_build"))
    with tarfile.open(sdist) as t:
        src = t.extractfile(KERNEL).read().decode()
    with zipfile.ZipFile(torch_wheel) as z:
        members = [m for m in z.namelist() if m.startswith(("torch/include/", "torch/lib/")) or m == "torch/version.py"]
        z.extractall(tmp, members)
    torch_version = next(line.split("'")[1] for line in (tmp / "torch/version.py").read_text().splitlines()
                         if line.startswith("__version__"))
    inc, lib = tmp / "torch/include", tmp / "torch/lib"
    swap = "#include <ATen/cuda/CUDAContext.h>"
    if swap not in src:
        raise SystemExit(f"{KERNEL}: expected '{swap}' (another marlin-kernels version?)")
    src = src.replace(swap, "#include <c10/cuda/CUDAStream.h>\n"
                            "namespace at { namespace cuda { using c10::cuda::getCurrentCUDAStream; } }")
    (tmp / "kernel.cu").write_text(src)
    (tmp / "reg.cpp").write_text(REGISTRATION)
    flags = ["-O3", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{inc}", f"-I{inc}/torch/csrc/api/include"]
    run([nvcc, "-c", str(tmp / "kernel.cu"), "-o", str(tmp / "kernel.o"), *flags, "-Xcompiler", "-fPIC",
         "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
         "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
         "-gencode", f"arch=compute_{arch},code=sm_{arch}"])
    run(["g++", "-c", str(tmp / "reg.cpp"), "-o", str(tmp / "reg.o"), *flags, "-fPIC"])
    cudart = Path(cuda_home) / "lib64"
    so = tmp / "_C.so"
    run(["g++", "-shared", "-o", str(so), str(tmp / "kernel.o"), str(tmp / "reg.o"), f"-L{lib}", "-lc10",
         "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", f"-L{cudart}", "-lcudart"])
    local = "torch" + torch_version.replace("+", ".")
    return write_wheel(out, {f"{NAME}/__init__.py": INIT.format(torch=torch_version).encode(),
                             f"{NAME}/_C.so": so.read_bytes()}, f"{VERSION}+{local}",
                       f"dense Marlin (marlin-kernels {VERSION} source) built for torch {torch_version}, sm_{arch}")


def write_wheel(out: Path, files: dict, version: str, summary: str) -> Path:
    dist = f"{NAME}-{version}.dist-info"
    files = {**files,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: marlin-kernels-dense\nVersion: {version}\n"
                                 f"Summary: {summary}\nLicense: Apache-2.0\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kernels.baselines.build_marlin\n"
                              b"Root-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{NAME}-{version}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB)")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, required=True, help="marlin-kernels-0.2.0.tar.gz")
    ap.add_argument("--torch-wheel", type=Path, required=True, help="the torch wheel the GPU machine runs")
    ap.add_argument("--out", type=Path, default=Path(".whl"))
    ap.add_argument("--arch", default="90", help="SM architecture (90: H100/H200)")
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--cuda-home", default=os.environ.get("CUDA_HOME", "/usr/local/cuda"), help="for lib64/libcudart")
    a = ap.parse_args(argv)
    build(a.sdist, a.torch_wheel, a.out, a.arch, a.nvcc, a.cuda_home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
