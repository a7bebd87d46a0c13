"""Every experiment plans on the CPU; smoke runs end to end (interpreter rows, merge, figure, report)."""
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from harness.report import build
from harness.runner import build_context
from harness.specs import CONF_DIR, choices
from harness.store import load_experiment


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("experiment", choices("experiment"))
def test_every_experiment_plans(experiment):
    cfg = _compose(f"experiment={experiment}", "run.device=cpu")
    ctx, bench, points = build_context(cfg)
    assert points and all(p.experiment == experiment for p in points)
    assert len({p for p in points}) == len(points)


def test_tilus_fig10_plans_the_papers_shapes_on_a_gpu_card():
    cfg = _compose("experiment=tilus_fig10", "precision=i4", "run.device=cpu")
    cfg.experiment.cpu = {"max_K": 10**9, "max_N": 10**9, "max_M": 10**9}
    _, _, points = build_context(cfg)
    assert {(p.K, p.N) for p in points} == {(8192, 8192), (8192, 57344), (28672, 8192)}
    assert {p.M for p in points} == {1, 16}
    cublas = {p.weight_dtype for p in points if p.impl == "cublas"}
    assert cublas == {"f16"}                      # the dense baseline beside every low-bit point
    assert {p.group_size for p in points if p.impl == "triton"} == {128}


def test_smoke_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness", "experiment=smoke", f"run.results_dir={tmp_path}",
                        "run.device=cpu", "run.progress=false"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    df = load_experiment(tmp_path / "cpu" / "smoke")
    pts = df.drop_duplicates("point_hash")
    assert set(pts["impl"]) == {"cublas", "triton"}
    assert set(pts["status"]) == {"ok"}, pts[["impl", "status", "error"]].to_string()
    assert set(df["device"]) == {"cpu-interpreter"}
    err = df[df["metric"] == "rel_err"]["value"]
    assert (err < 2e-3).all()
    build(tmp_path, tmp_path / "REPORT.md")
    text = (tmp_path / "cpu" / "REPORT.md").read_text()
    assert "figures/smoke_numerics.png" in text and (tmp_path / "cpu" / "figures" / "smoke_numerics.png").exists()
    assert "| cpu | cpu-interpreter |" in text
    assert "smoke_numerics" not in (tmp_path / "REPORT.md").read_text()


def test_multirun_on_cpu_interprets_kernels_imported_while_planning(tmp_path):
    # the multirun preflight plans proton_fig15, which imports kernels.suite before any job runs;
    # without TRITON_INTERPRET in the environment those kernels must still be interpreted
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "harness", "experiment=proton_fig15", f"run.results_dir={tmp_path}",
                        "run.device=cpu", "run.progress=false", "experiment.params.suite=[fused_softmax]", "-m"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    df = load_experiment(tmp_path / "cpu" / "proton_fig15")
    plain = df[(df["workload"] == "fused_softmax") & (df["profiler"] == "none")].drop_duplicates("point_hash")
    assert list(plain["status"]) == ["ok"], plain[["status", "error"]].to_string()
    # Proton's points are `unavailable` on the CPU: final, so a rerun measures nothing and says why
    assert "unavailable" in set(df["status"])
    r2 = subprocess.run([sys.executable, "-m", "harness", "experiment=proton_fig15", f"run.results_dir={tmp_path}",
                         "run.device=cpu", "run.progress=false", "experiment.params.suite=[fused_softmax]", "-m"],
                        capture_output=True, text=True, timeout=600, env=env)
    assert r2.returncode == 0 and " 0 to run" in r2.stdout and "unavailable)" in r2.stdout, r2.stdout
