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
    layers: int | None = None   # decoder-layer cap for whole-model experiments (`model.layers=4`); None: the experiment's

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
        _need(card.layers is None or (type(card.layers) is int and card.layers > 0),
              f"model {card.name}: layers={card.layers!r} must be a positive integer (a decoder-layer cap) or null")
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
        """The name is the source of truth (the kernels read it): kind, bits, exp_bits and man_bits
        must be what the name says, as kernels.lowbit.formats.parse_format reads it."""
        from kernels.lowbit.formats import parse_format

        _need(self.kind in self.KINDS, f"precision {self.name}: kind={self.kind!r}; valid kinds: {', '.join(self.KINDS)}")
        _need(self.act_dtype in self.ACTS,
              f"precision {self.name}: act_dtype={self.act_dtype!r}; valid: {', '.join(self.ACTS)}")
        _need(isinstance(self.group_size, int) and not isinstance(self.group_size, bool)
              and (self.group_size == -1 or self.group_size > 0),
              f"precision {self.name}: group_size={self.group_size!r}; use a positive size (e.g. 32, 64, 128) "
              f"or -1 (per channel)")
        if self.kind == "dense":
            _need(self.name in self.ACTS and self.bits == 16,
                  f"precision {self.name}: dense weights are named after their 16-bit dtype ({', '.join(self.ACTS)}) "
                  f"with bits=16, got name={self.name!r} bits={self.bits}")
            return
        try:
            fmt = parse_format(self.name)
        except ValueError as e:
            raise ConfigError(f"precision {self.name}: {e}") from None
        got = (self.kind, self.bits, self.exp_bits if fmt.kind == "float" else 0,
               self.man_bits if fmt.kind == "float" else 0)
        want = (fmt.kind, fmt.bits, fmt.exp_bits if fmt.kind == "float" else 0,
                fmt.man_bits if fmt.kind == "float" else 0)
        _need(got == want, f"precision {self.name}: the card says kind={self.kind} bits={self.bits} "
                           f"exp_bits={self.exp_bits} man_bits={self.man_bits}, but the name {self.name!r} means "
                           f"kind={want[0]} bits={want[1]} exp_bits={want[2]} man_bits={want[3]}")

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
    memory_gb: float | None = None   # the card's "GB" as NVIDIA names it (80 on an H100 80GB): GiB, see memory_bytes
    l2_mb: float | None = None
    arch: str | None = None          # compute capability, e.g. sm_90 (H100/H200/GH200), sm_100 (B200)

    @property
    def memory_bytes(self) -> float:
        """The card's memory in bytes: its "GB" are GiB (an H100 80GB holds 79.6 GiB by nvidia-smi, 85.0e9 bytes
        by torch's total_memory, which the Tilus artifact's OOM rule reads); 0 where unknown."""
        return (self.memory_gb or 0) * 2**30

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
    """conf/kernel/<name>.yaml: the Hydra choice. What an implementation supports is said once, where it
    is registered (kernels/baselines/registry.py), not here."""
    name: str
    impl: str
    description: str = ""

    @staticmethod
    def load(name: str) -> "KernelSpec":
        path = CONF_DIR / "kernel" / f"{name}.yaml"
        _need(path.exists(), f"unknown kernel {name!r}; valid kernels: {', '.join(choices('kernel'))}")
        d = _plain(OmegaConf.load(path))
        unknown = sorted(set(d) - set(KernelSpec.__dataclass_fields__))
        _need(not unknown, f"kernel {name}: unknown keys {unknown}; valid: name, impl, description "
                           f"(support is declared where the implementation registers)")
        return KernelSpec(**d)


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
        d["M"] = int_list(f"experiment.M", d.get("M"))
        if d.get("group_size") is not None:
            d["group_size"] = int_value("experiment.group_size", d["group_size"])
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


def int_value(key: str, v: Any, lo: int | None = None) -> int:
    """An integer config value (not a bool, float or string), optionally >= lo."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}={v!r} is not an integer" + (f" (use an integer >= {lo})" if lo is not None else ""))
    if lo is not None and v < lo:
        raise ConfigError(f"{key}={v} must be >= {lo}")
    return v


def int_list(key: str, v: Any, lo: int = 1) -> tuple[int, ...]:
    """A list of integers (a single integer is taken as a list of one), each >= lo."""
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        v = [v]
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ConfigError(f"{key}: {x!r} is not an integer; give integers >= {lo}, e.g. {key}=[1,16]")
        if x < lo:
            raise ConfigError(f"{key}: {x} must be >= {lo}")
    return tuple(int(x) for x in v)


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}={v!r} is not a boolean; use true or false")
    return v


def _number(key: str, v: Any, lo: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= lo:
        raise ConfigError(f"{key}={v!r} must be a number >= {lo}")
    return float(v)


@dataclass(frozen=True)
class RunSpec:
    """`run:` of conf/config.yaml, checked."""
    results_dir: str
    resume: bool
    device: str
    shard: str | None
    seed: int
    progress: bool

    DEVICES = ("auto", "cuda", "cpu")

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "RunSpec":
        d = _plain(cfg)
        unknown = sorted(set(d) - set(RunSpec.__dataclass_fields__))
        _need(not unknown, f"run: unknown keys {unknown}; valid: {sorted(RunSpec.__dataclass_fields__)}")
        _need(isinstance(d.get("results_dir"), str) and d["results_dir"] != "",
              f"run.results_dir={d.get('results_dir')!r} must be a folder path")
        _need(d.get("device") in RunSpec.DEVICES, f"run.device={d.get('device')!r}; valid: {', '.join(RunSpec.DEVICES)}")
        shard = d.get("shard")
        _need(shard is None or (isinstance(shard, str) and re.fullmatch(r"[\w.-]+", shard) is not None),
              f"run.shard={shard!r} must be a file name (letters, digits, '.', '_', '-')")
        return RunSpec(d["results_dir"], _bool("run.resume", d.get("resume")), d["device"], shard,
                       int_value("run.seed", d.get("seed"), 0), _bool("run.progress", d.get("progress")))


@dataclass(frozen=True)
class TimingSpec:
    """`timing:` of conf/config.yaml, checked."""
    warmup_ms: float
    samples: int
    flush_l2: bool
    flush_mb: int
    cuda_graph: bool
    host_ahead: bool
    cpu_samples: int

    @staticmethod
    def from_cfg(cfg: DictConfig | dict) -> "TimingSpec":
        d = _plain(cfg)
        unknown = sorted(set(d) - set(TimingSpec.__dataclass_fields__))
        _need(not unknown, f"timing: unknown keys {unknown}; valid: {sorted(TimingSpec.__dataclass_fields__)}")
        return TimingSpec(_number("timing.warmup_ms", d.get("warmup_ms"), 0),
                          int_value("timing.samples", d.get("samples"), 1),
                          _bool("timing.flush_l2", d.get("flush_l2")),
                          int_value("timing.flush_mb", d.get("flush_mb"), 1),
                          _bool("timing.cuda_graph", d.get("cuda_graph")),
                          _bool("timing.host_ahead", d.get("host_ahead")),
                          int_value("timing.cpu_samples", d.get("cpu_samples"), 1))


def _plain(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)
