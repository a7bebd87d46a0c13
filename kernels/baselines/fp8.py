"""``fp8``: cuBLAS fp8 GEMM through ``torch._scaled_mm`` for f8e4m3 / f8e5m2 weights
with per-channel scales.

THIS CHANGES THE MATH: ``_scaled_mm`` multiplies two fp8 matrices, so the
activations are quantized to float8_e4m3fn (one float32 scale per row, computed
inside the callable and timed with it). Its error against the float64 reference is
that of fp8 activations (a few percent), hence the loose ``TOLERANCE``; compare its
speed, not its numerics, with the weight-only kernels.

Weights are exact: our eXmY floats have no inf/nan, torch's float8 types do
(e4m3fn: code 0x7F is nan; e5m2: exponent 31 is inf/nan). Columns that use those
codes are stored halved with their scale doubled (exact except the smallest
subnormal of such a column). Output is bf16 (row-wise scaling needs it) and cast to
the activation dtype.
"""
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines._common import act_dtype_of, check_x, lowbit_case, require_cuda
from kernels.baselines.registry import register

NAME = "fp8"
TOLERANCE = 0.1


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.name not in ("f8e4m3", "f8e5m2"):
        return f"{fmt.name}: _scaled_mm takes fp8 (f8e4m3, f8e5m2) weights only"
    if case.group_size != -1:
        return f"group size {case.group_size}: _scaled_mm takes per-channel weight scales only (-1)"
    if case.K is not None and (case.K % 16 or case.N % 16):
        return f"_scaled_mm needs K and N multiples of 16, got K={case.K}, N={case.N}"
    return None


@register(NAME, supports=supports, tolerance=TOLERANCE)
def prepare_fp8(qw, act_dtype, **hints):
    from kernels.lowbit.formats import codes_of, float_code_values

    dev = require_cuda(NAME, min_cc=(8, 9))
    if not hasattr(torch, "_scaled_mm"):
        raise Unavailable("this torch build has no _scaled_mm")
    K, N, fmt = qw.K, qw.N, qw.fmt
    act = act_dtype_of(act_dtype)
    qw = qw.to(dev)
    table = float_code_values(fmt).to(dev)
    v = table[codes_of(qw).long()]  # float64 [K, N] code values
    w_dt = torch.float8_e4m3fn if fmt.exp_bits == 4 else torch.float8_e5m2
    fmax = torch.finfo(w_dt).max
    halve = (v.abs() > fmax).any(dim=0)  # columns using the codes torch calls nan/inf
    colscale = torch.where(halve, 2.0, 1.0).double()
    w8 = (v / colscale).to(w_dt)  # exact except tiny subnormals of halved columns
    del v
    b = w8.t().contiguous().t()  # [K, N] column-major, as cuBLAS wants
    scale_b = (qw.scales.double().reshape(1, N) * colscale).float().contiguous()
    fp8_max = torch.finfo(torch.float8_e4m3fn).max

    def run(x):
        check_x(x, act, K)
        M = x.shape[0]
        Mp = (M + 15) // 16 * 16
        xf = x.float()
        sa = (xf.abs().amax(dim=1, keepdim=True) / fp8_max).clamp(min=1e-12)
        xq = (xf / sa).to(torch.float8_e4m3fn)
        if Mp != M:  # pad rows to a multiple of 16
            xq = torch.cat([xq, xq.new_zeros(Mp - M, K)])
            sa = torch.cat([sa, sa.new_ones(Mp - M, 1)])
        y = torch._scaled_mm(xq, b, scale_a=sa, scale_b=scale_b, out_dtype=torch.bfloat16)
        return y[:M].to(act)

    try:
        run(torch.randn(16, K, device=dev).to(act))
        torch.cuda.synchronize()
    except RuntimeError as e:
        raise Unsupported(f"_scaled_mm refused {fmt.name} with row-wise scales: {e}") from e
    return run
