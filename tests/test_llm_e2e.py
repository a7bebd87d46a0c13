"""Whole-model low-bit engine (harness/engines/quantized.py, decode.py) and the llm_e2e benchmark, on the CPU.

Tiny cards of the real architectures (Llama, Qwen2 with q/k/v biases, Gemma-2 with soft-capping
and tied embeddings); our Triton kernel runs through the interpreter.
"""
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import nn

from harness.bench import Context
from harness.benchmarks.llm_e2e import LlmE2E
from harness.engines import decode
from harness.engines.decode import StaticKV, prepare_inference, run_sequence, use_static_attention
from harness.engines.model import tiny_card
from harness.engines.quantized import FusedLinear, Member, build_quantized, param_count, weights_oom
from harness.runner import build_context, run_point
from harness.specs import CONF_DIR, ConfigError, ExperimentSpec, GpuSpec, ModelCard, Precision
from harness.timing import rel_error

ARCHS = ["llama3_1_8b", "qwen2_5_32b", "gemma2_9b"]


def card(name, **tiny):
    c = ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))
    return tiny_card(c, **tiny) if tiny else c


def prec(name, group=None):
    p = Precision.from_cfg(OmegaConf.load(CONF_DIR / "precision" / f"{name}.yaml"))
    return p.with_group(group)


def logits(qm, ids):
    with torch.inference_mode():
        return qm.model(input_ids=ids, logits_to_keep=1).logits.double()


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_swap_matches_the_dequantized_float_model(arch):
    c = card(arch, hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("u4", 32), "triton", layers=2, device="cpu", initializer_range=0.1)
    # every decoder linear is fused as vLLM fuses them and runs our kernel; none is left behind
    assert [l.name for l in qm.linears] == ["qkv", "o", "gate_up", "down"] * 2
    assert not any(type(m) is nn.Linear for layer in qm.model.model.layers for m in layer.modules())
    assert all(isinstance(m, Member) for m in (qm.model.model.layers[0].self_attn.q_proj,
                                               qm.model.model.layers[0].mlp.up_proj))
    assert (qm.linears[0].bias is not None) == (arch == "qwen2_5_32b")
    use_static_attention(qm.model)
    qm.prepare(2)
    ids = torch.randint(1, c.vocab_size, (2, 1))
    out = logits(qm, ids)
    with qm.mode("check"):
        ref = logits(qm, ids)            # float64 dequantized linears, each kernel checked beside it
    errs = [e for l in qm.linears for e in l.check_errors]
    assert len(errs) == 8 and max(errs) < 2e-3
    assert 0 < rel_error(out, ref) < 1e-2
    with qm.mode("skip"):                # without the linears the logits are far off: the check has teeth
        assert rel_error(logits(qm, ids), ref) > 0.3


def test_fused_members_return_their_slices_of_one_gemm():
    c = card("qwen2_5_32b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("f16"), "cublas", layers=1, device="cpu")
    qm.prepare(3)
    attn = qm.model.model.layers[0].self_attn
    fused: FusedLinear = qm.linears[0]
    x = torch.randn(3, 64).half()
    w = fused.weight().double()
    want = x.double() @ w + fused.bias.double()
    got = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
    assert [g.shape[-1] for g in got] == list(fused.splits) == [64, 32, 32]
    assert rel_error(torch.cat(got, -1), want) < 2e-3
    # a new input recomputes (no stale slices across steps)
    x2 = torch.randn(3, 64).half()
    assert rel_error(attn.q_proj(x2), (x2.double() @ w + fused.bias.double())[:, :64]) < 2e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_loop_matches_the_hf_forward(arch):
    c = card(arch, hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("f16"), "cublas", layers=2, device="cpu", initializer_range=0.1)
    qm.prepare(1)
    ids = torch.randint(1, c.vocab_size, (2, 12))
    qm.model.config._attn_implementation = "eager"      # HF's own attention (Gemma-2 soft-caps only there)
    with torch.inference_mode():
        ref = qm.model(input_ids=ids).logits.double()[:, 7:]
    prepare_inference(qm.model)                          # our attention, fused RMSNorms
    out = run_sequence(qm.model, qm.layers, ids, 8, "cpu", torch.float16).double()   # prefill 8, decode 4
    assert out.shape == ref.shape
    assert rel_error(out, ref) < 5e-3
    assert rel_error(out[:, 1:], ref[:, :-1]) > 0.1     # one position off is caught


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_softcapped_decode_attention_is_hfs_formula_without_copying_the_cache(dtype):
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
    g = torch.Generator().manual_seed(0)
    B, H, kvh, kv, d, cap = 3, 8, 2, 37, 16, 5.0
    q = torch.randn(B, H, 1, d, generator=g).to(dtype)
    cache = (torch.randn(B, kvh, kv + 5, d, generator=g) * 3).to(dtype)    # a view of a longer cache, as StaticKV's
    k, v = cache[:, :, :kv], cache.flip(2)[:, :, :kv]
    mod = type("M", (), {"num_key_value_groups": H // kvh, "training": False})()
    ref, _ = eager_attention_forward(mod, q, k, v, None, dropout=0.0, scaling=d ** -0.5, softcap=cap)
    out, _ = decode._attention(mod, q, k, v, None, scaling=d ** -0.5, softcap=cap)
    assert out.shape == ref.shape == (B, 1, H, d)
    assert rel_error(out.double(), ref.double()) < (1e-12 if dtype == torch.float64 else 2e-3)
    wrong = decode._decode_softcap(q.flip(1), k, v, d ** -0.5, cap).reshape(B, 1, H, d)   # heads mis-grouped
    assert rel_error(wrong.double(), ref.double()) > 0.1


@pytest.mark.parametrize("arch", ["gemma2_9b", "qwen2_5_32b"])
def test_rms_norms_fused_close_to_hfs_formula_and_counted_as_one_op(arch):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    n = (Gemma2RMSNorm if arch.startswith("gemma") else Qwen2RMSNorm)(64).half()
    with torch.no_grad():
        n.weight.normal_()
    x = torch.randn(5, 64).half() * 4
    ref = n(x)
    assert decode.fuse_rms_norms(nn.Sequential(n)) == 1 and decode.fuse_rms_norms(nn.Sequential(n)) == 0
    out = n(x)
    assert out.dtype == torch.float16
    assert rel_error(out.double(), ref.double()) < 2e-3
    wrong = torch.nn.functional.rms_norm(x, (64,), n.weight.detach(), 1e-6)   # Gemma's 1 + w forgotten
    assert arch != "gemma2_9b" or rel_error(wrong.double(), ref.double()) > 0.1
    # what the timed decode step runs per layer besides the linears (experiments/tilus_fig12/nongemm_ops.py):
    # each norm one operation (one kernel on the GPU), Gemma's decode attention reads the cache in place
    from experiments.tilus_fig12.nongemm_ops import per_layer
    layer, fixed, names = per_layer(arch)
    assert layer["norms"] == (4 if arch.startswith("gemma") else 2)
    assert layer["attention"] == (7 if arch.startswith("gemma") else 1)   # SDPA where nothing is soft-capped
    assert "repeat_interleave" not in names["attention"]


def test_an_rms_norm_of_another_formula_keeps_its_own_forward():
    class OddRMSNorm(nn.Module):          # a norm named like one but computing something else
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(16))
            self.eps = 1e-6

        def forward(self, x):
            return x * self.weight

    m = OddRMSNorm()
    assert decode.fuse_rms_norms(nn.Sequential(m)) == 0
    x = torch.randn(3, 16)
    assert torch.equal(m(x), x)


def test_kv_bytes_of_a_step_respect_sliding_windows():
    c = card("gemma2_9b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    from harness.engines.model import build_model
    cfg = build_model(c, layers=2, dtype="f16", device="cpu").config      # layer_types: sliding, full
    assert list(cfg.layer_types[:2]) == ["sliding_attention", "full_attention"]
    cfg.sliding_window = 8
    kv = StaticKV(cfg, 2, 3, 21, torch.float16, "cpu")
    per_pos = 3 * cfg.num_key_value_heads * cfg.head_dim * 2 * 2           # K and V, f16
    assert kv.step_bytes(cfg, 21) == (8 + 21) * per_pos
    assert kv.step_bytes(cfg, 5) == (5 + 5) * per_pos == kv.nbytes * 10 // 42


def test_native_is_planned_in_cuda_graphs_and_prepared_once_for_every_batch_size(monkeypatch):
    import harness.engines.quantized as Q
    h200 = GpuSpec.load("h200")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=tilus_fig12", "model=gemma2_9b", "precision=u4"])
    spec = ExperimentSpec.from_cfg(cfg.experiment)
    assert "native" in spec.kernels
    ctx = Context(spec, card("gemma2_9b"), prec("u4"), h200, tuple(spec.kernels), "cuda")
    pts = LlmE2E().points(ctx)
    mode = {(p.impl, p.phase, p.batch): p.params_dict["mode"] for p in pts if not p.skip_reason}
    assert mode[("native", "decode", 1)] == mode[("native", "decode", 16)] == "cuda_graph"
    assert mode[("native", "prefill", 1)] == "eager" and mode[("tilus", "decode", 1)] == "eager"
    # a prepared fn that serves every M (native's) is prepared once per linear, not once per batch size
    calls = []
    real_get = Q.get

    def get(name):
        prep = real_get(name)
        return lambda p: calls.append(p.M) or prep(p)

    monkeypatch.setattr(Q, "get", get)
    monkeypatch.setattr(Q, "ANY_M", {"triton_lowbit"})
    c = card("llama3_1_8b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("u4", 32), "triton", layers=1, device="cpu")
    for M in (1, 16, 80, 1):
        qm.prepare(M)
    assert calls == [1] * 4 and all(l.prepared_M == 1 for l in qm.linears)
    # a prefill's numerics check takes the kernel path its timed step takes (native: decode kernel up to 16 rows)
    monkeypatch.setattr(Q, "ANY_M", set())
    qm.prepare(80)
    qm.linears[0].prepared.fn.decode_ok = lambda M: M <= 16
    use_static_attention(qm.model)
    job = type("J", (), {"p": {"check_tokens": 16, "logits_tol": 0.1}, "card": c})()
    shapes = []
    monkeypatch.setattr(Q, "step_inputs", lambda vocab, B, T, dev, seed: shapes.append((B, T)) or
                        torch.randint(1, vocab, (B, T)))
    pt = type("P", (), {"phase": "prefill", "batch": 1, "seq_len": 80, "M": 80})()
    LlmE2E()._check(qm, pt, type("C", (), {"seed": 0})(), job, prec("u4", 32), "cpu")
    assert shapes == [(1, 32)]


def test_a_transposed_kernel_output_reaches_the_model_row_major(monkeypatch):
    """native's prefill path returns y^T's transposed view (strides (1, M)); left so, every op after the linear
    inherits the layout and SDPA's query has stride(-1) = M, which rules out its fused kernels (the GPU falls
    back to the f32 math path): the engine hands the model a row-major y, same values."""
    c = card("qwen2_5_32b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("f16"), "cublas", layers=1, device="cpu", initializer_range=0.1)
    T = 12
    qm.prepare(T)
    prepare_inference(qm.model)
    ids = torch.randint(1, c.vocab_size, (1, T))

    def prefill():
        step = decode.Step(qm.model, StaticKV(qm.config, qm.layers, 1, T, torch.float16, "cpu"), 1, T, 0)
        step.set_ids(ids)
        return step.eager().clone()

    ref = prefill()
    for lin in qm.linears:                      # the same values in native's prefill layout
        fn = lin.prepared.fn
        lin.prepared.fn = lambda x, fn=fn: fn(x).t().contiguous().t()
    x = torch.randn(T, 64).half()
    assert qm.linears[0].prepared.fn(x).stride() == (1, T)
    assert qm.linears[0](x).is_contiguous() and qm.linears[2](x[None]).is_contiguous()
    strides = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: strides.append((q.stride(-1), k.stride(-1), v.stride(-1))) or
                        sdpa(q, k, v, **kw))
    assert torch.equal(prefill(), ref)
    assert strides == [(1, 1, 1)]


def test_oom_rule_is_the_artifacts_and_planned_without_building():
    h200, l40s, h100 = GpuSpec.load("h200"), GpuSpec.load("l40s"), GpuSpec.load("h100_sxm")
    llama, qwen = card("llama3_3_70b"), card("qwen2_5_32b")
    # paper's L40S (48 GB): Qwen2.5-32B f16, Llama-3-70B f16 and u8 are OOM, u4 fits (results/paper/tilus_e2e.csv)
    assert weights_oom(qwen, 16, l40s.memory_bytes) and weights_oom(llama, 8, l40s.memory_bytes)
    assert not weights_oom(llama, 4, l40s.memory_bytes)
    assert not weights_oom(qwen, 16, h200.memory_bytes) and weights_oom(llama, 16, h200.memory_bytes)
    # paper's H100 80GB (Fig. 13): Qwen2.5-32B f16 ran (65.5 GB of weights under 0.8 x 85.9e9 bytes); the card's GB
    # counted as 1e9 bytes would have made it an oom row
    assert not weights_oom(qwen, 16, h100.memory_bytes) and weights_oom(qwen, 16, h100.memory_gb * 1e9)
    assert abs(param_count(llama) - 70.55e9) < 0.1e9
    # planned for the H200 (no GPU touched), run: an `oom` row at once
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=tilus_fig12", "model=llama3_3_70b", "precision=f16"])
    ctx = Context(ExperimentSpec.from_cfg(cfg.experiment), llama, prec("f16"), h200, ("cublas", "triton"), "cuda")
    bench = LlmE2E()
    pts = bench.points(ctx)
    dense = [p for p in pts if p.impl == "cublas"]
    assert len(dense) == 3 and all(p.skip_reason.startswith("oom:") for p in dense)
    assert all(p.model_layers == 80 for p in pts)
    metrics, status, err = run_point(bench, dense[0], ctx)
    assert status == "oom" and "0.8 x 141 GiB" in err
    ctx_u4 = Context(ctx.experiment, llama, prec("u4"), h200, ("cublas", "triton"), "cuda")
    assert not any(p.skip_reason for p in bench.points(ctx_u4) if p.impl == "triton")


def test_model_layers_caps_the_step_over_the_experiments_caps():
    """`model.layers=N` (ModelCard.layers) wins over experiment.params.layers and, on a CPU, over
    experiment.cpu.layers; the points (and the OOM decision) use the cap."""
    import dataclasses
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=tilus_fig12", "model=llama3_3_70b",
                                                      "precision=f16", "experiment.params.layers=8", "model.layers=2"])
    exp, llama, h200 = ExperimentSpec.from_cfg(cfg.experiment), ModelCard.from_cfg(cfg.model), GpuSpec.load("h200")
    assert llama.layers == 2 and exp.params["layers"] == 8 and exp.cpu["layers"] == 1
    bench = LlmE2E()
    pts = bench.points(Context(exp, llama, prec("f16"), h200, ("cublas",), "cuda"))
    assert pts and {p.model_layers for p in pts} == {2}
    assert not any(p.skip_reason for p in pts)          # f16 Llama-3.3-70B fits the H200 at 2 of its 80 layers
    whole = dataclasses.replace(llama, layers=None)      # without model.layers: experiment.params.layers
    pts = bench.points(Context(exp, whole, prec("f16"), h200, ("cublas",), "cuda"))
    assert {p.model_layers for p in pts} == {8} and not any(p.skip_reason for p in pts)
    # on a CPU: over experiment.cpu.layers (1); at most the card's own layers
    for cap, want in ((3, 3), (None, 1), (500, 80)):
        c = dataclasses.replace(llama, layers=cap)
        pts = bench.points(Context(exp, c, prec("f16"), h200, ("cublas",), "cpu"))
        assert {p.model_layers for p in pts} == {want}, cap


def test_bad_steps_and_skip_rules_are_refused_before_any_work():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for bad in ["experiment.params.steps=[{phase: decod, batch: 1, seq_len: 8}]",
                    "experiment.params.skip=[{kernel: tilus}]", "experiment.params.layers=0",
                    "+experiment.params.repeat=3"]:
            cfg = compose(config_name="config", overrides=["experiment=tilus_fig12", "run.device=cpu", bad])
            with pytest.raises(ConfigError):
                build_context(cfg, plan_only=True)


def test_the_benchmark_runs_through_the_cli_on_cpu(tmp_path):
    from harness.store import load_experiment
    r = subprocess.run([sys.executable, "-m", "harness", "experiment=tilus_fig12", "model=gemma2_9b", "run.device=cpu",
                        f"run.results_dir={tmp_path}", "run.progress=false"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    df = load_experiment(tmp_path / "cpu" / "tilus_fig12")
    assert set(df["device"]) == {"cpu-interpreter"}
    pts = df.drop_duplicates("point_hash").set_index(["impl", "phase", "batch"])["status"]
    assert (pts.loc[["cublas", "triton"]] == "ok").all()
    assert pts.loc["torch_int4"].eq("unsupported").all()            # bf16-only kernel beside f16 activations
    assert pts.loc["native"].eq("unavailable").all()                # a status row without a GPU, never a crash
    err = df[df["impl"] == "native"]["error"].iloc[0]
    assert "CUDA GPU" in err
    ok = df[df["status"] == "ok"]
    for m in ("latency_ms", "predicted_ms", "gemm_ms", "nongemm_ms", "weight_bytes", "linear_rel_err"):
        assert ok[ok["metric"] == m].shape[0] == 6, m
    # the logits against the float64-linears model once per model build (its first point); every point checks
    # its linears (the build's first point: all of them; the others: the first of each distinct shape)
    lg = ok[ok["metric"] == "logits_rel_err"]
    assert sorted(lg["impl"]) == ["cublas", "triton"] and set(lg["phase"]) == {"decode"} and set(lg["batch"]) == {1}
    assert (lg["value"] < 0.1).all()
    which = ok[ok["metric"] == "linear_rel_err"].set_index(["impl", "phase", "batch"])["impl_config"]
    assert which.loc[("triton", "decode", 1)] == "every linear"
    assert which.loc[("triton", "prefill", 1)] == "the first linear of each distinct shape"
    u4 = ok[(ok["impl"] == "triton") & (ok["metric"] == "weight_bytes")]["value"]
    f16 = ok[(ok["impl"] == "cublas") & (ok["metric"] == "weight_bytes")]["value"]
    assert u4.max() < f16.min()
    assert set(ok["model_layers"]) == {1} and set(ok["params"].map(lambda s: '"mode": "eager"' in s)) == {True}
    # the figure and table code runs on rows of this shape (CPU rows relabelled in memory only: never drawn as
    # performance anywhere else)
    import experiments.tilus_fig12.figures as f12
    import experiments.tilus_fig13.figures as f13
    from harness.provenance import ROOT
    d = df.assign(device="cuda", gpu="h200")
    d.attrs["results_dir"] = str(ROOT / "results")
    import matplotlib.pyplot as plt
    q = d.assign(model="qwen2_5_32b")           # Fig. 13 draws Qwen2.5-32B only
    q.attrs = d.attrs
    for fn, rows in ((f12.fig12, d), (f12.fig12_speedup, d), (f13.fig13, q)):
        fig = fn(rows)
        assert fig is not None
        plt.close(fig)
    t = f12.targets(d)
    assert set(t["impl"]) == {"triton"} and len(t) == 3 and t["speedup"].notna().all()
    assert not f12.split(d).empty and not f12.vs_paper(d, ROOT / "results" / "paper").empty


def test_native_prefill_rows_from_before_the_layout_fix_are_flagged():
    import pandas as pd
    from experiments.tilus_fig12.figures import PRE_FIX_NOTE, split, steps
    base = dict(status="ok", gpu="h200", model="qwen2_5_32b", batch=1, seq_len=2048, weight_dtype="u4",
                model_layers=64, p10=1.0, p90=1.0, params='{"mode": "eager"}', impl_config="")
    rows = []
    before, after = "2026-12-01T06:28:21+00:00", "2026-12-02T00:00:00+00:00"      # the fix: 2026-12-01 06:32 UTC
    for impl, phase, ts in [("native", "prefill", before), ("native", "prefill", after), ("native", "decode", before),
                            ("triton", "prefill", before)]:
        for metric, v in (("latency_ms", 2.0), ("predicted_ms", 1.0)):
            rows.append(dict(base, impl=impl, phase=phase, ts_utc=ts, metric=metric, value=v,
                             model=base["model"] if ts < "2026-12-02" else "gemma2_9b"))
    s = steps(pd.DataFrame(rows)).set_index(["model", "impl", "phase"])["pre_fix"]
    assert s.to_dict() == {("gemma2_9b", "native", "prefill"): False, ("qwen2_5_32b", "native", "decode"): False,
                           ("qwen2_5_32b", "native", "prefill"): True, ("qwen2_5_32b", "triton", "prefill"): False}
    assert (split(pd.DataFrame(rows))["note"] == PRE_FIX_NOTE).sum() == 1


def test_the_logits_are_checked_once_per_build_and_each_distinct_linear_shape_at_every_point(monkeypatch):
    """A build's first point: every linear and the logits against float64; its later points: the first linear
    of each distinct shape (at that point's M, the kernel it times), the others running the kernel."""
    c = card("llama3_1_8b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    qm = build_quantized(c, prec("u4", 32), "triton", layers=2, device="cpu")
    use_static_attention(qm.model)
    job = type("J", (), {"p": {"check_tokens": 16, "logits_tol": 0.1}, "card": c})()
    ctx = type("C", (), {"seed": 0})()
    checked = []
    for M in (1, 2):
        qm.prepare(M)
        pt = type("P", (), {"phase": "decode", "batch": M, "seq_len": 16, "M": M})()
        lin_err, logit_err = LlmE2E()._check(qm, pt, ctx, job, prec("u4", 32), "cpu")
        checked.append([bool(lin.check_errors) for lin in qm.linears])
        assert 0 < lin_err < 2e-3 and (logit_err is None) == (M == 2)
    assert checked[0] == [True] * 8
    assert checked[1] == [True] * 4 + [False] * 4         # layer 0 holds one linear of each shape
    assert all(lin.mode == "kernel" for lin in qm.linears) and qm.logits_checked


def test_triton_packs_each_linear_once_per_build_and_every_step_runs_what_a_fresh_prepare_gives(monkeypatch):
    """Our Triton kernel's layout does not depend on M, only its config does: a build packs each linear once (its
    first point) and its later points choose their config on that packing, the only copy alive, without the
    canonical weight (not kept) being regenerated for it. At every M: the same words, the config and the outputs
    of a fresh, uncached prepare of the same weight."""
    import weakref

    from harness.impls import Problem, get
    from kernels.lowbit import triton_matmul as tm
    packs, made = [], []
    real_prepare, real_make = tm.prepare, FusedLinear.make_weight
    monkeypatch.setattr(tm, "prepare", lambda qw: packs.append(qw) or real_prepare(qw))
    monkeypatch.setattr(FusedLinear, "make_weight", lambda self: made.append(self) or real_make(self))
    c = card("qwen2_5_32b", hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)
    p = prec("u4", 32)
    qm = build_quantized(c, p, "triton", layers=1, device="cpu", keep_weights=False)
    n = len(qm.linears)
    qm.prepare(1)
    assert len(packs) == n and len(made) == n        # built once, packed once, the canonical weight dropped
    packed = [lin.prepared.fn.packed for lin in qm.linears]
    assert all(lin._weight is None for lin in qm.linears)
    for M in (1, 2, 80):                              # the CPU steps: decode 1 and 2, prefill 80
        old = [weakref.ref(lin.prepared.fn) for lin in qm.linears]
        before = (len(packs), len(made))
        qm.prepare(M)
        assert (len(packs), len(made)) == before      # nothing packed or regenerated again
        assert all(lin.prepared.fn.packed is pw for lin, pw in zip(qm.linears, packed))
        assert M == 1 or all(r() is None for r in old)   # the previous step's prepared fn is gone
        for lin, pw in zip(qm.linears, packed):
            fresh = get("triton")(Problem(M, lin.K, lin.N, p, real_make(lin), "cpu", tune_per_path=0))
            fw = fresh.fn.packed
            assert fw is not pw and len(fw.parts) == len(pw.parts)
            assert all(torch.equal(a, b) for a, b in zip(fw.parts, pw.parts))
            assert torch.equal(fw.scales, pw.scales) and torch.equal(fw.zeros, pw.zeros)
            assert (fw.fold, fw.tn, fw.tkw, fw.group) == (pw.fold, pw.tn, pw.tkw, pw.group)
            assert lin.config() == fresh.config_for(M) == tm.config_str(tm.choose_config(M, pw))
            x = torch.randn(M, lin.K, generator=torch.Generator().manual_seed(M)).half()
            assert torch.equal(lin.prepared.fn(x), fresh.fn(x))
    assert [lin.config().split(":")[0] for lin in qm.linears] == ["deq_mm"] * n
    assert len(packs) == 4 * n                        # only the fresh prepares above packed again
