"""Matmul variants of Proton's Fig. 8: C = A @ B^T, A [M, K], B [N, K] (row-major "weights"), f16 or fp8.

Variants (one Triton kernel each, written for this project after Triton's persistent-matmul tutorial,
which the CGO'26 artifact profiles):
  naive              one program per output tile, pointer loads
  persistent         one program per SM, looping over tiles (`tl.range(..., flatten=FLATTEN)`)
  tma                one program per tile, loads and stores through host-built TMA tensor descriptors
  tma_persistent     persistent + TMA (+ epilogue sub-tiling), tile loop `tl.range(..., flatten=FLATTEN)`
  tma_ws, tma_persistent_ws   the TMA kernels with `warp_specialize=True` on their loop
  cublas             torch.matmul (f16) / torch._scaled_mm (fp8), inside a Proton scope carrying flops and bytes
Every Triton launch carries Proton launch metadata: name "<kernel>[_ws] [M=.., N=.., K=..]",
flops<8|16> = 2 M N K, bytes = operand bytes + output bytes. Loop flattening changes only the
persistent kernels (their tile loop); the others are the same kernel in both profiles.
Runs in the Triton interpreter (TRITON_INTERPRET=1) with small blocks; Proton is not needed there.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

VARIANTS = ("naive", "persistent", "tma", "tma_persistent", "tma_ws", "tma_persistent_ws", "cublas")
FLATTENABLE = ("persistent", "tma_persistent", "tma_persistent_ws")   # variants with a tile loop
DTYPES = {"f16": torch.float16, "fp8": torch.float8_e4m3fn}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def config(variant: str, dtype: str) -> dict:
    """The one tile configuration each variant runs with (no autotuning: compile time is budgeted)."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1,
                    EPILOGUE_SUBTILE=variant.startswith("tma_persistent"))
    return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128 if dtype == "fp8" else 64, GROUP_M=8, num_warps=8,
                num_stages=3, EPILOGUE_SUBTILE=variant.startswith("tma_persistent"))


def config_str(cfg: dict) -> str:
    return (f"BM{cfg['BLOCK_M']}_BN{cfg['BLOCK_N']}_BK{cfg['BLOCK_K']}_G{cfg['GROUP_M']}_w{cfg['num_warps']}"
            f"_s{cfg['num_stages']}" + ("_sub" if cfg.get("EPILOGUE_SUBTILE") else ""))


def num_sms(device) -> int:
    if interpreting() or torch.device(device).type != "cuda":
        return 3
    return torch.cuda.get_device_properties(device).multi_processor_count


def flops_bytes(M: int, N: int, K: int, elem: int, out_elem: int) -> tuple[float, int]:
    return 2.0 * M * N * K, elem * (M * K + N * K) + out_elem * M * N


def kernel_label(base: str, M: int, N: int, K: int) -> str:
    return f"{base} [M={M}, N={N}, K={K}]"


def _launch_metadata(grid, metadata, args):
    M, N, K = args["M"], args["N"], args["K"]
    a = args["a_ptr"] if "a_ptr" in args else args["a_desc"].base
    c = args["c_ptr"] if "c_ptr" in args else args["c_desc"].base
    ws = "_ws" if args.get("WARP_SPECIALIZE", False) else ""
    flops, nbytes = flops_bytes(M, N, K, a.element_size(), c.element_size())
    return {"name": kernel_label(metadata.name + ws, M, N, K), f"flops{8 * a.element_size()}": flops,
            "bytes": nbytes}


@triton.jit
def _tile_of(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped tile order (GROUP_M rows of tiles share B tiles in L2)."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@triton.jit(launch_metadata=_launch_metadata)
def matmul_naive(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = tl.max_contiguous(tl.multiple_of(tl.where(rm < M, rm, 0), BLOCK_M), BLOCK_M)   # clamp: loads need no row mask
    bn = tl.max_contiguous(tl.multiple_of(tl.where(rn < N, rn, 0), BLOCK_N), BLOCK_N)
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit(launch_metadata=_launch_metadata)
def matmul_persistent(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        am = tl.max_contiguous(tl.multiple_of(tl.where(rm < M, rm, 0), BLOCK_M), BLOCK_M)
        bn = tl.max_contiguous(tl.multiple_of(tl.where(rn < N, rn, 0), BLOCK_N), BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            kk = ki * BLOCK_K + rk
            a = tl.load(a_ptr + am[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=rk[None, :] < K - ki * BLOCK_K, other=0.0)
            b = tl.load(b_ptr + kk[:, None] * stride_bk + bn[None, :] * stride_bn,
                        mask=rk[:, None] < K - ki * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit(launch_metadata=_launch_metadata)
def matmul_tma(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
        a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


@triton.jit(launch_metadata=_launch_metadata)
def matmul_tma_persistent(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                          EPILOGUE_SUBTILE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # The epilogue recomputes its tile from its own counter (a second induction variable): a value used
    # both before and after the K loop trips the Blackwell pipeliner, as Triton's tutorial notes.
    tile_c = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        tile_c += NUM_SMS
        cm, cn = _tile_of(tile_c, num_m, num_n, GROUP_M)
        if EPILOGUE_SUBTILE:      # two half-width stores: less shared memory for the epilogue
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            c0, c1 = tl.split(halves)
            c_desc.store([cm * BLOCK_M, cn * BLOCK_N], c0.to(c_desc.dtype))
            c_desc.store([cm * BLOCK_M, cn * BLOCK_N + BLOCK_N // 2], c1.to(c_desc.dtype))
        else:
            c_desc.store([cm * BLOCK_M, cn * BLOCK_N], acc.to(c_desc.dtype))


def make_inputs(M: int, N: int, K: int, dtype: str, device, seed: int = 0) -> dict:
    """A [M, K] and B [N, K], random normal (never zeros), scaled so C = A B^T has entries of order 1
    (fp8 e4m3 saturates at 448: both operands are scaled by K^-1/4)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not in {sorted(DTYPES)}")
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    sa, sb = (K ** -0.25, K ** -0.25) if dtype == "fp8" else (1.0, K ** -0.5)
    a = (torch.randn((M, K), generator=g, device=device) * sa).to(DTYPES[dtype])
    b = (torch.randn((N, K), generator=g, device=device) * sb).to(DTYPES[dtype])
    return {"a": a, "b": b, "dtype": dtype}


def reference(inputs: dict) -> torch.Tensor:
    """float64 for f16 inputs; float32 for fp8 (exact products of 4-bit mantissas, f32 sums)."""
    rt = torch.float32 if inputs["dtype"] == "fp8" else torch.float64
    return inputs["a"].to(rt) @ inputs["b"].to(rt).T


def _descriptor(t: torch.Tensor, block):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t, list(block))


def run(variant: str, inputs: dict, flatten: bool = False, cfg: dict | None = None) -> torch.Tensor:
    """Launch one variant once; returns C [M, N] in the input dtype (fp8 in, fp8 out, as the artifact)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} not in {VARIANTS}")
    a, b = inputs["a"], inputs["b"]
    if variant == "cublas":
        return cublas(a, b)
    cfg = cfg or config(variant, inputs["dtype"])
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    sms = num_sms(a.device)
    common = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    if variant in ("naive", "persistent"):
        bt = b.T                                        # [K, N] view, K-major (what fp8 wgmma wants)
        ptrs = (a, bt, c, M, N, K, a.stride(0), a.stride(1), bt.stride(0), bt.stride(1), c.stride(0), c.stride(1))
        if variant == "naive":
            matmul_naive[(tiles,)](*ptrs, **common)
        else:
            matmul_persistent[(min(sms, tiles),)](*ptrs, NUM_SMS=sms, FLATTEN=bool(flatten), **common)
        return c
    ws = variant.endswith("_ws")
    sub = bool(cfg.get("EPILOGUE_SUBTILE")) and variant.startswith("tma_persistent")
    a_d, b_d = _descriptor(a, (BM, BK)), _descriptor(b, (BN, BK))
    c_d = _descriptor(c, (BM, BN // 2 if sub else BN))
    if variant in ("tma", "tma_ws"):
        matmul_tma[(tiles,)](a_d, b_d, c_d, M, N, K, WARP_SPECIALIZE=ws, **common)
    else:
        matmul_tma_persistent[(min(sms, tiles),)](a_d, b_d, c_d, M, N, K, NUM_SMS=sms, EPILOGUE_SUBTILE=sub,
                                                   WARP_SPECIALIZE=ws, FLATTEN=bool(flatten), **common)
    return c


_SCALES: dict = {}
_FP8_OUT: dict = {}


def _unit_scale(device) -> torch.Tensor:
    """The f32 scale 1.0 that _scaled_mm needs, made once per device (not inside the profiled scope)."""
    key = str(device)
    if key not in _SCALES:
        _SCALES[key] = torch.ones((), dtype=torch.float32, device=device)
    return _SCALES[key]


def fp8_out_dtype(device) -> torch.dtype:
    """fp8 output where this torch/cuBLAS gives it (as the artifact's cuBLAS call), else bf16; probed once
    per device on a 16^3 problem, before any profiled call."""
    key = str(device)
    if key not in _FP8_OUT:
        a = torch.ones((16, 16), device=device).to(torch.float8_e4m3fn)
        try:
            torch._scaled_mm(a, a.T, scale_a=_unit_scale(device), scale_b=_unit_scale(device),
                             out_dtype=torch.float8_e4m3fn)
            _FP8_OUT[key] = torch.float8_e4m3fn
        except RuntimeError:
            _FP8_OUT[key] = torch.bfloat16
    return _FP8_OUT[key]


def cublas_impl(dtype: str, device="cuda") -> str:
    if dtype != "fp8":
        return "torch.matmul (cuBLAS)"
    out = "fp8" if fp8_out_dtype(device) == torch.float8_e4m3fn else "bf16"
    return f"torch._scaled_mm (cuBLASLt), {out} out"


def cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cuBLAS through torch, in a Proton scope named like the Triton kernels and carrying the same metrics
    (a cuBLAS launch has no Triton launch metadata; the scope's kernel children carry the time)."""
    import triton.profiler as proton
    M, K = a.shape
    N = b.shape[0]
    fp8 = a.dtype == torch.float8_e4m3fn
    out = fp8_out_dtype(a.device) if fp8 else a.dtype
    flops, nbytes = flops_bytes(M, N, K, a.element_size(), torch.empty((), dtype=out).element_size())
    with proton.scope(kernel_label("cublas", M, N, K), {f"flops{8 * a.element_size()}": flops, "bytes": nbytes}):
        if fp8:
            one = _unit_scale(a.device)
            return torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=out)
        return a @ b.T
