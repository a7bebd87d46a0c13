"""A model card as a Hugging Face model whose decoder linears run a kernel of the registry.

Every decoder linear (qkv, o, gate_up, down; fused the way vLLM fuses them, so the shapes are
those of harness/shapes.py and of the kernel-level rows) becomes a `FusedLinear` that calls one
implementation of harness/impls.py (`cublas` for dense f16/bf16, `triton`'s `triton_lowbit`,
`tilus`, `native` (our CUDA C++ kernels), `torch_int4`, ...), prepared once per batch size (`native`:
once, its prepared fn serves every batch size; `triton`: packed once per linear, its config chosen per
batch size). Its weight is drawn once from a normal
init (std = the config's initializer_range) and, for a low-bit precision, quantized with
kernels.lowbit.formats.quantize (round to nearest; per-group scales and zero points as kernels/lowbit
computes them). The dense decoder weights are never materialized as a whole: the HF model is built
with its nn.Linear parameters on the meta device, so a model whose f16 weights do not fit the GPU
still builds in u4.

Modes of every FusedLinear (`QuantizedModel.set_mode`):
  kernel     the prepared implementation (what is timed)
  reference  x(float64) @ dequantize_ref(W)(float64) (+ bias), rounded to the activation dtype:
             the float64 reference of the kernels, used to check the model's logits
  check      the reference, and the kernel on the same input: the relative error of every linear
             is recorded in `check_errors` (the kernel-level check, on the model's own activations)
  skip       a preallocated output, no GEMM at all: the step's non-GEMM time

Pure compute: no Hydra, no CSV. MoE cards are not supported: transformers stores their experts
as 3-D fused parameters (e.g. Qwen3MoeExperts.gate_up_proj [E, 2I, H]), not as nn.Linear layers.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from kernels import Unsupported
from ..impls import TORCH_DTYPES, Prepared, Problem, get
from ..specs import ModelCard, Precision
from .model import build_model

# (fused name, parent module of the decoder layer, member linears in the order of their outputs)
GROUPS = (
    ("qkv", "self_attn", ("q_proj", "k_proj", "v_proj")),
    ("qkv", "self_attn", ("qkv_proj",)),
    ("o", "self_attn", ("o_proj",)),
    ("gate_up", "mlp", ("gate_proj", "up_proj")),
    ("gate_up", "mlp", ("gate_up_proj",)),
    ("down", "mlp", ("down_proj",)),
)
MODES = ("kernel", "reference", "check", "skip")
# implementations whose prepared fn serves any batch size (it packs the weight once and picks its decode or
# prefill path per call): prepared once per linear, not once per M (native/lowbit.py ignores the M hint)
ANY_M = {"native"}
_SKIP_OUT: dict = {}     # (N, dtype, device) -> the preallocated output every skipped linear of that width returns


@contextlib.contextmanager
def linears_on_meta():
    """nn.Linear parameters created on the meta device (no memory, no init) while building."""
    orig = nn.Linear.__init__

    def init(self, in_features, out_features, bias=True, device=None, dtype=None):
        orig(self, in_features, out_features, bias, device="meta", dtype=dtype)

    nn.Linear.__init__ = init
    try:
        yield
    finally:
        nn.Linear.__init__ = orig


class FusedLinear(nn.Module):
    """y[M, sum(splits)] = x[M, K] @ W[K, N] (+ bias) through a registry implementation."""

    def __init__(self, name: str, layer: int, K: int, splits: tuple[int, ...], bias: bool, impl: str,
                 precision: Precision, seed: int, std: float, device: str, keep_weight: bool = True):
        super().__init__()
        self.name, self.layer, self.K, self.splits = name, layer, K, tuple(splits)
        self.N = sum(splits)
        self.impl, self.precision, self.seed, self.std, self.device = impl, precision, seed, std, device
        self.act = TORCH_DTYPES[precision.act_dtype]
        self.keep_weight = keep_weight
        self.mode = "kernel"
        self.prepared: Prepared | None = None
        self.prepared_M: int | None = None
        self.check_errors: list[float] = []
        g = torch.Generator(device=device).manual_seed(seed + 7919)
        self.bias = ((torch.randn(self.N, generator=g, device=device) * std).to(self.act) if bias else None)
        self._weight = self.make_weight()             # dense [K, N] or QuantizedWeight
        self.nbytes = (self._weight.numel() * self._weight.element_size() if self.dense
                       else self._weight.nbytes) + (0 if self.bias is None else self.bias.numel() * 2)

    @property
    def dense(self) -> bool:
        return self.precision.kind == "dense"

    @property
    def any_m(self) -> bool:
        from ..impls import resolve
        return resolve(self.impl) in ANY_M

    def make_weight(self):
        """The weight, deterministic in (seed, shape): regenerated when it was not kept."""
        g = torch.Generator(device=self.device).manual_seed(self.seed)
        w = torch.randn(self.K, self.N, generator=g, device=self.device) * self.std
        if self.dense:
            return w.to(self.act)
        from kernels.lowbit.formats import quantize
        return quantize(w, self.precision.name, self.precision.group_size, self.act)

    def weight(self):
        return self._weight if self._weight is not None else self.make_weight()

    def prepare(self, M: int, seconds=None, tune_per_path: int = 0) -> float:
        """Prepare the implementation for batch size M (once per M); returns the seconds it took.

        An implementation whose prepared fn carries `packed` (the weight in its own layout, which does not
        depend on M: triton's) gets that back instead of the weight, so it chooses the config for M without
        packing again (nor regenerating a weight that was not kept). It is this linear's own: one impl,
        precision and weight for the linear's life, freed with the model build; the only copy alive."""
        if self.prepared is not None and (self.prepared_M == M or self.any_m):
            self.prepared_M = M
            return 0.0
        packed = getattr(self.prepared.fn, "packed", None) if self.prepared is not None else None
        self.prepared = None                           # one prepared copy of the weight at a time
        t0 = time.perf_counter()
        w = packed if packed is not None else self.weight()
        self.prepared = get(self.impl)(Problem(M, self.K, self.N, self.precision, w, self.device,
                                               seconds=seconds, tune_per_path=tune_per_path))
        self.prepared_M = M
        if not self.keep_weight and not self.dense:
            self._weight = None                        # regenerated for the reference / next prepare
        return time.perf_counter() - t0

    def config(self) -> str:
        return self.prepared.config_for(self.prepared_M) if self.prepared is not None else ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.K)
        M = x2.shape[0]
        if self.mode == "skip":       # one buffer per width, shared by the layers (allocated before any capture)
            key = (self.N, x.dtype, str(x.device))
            buf = _SKIP_OUT.get(key)
            if buf is None or buf.shape[0] < M:
                g = torch.Generator(device=x.device).manual_seed(self.N)
                buf = _SKIP_OUT[key] = (torch.randn(M, self.N, generator=g, device=x.device) * 0.1).to(x.dtype)
            return buf[:M].view(*lead, self.N)
        if self.mode in ("reference", "check"):
            from kernels.lowbit.formats import dequantize_ref
            w = self.weight()
            w64 = w.double() if self.dense else dequantize_ref(w, device=x.device)
            y = x2.double() @ w64
            del w64
            if self.mode == "check":
                from ..timing import rel_error
                self.check_errors.append(rel_error(self.prepared.fn(x2.contiguous()), y))
            if self.bias is not None:
                y = y + self.bias.double()
            return y.to(x.dtype).view(*lead, self.N)
        y = self.prepared.fn(x2 if x2.is_contiguous() else x2.contiguous())
        if not y.is_contiguous():
            # native's prefill path returns y^T's transposed view (strides (1, M)). Handed on as is, every op
            # after the linear inherits that layout (bias, rotary, gelu x up, residual adds, norms: strided
            # reads), and SDPA's query gets stride(-1) = M, which rules out flash / memory-efficient attention:
            # PyTorch falls back to its math path, in f32 (1 Dec rows: Qwen2.5-32B native prefill 582 ms against
            # 277 predicted). One row-major copy here (the bias add fused into it) instead.
            out = torch.empty(M, self.N, dtype=y.dtype, device=y.device)
            if self.bias is not None:
                torch.add(y, self.bias, out=out)
            else:
                out.copy_(y)
            return out.view(*lead, self.N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead, self.N)


class Member(nn.Module):
    """Stands where one of a fused group's HF linears was: returns its slice of the fused output.

    The first member called with a new input computes the whole fused GEMM once; the others
    (called with the same tensor, as HF's attention and MLP do) take their slices."""

    def __init__(self, fused: FusedLinear, index: int, state: dict):
        super().__init__()
        self.fused = fused               # registered once per member: parameters are not shared
        self.index = index
        self.state = state               # shared by the members of the group: input, outputs, pending

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.state
        if s.get("x") is not x or self.index not in s["pending"]:
            y = self.fused(x)
            s["x"], s["parts"] = x, y.split(self.fused.splits, dim=-1)
            s["pending"] = set(range(len(self.fused.splits)))
        s["pending"].discard(self.index)
        out = s["parts"][self.index]
        if not s["pending"]:
            s.clear()                    # no reference to this step's tensors survives
            s["pending"] = set()
        return out


@dataclass
class QuantizedModel:
    model: nn.Module                     # the HF causal LM with FusedLinear decoder linears
    card: ModelCard
    precision: Precision                 # of the decoder linears (dense f16/bf16 for cublas)
    impl: str
    layers: int
    linears: list[FusedLinear]
    weight_bytes: int                    # bytes one full step reads: linears + lm_head + norms
    build_s: float
    M: int | None = None
    prepare_s: dict = field(default_factory=dict)     # M -> seconds spent preparing the linears
    logits_checked: bool = False         # the logits were checked against the float64-linears model once

    @property
    def config(self):
        return self.model.config

    def set_mode(self, mode: str, only: list[FusedLinear] | None = None) -> None:
        """Every linear (or the `only` ones; the others keep their mode) to `mode`."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}; valid: {MODES}")
        for lin in self.linears if only is None else only:
            lin.mode = mode
        if mode != "skip":
            _SKIP_OUT.clear()

    @contextlib.contextmanager
    def mode(self, mode: str, only: list[FusedLinear] | None = None):
        lins = self.linears if only is None else only
        old = [(lin, lin.mode) for lin in lins]
        self.set_mode(mode, lins)
        try:
            yield
        finally:
            for lin, m in old:
                lin.mode = m
            if any(m != "skip" for _, m in old):
                _SKIP_OUT.clear()

    def prepare(self, M: int, seconds=None, tune_per_path: int = 0) -> float:
        """Prepare every linear for batch size M (tokens per step)."""
        if self.M == M:
            return 0.0
        s = sum(lin.prepare(M, seconds, tune_per_path) for lin in self.linears)
        self.M = M
        self.prepare_s[M] = s
        return s

    def shapes(self) -> list[tuple[str, int, int, int]]:
        """(name, K, N, count per step) of the distinct linear shapes, in the harness' layer names."""
        seen: dict[tuple[str, int, int], int] = {}
        for lin in self.linears:
            key = (lin.name, lin.K, lin.N)
            seen[key] = seen.get(key, 0) + 1
        return [(n, K, N, c) for (n, K, N), c in seen.items()]

    def first_of_each_shape(self) -> list[FusedLinear]:
        out, seen = [], set()
        for lin in self.linears:
            if (lin.name, lin.K, lin.N) not in seen:
                seen.add((lin.name, lin.K, lin.N))
                out.append(lin)
        return out

    def configs(self) -> str:
        """The config each distinct shape runs with (after prepare)."""
        return "; ".join(f"{lin.name}={lin.config()}" for lin in self.first_of_each_shape())


def _decoder_layers(model: nn.Module):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise Unsupported(f"{type(model).__name__}: no model.layers (decoder layers) to swap")
    return layers


def build_quantized(card: ModelCard, precision: Precision, impl: str, layers: int | None = None,
                    device: str = "cuda", seed: int = 0, keep_weights: bool = True,
                    **config_overrides) -> QuantizedModel:
    """The card with `layers` decoder layers, its decoder linears on `impl` in `precision`.

    keep_weights=False drops each linear's canonical weight once its implementation is prepared
    (the reference and the next prepare regenerate it from its seed): one copy of the weights in
    memory instead of two. config_overrides go to the HF config (e.g. initializer_range)."""
    if card.num_experts:
        raise Unsupported(f"{card.name} is MoE: transformers stores its experts as 3-D fused parameters, "
                          "not nn.Linear layers; the quantized swap covers dense decoders only")
    t0 = time.perf_counter()
    act = precision.act_dtype
    with linears_on_meta():
        built = build_model(card, layers, dtype=act, device=device, seed=seed, **config_overrides)
    model = built.model
    std = float(getattr(model.config, "initializer_range", 0.02))
    linears: list[FusedLinear] = []
    for i, layer in enumerate(_decoder_layers(model)):
        for gname, parent_name, members in GROUPS:
            parent = getattr(layer, parent_name, None)
            mods = [getattr(parent, m, None) for m in members] if parent is not None else [None]
            if not all(isinstance(m, nn.Linear) for m in mods):
                continue
            K = mods[0].in_features
            if any(m.in_features != K for m in mods):
                raise Unsupported(f"{card.name}: {members} have different input sizes")
            bias = mods[0].bias is not None
            fused = FusedLinear(gname, i, K, tuple(m.out_features for m in mods), bias, impl, precision,
                                seed=seed + 1000 * i + len(linears), std=std, device=device,
                                keep_weight=keep_weights)
            linears.append(fused)
            state: dict = {"pending": set()}
            for j, m in enumerate(members):
                setattr(parent, m, Member(fused, j, state))
        left = [n for n, p in layer.named_parameters() if p.is_meta]
        if left:
            raise Unsupported(f"{card.name} ({type(layer).__name__}): parameters {left[:4]} are not "
                              "decoder linears this swap knows (qkv/o/gate_up/down)")
    # what is still on meta outside the decoder layers (an untied lm_head): dense, random
    for mod in model.modules():
        if any(p.is_meta for p in mod.parameters(recurse=False)):
            mod.to_empty(device=device, recurse=False)
            with torch.no_grad():
                for name, p in mod.named_parameters(recurse=False):
                    if name == "bias":
                        p.zero_()
                    else:
                        p.normal_(0.0, std)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    skip = set() if head is not None and head.weight is emb.weight else {id(emb.weight)}   # rows gathered only
    seen, dense_bytes = set(), 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in skip:
            seen.add(id(p))
            dense_bytes += p.numel() * p.element_size()
    wbytes = dense_bytes + sum(lin.nbytes for lin in linears)
    return QuantizedModel(model, card, precision, impl, built.layers, linears, wbytes,
                          build_s=time.perf_counter() - t0)


def param_count(card: ModelCard, layers: int | None = None, tied: bool = False) -> int:
    """Parameters of the card with `layers` decoder layers (linears, embeddings, lm_head; norms ignored)."""
    from ..shapes import linear_layers
    n = card.num_layers if not layers or layers <= 0 else min(int(layers), card.num_layers)
    per_layer = 0
    for l in linear_layers(card):
        per_layer += l.K * l.N * (card.num_experts if l.name.startswith("expert_") else 1)
    if card.num_experts:
        per_layer += card.hidden_size * card.num_experts        # router
    emb = card.vocab_size * card.hidden_size
    return n * per_layer + emb * (1 if tied else 2)


def weights_oom(card: ModelCard, bits: int, memory_bytes: float, layers: int | None = None,
                tied: bool = False, fraction: float = 0.8) -> str | None:
    """The Tilus artifact's rule (figure11.py): parameters x bits / 8 > 0.8 x GPU memory -> OOM."""
    need = param_count(card, layers, tied) * bits / 8
    if need > fraction * memory_bytes:
        return (f"oom: {need / 1e9:.1f} GB of {bits}-bit weights > {fraction} x {memory_bytes / 2**30:.0f} GiB "
                f"GPU memory (the artifact's rule); not built")
    return None


def step_inputs(vocab: int, batch: int, tokens: int, device: str, seed: int) -> torch.Tensor:
    """Fresh random token ids [batch, tokens] (never zeros: a fixed-seed draw from the vocabulary)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(1, vocab, (batch, tokens), generator=g, device=device)


def time_linear(lin: FusedLinear, M: int, timer: Callable) -> float:
    """Kernel-level time (ms) of one linear at batch size M with the caller's timer."""
    x = torch.randn(M, lin.K, dtype=lin.act, device=lin.device)
    fn = lin.prepared.fn
    return timer(lambda: fn(x)).median_ms
