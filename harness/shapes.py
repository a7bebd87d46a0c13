"""Linear-layer GEMM shapes of a model card, fused the way vLLM fuses them.

y[M, N] = x[M, K] @ W[K, N]:
  qkv      K = hidden,           N = (heads + 2 * kv_heads) * head_dim
  o        K = heads * head_dim, N = hidden
  gate_up  K = hidden,           N = 2 * intermediate
  down     K = intermediate,     N = hidden
A MoE card has per-expert gate_up / down instead (K, N of one expert; `count` says
how many experts a token visits per layer).
"""
from __future__ import annotations

from dataclasses import dataclass

from .specs import ConfigError, ModelCard


@dataclass(frozen=True)
class Layer:
    name: str
    K: int
    N: int
    count: int = 1          # instances used per token per transformer block


def linear_layers(card: ModelCard) -> list[Layer]:
    h, hd = card.hidden_size, card.head_dim
    layers = [
        Layer("qkv", h, (card.num_heads + 2 * card.num_kv_heads) * hd),
        Layer("o", card.num_heads * hd, h),
    ]
    if card.num_experts:
        i = card.moe_intermediate_size
        layers += [Layer("expert_gate_up", h, 2 * i, card.experts_per_token),
                   Layer("expert_down", i, h, card.experts_per_token)]
    else:
        i = card.intermediate_size
        layers += [Layer("gate_up", h, 2 * i), Layer("down", i, h)]
    return layers


def select_layers(card: ModelCard, names: tuple[str, ...] | None) -> list[Layer]:
    layers = linear_layers(card)
    if names is None:
        return layers
    valid = [l.name for l in layers]
    for n in names:
        if n not in valid:
            raise ConfigError(f"model {card.name} has no layer {n!r}; valid layers: {', '.join(valid)}")
    return [l for l in layers if l.name in names]
