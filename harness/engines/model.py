"""Build a model card as a Hugging Face transformers model with random weights (no download).

The weights are created directly on the target device (building a 2-layer Llama-3-8B on the CPU
took 95 s; on the GPU it is a few seconds). `layers` caps the number of decoder layers so the
largest cards fit one GPU; the cap actually used is returned with the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.lowbit.formats import ACT_DTYPES

from ..hf import check_transformers_importable, hf_config
from ..specs import ModelCard

DTYPES = {"f16": ACT_DTYPES["f16"], "bf16": ACT_DTYPES["bf16"], "f32": torch.float32}


@dataclass
class BuiltModel:
    model: torch.nn.Module
    card: ModelCard
    layers: int              # decoder layers actually built
    dtype: str
    params: int              # parameter count of what was built

    @property
    def config(self):
        return self.model.config


def tiny_card(card: ModelCard, hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
              vocab: int = 512, experts: int = 4) -> ModelCard:
    """The same architecture at a size the CPU runs in seconds (pipeline checks, never performance)."""
    kv = kv_heads if card.num_kv_heads < card.num_heads else heads
    d = dict(card.__dict__)
    d.update(hidden_size=hidden, num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
             intermediate_size=intermediate, vocab_size=vocab)
    if card.num_experts:
        d.update(num_experts=experts, experts_per_token=min(card.experts_per_token, 2),
                 moe_intermediate_size=intermediate // 2)
    return ModelCard(**d)


def build_model(card: ModelCard, layers: int | None = None, dtype: str = "bf16", device: str = "cuda",
                seed: int = 0, **config_overrides) -> BuiltModel:
    """The card's architecture with min(layers, card.num_layers) decoder layers, random weights on `device`."""
    check_transformers_importable()
    from transformers import AutoModelForCausalLM

    n = card.num_layers if not layers or layers <= 0 else min(int(layers), card.num_layers)
    cfg = hf_config(card, num_hidden_layers=n, **config_overrides)
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:     # per-layer attention kinds (Gemma, gpt-oss)
        cfg.layer_types = list(cfg.layer_types)[:n]
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):    # special ids past a shrunk vocabulary
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v >= cfg.vocab_size:
            setattr(cfg, attr, 0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPES[dtype])
    model.eval()
    return BuiltModel(model, card, n, dtype, sum(p.numel() for p in model.parameters()))
