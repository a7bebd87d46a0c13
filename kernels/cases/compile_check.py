"""Compile a Triton kernel for a given NVIDIA architecture without a GPU (Triton's bundled ptxas).

Used to learn what Triton 3.6 does with a variant on an architecture we may not have: e.g. whether
`tl.range(..., warp_specialize=True)` is lowered to warp partitions on sm_90 (it is not: the PTX equals
the plain kernel's) or only on sm_100.
"""
from __future__ import annotations

import torch


def compile_for(fn, args: dict, constexprs: dict, options: dict, cc: int):
    """triton.compile of JIT function `fn` for sm_<cc>: `args` maps each runtime argument to a sample value
    (tensors, TensorDescriptors, ints; only their types are used), `constexprs` the compile-time ones."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    names = list(fn.arg_names)
    missing = [n for n in names if n not in args and n not in constexprs]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for {missing}")
    sig, attrs = {}, {}
    constexprs = dict(constexprs)
    for n in names:                  # as a launch does: an int argument equal to 1 becomes a constant
        if n not in constexprs and isinstance(args.get(n), int) and not isinstance(args[n], bool) and args[n] == 1:
            constexprs[n] = 1
    for i, n in enumerate(names):
        if n in constexprs:
            sig[n] = "constexpr"
            continue
        v = args[n]
        sig[n] = mangle_type(v)
        if isinstance(v, torch.Tensor) or (isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", int(cc), 32), options=dict(options))


def tma_kernel_ptx(cc: int, dtype: torch.dtype, warp_specialize: bool, persistent: bool = False,
                   cfg: dict | None = None) -> str:
    """PTX of the Fig. 8 TMA kernel (or TMA-persistent) for sm_<cc>, with or without warp specialization."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from . import matmul_variants as mv
    name = "fp8" if dtype == torch.float8_e4m3fn else "f16"
    cfg = cfg or mv.config("tma_persistent" if persistent else "tma", name)
    if min(cfg["BLOCK_M"], cfg["BLOCK_N"]) < 64:          # interpreter-sized blocks: use the GPU's
        cfg = dict(cfg, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128 if name == "fp8" else 64, num_warps=8, num_stages=3)
    M = N = K = 1024
    a, b, c = (torch.empty((M, K), dtype=dtype), torch.empty((N, K), dtype=dtype), torch.empty((M, N), dtype=dtype))
    sub = persistent and cfg.get("EPILOGUE_SUBTILE", False)
    args = dict(a_desc=TensorDescriptor.from_tensor(a, [cfg["BLOCK_M"], cfg["BLOCK_K"]]),
                b_desc=TensorDescriptor.from_tensor(b, [cfg["BLOCK_N"], cfg["BLOCK_K"]]),
                c_desc=TensorDescriptor.from_tensor(c, [cfg["BLOCK_M"], cfg["BLOCK_N"] // 2 if sub else cfg["BLOCK_N"]]),
                M=M, N=N, K=K)
    consts = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
                  WARP_SPECIALIZE=bool(warp_specialize))
    fn = mv.matmul_tma
    if persistent:
        fn = mv.matmul_tma_persistent
        consts.update(NUM_SMS=132, EPILOGUE_SUBTILE=bool(sub), FLATTEN=False)
    k = compile_for(fn, args, consts, {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}, cc)
    return k.asm["ptx"]


def warp_specialize_lowered(cc: int, dtype: torch.dtype = torch.float16, persistent: bool = False) -> bool:
    """True when Triton turns `warp_specialize=True` into different code for sm_<cc> than the plain kernel."""
    return tma_kernel_ptx(cc, dtype, True, persistent) != tma_kernel_ptx(cc, dtype, False, persistent)
