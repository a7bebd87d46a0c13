"""``marlin``, ``bitblas``, ``quantllm``: the Tilus paper's other baselines, through every route
the package index offers (see kernels/baselines/WHEELS.md for what was tried and what travels).

Each baseline has a list of ``Route``s, tried in order; the first that prepares wins. When none
does, ``Unavailable`` names every route and why it failed (a package that is not installed says
why it could not be, from what was found on the index). Packages are imported lazily, inside
prepare. A route that loads a binary built for another torch first proves itself in a child
process (``_probe``: a small problem checked against float64), so a crash there cannot take
the harness job down.

* marlin: the dense Marlin kernel (IST-DASLab; the paper's "Marlin") as shipped in the
  marlin-kernels 0.2.0 source distribution, built for torch 2.11+cu130 / sm_90 by
  ``build_marlin.py`` into the ``marlin-kernels-dense`` wheel (or marlin-kernels 0.2.0 installed
  from source where an index is); weights repacked by ``marlin_pack`` (ours). i4 (w = (u - 8) * s),
  group 128 or per channel, f16.
* quantllm: QuantLLM / FP6-LLM's kernel as torchao's ``quant_llm_linear`` (torchao 0.8-0.15; it
  was removed in 0.16), whose binary is built for CUDA 12 and torch <= 2.9: loaded with
  libcudart.so.12 (nvidia-cuda-runtime-cu12) and a one-function shim for the one c10 symbol whose
  signature changed (``c10_cuda_check_implementation``: line number int -> unsigned int).
  f6e3m2 / f5e2m2, per channel, f16.
* bitblas: no route fits (its wheels are 57-92 MB); no adapter.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from kernels import Unavailable, Unsupported
from kernels.baselines._common import act_dtype_of, check_x, lowbit_case, signed_codes
from kernels.baselines.registry import register

TOLERANCE = 2e-2


class RouteFailed(Exception):
    """This route cannot run here; the message says why."""


@dataclass(frozen=True)
class Route:
    label: str                                  # e.g. "marlin-kernels 0.2.0 (built here)"
    attempt: Callable | None = None             # (qw, act_dtype) -> fn; raises RouteFailed
    why_absent: str = ""                        # what was found on the index for a route with no adapter
    module: str = ""                            # import name checked when there is no adapter


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _need_cuda():
    if not torch.cuda.is_available():
        raise RouteFailed("no CUDA GPU visible")
    if torch.cuda.get_device_capability() < (8, 0):
        raise RouteFailed("needs compute capability >= 8.0")


def _absent(route):
    """Routes without an adapter: say whether the module imports and what the index offers."""
    if route.module:
        try:
            importlib.import_module(route.module)
        except ModuleNotFoundError:
            raise RouteFailed(route.why_absent) from None
        except Exception as e:      # a broken install
            raise RouteFailed(f"import: {type(e).__name__}: {str(e)[:80]}; {route.why_absent}") from None
        raise RouteFailed("imports, but no adapter is wired (untested API)")
    raise RouteFailed(route.why_absent)


_PROBED: dict = {}


def _probe(name: str, timeout: float = 300.0):
    """Run ``_probe_main(name)`` in a child process once per process: True, or RouteFailed with
    the child's last line (a binary built for another torch may crash; the harness must not)."""
    if name not in _PROBED:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2])]
                                                           + sys.path)}
        try:
            r = subprocess.run([sys.executable, "-c", f"from kernels.baselines.external import _probe_main; "
                                                      f"_probe_main({name!r})"],
                               capture_output=True, text=True, timeout=timeout, env=env)
            tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
            _PROBED[name] = None if r.returncode == 0 else f"in a child process, exit {r.returncode}: {tail[0][-120:]}"
        except subprocess.TimeoutExpired:
            _PROBED[name] = f"child process timed out after {timeout:.0f}s"
    if _PROBED[name]:
        raise RouteFailed(_PROBED[name])


def _probe_main(name: str):
    """Child process: one small problem of route ``name`` against float64; exit 1 on a mismatch."""
    from kernels.lowbit.formats import dequantize_ref, random_quantized

    fmt, g = {"quantllm": ("f6e3m2", -1), "marlin": ("i4", 128)}[name]
    qw = random_quantized(1024, 512, fmt, g, torch.float16, seed=3, device="cuda")
    fn = {"quantllm": _torchao_quant_llm, "marlin": _marlin_dense}[name](qw, torch.float16, probe=False)
    x = torch.randn(16, 1024, dtype=torch.float16, device="cuda")
    ref = x.double() @ dequantize_ref(qw, device="cuda")
    err = ((fn(x).double() - ref).norm() / ref.norm()).item()
    print(f"{name}: relative error {err:.3g}")
    sys.exit(0 if err < TOLERANCE else 1)


def _first_call(run, K, what):
    """One call at prepare: a problem the kernel refuses is `unsupported`, not an error later."""
    try:
        run(torch.randn(1, K, device="cuda", dtype=torch.float16))
        torch.cuda.synchronize()
    except RuntimeError as e:
        raise Unsupported(f"{what} refused this problem: {str(e).splitlines()[0][:200]}") from e
    return run


# ----------------------------------------------------------------------------- marlin

def marlin_perms():
    """Marlin's (dense, IST-DASLab) weight and scale permutations: the order in which one warp's
    mma fragments of a 16x64 weight tile are stored, 8 nibbles per int32."""
    perm = []
    for i in range(32):                       # a lane of the warp
        col, r = i // 4, i % 4
        lane = [16 * row + col + 8 * block for block in (0, 1)
                for row in (2 * r, 2 * r + 1, 2 * (r + 4), 2 * (r + 4) + 1)]
        for j in range(4):                    # the 4 16x16 sub-tiles of a 16x64 tile
            perm += [p + 256 * j for p in lane]
    perm = torch.tensor(perm).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(-1)
    scale_perm = torch.tensor([i + 8 * j for i in range(8) for j in range(8)])
    scale_perm_single = torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])
    return perm, scale_perm, scale_perm_single


def marlin_pack(u: torch.Tensor, s: torch.Tensor, group_size: int):
    """u: [K, N] codes 0..15 (w = (u - 8) * s), s: [K/g, N] f16 -> (B int32 [K/16, N*2], s permuted)."""
    K, N = u.shape
    perm, scale_perm, scale_perm_single = (p.to(u.device) for p in marlin_perms())
    if group_size != -1 and group_size != K:
        s = s.reshape(-1, scale_perm.numel())[:, scale_perm]
    else:
        s = s.reshape(-1, scale_perm_single.numel())[:, scale_perm_single]
    s = s.reshape(-1, N).contiguous()
    w = u.reshape(K // 16, 16, N // 16, 16).permute(0, 2, 1, 3).reshape(K // 16, N * 16)
    w = w.reshape(-1, perm.numel())[:, perm].reshape(K // 16, N * 16).to(torch.int64)
    q = torch.zeros(K // 16, N * 2, dtype=torch.int64, device=u.device)
    for i in range(8):
        q |= w[:, i::8] << (4 * i)
    q = torch.where(q >= 2 ** 31, q - 2 ** 32, q).to(torch.int32)
    return q, s


def _marlin_dense(qw, act_dtype, probe=True):
    """Our build of the marlin-kernels 0.2.0 dense kernel (build_marlin.py): torch.ops.marlin_dense.gemm."""
    if _version("marlin-kernels-dense") is None:
        raise RouteFailed("not installed")
    _need_cuda()
    if probe:
        _probe("marlin")
    try:
        import marlin_kernels_dense  # noqa: F401  (loads the op library)
    except Exception as e:
        raise RouteFailed(f"loading the op library: {type(e).__name__}: {e}") from None
    return _marlin_with(qw, torch.ops.marlin_dense.gemm,
                        f"marlin-kernels-dense {_version('marlin-kernels-dense')} (dense Marlin, auto thread tiles)")


def _marlin_kernels(qw, act_dtype, probe=True):
    """marlin-kernels installed from its sdist on a machine with an index (0.2.0 builds marlin_gemm)."""
    v = _version("marlin-kernels")
    if v is None:
        raise RouteFailed("not installed (sdist only)")
    try:
        import marlin_kernels
        op = marlin_kernels.marlin_gemm
    except Exception as e:
        raise RouteFailed(f"marlin-kernels {v}: no marlin_gemm ({type(e).__name__}: {e})") from None
    _need_cuda()
    return _marlin_with(qw, op, f"marlin-kernels {v} marlin_gemm (dense Marlin, auto thread tiles)")


def _marlin_with(qw, op, config):
    from kernels.lowbit.formats import codes_of

    dev = torch.device("cuda")
    K, N = qw.K, qw.N
    qw = qw.to(dev)
    u = signed_codes(codes_of(qw), 4) + 8          # i4 q in -7..7 -> Marlin's u = q + 8
    B, s = marlin_pack(u, qw.scales.to(torch.float16), qw.group_size)
    # the kernel's lock workspace: (N / min_thread_n) * max_par ints with min_thread_n = 64, max_par = 16
    # (the H200 route check refused N // 128 * 16: "workspace.numel = 64 is below min_workspace_size = 128")
    workspace = torch.zeros(max(N // 64, 1) * 16, dtype=torch.int32, device=dev)

    def run(x):
        check_x(x, torch.float16, K)
        return op(x.contiguous(), B, s, workspace, x.shape[0], N, K)

    run.config = config
    return _first_call(run, K, "marlin")


def marlin_supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.name != "i4" or case.group_size not in (128, -1) or act_dtype_of(case.act) != torch.float16:
        return ("Marlin (dense) takes i4 weights (w = (u - 8) * s, no zero points), group 128 or per channel, "
                "f16 activations")
    if case.K is not None and (case.K % 128 or case.N % 256):
        return f"Marlin needs K % 128 == 0 and N % 256 == 0, got K={case.K}, N={case.N}"
    return None


# ----------------------------------------------------------------------------- quantllm (torchao)

_TORCHAO_QUANT_LLM = ("0.8.0", "0.9.0", "0.10.0", "0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0")
_SHIM = r"""
#include <cstdint>
namespace c10 { namespace cuda {
void c10_cuda_check_implementation(int32_t, const char*, const char*, uint32_t, bool);
void c10_cuda_check_implementation(int32_t e, const char* f, const char* fn, int line, bool d) {
  c10_cuda_check_implementation(e, f, fn, static_cast<uint32_t>(line), d);
}
}}
"""
_LOADED: dict = {}


def _load_torchao_ops():
    """Load torchao's _C.abi3.so into this torch: libcudart.so.12 first, then the shim."""
    if "torchao" in _LOADED:
        return
    spec = importlib.util.find_spec("torchao")
    so = Path(spec.submodule_search_locations[0]) / "_C.abi3.so"
    if not so.exists():
        raise RouteFailed(f"{so.name} missing from the torchao package")
    rt = importlib.util.find_spec("nvidia.cuda_runtime") if _version("nvidia-cuda-runtime-cu12") else None
    cudart = next(iter(Path(rt.submodule_search_locations[0], "lib").glob("libcudart.so.12*")), None) if rt else None
    if cudart is None:
        raise RouteFailed("needs libcudart.so.12: nvidia-cuda-runtime-cu12 not installed")
    ctypes.CDLL(str(cudart), mode=ctypes.RTLD_GLOBAL)
    torch_lib = Path(torch.__file__).parent / "lib"
    d = Path(tempfile.mkdtemp(prefix="c10shim"))
    (d / "shim.cpp").write_text(_SHIM)
    r = subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(d / "shim.so"), str(d / "shim.cpp"),
                        f"-L{torch_lib}", "-lc10_cuda", f"-Wl,-rpath,{torch_lib}"], capture_output=True, text=True)
    if r.returncode:
        raise RouteFailed(f"building the c10 shim failed: {(r.stderr or r.stdout).strip()[-200:]}")
    ctypes.CDLL(str(d / "shim.so"), mode=ctypes.RTLD_GLOBAL)
    try:
        torch.ops.load_library(str(so))
    except Exception as e:
        raise RouteFailed(f"torch.ops.load_library({so.name}): {type(e).__name__}: {str(e)[:200]}") from None
    if not hasattr(torch.ops.torchao, "quant_llm_linear"):
        raise RouteFailed(f"{so.name} loaded but registered no torchao::quant_llm_linear")
    _LOADED["torchao"] = True


def _torchao_quant_llm(qw, act_dtype, probe=True):
    v = _version("torchao")
    if v is None:
        raise RouteFailed("not installed (0.8-0.15 have quant_llm_linear)")
    if v.split("+")[0] not in _TORCHAO_QUANT_LLM:
        raise RouteFailed(f"torchao {v} has none (removed in 0.16)")
    _need_cuda()
    if probe:
        _probe("quantllm")
    _load_torchao_ops()
    try:
        from torchao.prototype.dtypes.floatx.floatx_tensor_core_layout import _SPLIT_K_MAP, pack_tc_floatx
    except ImportError:
        from torchao.dtypes.floatx.floatx_tensor_core_layout import _SPLIT_K_MAP, pack_tc_floatx
    from kernels.lowbit.formats import codes_of

    dev = torch.device("cuda")
    K, N, fmt = qw.K, qw.N, qw.fmt
    qw = qw.to(dev)
    w = pack_tc_floatx(codes_of(qw).t().contiguous().to(torch.uint8), fmt.bits)    # [N, K*bits/8]
    scale = qw.scales.reshape(N).to(torch.float16).contiguous()
    op = torch.ops.torchao.quant_llm_linear.default

    def run(x):
        check_x(x, torch.float16, K)
        M = x.shape[0]
        split_k = _SPLIT_K_MAP[(M - 1) // 64].get(N, 1) if M <= 768 else 1
        return op(fmt.exp_bits, fmt.man_bits, x.contiguous(), w, scale, split_k)

    run.config = f"torchao {v} quant_llm_linear (FP6-LLM), splitK from torchao's map"
    return _first_call(run, K, "quant_llm_linear")


def quantllm_supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.name not in ("f6e3m2", "f5e2m2") or case.group_size != -1 or act_dtype_of(case.act) != torch.float16:
        return "QuantLLM takes f6e3m2 / f5e2m2 weights, per channel (-1), f16 activations"
    if case.K is not None and (case.K % 64 or case.N % 256):
        return f"QuantLLM needs K % 64 == 0 and N % 256 == 0, got K={case.K}, N={case.N}"
    return None


# ----------------------------------------------------------------------------- bitblas

def bitblas_supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if act_dtype_of(case.act) != torch.float16 or (fmt.kind == "float" and fmt.name not in
                                                   ("f4e2m1", "f8e4m3", "f8e5m2")):
        return "BitBLAS takes u/i 1..8 bits or f4e2m1/f8e4m3/f8e5m2 weights, f16 activations"
    return None


# ----------------------------------------------------------------------------- routes

ROUTES = {       # short reasons: an unavailable row's error (<= 300 characters) names every route
    "marlin": [
        Route("marlin-kernels-dense", _marlin_dense),
        Route("marlin-kernels", _marlin_kernels),
        Route("IST marlin", module="marlin", why_absent="not on PyPI"),
        Route("gptqmodel", module="gptqmodel", why_absent="sdist only (builds CUDA at install)"),
        Route("sgl-kernel", module="sgl_kernel", why_absent="281-536 MB wheels"),
        Route("vllm", module="vllm", why_absent="wheels of hundreds of MB"),
        Route("torchao", why_absent="sparse/int8-activation Marlin only"),
    ],
    "quantllm": [
        Route("torchao", _torchao_quant_llm),
        Route("fp6_llm", module="fp6_llm", why_absent="not on PyPI"),
    ],
    "bitblas": [
        Route("bitblas", module="bitblas",
              why_absent="57-92 MB wheels, over the 64 MiB that travels to the GPU machine"),
    ],
}


def _make_prepare(name):
    def prepare(qw, act_dtype, **hints):
        tried = []
        for route in ROUTES[name]:
            try:
                if route.attempt is None:
                    _absent(route)
                return route.attempt(qw, act_dtype)
            except RouteFailed as e:
                tried.append(f"{route.label}: {e}")
        raise Unavailable(f"{name} (kernels/baselines/WHEELS.md): " + "; ".join(tried))

    prepare.__name__ = f"prepare_{name}"
    return prepare


prepare_marlin = register("marlin", supports=marlin_supports, tolerance=TOLERANCE,
                          packages=("marlin-kernels-dense", "marlin-kernels"))(_make_prepare("marlin"))
prepare_quantllm = register("quantllm", supports=quantllm_supports, tolerance=TOLERANCE,
                            packages=("torchao", "nvidia-cuda-runtime-cu12"))(_make_prepare("quantllm"))
prepare_bitblas = register("bitblas", supports=bitblas_supports, tolerance=TOLERANCE,
                           packages=("bitblas",))(_make_prepare("bitblas"))
