"""Hugging Face configs from our model cards (architecture only, no weights).

`hf_config(card)` builds the transformers config class named by the card's
`hf_model_type`, so engines can instantiate the real architecture with
`AutoModelForCausalLM.from_config` (random weights, built on the GPU).
"""
from __future__ import annotations

import importlib.metadata

from .specs import ModelCard


def check_transformers_importable() -> None:
    """Fail with the reason, not transformers' ImportError, where the HF `kernels` package is installed:
    transformers imports it when it is, and our top-level `kernels/` package shadows it."""
    try:
        v = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    raise RuntimeError(f"the Hugging Face `kernels` package ({v}) is installed: transformers imports it, and this "
                       "project's own top-level `kernels/` package shadows it. `pip uninstall kernels` (and keep "
                       "transformers < 5.25, which does not require it, as pyproject.toml pins)")


def hf_config(card: ModelCard, **overrides):
    check_transformers_importable()
    from transformers import AutoConfig

    kw = dict(
        hidden_size=card.hidden_size,
        num_hidden_layers=card.num_layers,
        num_attention_heads=card.num_heads,
        num_key_value_heads=card.num_kv_heads,
        head_dim=card.head_dim,
        intermediate_size=card.intermediate_size,
        vocab_size=card.vocab_size,
    )
    if card.num_experts:
        kw.update(num_experts=card.num_experts, num_local_experts=card.num_experts,
                  num_experts_per_tok=card.experts_per_token)
        if card.hf_model_type != "gpt_oss":      # gpt-oss experts use intermediate_size
            kw["moe_intermediate_size"] = card.moe_intermediate_size
    kw.update(overrides)
    return AutoConfig.for_model(card.hf_model_type, **kw)
