"""``gemlite``: gemlite 0.6 Triton A16Wn kernels (8/4/2/1-bit), f16/bf16 activations.

gemlite dequantizes W = (W_q - zeros) * scales with unsigned codes, which is exactly
our uN (zeros and scales passed through unchanged). iN maps exactly too: the
unsigned code is q + 2^(N-1) with zero point 2^(N-1) (an integer, exact in f16/bf16).
Per-channel scales (-1) use gemlite's channel-wise path (shift in the kernel, scale on
the output). gemlite autotunes on the first call for each batch-size bucket (its
default setting); no extra tuning is added here.
"""
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines._common import act_dtype_of, check_x, lowbit_case, require_cuda, signed_codes
from kernels.baselines.registry import register

NAME = "gemlite"
TOLERANCE = 2e-2
BITS = (1, 2, 4, 8)


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.kind == "float" or fmt.bits not in BITS:
        return f"{fmt.name}: gemlite A16Wn takes 8/4/2/1-bit integer weights only"
    if case.group_size != -1 and case.group_size < 16:
        return f"group size {case.group_size}: gemlite needs >= 16 or per channel (-1)"
    if case.K is not None and case.K % 32:
        return f"gemlite needs K % 32 == 0, got K={case.K}"
    return None


@register(NAME, supports=supports, tolerance=TOLERANCE, packages=("gemlite",))
def prepare_gemlite(qw, act_dtype, **hints):
    from kernels.lowbit.formats import codes_of

    dev = require_cuda(NAME)
    try:
        import gemlite
        from gemlite import DType, GemLiteLinearTriton
    except Exception as e:
        raise Unavailable(f"gemlite is not importable: {type(e).__name__}: {e}") from e
    K, N, fmt = qw.K, qw.N, qw.fmt
    act = act_dtype_of(act_dtype)
    qw = qw.to(dev)
    q = codes_of(qw)
    if fmt.kind == "int":
        off = 1 << (fmt.bits - 1)
        q = signed_codes(q, fmt.bits) + off
        zeros = torch.full_like(qw.scales, float(off))
    else:
        zeros = qw.zeros
    w_q = q.t().contiguous().to(torch.uint8)  # [N, K]
    del q
    g = K if qw.group_size == -1 else qw.group_size
    dt = DType.FP16 if act == torch.float16 else DType.BF16
    try:
        lin = GemLiteLinearTriton(W_nbits=fmt.bits, group_size=g, in_features=K, out_features=N,
                                  input_dtype=dt, output_dtype=dt)
        lin.pack(w_q, qw.scales.t().contiguous(), zeros.t().contiguous(), bias=None, fma_mode=False)
    except (NotImplementedError, AssertionError) as e:
        raise Unsupported(f"gemlite refused this problem: {e}") from e
    del w_q

    def run(x):
        check_x(x, act, K)
        return lin(x.contiguous())

    run(torch.randn(1, K, device=dev).to(act))
    torch.cuda.synchronize()
    run.module = lin
    return run
