"""llm_profile (Proton Figs. 13/14): the real engines on tiny cards on the CPU, the benchmark through
the harness CLI, and bad configs refused before any work."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.engines.measure import measure_safely
from harness.engines.model import build_model, tiny_card
from harness.engines.profilers import hatchet_kernel_launches
from harness.engines.train import make_infer, make_train
from harness.runner import build_context
from harness.specs import CONF_DIR, ConfigError, ModelCard
from harness.store import done_hashes, load_experiment


def _card(name):
    return ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))


def _tiny(name, layers=2):
    return build_model(tiny_card(_card(name)), layers=layers, dtype="f32", device="cpu", seed=0)


def test_lora_train_step_moves_only_the_adapters():
    built = _tiny("tinyllama_1_1b")
    wl = make_train(built, batch=1, seq_len=16, grad_accum=2, lora_r=4, lora_alpha=4)
    assert wl.info["lora_targets"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    chk = wl.check()                                   # one hand-made step: grads on every LoRA tensor, B moves
    assert chk["lora_tensors"] == 2 * 7 * 2 and chk["lora_moved"] == chk["lora_tensors"]
    lora = {n: p.detach().clone() for n, p in built.model.named_parameters() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in built.model.named_parameters() if "lora_" not in n}
    wl.unit()
    after = dict(built.model.named_parameters())
    assert all(not torch.equal(v, after[n]) for n, v in lora.items())           # every adapter tensor moved
    assert all(torch.equal(v, after[n]) for n, v in base.items())               # the base model did not
    assert all(after[n].grad is None for n in lora)                             # zero_grad(set_to_none) ran
    assert wl.info["trainable_params"] == sum(v.numel() for v in lora.values())


def test_moe_card_adapts_its_expert_parameters():
    built = _tiny("qwen3_30b_a3b", layers=1)
    wl = make_train(built, batch=1, seq_len=8, grad_accum=1)
    assert "mlp.experts.gate_up_proj" in wl.info["lora_targets"] and "mlp.experts.down_proj" in wl.info["lora_targets"]
    assert wl.check()["lora_moved"] > 0


@pytest.fixture
def restore_transformers():
    """liger-kernel patches module globals of transformers (e.g. apply_rotary_pos_emb): undo it after the test."""
    import importlib

    from harness.engines.measure import PRELOAD
    for m in PRELOAD:                       # the paper's architectures, imported before the snapshot
        importlib.import_module(m)
    saved = {n: dict(vars(m)) for n, m in list(sys.modules.items()) if n.startswith("transformers.models.")}
    yield
    for n, d in saved.items():
        mod = sys.modules[n]
        for k, v in d.items():
            if vars(mod).get(k) is not v:
                setattr(mod, k, v)


@pytest.mark.parametrize("name,expect", [("llama3_1_8b", "swiglu"), ("gemma3_4b", "geglu"), ("phi3_5_mini", "swiglu"),
                                         ("qwen3_30b_a3b", "rms_norm"), ("gpt_oss_20b", "rope")])
def test_liger_patches_every_paper_architecture(name, expect, restore_transformers):
    """liger-kernel's Triton kernels cannot run on the CPU, but patching them into each card's model (what
    the GPU runs do) is checked here: the ops are patched and the LoRA wrapping still finds its targets."""
    pytest.importorskip("liger_kernel")
    from harness.engines.train import apply_liger
    built = _tiny(name, layers=1)
    ops = apply_liger(built.model)
    assert expect in ops and "fused_linear_cross_entropy" in ops
    assert ("swiglu" in ops) == (name in ("llama3_1_8b", "phi3_5_mini"))      # MoE experts stay on grouped_mm
    assert built.model.forward.__func__.__module__.startswith("liger_kernel")   # the fused-loss forward is bound
    wl = make_train(built, batch=1, seq_len=8, grad_accum=1)
    assert wl.info["lora_tensors"] > 0


def test_cached_decode_matches_a_full_forward():
    built = _tiny("gemma3_4b")
    wl = make_infer(built, batch=2, seq_len=12, decode_tokens=3)
    chk = wl.check()
    assert chk["decode_rel_err_max"] < 1e-4
    wl.unit()


def test_measure_times_both_regions_and_counts_the_torch_trace(tmp_path):
    card = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "smollm2_1_7b.yaml"))
    spec = dict(card=card, tiny=True, layers=1, dtype="f32", device="cpu", workload="train", batch=1, seq_len=8,
                knobs={"grad_accum": 1, "warmup": 0}, liger=False, target_s=0.01, max_units=2, residual=True,
                profiler={"kind": "torch", "options": {"activities": ["cpu", "cuda"], "record_shapes": True,
                                                       "profile_memory": True}},
                out_dir=str(tmp_path), stem="torch")
    res = measure_safely(spec)
    assert res["status"] == "ok", res
    trace = tmp_path / "torch.json"
    assert res["files"] == {str(trace): trace.stat().st_size} and res["profile_bytes"] == trace.stat().st_size > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)          # the region's ops are in it
    assert res["activities"] == ["cpu"]                                          # no CUDA activity on a CPU build
    assert 1 <= res["units"] <= 2 and min(res["baseline_s"], res["region_s"], res["residual_s"]) > 0
    assert res["finalize_s"] > 0 and res["stack"] == "hf+peft"


def test_regions_carry_the_hosts_counters_and_options_apply(tmp_path):
    import gc
    import os
    card = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tinyllama_1_1b.yaml"))
    cpu = sorted(os.sched_getaffinity(0))[-1]
    spec = dict(card=card, tiny=True, layers=1, dtype="f32", device="cpu", workload="infer", batch=1, seq_len=8,
                knobs={"decode_tokens": 2, "warmup": 1}, liger=False, target_s=0.01, units=3, residual=False,
                profiler={"kind": "none"}, out_dir=str(tmp_path), stem="none", cpus=[cpu], gc_freeze=True)
    before = os.sched_getaffinity(0)
    try:
        res = measure_safely(spec)
    finally:                                          # the measurement ran in this process: undo its options
        os.sched_setaffinity(0, before)
        gc.unfreeze()
    assert res["status"] == "ok", res
    assert res["cpus"] == [cpu] and res["units"] == 3
    for reg in (res["baseline"], res["region"]):
        assert len(reg["unit_s"]) == 3 and abs(sum(reg["unit_s"]) - reg["s"]) < 1e-9
        assert len(reg["probe_s"]) == 4 and min(reg["probe_s"]) > 0          # before the first unit, after each
        assert reg["cpu_s"] > 0 and reg["gc_s"] >= 0 and reg["minflt"] >= 0 and reg["nivcsw"] >= 0
    assert res["baseline_s"] == res["baseline"]["s"] and res["region_s"] == res["region"]["s"]


def test_extra_baseline_processes_join_the_sample_and_model_layers_caps(tmp_path):
    cfg = _compose("experiment=proton_fig13", "model=tinyllama_1_1b", "run.device=cpu", "model.layers=1",
                   "experiment.params.baseline_processes=2", "experiment.params.profilers=[none]",
                   "experiment.params.workloads=[infer]", f"run.results_dir={tmp_path}")
    ctx, bench, pts = build_context(cfg)
    assert {p.model_layers for p in pts} == {1} and dict(pts[0].params)["baseline_processes"] == 2
    ms = {m.metric: m for m in bench.run(pts[0], ctx)}
    assert ms["baseline_region_s"].n_samples == 3 and ms["baseline_cv"].n_samples == 3   # none + 2 extra processes
    assert ms["overhead_hostnorm"].value > 0 and ms["baseline_probe_ms"].value > 0


def test_plain_subprocess_launcher_returns_the_same_result(tmp_path):
    """The fallback (and nsys') way: `python -m harness.engines.measure '<spec>'` in a new interpreter."""
    from harness.engines.measure import run_isolated
    card = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tinyllama_1_1b.yaml"))
    spec = dict(card=card, tiny=True, layers=1, dtype="f32", device="cpu", workload="infer", batch=1, seq_len=8,
                knobs={"decode_tokens": 2, "warmup": 0}, units=2, target_s=1.0, out_dir=str(tmp_path), stem="none")
    res = run_isolated(spec, launcher="subprocess", timeout_s=120)
    assert res["status"] == "ok", res
    assert res["launcher"] == "subprocess" and res["units"] == 2 and res["check"]["decode_rel_err"] < 1e-4


def test_a_failing_measurement_is_a_status_not_a_crash(tmp_path):
    card = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tinyllama_1_1b.yaml"))
    res = measure_safely(dict(card=card, tiny=True, layers=1, dtype="f32", device="cpu", workload="train", batch=1,
                              seq_len=8, knobs={"grad_accum": 1, "lora_r": 0}, out_dir=str(tmp_path), target_s=0.01))
    assert res["status"] == "error" and res["phase"] == "build" and "`r` should be a positive integer" in res["error"]


def test_proton_tree_launch_count():
    # the layout of a Proton hatchet file: [tree, device info]; kernels carry device metrics, frames none
    kern = lambda n, c: {"frame": {"name": n, "type": "function"}, "children": [],                   # noqa: E731
                         "metrics": {"count": c, "time (ns)": 10 * c, "device_id": "0", "device_type": "CUDA"}}
    tree = {"frame": {"name": "ROOT", "type": "function"}, "metrics": {}, "children": [
        {"frame": {"name": "train.py:step", "type": "function"}, "metrics": {}, "children": [kern("gemm", 7)]},
        kern("rms_norm", 5)]}
    assert hatchet_kernel_launches([tree, {"CUDA": {"0": {"arch": "90"}}}]) == 12


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("overrides,needle", [
    (["experiment.params.profilers=[none,bogus]"], "unknown profiler 'bogus'; valid: none, nsys, proton"),
    (["experiment.params.workloads=[decode]"], "workload 'decode'; valid: train, infer"),
    (["experiment.params.train.batch=0"], "train.batch=0 must be a positive integer"),
    (["experiment.params.layers=-2"], "layers=-2 must be a positive integer"),
    (["+experiment.params.infer.top_k=3"], "unknown infer knobs ['top_k']"),
    (["+experiment.params.sampels=3"], "unknown params ['sampels']"),
    (["precision=i4"], "llm_profile runs dense models; precision=i4"),
    (["experiment.params.shapes=[[1,abc]]"], "shapes="),
    (["experiment.params.stack=vllm"], "stack='vllm'; valid: auto"),
    (["experiment.params.baseline_processes=-1"], "baseline_processes=-1 must be an integer >= 0"),
    (["experiment.params.pin_cpus=100000"], "pin_cpus=100000, but this process may use"),
    (["experiment.params.pin_cpus=0"], "pin_cpus=0 must be a positive integer"),
    (["experiment.params.gc_freeze=maybe"], "gc_freeze='maybe' must be true or false"),
    (["model.layers=0"], "layers=0 must be a positive integer (a decoder-layer cap) or null"),
])
def test_bad_values_fail_while_planning(overrides, needle):
    # planned for a GPU (plan_only touches no device), so the CPU block does not replace the values
    cfg = _compose("experiment=proton_fig13", "model=tinyllama_1_1b", "run.device=cuda", *overrides)
    with pytest.raises(ConfigError) as e:
        build_context(cfg, plan_only=True)
    assert needle in str(e.value)


def test_the_paper_models_and_gpu_sizes_plan_without_a_gpu():
    cfg = _compose("experiment=proton_fig13", "model=llama3_3_70b", "run.device=cuda")
    _, _, pts = build_context(cfg, plan_only=True)
    train = [p for p in pts if p.workload == "train"]
    assert {p.profiler for p in pts} == {"none", "proton", "proton_python", "torch", "nsys"}
    assert {(p.batch, p.seq_len, p.model_layers) for p in train} == {(1, 256, 4)}   # per_model: the artifact's B1
    assert dict(train[0].params)["lora_r"] == 16 and dict(train[0].params)["grad_accum"] == 8


def _harness(*args, tmp):
    return subprocess.run([sys.executable, "-m", "harness", *args, f"run.results_dir={tmp}", "run.progress=false"],
                          capture_output=True, text=True, timeout=300)


def test_cli_on_cpu_runs_tiny_cards_and_says_what_cannot_run(tmp_path):
    # the default sweep is the paper's workload (LoRA training); inference (ours) is asked for
    assert list(_compose("experiment=proton_fig13").experiment.params.workloads) == ["train"]
    assert list(_compose("experiment=proton_noise").experiment.params.workloads) == ["train"]
    r = _harness("experiment=proton_fig13", "model=tinyllama_1_1b", "run.device=cpu",
                 "experiment.params.workloads=[train,infer]", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    df = load_experiment(tmp_path / "cpu" / "proton_fig13")
    pts = df.drop_duplicates("point_hash").set_index(["workload", "profiler"])
    assert set(df["device"]) == {"cpu-interpreter"} and set(df["model_layers"]) == {2}
    for w in ("train", "infer"):
        assert pts.loc[(w, "none"), "status"] == "ok" and pts.loc[(w, "torch"), "status"] == "ok"
        for p in ("proton", "proton_python"):
            assert pts.loc[(w, p), "status"] == "unavailable" and "no GPU" in pts.loc[(w, p), "error"]
        assert pts.loc[(w, "nsys"), "status"] == "unavailable" and "nsys" in pts.loc[(w, "nsys"), "error"]
    ok = df[df["status"] == "ok"].set_index(["workload", "profiler", "metric"])
    for w in ("train", "infer"):
        o = ok.loc[(w, "torch", "overhead")]
        assert o["n_samples"] == 2 and o["p10"] <= o["value"] <= o["p90"]      # baseline of 2 processes
        assert ok.loc[(w, "torch", "profile_bytes"), "value"] > 0
        assert ok.loc[(w, "torch", "finalize_s"), "value"] > 0
        assert ok.loc[(w, "none", "baseline_cv"), "n_samples"] == 2
        assert "liger-kernel not used: its Triton kernels need a CUDA GPU" in o["impl_config"]
    assert set(df[df["workload"] == "train"]["impl"]) == {"hf+peft"}
    assert not list((tmp_path / "cpu" / "proton_fig13" / "artifacts").rglob("*.json"))   # traces only measured

    assert len(done_hashes(tmp_path / "cpu" / "proton_fig13")) == 10    # every point final: a rerun measures nothing

    from experiments.proton_fig13 import figures as f13        # the figure code runs on real rows
    df.insert(0, "gpu", "cpu")
    assert f13.fig13(df) is not None and f13.fig14(df) is not None
    assert "TinyLlama-Chat" in set(f13.ordering(df)["model"])


def test_cli_refuses_a_bad_profiler_before_any_work(tmp_path):
    r = _harness("experiment=proton_fig13", "model=tinyllama_1_1b", "run.device=cpu",
                 "experiment.params.profilers=[none,perf]", tmp=tmp_path)
    assert r.returncode != 0 and "unknown profiler 'perf'" in r.stderr
    assert not any(tmp_path.iterdir())


def test_a_layer_cap_on_a_layer_shape_experiment_is_refused():
    cfg = _compose("experiment=gemm_shapes", "model=llama3_70b", "model.layers=4", "run.device=cuda")
    with pytest.raises(ConfigError) as e:
        build_context(cfg, plan_only=True)
    assert "model.layers=4: experiment gemm_shapes times layer shapes" in str(e.value)
