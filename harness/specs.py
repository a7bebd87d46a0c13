"""Typed views of the Hydra config, with the validation that runs before any GPU work.

Every check raises ConfigError with a message that names the bad value and lists
what is valid. Nothing here touches a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(ValueError):
    """A config value that cannot run; raised before any GPU work is spent."""


def choices(group: str) -> list[str]:
    """The names of the configs in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class ModelCard:
    name: str
    hf_id: str
    hf_model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    papers: tuple[str, ...] = ()

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "ModelCard":
        d = _plain(cfg)
        d["papers"] = tuple(d.get("papers") or ())
        card = ModelCard(**d)
        for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size"):
            _need(getattr(card, k) > 0, f"model {card.name}: {k}={getattr(card, k)} must be > 0")
        _need(card.num_heads % card.num_kv_heads == 0,
              f"model {card.name}: num_heads={card.num_heads} is not a multiple of num_kv_heads={card.num_kv_heads}")
        if card.num_experts:
            _need(0 < card.experts_per_token <= card.num_experts and card.moe_intermediate_size > 0,
                  f"model {card.name}: MoE needs 0 < experts_per_token <= num_experts and moe_intermediate_size > 0")
        return card


_FLOAT_NAME = re.compile(r"^f(\d)e(\d)m(\d)$")


@dataclass(frozen=True)
class Precision:
    """Weight dtype (kind, bits, exponent/mantissa bits), activation dtype and group size."""
    name: str
    kind: str            # dense | uint | int | float
    bits: int
    exp_bits: int
    man_bits: int
    act_dtype: str       # f16 | bf16
    group_size: int      # -1 = one scale per output channel

    KINDS = ("dense", "uint", "int", "float")
    ACTS = ("f16", "bf16")

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "Precision":
        p = Precision(**_plain(cfg))
        p.validate()
        return p

    def validate(self) -> None:
        _need(self.kind in self.KINDS, f"precision {self.name}: kind={self.kind!r}; valid kinds: {', '.join(self.KINDS)}")
        _need(self.act_dtype in self.ACTS,
              f"precision {self.name}: act_dtype={self.act_dtype!r}; valid: {', '.join(self.ACTS)}")
        if self.kind == "dense":
            _need(self.bits == 16, f"precision {self.name}: dense weights are 16-bit, got bits={self.bits}")
            return
        _need(1 <= self.bits <= 8, f"precision {self.name}: bits={self.bits} is outside 1..8 (weights of 1 to 8 bits)")
        if self.kind == "int":
            _need(self.bits >= 2, f"precision {self.name}: signed ints need bits >= 2, got {self.bits}")
        if self.kind == "float":
            _need(self.exp_bits >= 1 and self.man_bits >= 0 and 1 + self.exp_bits + self.man_bits == self.bits,
                  f"precision {self.name}: float needs 1 + exp_bits + man_bits == bits, got "
                  f"1 + {self.exp_bits} + {self.man_bits} != {self.bits}")
        _need(self.group_size == -1 or self.group_size > 0,
              f"precision {self.name}: group_size={self.group_size}; use a positive size (e.g. 32, 64, 128) or -1 (per channel)")

    @property
    def weight_dtype(self) -> str:
        """Name recorded in rows: the low-bit format, or the activation dtype for dense weights."""
        return self.act_dtype if self.kind == "dense" else self.name

    def check_k(self, K: int) -> None:
        if self.kind != "dense" and self.group_size != -1:
            _need(K % self.group_size == 0,
                  f"precision {self.name}: group_size={self.group_size} does not divide K={K}; "
                  f"pick a divisor of K or -1 (per channel)")

    def weight_bytes(self, K: int, N: int) -> int:
        """Bytes a weight-only kernel must read for a K x N weight: codes + scales (+ zero points)."""
        if self.kind == "dense":
            return 2 * K * N
        groups = 1 if self.group_size == -1 else K // self.group_size
        params = 2 if self.kind == "uint" else 1           # scale (+ zero point for uint)
        return (K * N * self.bits + 7) // 8 + params * 2 * groups * N

    def with_group(self, group_size: int | None) -> "Precision":
        if group_size is None or self.kind == "dense":
            return self
        p = Precision(**{**self.__dict__, "group_size": int(group_size)})
        p.validate()
        return p


@dataclass(frozen=True)
class GpuSpec:
    name: str
    match: str = ""
    hbm_bw_tbs: float | None = None
    measured_bw_tbs: float | None = None
    f16_tflops: float | None = None
    measured_f16_tflops: float | None = None
    sm_count: int | None = None
    memory_gb: float | None = None
    l2_mb: float | None = None

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "GpuSpec":
        return GpuSpec(**_plain(cfg))

    @staticmethod
    def load(name: str) -> "GpuSpec | None":
        """The card conf/gpu/<name>.yaml, or None where there is none."""
        path = CONF_DIR / "gpu" / f"{name}.yaml"
        return GpuSpec.from_cfg(OmegaConf.load(path)) if path.exists() else None

    @property
    def bw_tbs(self) -> float | None:
        """Bandwidth the roofline floor uses: measured where known, else the datasheet."""
        return self.measured_bw_tbs or self.hbm_bw_tbs

    @property
    def tflops(self) -> float | None:
        return self.measured_f16_tflops or self.f16_tflops


@dataclass(frozen=True)
class KernelSpec:
    name: str
    impl: str
    description: str = ""
    weight_kinds: tuple[str, ...] = ()
    act_dtypes: tuple[str, ...] = ("f16", "bf16")

    @staticmethod
    def load(name: str) -> "KernelSpec":
        path = CONF_DIR / "kernel" / f"{name}.yaml"
        _need(path.exists(), f"unknown kernel {name!r}; valid kernels: {', '.join(choices('kernel'))}")
        d = _plain(OmegaConf.load(path))
        d["weight_kinds"] = tuple(d.get("weight_kinds") or ())
        d["act_dtypes"] = tuple(d.get("act_dtypes") or ())
        return KernelSpec(**d)

    def static_reason(self, prec: Precision) -> str | None:
        """Why this kernel cannot run this precision, from its card alone (None = it may)."""
        if self.weight_kinds and prec.kind not in self.weight_kinds:
            return f"{self.name} supports weight kinds {list(self.weight_kinds)}, not {prec.kind}"
        if self.act_dtypes and prec.act_dtype not in self.act_dtypes:
            return f"{self.name} supports activations {list(self.act_dtypes)}, not {prec.act_dtype}"
        return None


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    benchmark: str
    figure: str = ""
    description: str = ""
    kernels: tuple[str, ...] = ()
    M: tuple[int, ...] = (1,)
    layers: tuple[str, ...] | None = None      # None = every linear layer of the card
    shapes: tuple[tuple[int, int], ...] | None = None  # explicit (K, N) instead of the card
    group_size: int | None = None              # overrides the precision's default
    cpu: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)   # benchmark-specific knobs

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "ExperimentSpec":
        d = _plain(cfg)
        known = set(ExperimentSpec.__dataclass_fields__)
        extra = sorted(set(d) - known)
        _need(not extra, f"experiment {d.get('name')}: unknown keys {extra}; valid keys: {sorted(known)}")
        d["kernels"] = tuple(d.get("kernels") or ())
        d["M"] = tuple(int(m) for m in (d.get("M") or ()))
        if d.get("layers") is not None:
            d["layers"] = tuple(d["layers"])
        if d.get("shapes") is not None:
            d["shapes"] = tuple((int(k), int(n)) for k, n in d["shapes"])
        spec = ExperimentSpec(**d)
        for m in spec.M:
            _need(m > 0, f"experiment {spec.name}: M={m} must be > 0")
        for k, n in spec.shapes or ():
            _need(k > 0 and n > 0, f"experiment {spec.name}: shape (K={k}, N={n}) must be positive")
        for kname in spec.kernels:
            KernelSpec.load(kname)
        return spec


def _plain(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)
