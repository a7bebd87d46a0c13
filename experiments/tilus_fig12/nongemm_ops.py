"""What one decode step runs besides the decoder linears: the ATen operations of our engine's step, counted.

    python -m experiments.tilus_fig12.nongemm_ops                    # gemma2_9b, qwen2_5_32b, llama3_3_70b
    python -m experiments.tilus_fig12.nongemm_ops --models gemma2_9b --batch 16
    python -m experiments.tilus_fig12.nongemm_ops --cuda     # also the CUDA kernels one step launches (on a GPU)

The step is exactly the one llm_e2e times for `nongemm_ms` (harness/engines/decode.py: the HF forward over
a StaticKV cache through our attention function, every decoder linear in `skip` mode), run on the CPU on a
tiny card of the same architecture: the *number* of operations per layer does not depend on the sizes, and
each non-view ATen operation is (about) one CUDA kernel, which inside a CUDA graph costs a few microseconds
even when it moves almost no data. Operations are attributed to the module that ran them (norms, rotary,
attention, KV writes, MLP activation, residual adds, head). The bytes that dominate at the real size
(lm_head, KV cache) are counted from the card (`bytes_of`). No GPU, no results rows: an explanation tool
for experiments/tilus_fig12/README.md.
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_FREE = {"detach", "alias", "lift_fresh", "empty", "empty_strided", "_local_scalar_dense", "set_", "resize_",
         "_to_copy_cpu_scalar"}


class Count(TorchDispatchMode):
    """Non-view ATen operations, by the label of the module running them."""

    def __init__(self):
        super().__init__()
        self.labels: list[str] = ["step"]
        self.ops: Counter = Counter()
        self.names: dict = {}
        self.paused = False

    def add(self, name: str) -> None:
        lab = self.labels[-1]
        self.ops[lab] += 1
        self.names.setdefault(lab, Counter())[name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        name = func.overloadpacket.__name__
        copied = not func.is_view or (                 # `to` / `reshape` / `contiguous` alias or copy
            isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor)
            and out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr())
        if copied and name not in _FREE:
            self.add(name)
        return out


class OneKernel(TorchFunctionMode):
    """Functions that are one fused kernel on the GPU but a composite of several ATen operations on the CPU
    (`F.rms_norm` -> `_fused_rms_norm`, CUDA-only): counted as one operation, their insides not at all."""
    FUSED = {F.rms_norm: "rms_norm"}

    def __init__(self, count: Count):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.FUSED.get(func)
        if name is None or self.count.paused:
            return func(*args, **(kwargs or {}))
        self.count.add(name)
        self.count.paused = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.count.paused = False


def _label(module) -> str | None:
    n = type(module).__name__
    if "RMSNorm" in n or "LayerNorm" in n:
        return "norms"
    if "Rotary" in n:
        return "rotary table"
    if n.endswith("Attention"):
        return "attention: rotary, reshapes"
    if n.endswith("MLP"):
        return "mlp activation"
    if n.endswith("DecoderLayer"):
        return "residual adds"
    if "Embedding" in n:
        return "embedding"
    if n == "Linear":
        return "lm_head"
    return None


def _tiny(card_name: str):
    from omegaconf import OmegaConf
    from harness.engines.model import tiny_card
    from harness.specs import CONF_DIR, ModelCard
    return tiny_card(ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{card_name}.yaml")),
                     hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)


def _build(card, layers: int, batch: int, device: str):
    """The engine's f16 model of the tiny card, prepared for inference as llm_e2e prepares it."""
    from harness.benchmarks.llm_e2e import dense as dense_precision
    from harness.engines import decode
    from harness.engines.quantized import build_quantized
    qm = build_quantized(card, dense_precision("f16"), "cublas", layers=layers, device=device)
    decode.prepare_inference(qm.model)
    qm.prepare(batch)
    return qm


def count(card_name: str, layers: int, batch: int = 1, context: int = 16) -> Count:
    from harness.engines import decode
    from harness.engines.quantized import step_inputs

    card = _tiny(card_name)
    qm = _build(card, layers, batch, "cpu")
    cache = decode.StaticKV(qm.config, qm.layers, batch, context + 1, torch.float16, "cpu")
    cache.fill_random(context)
    step = decode.Step(qm.model, cache, batch, 1, context)
    step.set_ids(step_inputs(card.vocab_size, batch, 1, "cpu", 1))
    mode = Count()
    hooks = []
    for m in qm.model.modules():
        lab = _label(m)
        if lab:
            hooks.append(m.register_forward_pre_hook(lambda mod, a, lab=lab: mode.labels.append(lab)))
            hooks.append(m.register_forward_hook(lambda mod, a, o: mode.labels.pop() and None))
    attn, upd = decode._attention, decode.StaticKV.update

    def attention(*a, **k):
        mode.labels.append("attention")
        try:
            return attn(*a, **k)
        finally:
            mode.labels.pop()

    def update(self, *a, **k):
        mode.labels.append("kv write")
        try:
            return upd(self, *a, **k)
        finally:
            mode.labels.pop()

    from transformers import AttentionInterface
    AttentionInterface.register(decode.ATTN_NAME, attention)
    decode.StaticKV.update = update
    try:
        with qm.mode("skip"):
            step.eager()                       # allocates the skip buffers outside the count
            with mode, OneKernel(mode):
                step.eager()
    finally:
        decode.StaticKV.update = upd
        AttentionInterface.register(decode.ATTN_NAME, attn)
        for h in hooks:
            h.remove()
    return mode


def cuda_kernels(card_name: str, layers: int, batch: int = 1, context: int = 16) -> Counter:
    """The GPU kernels one eager decode step launches on the same tiny card (torch.profiler, CUDA activity): what
    the CPU count above stands for, checked (e.g. that `F.rms_norm` is one fused kernel there)."""
    from harness.engines import decode
    card = _tiny(card_name)
    qm = _build(card, layers, batch, "cuda")
    cache = decode.StaticKV(qm.config, qm.layers, batch, context + 1, torch.float16, "cuda")
    cache.fill_random(context)
    step = decode.Step(qm.model, cache, batch, 1, context)
    from harness.engines.quantized import step_inputs
    step.set_ids(step_inputs(card.vocab_size, batch, 1, "cuda", 1))
    with qm.mode("skip"):
        step.eager()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step.eager()
            torch.cuda.synchronize()
    return Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def per_layer(card_name: str, batch: int = 1) -> tuple[Counter, Counter, dict]:
    """(operations per decoder layer, operations once per step, op names per layer) by label."""
    one, two = count(card_name, 1, batch), count(card_name, 2, batch)
    layer = Counter({k: two.ops[k] - one.ops.get(k, 0) for k in two.ops})
    fixed = Counter({k: one.ops[k] - layer.get(k, 0) for k in one.ops})
    names = {k: {n: two.names[k][n] - one.names.get(k, Counter()).get(n, 0) for n in two.names[k]} for k in two.names}
    return +layer, +fixed, names


def bytes_of(card_name: str, batch: int = 1, context: int = 2048) -> dict:
    """HBM bytes a decode step reads outside the decoder linears (f16): lm_head, KV cache."""
    from omegaconf import OmegaConf
    from harness.specs import CONF_DIR, ModelCard
    c = ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{card_name}.yaml"))
    kv = 2 * c.num_layers * batch * c.num_kv_heads * (context // batch + 1) * c.head_dim * 2
    return {"lm_head": c.vocab_size * c.hidden_size * 2, "kv_cache": kv, "layers": c.num_layers}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gemma2_9b", "qwen2_5_32b", "llama3_3_70b"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cuda", action="store_true", help="also count the CUDA kernels of one step on the GPU")
    a = ap.parse_args(argv)
    for m in a.models:
        layer, fixed, names = per_layer(m, a.batch)
        b = bytes_of(m, a.batch)
        n = b["layers"] * sum(layer.values()) + sum(fixed.values())
        print(f"{m}: {sum(layer.values())} operations per layer x {b['layers']} layers + {sum(fixed.values())} per "
              f"step = {n}; lm_head {b['lm_head'] / 1e9:.2f} GB, KV cache {b['kv_cache'] / 1e9:.2f} GB")
        for k, v in layer.most_common():
            top = ", ".join(f"{o} {c}" for o, c in Counter(names[k]).most_common() if c)
            print(f"   per layer  {k:30s} {v:3d}  ({top})")
        for k, v in fixed.most_common():
            print(f"   per step   {k:30s} {v:3d}")
        if a.cuda:
            one, two = cuda_kernels(m, 1, a.batch), cuda_kernels(m, 2, a.batch)
            per = two - one
            print(f"   CUDA kernels (eager step on the GPU): {sum(per.values())} per layer + "
                  f"{sum(one.values()) - sum(per.values())} per step; per layer: "
                  + ", ".join(f"{k[:60]} {v}" for k, v in per.most_common()))


if __name__ == "__main__":
    main()
