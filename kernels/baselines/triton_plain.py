"""``triton_plain``: the Tilus paper's Triton baseline, our own kernel of its plain design.

The Tilus artifact's Triton runner (its W4A16 and W8A16 kernels, a Triton matmul tutorial
kernel with the weight unpacked in the K loop) is what a Triton user writes for weight-only
quantization; the paper's "Triton" bars are that design. This kernel follows it:

* the codes are packed along K into int32 words, P = 32 / bits codes per word (GPTQ's layout),
  so the design covers the widths that divide 32: u1, u2, u4, u8, i2, i4, i8 (the artifact ran
  u4 and u8); floats and 3/5/6/7-bit widths are outside it;
* one program computes a [BM, BN] tile of y (grouped program order, GROUP_M = 8): in the K
  loop it loads a [BM, BK] tile of x (rows past M masked, so M = 1 pads to BM >= 16) and the
  [BK, BN] words (each word loaded once per code it holds, as in the artifact), shifts and masks
  the codes out, dequantizes w = (q - z) * s (uN) or q * s (iN) in the activation dtype with the
  group's scales (per channel: loaded once before the loop), and accumulates ``tl.dot`` in f32
  (in the Triton interpreter bf16 tiles are dequantized and multiplied in f32, rounded to bf16
  first: its bf16 arithmetic is wrong);
* no split-K, no layout tricks; its own autotune space (``TUNING_SPACE``, a standard Triton
  matmul list like the artifact's; the first ``tune_per_path`` tiles fit for the batch size), timed
  with the caller's timer once per batch size.

Our optimized Triton kernel is ``triton`` (kernels/lowbit). Pure compute, no harness imports.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.baselines._common import act_dtype_of, check_x, lowbit_case
from kernels.baselines.registry import register

NAME = "triton_plain"
TOLERANCE = 2e-2
BITS = (1, 2, 4, 8)
GROUP_M = 8
MIN_BK = 32
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# (BM, BN, BK, num_warps, num_stages), in the order they are tried: decode tiles (x padded to 16 or
# 32 rows), then GEMM tiles, likelier first
TUNING_SPACE = [
    (16, 128, 64, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 256, 64, 8, 3),
    (32, 128, 64, 4, 4),
    (32, 64, 128, 4, 4),
    (128, 256, 32, 8, 3),
    (128, 128, 32, 8, 3),
    (256, 128, 32, 8, 3),
    (64, 256, 32, 8, 3),
    (64, 128, 32, 4, 4),
]


def supports(case):
    fmt, why = lowbit_case(case)
    if why:
        return why
    if fmt.kind == "float" or fmt.bits not in BITS:
        return (f"{fmt.name}: the plain Triton design packs integer codes along K in 32-bit words, "
                f"widths 1/2/4/8 only (u1 u2 u4 u8 i2 i4 i8)")
    if case.group_size != -1 and case.group_size % MIN_BK:
        return f"group size {case.group_size}: must be a multiple of {MIN_BK} (one scale per K tile) or -1"
    if case.K is not None and case.K % MIN_BK:
        return f"K={case.K}: must be a multiple of {MIN_BK} (no masking along K)"
    return None


@triton.jit
def _plain_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_wk, stride_sg, stride_ym,
                  GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr, BITS: tl.constexpr, SIGNED: tl.constexpr,
                  HAS_ZEROS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP_M: tl.constexpr, DEQ_F32: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    P: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_mask = offs_m[:, None] < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + (offs_k[:, None] // P) * stride_wk + offs_n[None, :]     # each word repeated P times
    shift = (offs_k % P) * BITS
    dt = x_ptr.dtype.element_ty
    if PER_CHANNEL:      # one scale (and zero point) per column: loaded once
        s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
        z = tl.load(z_ptr + offs_n, mask=n_mask, other=0.0)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, K // BK):
        x = tl.load(x_ptrs, mask=m_mask, other=0.0)
        w = tl.load(w_ptrs, mask=n_mask[None, :], other=0)
        if not PER_CHANNEL:
            g = (kt * BK) // GROUP
            s = tl.load(s_ptr + g * stride_sg + offs_n, mask=n_mask, other=0.0)
            z = tl.load(z_ptr + g * stride_sg + offs_n, mask=n_mask, other=0.0)
        q = (w >> shift[:, None]) & MASK
        if SIGNED:
            q = tl.where(q >= (1 << (BITS - 1)), q - (1 << BITS), q)
        if DEQ_F32:      # the interpreter's bf16 arithmetic is wrong: dequantize and dot in f32 there
            if HAS_ZEROS:
                wf = (q.to(tl.float32) - z[None, :].to(tl.float32)) * s[None, :].to(tl.float32)
            else:
                wf = q.to(tl.float32) * s[None, :].to(tl.float32)
            acc += tl.dot(x.to(tl.float32), wf.to(dt).to(tl.float32))
        else:
            if HAS_ZEROS:
                wf = (q.to(dt) - z[None, :]) * s[None, :]
            else:
                wf = q.to(dt) * s[None, :]
            acc += tl.dot(x, wf)
        x_ptrs += BK
        w_ptrs += (BK // P) * stride_wk
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(dt), mask=m_mask & n_mask[None, :])


def pack_words(qw) -> torch.Tensor:
    """Canonical stream -> int32 words [K / P, N], word (kw, n) holding code k = kw*P + j at bits
    [j*bits, (j+1)*bits) (P = 32 / bits)."""
    from kernels.lowbit.formats import unpack_bits

    b, K, N = qw.fmt.bits, qw.K, qw.N
    P = 32 // b
    words = torch.empty(K // P, N, dtype=torch.int32, device=qw.packed.device)
    rows = max(P, ((1 << 22) // max(N, 1)) // P * P)
    for r0 in range(0, K, rows):
        r1 = min(K, r0 + rows)
        codes = unpack_bits(qw.packed[r0 * N * b // 8:r1 * N * b // 8], b, (r1 - r0) * N)
        codes = codes.reshape((r1 - r0) // P, P, N).to(torch.int64)
        word = torch.zeros(((r1 - r0) // P, N), dtype=torch.int64, device=words.device)
        for j in range(P):
            word |= codes[:, j, :] << (j * b)
        words[r0 // P:r1 // P] = torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)
    return words


def candidates(M: int, K: int, group: int) -> list:
    """The tuning space for batch size M: tiles as tall as the padded batch up to twice that
    (decode: 16-32 rows; M >= 64: 64-256 rows), BK dividing K and the group."""
    m = max(16, triton.next_power_of_2(M))
    valid = [c for c in TUNING_SPACE if K % c[2] == 0 and group % c[2] == 0]
    return [c for c in valid if min(m, 64) <= c[0] <= 2 * m] or valid[:1]


def config_str(c) -> str:
    return "bm%d bn%d bk%d w%d s%d" % c


def launch(x, words, scales, zeros, fmt, group_size, cfg, y=None):
    BM, BN, BK, warps, stages = cfg
    M, K = x.shape
    N = words.shape[1]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if y is None else y
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _plain_kernel[grid](x, words, scales, scales if zeros is None else zeros, y, M, N, K,
                        x.stride(0), words.stride(0), scales.stride(0), y.stride(0),
                        GROUP=K if group_size == -1 else group_size, PER_CHANNEL=group_size == -1,
                        BITS=fmt.bits, SIGNED=fmt.kind == "int", HAS_ZEROS=zeros is not None,
                        BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, DEQ_F32=INTERPRET and x.dtype == torch.bfloat16,
                        num_warps=warps, num_stages=stages)
    return y


@register(NAME, supports=supports, tolerance=TOLERANCE)
def prepare_triton_plain(qw, act_dtype, M=1, seconds=None, tune_per_path=3, **hints):
    """Pack the words once; tune over the first ``tune_per_path`` of ``candidates`` with the caller's
    ``seconds`` timer for each batch size on its first call (no timer, e.g. in the interpreter: the
    first candidate)."""
    act = act_dtype_of(act_dtype)
    K, N, fmt, g = qw.K, qw.N, qw.fmt, qw.group_size
    words = pack_words(qw)
    scales = qw.scales.contiguous()
    zeros = qw.zeros.contiguous() if fmt.kind == "uint" else None
    chosen, timings = {}, {}

    def tune(x):
        m = x.shape[0]
        cands = candidates(m, K, K if g == -1 else g)[:max(1, tune_per_path)]
        if seconds is None or len(cands) == 1:
            return cands[0]
        y = torch.empty(m, N, dtype=act, device=x.device)
        log, failed = [], []
        for c in cands:
            try:
                launch(x, words, scales, zeros, fmt, g, c, y)       # compile outside the timing
            except Exception as e:                                  # e.g. out of shared memory
                failed.append(f"{config_str(c)}: {type(e).__name__}")
                continue
            log.append((seconds(lambda c=c: launch(x, words, scales, zeros, fmt, g, c, y)), c))
        if not log:
            raise RuntimeError("no tuning candidate compiled: " + "; ".join(failed))
        log.sort()
        timings[m] = " ".join([f"{config_str(c)}={t * 1e6:.1f}us" for t, c in log] + failed)
        return log[0][1]

    def run(x):
        check_x(x, act, K)
        m = x.shape[0]
        if m not in chosen:
            chosen[m] = tune(x.contiguous())
        return launch(x.contiguous(), words, scales, zeros, fmt, g, chosen[m])

    def chosen_config(m):
        if m not in chosen:
            return None
        return config_str(chosen[m]) + (f" | tuned: {timings[m]}" if m in timings else "")

    run.chosen_config = chosen_config
    run.tuning_space = [config_str(c) for c in TUNING_SPACE]
    return run
