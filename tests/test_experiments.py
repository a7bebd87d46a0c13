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


# ---- `make reproduce`: every experiment, with its default sweep -------------------------------------------

def _make_default_experiments() -> list[str]:
    from harness.provenance import ROOT
    lines = [l for l in (ROOT / "Makefile").read_text().splitlines() if l.startswith("EXPERIMENTS ?=")]
    assert len(lines) == 1, lines
    return lines[0].split("?=", 1)[1].split()


def test_make_reproduce_runs_every_experiment():
    """The team's rule: every experiment joins the default `make reproduce` (and so the figures and the report)."""
    names = _make_default_experiments()
    assert len(names) == len(set(names))
    assert set(names) == set(choices("experiment"))


def _plan(*overrides):
    """The points of every job of an experiment's own sweep, planned for a GPU (no device touched)."""
    from harness.preflight import expand_jobs
    pts = []
    for job in expand_jobs(list(overrides)):
        _, _, p = build_context(_compose(*job, "run.device=cuda"), plan_only=True)
        pts += p
    return pts


FULL_SHAPES = "experiment.params.shapes=[[1,128],[2,512],[4,1024],[8,2048]]"


def test_proton_overhead_sweep_default_and_full_sweep():
    """Default: both models at the two ends of the launch-rate range; the full 4-shape sweep on request
    (the override experiments/proton_overhead_sweep/README.md gives)."""
    pts = _plan("experiment=proton_overhead_sweep")
    assert {(p.model, p.batch, p.seq_len) for p in pts} == {
        (m, b, t) for m in ("tinyllama_1_1b", "llama3_1_8b") for b, t in ((1, 128), (8, 2048))}
    assert {p.workload for p in pts} == {"train"} and {p.profiler for p in pts} == {"none", "proton", "torch"}
    assert all(dict(p.params)["residual"] for p in pts)
    full = _plan("experiment=proton_overhead_sweep", FULL_SHAPES)
    assert {(p.batch, p.seq_len) for p in full} == {(1, 128), (2, 512), (4, 1024), (8, 2048)}
    assert len(full) == 2 * 4 * 3 and len(pts) == 2 * 2 * 3


def test_proton_noise_default_and_both_workloads():
    """Default: the paper's workload (train) over the whole pin_cpus x gc_freeze grid, 4 processes a cell;
    inference as well on request."""
    pts = _plan("experiment=proton_noise")
    cells = {(dict(p.params).get("pin_cpus"), dict(p.params).get("gc_freeze", False)) for p in pts}
    assert cells == {(None, False), (None, True), (2, False), (2, True)}
    assert {p.workload for p in pts} == {"train"} and {p.profiler for p in pts} == {"none"}
    assert {dict(p.params)["baseline_processes"] for p in pts} == {3} and len(pts) == 4
    both = _plan("experiment=proton_noise", "experiment.params.workloads=[train,infer]")
    assert {p.workload for p in both} == {"train", "infer"} and len(both) == 8


@pytest.mark.parametrize("experiment,override,needle", [
    ("proton_overhead_sweep", "experiment.params.shapes=[[1,0]]", "shapes seq_len=0 must be a positive integer"),
    ("proton_overhead_sweep", "experiment.params.shapes=[[1,128,3]]", "must be a list of [batch, seq_len] pairs"),
    ("proton_noise", "experiment.params.workloads=[train,inference]", "workload 'inference'; valid: train, infer"),
])
def test_a_bad_sweep_override_fails_before_any_work(experiment, override, needle, tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness", f"experiment={experiment}", override,
                        f"run.results_dir={tmp_path}", "run.device=cpu", "-m"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and needle in r.stderr, r.stderr[-2000:]
    assert not any(tmp_path.iterdir())
