"""Whole-model workloads for profiling: LoRA fine-tuning steps and prefill + decode.

Pure compute (no Hydra, no CSV). A workload is built once and then exposes `unit()`, one unit
of work (train: one optimizer step over `grad_accum` micro-batches; infer: one request = a
prefill of the prompt and `decode_tokens` greedy decode steps with a KV cache), and `check()`,
which verifies on the real model that the unit does what it claims (LoRA weights receive
gradients and move while the base weights stay frozen; cached decode matches a full forward).
Inputs are random token ids made before any timing, so no RNG work is inside a unit.

The stack follows Proton's artifact where it can (Deep-Learning-Profiling-Tools/CGO-26-AE,
fig13_14/model_runners): LoRA on the attention and MLP projections, lora_alpha = r, dropout 0,
gradient checkpointing, AdamW (lr 2e-4, weight decay 0.01, linear schedule with 5 warm-up
steps), gradient clipping at 0.3, bf16. The artifact ran Unsloth with bitsandbytes' 8-bit AdamW
on real data; here it is Hugging Face transformers + peft, with liger-kernel's Triton kernels
(RoPE, RMSNorm, SwiGLU, fused linear cross entropy) patched in when asked for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..timing import NumericsFail, rel_error
from .model import BuiltModel

# The artifact's LoRA targets (q, k, v, o, gate, up, down), plus the fused names some
# architectures use for the same projections (Phi-3: qkv_proj, gate_up_proj).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj",
                "down_proj")
# MoE experts in transformers 5 are 3-D parameters, not Linear modules: peft adapts them as parameters.
LORA_EXPERT_PARAMS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# liger-kernel ops patched per model family; MoE experts stay on transformers' grouped_mm path.
LIGER_OPS = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")


@dataclass
class Workload:
    unit: Callable[[], None]         # one unit of timed work (launches only; no host sync inside)
    check: Callable[[], dict]        # engine check on the real model; raises NumericsFail
    info: dict = field(default_factory=dict)


def apply_liger(model: torch.nn.Module) -> list[str]:
    """Patch liger-kernel's Triton ops into a built model instance; returns the ops patched."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    mtype = model.config.model_type
    fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(mtype)
    if fn is None:
        raise RuntimeError(f"liger-kernel has no patch for model type {mtype!r}")
    import inspect
    sig = inspect.signature(fn).parameters
    moe = bool(getattr(model.config, "num_experts", 0) or getattr(model.config, "num_local_experts", 0))
    ops = {op: (op != "swiglu" or not moe) for op in LIGER_OPS if op in sig}
    fn(model=model, **ops)
    # what ran: our choices plus the function's own defaults for ops we did not name (e.g. Gemma's geglu)
    on = {k: p.default for k, p in sig.items() if isinstance(p.default, bool)} | ops
    return sorted(k for k, v in on.items() if v)


def _lora(model: torch.nn.Module, r: int, alpha: int):
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    modules = [m for m in LORA_MODULES if m in present]
    names = [n for n, _ in model.named_parameters()]
    params = [p for p in LORA_EXPERT_PARAMS if any(n.endswith(p) for n in names)]
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=modules,
                     target_parameters=params or None, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg), modules + params


def make_train(built: BuiltModel, batch: int, seq_len: int, grad_accum: int = 4, lora_r: int = 8,
               lora_alpha: int = 8, grad_ckpt: bool = True, lr: float = 2e-4, weight_decay: float = 0.01,
               max_grad_norm: float = 0.3, lr_warmup_steps: int = 5, lr_total_steps: int = 30,
               seed: int = 0) -> Workload:
    """LoRA fine-tuning: one unit = one optimizer step over `grad_accum` micro-batches of (batch, seq_len)."""
    model = built.model
    dev = next(model.parameters()).device
    model.train()
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_model, targets = _lora(model, lora_r, lora_alpha)
    trainable = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    if not trainable:
        raise RuntimeError("LoRA left no trainable parameter")
    params = [p for _, p in trainable]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def lr_lambda(step: int) -> float:
        if step < lr_warmup_steps:
            return (step + 1) / lr_warmup_steps
        return max(0.05, (lr_total_steps - step) / max(1, lr_total_steps - lr_warmup_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    g = torch.Generator(device="cpu").manual_seed(seed)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (batch, seq_len), generator=g).to(dev) for _ in range(grad_accum)]
    last_loss: list[torch.Tensor] = []

    def unit() -> None:
        last_loss.clear()
        for ids in batches:
            out = peft_model(input_ids=ids, labels=ids, use_cache=False)
            (out.loss / grad_accum).backward()
            last_loss.append(out.loss.detach())
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    def check() -> dict:
        """One step by hand: every LoRA tensor gets a finite gradient, LoRA B moves off its zero
        init, the frozen base weights do not move, and the loss is finite."""
        frozen = min((p for p in peft_model.parameters() if not p.requires_grad and p.dim() == 2), key=torch.numel)
        before_frozen = frozen.detach().clone()
        before = [p.detach().clone() for p in params]
        for ids in batches:
            out = peft_model(input_ids=ids, labels=ids, use_cache=False)
            (out.loss / grad_accum).backward()
        loss = float(out.loss.detach().float())
        missing = [n for n, p in trainable if p.grad is None or not torch.isfinite(p.grad).all()]
        if missing or not torch.isfinite(torch.tensor(loss)):
            raise NumericsFail(f"LoRA step: loss={loss}, {len(missing)} of {len(trainable)} LoRA tensors "
                               f"without a finite gradient (e.g. {missing[:1]})")
        nonzero = sum(int(p.grad.abs().sum() > 0) for p in params)
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        moved = sum(int(not torch.equal(b, p.detach())) for b, p in zip(before, params))
        if moved == 0 or nonzero == 0:
            raise NumericsFail(f"LoRA step moved {moved} of {len(params)} LoRA tensors ({nonzero} nonzero grads)")
        if not torch.equal(before_frozen, frozen.detach()):
            raise NumericsFail("a frozen base weight changed during a LoRA step")
        return {"loss": loss, "lora_tensors": len(params), "lora_moved": moved, "lora_nonzero_grad": nonzero}

    n_train = sum(p.numel() for p in params)
    return Workload(unit, check, {"lora_targets": targets, "trainable_params": n_train,
                                  "lora_tensors": len(params), "tokens_per_unit": batch * seq_len * grad_accum})


def make_infer(built: BuiltModel, batch: int, seq_len: int, decode_tokens: int = 32, seed: int = 0) -> Workload:
    """One unit = prefill of a (batch, seq_len) prompt, then `decode_tokens` greedy steps, each one token
    per sequence through the model with a KV cache (transformers' DynamicCache), eager."""
    model = built.model
    model.eval()
    dev = next(model.parameters()).device
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=g).to(dev)

    @torch.inference_mode()
    def generate(n: int, keep_logits: bool = False):
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        toks, logits = [tok], [out.logits[:, -1]] if keep_logits else []
        for _ in range(n):
            out = model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(tok)
            if keep_logits:
                logits.append(out.logits[:, -1])
        return torch.cat(toks, 1), logits

    def unit() -> None:
        generate(decode_tokens)

    @torch.inference_mode()
    def check() -> dict:
        """Cached decode against a full forward without cache over the same tokens: the logits of the
        prefill's last position and of every decoded position must agree. Relative error per
        (sequence, position) in float64; the median must be within tolerance (a rare MoE routing flip
        between two near-equal experts in bf16 moves one position, a broken cache moves all of them)."""
        n = min(3, decode_tokens)
        toks, logits = generate(n, keep_logits=True)
        full = model(input_ids=torch.cat([prompt, toks[:, :n]], 1), use_cache=False).logits
        ref = full[:, seq_len - 1: seq_len + n]
        got = torch.stack(logits, 1)
        errs = sorted(rel_error(got[b, i], ref[b, i]) for b in range(got.shape[0]) for i in range(got.shape[1]))
        med = errs[len(errs) // 2]
        tol = 1e-3 if got.dtype == torch.float32 else 5e-2
        if not med <= tol:
            raise NumericsFail(f"cached decode vs full forward: median relative error {med:.3g} > {tol:g} "
                               f"(max {errs[-1]:.3g})")
        return {"decode_rel_err": med, "decode_rel_err_max": errs[-1]}

    return Workload(unit, check, {"tokens_per_unit": batch * (seq_len + decode_tokens)})
