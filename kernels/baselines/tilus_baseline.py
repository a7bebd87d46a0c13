"""``tilus``: our kernel in Tilus 0.2.0 (``tilus_kernel.py``; not the paper's Tilus).

The kernel itself is in ``tilus_kernel.py`` (imported lazily: it needs the tilus package).
Math: y = x @ W with W = (q - z) * s (uN), q * s (iN) or value(q) * s (eXmY) dequantized in
registers in the activation dtype, f32 accumulation, split-K partial sums added in the
activation dtype. For M > ``PREFILL_M`` (256) a Tilus kernel dequantizes W into the activation
dtype and torch.matmul (cuBLAS) multiplies, as the Tilus artifact's runner does for m > 256.
"""
import os

import torch

from kernels import Unavailable
from kernels.baselines._common import act_dtype_of, check_x, lowbit_case, require_cuda
from kernels.baselines.registry import register

NAME = "tilus"
TOLERANCE = 2e-2
PREFILL_M = 256      # = tilus_kernel.PREFILL_M (kept here: that module needs tilus to import)
# Tilus has these small-float types; the E=5 ones (f7e5m1, f8e5m2) treat the all-ones
# exponent as inf/nan, unlike our formats, so they are left out.
_TILUS_FLOATS = {"f3e1m1", "f4e2m1", "f5e2m2", "f5e3m1", "f6e2m3", "f6e3m2", "f6e4m1",
                 "f7e2m4", "f7e3m3", "f7e4m2", "f8e4m3"}
MIN_GROUP = 32  # every candidate's block_k (16 or 32) and the dequantize tile (32) must divide the group


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.kind == "float" and fmt.name not in _TILUS_FLOATS:
        if fmt.exp_bits == 5:
            return f"{fmt.name}: Tilus reserves the all-ones exponent of E=5 floats for inf/nan; our format has none"
        return f"{fmt.name}: no such Tilus float type"
    if case.group_size != -1 and (case.group_size <= 0 or case.group_size % MIN_GROUP):
        return f"group size {case.group_size}: the Tilus kernel needs a multiple of {MIN_GROUP} or per channel (-1)"
    if case.K is not None and (case.K % 32 or case.N % 16):
        return f"Tilus kernel tiles need K % 32 == 0 and N % 16 == 0, got K={case.K}, N={case.N}"
    return None


def tilus_dtype(fmt):
    import tilus

    if fmt.kind == "uint":
        return tilus.uint8 if fmt.bits == 8 else getattr(tilus, f"uint{fmt.bits}b")
    if fmt.kind == "int":
        return tilus.int8 if fmt.bits == 8 else getattr(tilus, f"int{fmt.bits}b")
    return getattr(tilus, f"float{fmt.bits}_e{fmt.exp_bits}m{fmt.man_bits}")


def _import_tilus():
    try:
        import tilus  # noqa: F401
        from kernels.baselines import tilus_kernel
    except Exception as e:  # ImportError, or cuda-bindings missing
        raise Unavailable(f"tilus is not importable: {type(e).__name__}: {e}") from e
    cache = os.environ.get("TILUS_CACHE_DIR")
    if cache:
        tilus.option.cache_dir(cache)
    return tilus, tilus_kernel


@register(NAME, supports=supports, tolerance=TOLERANCE, packages=("tilus", "apache-tvm-ffi"))
def prepare_tilus(qw, act_dtype, **hints):
    K, N, fmt = qw.K, qw.N, qw.fmt
    dev = require_cuda(NAME)
    tilus, tk = _import_tilus()
    assert tk.PREFILL_M == PREFILL_M
    act = act_dtype_of(act_dtype)
    a_t = tilus.float16 if act == torch.float16 else tilus.bfloat16
    w_t = tilus_dtype(fmt)

    packed = qw.packed.to(dev).contiguous()  # canonical little-endian stream == Tilus dense [K, N] of w_t
    repacked = torch.empty_like(packed)
    tk.TilusWeightRepack(a_t, w_t)(K, N, packed.data_ptr(), repacked.data_ptr())
    scales = qw.scales.to(dev).contiguous()
    zeros = qw.zeros.to(dev).contiguous() if fmt.kind == "uint" else None
    group = K if qw.group_size == -1 else qw.group_size
    mm = tk.TilusWeightOnlyMatmul(group, a_t, w_t, zeros is not None)
    deq = tk.TilusWeightDequant(group, a_t, w_t, zeros is not None)
    z_ptr = (zeros if zeros is not None else scales).data_ptr()
    keep = (repacked, scales, zeros, packed)

    def run(x):
        check_x(x, act, K)
        x = x.contiguous()
        M = x.shape[0]
        if M > PREFILL_M:       # prefill: dequantize with Tilus, multiply with cuBLAS
            w = torch.empty(K, N, dtype=act, device=x.device)
            deq(K, N, keep[3].data_ptr(), keep[1].data_ptr(), z_ptr, w.data_ptr())
            return torch.matmul(x, w)
        y = torch.empty(M, N, dtype=act, device=x.device)
        mm(M, N, K, x.data_ptr(), keep[0].data_ptr(), keep[1].data_ptr(), z_ptr, y.data_ptr())
        return y

    def chosen_config(M):
        """The tuning candidate Tilus picked for batch size M (after a call with that M)."""
        if M > PREFILL_M:
            return "prefill: tilus dequantize (tile %dx%d) + torch.matmul" % tk.DEQUANT_TILE
        try:
            from tilus.lang.instantiated_script import extract_keys

            args = (M, N, K, 0, 0, 0, 0, 0)
            jit_key, tuning_key = extract_keys(args, mm.const_params, mm.tuning_params)
            ji = mm.jit_instances[jit_key]
            idx = ji.dispatch_table[tuning_key]
            return dict(ji.schedules[ji.valid_schedules[idx]])
        except Exception:
            return None

    # build every candidate now (compile time stays out of timings); tuning for other M
    # buckets happens on their first call
    torch.cuda.synchronize()
    run(torch.randn(1, K, device=dev).to(act))
    torch.cuda.synchronize()
    run.chosen_config = chosen_config
    run.tuning_space = [dict(zip(("warp_spatial", "warp_repeat", "num_stages", "split_k"), c))
                        for c in tk.TUNING_SPACE]
    return run
