"""Every model x precision config composes and gives the right shapes; bad input fails early."""
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from harness.runner import build_context
from harness.shapes import linear_layers
from harness.specs import CONF_DIR, ConfigError, ModelCard, Precision, choices

MODELS = choices("model")
PRECISIONS = choices("precision")


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_every_paper_model_has_a_card():
    assert set(MODELS) == {"llama3_70b", "llama3_3_70b", "llama3_1_8b", "gemma2_9b", "gemma3_4b", "qwen2_5_32b",
                           "qwq_32b", "qwen3_30b_a3b", "gpt_oss_20b", "mistral_7b", "phi3_5_mini",
                           "smollm2_1_7b", "tinyllama_1_1b", "zephyr_7b"}


@pytest.mark.parametrize("model,expected", [
    ("llama3_70b", {"qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344), "down": (28672, 8192)}),
    ("llama3_3_70b", {"qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344), "down": (28672, 8192)}),
    ("gemma2_9b", {"qkv": (3584, 8192), "o": (4096, 3584), "gate_up": (3584, 28672), "down": (14336, 3584)}),
    ("qwen2_5_32b", {"qkv": (5120, 7168), "o": (5120, 5120), "gate_up": (5120, 55296), "down": (27648, 5120)}),
    ("qwq_32b", {"qkv": (5120, 7168), "o": (5120, 5120), "gate_up": (5120, 55296), "down": (27648, 5120)}),
    ("llama3_1_8b", {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}),
    ("qwen3_30b_a3b", {"qkv": (2048, 5120), "o": (4096, 2048), "expert_gate_up": (2048, 1536),
                       "expert_down": (768, 2048)}),
    ("gpt_oss_20b", {"qkv": (2880, 5120), "o": (4096, 2880), "expert_gate_up": (2880, 5760),
                     "expert_down": (2880, 2880)}),
])
def test_layer_shapes_match_vllm_fusion(model, expected):
    card = ModelCard.from_cfg(_compose(f"model={model}").model)
    assert {l.name: (l.K, l.N) for l in linear_layers(card)} == expected


@pytest.mark.parametrize("model", MODELS)
def test_every_card_builds_its_hf_config(model):
    pytest.importorskip("transformers")
    from harness.hf import hf_config
    card = ModelCard.from_cfg(_compose(f"model={model}").model)
    cfg = hf_config(card)
    assert cfg.hidden_size == card.hidden_size and cfg.num_hidden_layers == card.num_layers
    assert cfg.num_key_value_heads == card.num_kv_heads and cfg.vocab_size == card.vocab_size


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_model_x_precision_plans(precision):
    """The matmul sweep plans for every model card with this precision, with every layer's shape."""
    for model in MODELS:
        cfg = _compose("experiment=gemm_shapes", f"model={model}", f"precision={precision}",
                       "run.device=cpu")
        cfg.experiment.kernels = ["triton" if precision not in ("f16", "bf16") else "cublas"]
        cfg.experiment.cpu = {"max_K": 10**9, "max_N": 10**9, "max_M": 10**9}   # plan the real shapes
        card = ModelCard.from_cfg(cfg.model)
        g = cfg.precision.group_size
        if cfg.precision.kind != "dense" and g > 0 and any(l.K % g for l in linear_layers(card)):
            with pytest.raises(ConfigError, match="does not divide K"):   # e.g. gpt-oss K=2880, g=128
                build_context(cfg)
            continue
        ctx, _, points = build_context(cfg)
        want = {(l.name, l.K, l.N) for l in linear_layers(card)}
        assert {(p.layer, p.K, p.N) for p in points} == want
        assert {p.M for p in points} == {1, 16, 2048}
        prec = ctx.precision
        assert all(p.weight_dtype == prec.weight_dtype and p.group_size == prec.group_size for p in points)


def test_precision_semantics():
    i4 = Precision.from_cfg(_compose("precision=i4").precision)
    assert (i4.kind, i4.bits, i4.group_size) == ("int", 4, 128)
    # 4-bit codes + f16 group-128 scales at K=8192, N=57344: the 242 MB floor of results/paper/design_h200.csv's shape
    assert i4.weight_bytes(8192, 57344) == 8192 * 57344 // 2 + 2 * 64 * 57344
    f6 = Precision.from_cfg(_compose("precision=f6e3m2").precision)
    assert (f6.exp_bits, f6.man_bits, f6.group_size) == (3, 2, -1)
    assert Precision.from_cfg(_compose("precision=u3").precision).weight_bytes(128, 8) == 128 * 8 * 3 // 8 + 4 * 8
    for name in PRECISIONS:
        Precision.from_cfg(_compose(f"precision={name}").precision)


@pytest.mark.parametrize("overrides,needle", [
    (["precision=u4", "precision.bits=9"], "the name 'u4' means kind=uint bits=4"),
    (["precision=f6e3m2", "precision.man_bits=3"], "the name 'f6e3m2' means kind=float bits=6 exp_bits=3 man_bits=2"),
    (["precision=u4", "precision.group_size=100"], "group_size=100 does not divide K=8192"),
    (["experiment.M=[0,16]"], "experiment.M: 0 must be >= 1"),
    (["experiment.M=abc"], "experiment.M: 'abc' is not an integer"),
    (["experiment.M=[1.5]"], "experiment.M: 1.5 is not an integer"),
    (["timing.samples=0"], "timing.samples=0 must be >= 1"),
    (["run.resume=maybe"], "run.resume='maybe' is not a boolean"),
    (["run.seed=abc"], "run.seed='abc' is not an integer"),
    (["kernel=tilus"], "kernel=tilus is not among experiment gemm_shapes's kernels"),
    (["precision=u4", "precision.act_dtype=f32"], "act_dtype='f32'"),
    (["experiment.kernels=[cublas,nope]"], "unknown kernel 'nope'"),
])
def test_bad_values_fail_while_planning(overrides, needle):
    cfg = _compose("experiment=gemm_shapes", "model=llama3_70b", "run.device=cpu", *overrides)
    with pytest.raises(ConfigError, match=None) as e:
        build_context(cfg)
    assert needle in str(e.value)


def test_proton_fig15_native_buffer_records_auto_and_integers_plan():
    """native_buffer_records: 'auto' (the default: each kernel's buffer holds what it writes) and accepted integers,
    one point per value and mode."""
    cfg = _compose("experiment=proton_fig15", "run.device=cpu", "experiment.params.suite=[]",
                   "experiment.params.native=[softmax]", "experiment.params.native_modes=[staged]")
    assert list(cfg.experiment.params.native_buffer_records) == ["auto"]
    _, _, points = build_context(cfg)
    assert [dict(p.params).get("buffer_records") for p in points if p.workload == "softmax"] == [None, "auto"]
    cfg.experiment.params.native_buffer_records = ["auto", 1024]
    _, _, points = build_context(cfg)
    assert [dict(p.params).get("buffer_records") for p in points if p.workload == "softmax"] == [None, "auto", 1024]


@pytest.mark.parametrize("args,needle", [
    (["experiment=gemm_shapes", "model=llama3_70b,nosuchmodel", "-m"], "unknown model 'nosuchmodel'; valid model choices: gemma2_9b"),
    (["experiment=gemm_shapes", "precision=u9"], "unknown precision 'u9'; valid precision choices: bf16"),
    (["experiment=gemm_shapes", "precision=u4", "precision.group_size=100"], "does not divide K"),
    (["experiment=gemm_shapes", "timing.sampels=3", "-m"], "Could not override 'timing.sampels'"),
    (["experiment=gemm_shapes", "timing.sampels=3"], "Could not override 'timing.sampels'"),
    (["experiment=gemm_shapes", "hydra/launcher=nosuch", "-m"], "Could not find 'hydra/launcher/nosuch'"),
    (["experiment=gemm_shapes", "timing.samples=-1", "-m"], "timing.samples=-1 must be >= 1"),
    # a GPU value that the experiment's `cpu:` block replaces on this machine is still checked
    (["experiment=proton_fig13", "experiment.params.layers=abc"], "layers='abc' must be a positive integer"),
    (["experiment=tilus_fig12", "experiment.params.decode_repeats=abc"], "decode_repeats='abc' is not an integer"),
    (["experiment=tilus_fig13", "experiment.params.decode_graph_repeats=0"], "decode_graph_repeats=0 must be >= 1"),
    (["experiment=proton_fig8", "experiment.params.K=[abc]"], "experiment.params.K: 'abc' is not a number"),
    (["experiment=proton_fig15", "experiment.params.native_buffer_records=[abc]"],
     "experiment.params.native_buffer_records: buffer_records must be an integer >= 16"),
    (["experiment=proton_fig15", "experiment.params.native_buffer_records=[8]"],
     "experiment.params.native_buffer_records: buffer_records must be an integer >= 16"),
    (["experiment=proton_fig15", "experiment.params.native_buffer_records=[1026]"],
     "and a multiple of 4 (whole 32-byte sectors), got 1026"),
    (["experiment=proton_fig15", "experiment.params.spin_cycles=abc"], "experiment.params.spin_cycles='abc' is not an integer"),
])
def test_cli_rejects_bad_input_with_valid_choices(args, needle, tmp_path):
    flags = [a for a in args if a.startswith("-")]
    args = [a for a in args if not a.startswith("-")] + [f"run.results_dir={tmp_path}", "run.device=cpu"] + flags
    r = subprocess.run([sys.executable, "-m", "harness", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr          # one line, no traceback
    assert not any(tmp_path.iterdir()), "nothing may be measured or written for a bad config"


def test_a_results_dir_that_cannot_be_written_stops_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    for bad, needle in ((tmp_path / "afile", "is a file, not a folder"), ("/proc/nope", "cannot write to /proc/nope")):
        r = subprocess.run([sys.executable, "-m", "harness", "experiment=smoke", f"run.results_dir={bad}",
                            "run.device=cpu"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("card,needle", [
    (dict(name="f2e1m0", kind="float", bits=2, exp_bits=1, man_bits=0), "3 <= bits <= 8"),
    (dict(name="u4", kind="uint", bits=3, exp_bits=0, man_bits=0), "the name 'u4' means kind=uint bits=4"),
    (dict(name="f6e3m2", kind="float", bits=6, exp_bits=2, man_bits=3), "means kind=float bits=6 exp_bits=3 man_bits=2"),
    (dict(name="i4", kind="uint", bits=4, exp_bits=0, man_bits=0), "means kind=int"),
    (dict(name="f16", kind="dense", bits=8, exp_bits=0, man_bits=0), "dense weights are named"),
])
def test_a_precision_card_must_agree_with_its_name(card, needle):
    with pytest.raises(ConfigError, match=None) as e:
        Precision.from_cfg(dict(card, act_dtype="f16", group_size=-1))
    assert needle in str(e.value)


def test_every_precision_card_agrees_with_its_name():
    for p in PRECISIONS:
        Precision.from_cfg(_compose(f"precision={p}").precision)     # raises on a disagreement


def test_help_lists_groups_and_choices():
    r = subprocess.run([sys.executable, "-m", "harness", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for group in ("experiment:", "model:", "precision:", "gpu:", "kernel:"):
        assert group in r.stdout
    assert "llama3_70b" in r.stdout and "f6e3m2" in r.stdout
    assert "tilus_fig10" in r.stdout and "Kernel speedup over cuBLAS" in r.stdout     # what each experiment does
    assert r.stdout.count("python -m harness experiment=") >= 2                        # examples


def test_multirun_fails_before_any_job_when_a_later_job_is_bad(tmp_path):
    """llama3_70b would run; gpt_oss_20b has no gate_up layer: nothing may run at all."""
    r = subprocess.run([sys.executable, "-m", "harness", "experiment=tilus_fig10", "model=llama3_70b,gpt_oss_20b",
                        f"run.results_dir={tmp_path}", "run.device=cpu", "-m"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "in job [experiment=tilus_fig10 model=gpt_oss_20b" in r.stderr
    assert "valid layers: qkv, o, expert_gate_up, expert_down" in r.stderr
    assert not any(tmp_path.iterdir())


def test_preflight_expands_the_experiments_own_sweep():
    from harness.preflight import expand_jobs
    jobs = expand_jobs(["experiment=tilus_fig10", "model=llama3_70b,qwen2_5_32b"])
    assert len(jobs) == 2 * 6
    assert ["experiment=tilus_fig10", "model=qwen2_5_32b", "precision=u1"] in jobs


@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p not in ("f16", "bf16")])
@pytest.mark.parametrize("group", [32, -1])
def test_roofline_bytes_match_the_stored_weight(precision, group):
    """The floor's byte count (Precision.weight_bytes) is what the quantized weight really stores."""
    from kernels.lowbit.formats import parse_format, random_quantized
    prec = Precision.from_cfg(_compose(f"precision={precision}").precision).with_group(group)
    qw = random_quantized(256, 64, parse_format(precision), group, seed=1)
    assert prec.weight_bytes(256, 64) == qw.nbytes
