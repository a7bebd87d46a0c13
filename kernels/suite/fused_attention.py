"""FlashAttention forward (causal): one program per (query block, batch*head); K/V blocks streamed
with an online softmax in base 2; the score matrix never touches memory.

llm size: batch 1, 32 heads, 8192 tokens, head_dim 128, causal, fp16 (Llama-3-8B prefill;
KV heads expanded to 32, i.e. plain multi-head attention).
"""
import math

import torch
import triton
import triton.language as tl
import triton.profiler.language as pl

from ._common import KernelCase, check_size, generator, randn, profile_flag, interpreting, nbytes

SHAPES = {"tiny": (1, 2, 48, 16), "llm": (1, 32, 8192, 128)}  # B, H, S, D


def config():
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S, qk_scale,
                     stride_bh, stride_s, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PROFILE: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    base = bh * stride_bh
    if PROFILE:
        pl.enter_scope("load_q")
    q = tl.load(q_ptr + base + offs_m[:, None] * stride_s + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0)
    if PROFILE:
        pl.exit_scope("load_q")
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
    else:
        hi = S
    if PROFILE:
        pl.enter_scope("loop")
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = cols[:, None] < S
        k = tl.load(k_ptr + base + cols[:, None] * stride_s + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        valid = cols[None, :] < S
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= cols[None, :])
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + cols[:, None] * stride_s + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if PROFILE:
        pl.exit_scope("loop")
        pl.enter_scope("store")
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * stride_s + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < S)
    if PROFILE:
        pl.exit_scope("store")


def make_inputs(size, device, seed=0):
    check_size(size)
    b, h, s, d = SHAPES[size]
    g = generator(device, seed)
    mk = lambda: randn((b, h, s, d), dtype=torch.float16, device=device, gen=g)  # noqa: E731
    return {"q": mk(), "k": mk(), "v": mk(), "causal": True, "sm_scale": 1.0 / math.sqrt(d)}


def run(inputs, instrument=False):
    q, k, v = inputs["q"].contiguous(), inputs["k"].contiguous(), inputs["v"].contiguous()
    b, h, s, d = q.shape
    o = torch.empty_like(q)
    cfg = config()
    grid = (triton.cdiv(s, cfg["BLOCK_M"]), b * h)
    _attn_fwd_kernel[grid](q, k, v, o, s, inputs["sm_scale"] * 1.4426950408889634, q.stride(1), q.stride(2),
                           HEAD_DIM=d, CAUSAL=inputs["causal"], PROFILE=profile_flag(instrument), **cfg)
    return o


def reference(inputs):
    q, k, v = (inputs[n].to(torch.float32) for n in ("q", "k", "v"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=inputs["causal"],
                                                            scale=inputs["sm_scale"])


def flops_bytes(inputs):
    b, h, s, d = inputs["q"].shape
    flops = 4 * b * h * s * s * d
    if inputs["causal"]:
        flops //= 2
    return flops, nbytes(inputs["q"], inputs["k"], inputs["v"]) + nbytes(inputs["q"])


CASE = KernelCase(
    name="fused_attention",
    description="FlashAttention forward, causal, online softmax (fp16 in/out, fp32 accumulate)",
    sizes={"tiny": "B=1 H=2 S=48 D=16 causal fp16", "llm": "B=1 H=32 S=8192 D=128 causal fp16 (Llama-3-8B prefill)"},
    scopes=("load_q", "loop", "store"),
    make_inputs=make_inputs, run=run, reference=reference, flops_bytes=flops_bytes,
    tolerance={"atol": 1e-2, "rtol": 1e-2},
)
