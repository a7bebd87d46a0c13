"""Small helpers shared by the baseline adapters (no harness imports)."""
import torch

from kernels import Unavailable, Unsupported
from kernels.lowbit.formats import ACT_DTYPES as _ACT


def act_dtype_of(act_dtype):
    """torch.float16 / torch.bfloat16 from a dtype or a name; None if it is neither."""
    if isinstance(act_dtype, torch.dtype):
        return act_dtype if act_dtype in (torch.float16, torch.bfloat16) else None
    if isinstance(act_dtype, str):
        return _ACT.get(act_dtype.strip().lower().replace("torch.", ""))
    return None


def act_name(act_dtype):
    d = act_dtype_of(act_dtype)
    return {torch.float16: "f16", torch.bfloat16: "bf16"}.get(d, str(act_dtype))


def parse_fmt(fmt_name):
    """WeightFormat or None (the lowbit formats module is imported lazily)."""
    from kernels.lowbit.formats import parse_format

    try:
        return parse_format(fmt_name)
    except ValueError:
        return None


def lowbit_case(case):
    """(WeightFormat, None) for a low-bit case with f16/bf16 activations, else (None, reason)."""
    if act_dtype_of(case.weight) is not None:
        return None, f"dense {case.weight} weights: this is a low-bit kernel (dense weights run on cublas)"
    fmt = parse_fmt(case.weight)
    if fmt is None:
        return None, f"unknown weight format {case.weight!r}"
    if act_dtype_of(case.act) is None:
        return None, f"activations must be f16 or bf16, got {case.act}"
    return fmt, None


def require_cuda(name, min_cc=(8, 0)):
    if not torch.cuda.is_available():
        raise Unavailable(f"{name} needs an NVIDIA GPU with CUDA; none is available here")
    cc = torch.cuda.get_device_capability()
    if tuple(cc) < tuple(min_cc):
        raise Unavailable(f"{name} needs compute capability >= {min_cc[0]}.{min_cc[1]}, device has {cc[0]}.{cc[1]}")
    return torch.device("cuda")


def signed_codes(codes, bits):
    """Two's complement bit patterns -> signed integers (same dtype)."""
    return torch.where(codes >= (1 << (bits - 1)), codes - (1 << bits), codes)


def check_x(x, act, K):
    if x.dtype != act:
        raise ValueError(f"x must be {act}, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"x must be [M, {K}], got {tuple(x.shape)}")
