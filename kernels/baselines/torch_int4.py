"""``torch_int4``: ``torch._weight_int4pack_mm`` (tinygemm), bf16 activations, CUDA.

tinygemm computes w = (u - 8) * s + zt with u in 0..15 and one (s, zt) pair per
group of K. Our formats map exactly onto it:

* i4 (w = q * s, q in -8..7): u = q + 8, zt = 0 (bit exact);
* u4 (w = (q - z) * s): u = q, zt = (8 - z) * s, rounded once to bf16 (tinygemm
  stores zt in bf16), so the zero term carries one bf16 rounding per group.
"""
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines._common import act_dtype_of, check_x, lowbit_case, require_cuda, signed_codes
from kernels.baselines.registry import register

NAME = "torch_int4"
TOLERANCE = 2e-2
GROUPS = (32, 64, 128, 256)


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.name not in ("u4", "i4"):
        return f"{fmt.name}: tinygemm only takes 4-bit integer weights (u4, i4)"
    if case.group_size not in GROUPS:
        return f"group size {case.group_size}: tinygemm supports {GROUPS} only"
    if act_dtype_of(case.act) != torch.bfloat16:
        return f"activations {case.act}: tinygemm on CUDA takes bf16 only"
    if case.K is not None and (case.K % 32 or case.N % 8):
        return f"tinygemm needs K % 32 == 0 and N % 8 == 0, got K={case.K}, N={case.N}"
    return None


@register(NAME, supports=supports, tolerance=TOLERANCE)
def prepare_torch_int4(qw, act_dtype, **hints):
    from kernels.lowbit.formats import codes_of

    dev = require_cuda(NAME)
    if not hasattr(torch, "_weight_int4pack_mm") or not hasattr(torch, "_convert_weight_to_int4pack"):
        raise Unavailable("this torch build has no _weight_int4pack_mm")
    K, N, g = qw.K, qw.N, qw.group_size
    inner = next(t for t in (8, 4, 2) if K % (t * 16) == 0)
    qw = qw.to(dev)
    q = codes_of(qw)  # int32 [K, N] bit patterns
    s = qw.scales.double()  # [K/g, N]
    if qw.fmt.kind == "int":
        u = signed_codes(q, 4) + 8
        zt = torch.zeros_like(s)
    else:
        u = q
        zt = (8.0 - qw.zeros.double()) * s
    u = u.t().contiguous().to(torch.int32)  # [N, K]
    u8 = ((u[:, ::2] << 4) | u[:, 1::2]).to(torch.uint8)  # [N, K/2], even k in the high nibble
    w_packed = torch._convert_weight_to_int4pack(u8, inner)
    sz = torch.stack([s, zt], dim=2).to(torch.bfloat16).contiguous()  # [K/g, N, 2]
    del q, u, u8

    def run(x):
        check_x(x, torch.bfloat16, K)
        return torch._weight_int4pack_mm(x.contiguous(), w_packed, g, sz)

    try:
        run(torch.randn(1, K, device=dev, dtype=torch.bfloat16))
        torch.cuda.synchronize()
    except RuntimeError as e:
        raise Unsupported(f"_weight_int4pack_mm refused this problem: {e}") from e
    return run
