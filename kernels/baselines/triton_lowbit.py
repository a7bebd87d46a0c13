"""``triton_lowbit`` (kernel ``triton``): this project's optimized Triton low-bit kernel
(``kernels/lowbit/triton_matmul.py``): every width 1..8, uint/int/float, f16/bf16."""
from kernels.baselines._common import lowbit_case
from kernels.baselines.registry import register


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if case.group_size != -1 and case.group_size % 8:
        return f"group size {case.group_size} is not a multiple of 8"
    if case.K is not None and case.K % 8:
        return f"K={case.K} is not a multiple of 8 (kernel layout packs 8 k per word)"
    return None


@register("triton_lowbit", supports=supports, tolerance=None)
def prepare_triton_lowbit(qw, act_dtype, M=1, seconds=None, tune_per_path=2, **hints):
    """qw: the canonical QuantizedWeight, packed here into the kernel layout, or a PreparedWeight already in
    that layout (``fn.packed`` of an earlier prepare of the same weight), used as it is: the layout does not
    depend on M, only the config chosen below does."""
    import torch

    from kernels.baselines._common import act_dtype_of
    from kernels.lowbit import triton_matmul as tm

    pw = qw if isinstance(qw, tm.PreparedWeight) else tm.prepare(qw)
    if seconds and tune_per_path > 0:     # a small recorded space: the first candidates of each path
        cands, per = [], {}
        for c in tm.configs_for(M, pw.K, pw.N, pw.fmt, pw.group):
            per[c.path] = per.get(c.path, 0) + 1
            if per[c.path] <= tune_per_path:
                cands.append(c)
        x0 = torch.randn(M, pw.K, dtype=act_dtype_of(act_dtype), device=pw.device)
        cfg = tm.autotune(x0, pw, seconds, cands)
        desc = f"{tm.config_str(cfg)} | tuned: {tm.tuning_summary(M, pw)}"
    else:
        cfg = tm.choose_config(M, pw)
        desc = tm.config_str(cfg)

    def run(x):
        return tm.lowbit_matmul(x, pw, cfg)

    run.config = desc
    run.packed = pw           # what a prepare for another M of this weight takes instead of packing it again
    return run
