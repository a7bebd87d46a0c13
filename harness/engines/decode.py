"""One forward step of a Hugging Face causal LM with a static KV cache, eager or as a CUDA graph.

The step is the HF model's own forward (embeddings, decoder layers, norms, lm_head, logit
soft-capping: every architecture detail stays HF's), driven with:
  * `StaticKV`, a preallocated KV cache [batch, kv_heads, max_len, head_dim] per layer: the
    attention modules call its `update(k, v, layer_idx, ...)` (the call shape of transformers 5.17
    and 5.24 alike), which writes the step's keys/values at `write_pos` and returns the first
    `kv_len` positions;
  * an attention function registered with transformers' AttentionInterface ("e2e_static"): PyTorch
    SDPA with grouped-query heads (flash attention on the GPU), causal for a prefill from an empty
    cache, unmasked for a decode token that sees the whole cache; where the model soft-caps attention
    logits (Gemma-2), which SDPA cannot express: for a decode token `_decode_softcap` (HF's formula
    as seven kernels reading K and V in place), for a prefill HF's eager formula (a sliding window
    that cuts a prefill's context also takes that path). A custom attention name also makes HF skip
    its mask building, which needs cache methods and host syncs that a CUDA graph cannot hold;
  * `fuse_rms_norms`: every RMSNorm as PyTorch's fused `F.rms_norm` (one kernel on the GPU instead of
    HF's 8-10), Gemma's scale (1 + weight) computed once (`prepare_inference` does both).

`Step` holds static input buffers, so the same step can be captured once and replayed:
`step.capture()` (after warm-up calls, which also compile Triton kernels) returns a replay
callable; `step.eager()` runs the same forward without a graph. Timing is the caller's.

Pure compute: no Hydra, no CSV.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn
import torch.nn.functional as F

ATTN_NAME = "e2e_static"


def _attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, softcap=None,
               sliding_window=None, **kwargs):
    """query [B, H, q, d], key/value [B, kvH, kv, d] (the cache's valid part) -> [B, q, H, d]."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len > 1 and q_len != kv_len:
        raise NotImplementedError(f"a step of {q_len} tokens over {kv_len} cached ones: only a prefill from an "
                                  "empty cache or single-token decode steps are supported")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    window = sliding_window if sliding_window and kv_len > sliding_window else None
    if window and q_len == 1:                      # decode: the window is the last `window` positions
        key, value, kv_len, window = key[:, :, -window:], value[:, :, -window:], window, None
    groups = query.shape[1] // key.shape[1]
    if softcap is None and window is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=q_len > 1, scale=scaling,
                                             enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    if q_len == 1:
        return _decode_softcap(query, key, value, scaling, softcap), None
    # math path (HF's eager formula): soft-capped logits and/or a banded causal mask
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    # in place on the fresh scores (a prefill's are [B, H, q, kv]: every pass over them counts), the scale
    # and the cap's division as one multiplication
    w = torch.matmul(query, key.transpose(2, 3))
    if softcap is not None:
        w.mul_(scaling / softcap).tanh_().mul_(softcap)
    else:
        w.mul_(scaling)
    if q_len > 1:
        i = torch.arange(q_len, device=query.device)[:, None]
        j = torch.arange(kv_len, device=query.device)[None, :]
        allowed = j <= i
        if window:
            allowed = allowed & (j > i - window)
        w.masked_fill_(~allowed, torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), None


def _decode_softcap(query, key, value, scaling: float, softcap: float) -> torch.Tensor:
    """One decode token with soft-capped logits (HF's eager formula, which SDPA cannot express), without
    copying the cache: the query heads of each KV head form the rows of one [groups, d] x [d, kv] product
    (HF's repeat_kv order: query head h reads KV head h // groups), so K and V are read once, in place
    (strided batched GEMMs over the cache's valid part), not repeated into [B, H, kv, d] copies first.
    Seven kernels: QK^T, scale, tanh, cap, softmax (f32), cast, PV. query [B, H, 1, d] -> [B, 1, H, d]."""
    B, H, _, d = query.shape
    kvh = key.shape[1]
    q = query.reshape(B, kvh, H // kvh, d)
    w = torch.matmul(q, key.transpose(2, 3))                     # [B, kvH, groups, kv]
    w = torch.tanh(w * (scaling / softcap)) * softcap
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, value).reshape(B, 1, H, d)


_GEMMA_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")     # scale = 1 + weight


def _fused_norm_forward(self, x):
    return F.rms_norm(x, self._fused_shape, self._fused_scale.to(x.dtype), self._fused_eps)


def fuse_rms_norms(model: nn.Module, tol: float = 1e-2) -> int:
    """Every RMSNorm of the model through PyTorch's `F.rms_norm` (one fused kernel on the GPU) instead of HF's
    formula (cast to f32, pow, mean, add, rsqrt, mul, cast, mul: 8 kernels per call, 10 for Gemma's (1 + w)
    in f32), as vLLM's runtime does. The scale (Gemma's 1 + weight) is computed once, in the weight's dtype.
    Each norm is checked when it is swapped: its fused output against HF's own forward on a random input
    (relative error <= tol; the difference is one rounding of the scale and of the product); a norm whose
    formula differs (an unknown variant) keeps HF's forward. Returns the number of norms fused."""
    from ..timing import rel_error
    n = 0
    for m in model.modules():
        name = type(m).__name__
        w = getattr(m, "weight", None)
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
        if (not name.endswith("RMSNorm") or hasattr(m, "_fused_scale") or not isinstance(w, torch.Tensor)
                or w.dim() != 1 or w.is_meta or not isinstance(eps, float)):
            continue
        scale = (1.0 + w.detach().float()) if name in _GEMMA_NORMS else w.detach().float()
        g = torch.Generator(device=w.device).manual_seed(0)
        probe = torch.randn(4, w.shape[0], generator=g, device=w.device).to(w.dtype) * 3
        with torch.no_grad():
            ref = m(probe)
            m.register_buffer("_fused_scale", scale.to(w.dtype), persistent=False)
            m._fused_shape, m._fused_eps = (w.shape[0],), eps
            err = rel_error(_fused_norm_forward(m, probe), ref)
        if err > tol:
            del m._fused_scale
            continue
        m.forward = _fused_norm_forward.__get__(m)
        n += 1
    return n


def prepare_inference(model: nn.Module) -> None:
    """What the timed steps need: our attention function, and fused RMSNorms with their scales computed once."""
    use_static_attention(model)
    fuse_rms_norms(model)


def use_static_attention(model: nn.Module) -> None:
    """Route the model's attention through `_attention` (registered once per process)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention)
    model.config._attn_implementation = ATTN_NAME


class StaticKV:
    """A preallocated KV cache with the one method HF's attention modules call on a cache."""

    def __init__(self, config, layers: int, batch: int, max_len: int, dtype, device):
        kv = config.num_key_value_heads
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.k = [torch.zeros(batch, kv, max_len, hd, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(batch, kv, max_len, hd, dtype=dtype, device=device) for _ in range(layers)]
        self.max_len = max_len
        self.kv_len = 0
        self.write_pos = torch.zeros(1, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def step_bytes(self, config, kv_len: int) -> int:
        """Bytes of K and V a step touches: every layer's first `kv_len` positions, at most the last
        `sliding_window` of them in a sliding-window layer (config.layer_types, as HF's Gemma-2/3)."""
        kinds = list(getattr(config, "layer_types", None) or [])
        window = getattr(config, "sliding_window", None)
        total = 0
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            n = min(kv_len, k.shape[2])
            if window and i < len(kinds) and kinds[i] == "sliding_attention":
                n = min(n, int(window))
            total += n * (k[:, :, 0].numel() * k.element_size() + v[:, :, 0].numel() * v.element_size())
        return total

    def fill_random(self, upto: int, seed: int = 0) -> None:
        """Stand-in context: random keys/values in the first `upto` positions (a decode step's cost does
        not depend on their values)."""
        g = torch.Generator(device=self.k[0].device).manual_seed(seed)
        for t in self.k + self.v:
            t[:, :, :upto].copy_(torch.randn(t[:, :, :upto].shape, generator=g, device=t.device))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.k[layer_idx], self.v[layer_idx]
        k.index_copy_(2, self.write_pos, key_states)
        v.index_copy_(2, self.write_pos, value_states)
        return k[:, :, :self.kv_len], v[:, :, :self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len


class Step:
    """One forward step of `tokens` new tokens per sequence at position `start` (all sequences alike).

    Static buffers: ids [batch, tokens], position_ids, the cache's write positions. `set_ids`
    copies new token ids in; `eager()` / the replay of `capture()` compute logits [batch, vocab]
    of the last token into `self.logits`."""

    def __init__(self, model: nn.Module, cache: StaticKV, batch: int, tokens: int, start: int):
        if start + tokens > cache.max_len:
            raise ValueError(f"step of {tokens} tokens at {start} overflows the cache ({cache.max_len})")
        self.model, self.cache, self.batch, self.tokens, self.start = model, cache, batch, tokens, start
        dev = cache.k[0].device
        self.ids = torch.ones(batch, tokens, dtype=torch.long, device=dev)
        self.pos = torch.arange(start, start + tokens, device=dev)
        self.position_ids = self.pos[None, :].expand(batch, -1).contiguous()
        self.logits: torch.Tensor | None = None
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"   # transformers >= 5.2x renamed it
        self.graph: torch.cuda.CUDAGraph | None = None

    def set_ids(self, ids: torch.Tensor) -> None:
        self.ids.copy_(ids)

    def _forward(self) -> torch.Tensor:
        c = self.cache
        c.kv_len = self.start + self.tokens
        c.write_pos = self.pos
        out = self.model(input_ids=self.ids, position_ids=self.position_ids, use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: c})
        return out.logits[:, -1]

    @torch.inference_mode()
    def eager(self) -> torch.Tensor:
        self.logits = self._forward()
        return self.logits

    @torch.inference_mode()
    def capture(self, warmup: int = 2):
        """Warm up on a side stream, capture one step into a CUDA graph; returns the replay callable."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                self._forward()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.logits = self._forward()
        self.graph = g
        return g.replay

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


def decode_cache(model: nn.Module, layers: int, batch: int, context: int, device, dtype) -> StaticKV:
    """A cache for one decode token after `context` tokens per sequence."""
    return StaticKV(model.config, layers, batch, context + 1, dtype, device)


def run_sequence(model: nn.Module, layers: int, ids: torch.Tensor, prompt: int, device, dtype) -> torch.Tensor:
    """Prefill ids[:, :prompt] from an empty cache, then decode the rest one token at a time, eagerly.
    Returns the logits after every position from prompt-1 on: [batch, T - prompt + 1, vocab]."""
    B, T = ids.shape
    cache = StaticKV(model.config, layers, B, T, dtype, device)
    step = Step(model, cache, B, prompt, 0)
    step.set_ids(ids[:, :prompt])
    out = [step.eager().float()]
    for t in range(prompt, T):
        step = Step(model, cache, B, 1, t)
        step.set_ids(ids[:, t:t + 1])
        out.append(step.eager().float())
    return torch.stack(out, dim=1)
