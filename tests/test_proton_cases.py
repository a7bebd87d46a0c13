"""Proton case studies (Figs. 8, 9, 10, 12): kernels in the interpreter, Proton tree handling, planning and rows."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from kernels import Unavailable, Unsupported
from kernels.cases import matmul_variants as mv
from kernels.cases import moe_mlp as mm
from kernels.cases import proton_tree as pt

ROOT = Path(__file__).resolve().parent.parent
# fp8 outputs: e4m3 rounding alone gives ~3% (Frobenius); Triton 3.6's interpreter also halves values whose
# f32 -> fp8 rounding carries into the next binade (~3% of them), so its bound is wider. Logic errors give O(1).
FP8_TOL = 0.15


def rel(out, ref):
    o, r = out.double(), ref.double()
    return (torch.linalg.norm(o - r) / torch.linalg.norm(r)).item()


# ---- Fig. 8 kernels ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f16", "fp8"])
def test_matmul_variants_match_reference(dtype):
    inp = mv.make_inputs(40, 48, 96, dtype, "cpu", seed=5)          # M, N not multiples of the tiles
    assert inp["a"].float().abs().sum() > 0 and inp["b"].float().abs().sum() > 0
    ref = mv.reference(inp)
    assert ref.dtype == (torch.float32 if dtype == "fp8" else torch.float64)
    for v in mv.VARIANTS:
        for flatten in ([False, True] if v in mv.FLATTENABLE else [False]):
            out = mv.run(v, inp, flatten=flatten)
            assert out.shape == (40, 48) and out.dtype == mv.DTYPES[dtype]
            err = rel(out, ref)
            assert err < (FP8_TOL if dtype == "fp8" else 2e-3), (v, flatten, err)


def test_matmul_launch_metadata_carries_proton_metrics():
    a = torch.empty((64, 32), dtype=torch.float8_e4m3fn)
    c = torch.empty((64, 48), dtype=torch.float8_e4m3fn)
    meta = mv._launch_metadata(None, SimpleNamespace(name="matmul_tma"),
                               {"a_ptr": a, "c_ptr": c, "M": 64, "N": 48, "K": 32, "WARP_SPECIALIZE": True})
    assert meta["name"] == "matmul_tma_ws [M=64, N=48, K=32]"
    assert meta["flops8"] == 2 * 64 * 48 * 32 and "flops16" not in meta
    assert meta["bytes"] == 64 * 32 + 48 * 32 + 64 * 48


def test_warp_specialization_lowered_for_blackwell_only():
    """Triton 3.6 accepts warp_specialize=True for sm_90 but emits the plain kernel's PTX (compiled here with
    Triton's bundled ptxas, without a GPU and without the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from kernels.cases.compile_check import warp_specialize_lowered as w;"
            "print(w(90), w(100))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"]


# ---- Fig. 9/10 kernels ------------------------------------------------------------------------------------
def test_route_covers_every_pair_once():
    g = torch.Generator().manual_seed(1)
    ids = torch.topk(torch.rand(37, 8, generator=g), 3, dim=-1).indices.to(torch.int32)
    r = mm.route(ids, first=2, n_local=4, block_m=4)
    flat = ids.reshape(-1)
    local = ((flat >= 2) & (flat < 6)).nonzero().flatten()
    assert r.rows == local.numel() and sorted(r.dst.tolist()) == local.tolist()
    assert torch.equal(r.src.long(), r.dst.long() // 3)
    exp_of_row = flat[r.dst.long()] - 2
    assert torch.all(exp_of_row[1:] >= exp_of_row[:-1])              # sorted by expert
    seen = []
    for e, start, n in r.tiles.tolist():
        if n:
            assert 0 < n <= 4 and torch.all(exp_of_row[start:start + n] == e)
            seen += list(range(start, start + n))
    assert sorted(seen) == list(range(r.rows))
    assert r.hits == int((r.counts > 0).sum())


@pytest.mark.parametrize("dtype", ["f16", "fp8"])
def test_moe_mlp_and_its_splits_match_reference(dtype):
    full = mm.make_weights(mm.TINY, dtype, "cpu", seed=2)
    inp = mm.make_inputs(full, 5, seed=2)
    assert inp["x"].float().abs().sum() > 0
    ref = mm.reference(inp)
    tol = FP8_TOL if dtype == "fp8" else 2e-3
    assert rel(mm.forward(inp), ref) < tol
    for tp, ep in [(2, 1), (1, 2), (2, 2)]:                         # partial outputs sum to the full MLP
        total = 0
        for rank in range(tp * ep):
            w = mm.make_weights(mm.TINY, dtype, "cpu", 2, tp, rank % tp, ep, rank // tp)
            total = total + mm.forward(mm.make_inputs(w, 5, seed=2)).double()
        assert rel(total, ref) < tol, (tp, ep)


def test_moe_split_runs_under_torchrun_on_cpu(tmp_path):
    """The Fig. 10 entry point end to end: two gloo processes (EP = 2), all-reduce, rank 0's check, summary."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "kernels.cases.moe_dist", "--tp", "1", "--ep", "2", "--dtype", "f16", "--per-expert", "3",
           "--hidden", "64", "--intermediate", "32", "--experts", "8", "--topk", "2", "--out", str(tmp_path)]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    ranks = sorted(s["ranks"], key=lambda x: x["rank"])
    assert [x["ep_rank"] for x in ranks] == [0, 1]
    assert sum(x["rows"] for x in ranks) == ranks[0]["tokens"] * 2     # every (token, slot) pair on one rank
    assert ranks[0]["rel_err"] < 2e-3


# ---- Proton trees -----------------------------------------------------------------------------------------
def _node(name, metrics=None, children=()):
    return {"frame": {"name": name, "type": "function"}, "metrics": metrics or {}, "children": list(children)}


def _profile(frames):
    return [_node("ROOT", {}, frames), {"CUDA": {"0": {"arch": "90", "num_sms": 132}}}]


def test_proton_tree_metrics_merge_and_diff(tmp_path):
    k_plain = _node("matmul_persistent [M=8, N=8, K=8]", {"time (ns)": 2e6, "count": 2, "flops16": 4e9, "bytes": 10})
    cublas = _node("cublas [M=8, N=8, K=8]", {"flops16": 4e9, "bytes": 10},
                   [_node("nvjet_kernel", {"time (ns)": 1e6, "count": 2}),
                    _node(pt.METADATA_FRAME, {}, [_node("fill", {"time (ns)": 5e5, "count": 1})])])
    m = pt.inclusive(cublas)
    assert m["time (ns)"] == 1e6 and m["flops16"] == 4e9           # launch-metadata kernels are dropped
    assert pt.derived(m)["tflop/s"] == pytest.approx(4.0) and pt.derived(m)["tflop16/s"] == pytest.approx(4.0)
    assert [n for n, _ in pt.leaves(cublas)] == ["nvjet_kernel"]
    a, b = tmp_path / "a.hatchet", tmp_path / "b.hatchet"
    a.write_text(json.dumps(_profile([k_plain])))
    b.write_text(json.dumps(_profile([cublas])))
    merged = pt.merge(tmp_path / "m.hatchet", a)
    pt.merge(merged, b)
    both = pt.load(merged)
    assert set(pt.top_frames(both)) == {k_plain["frame"]["name"], cublas["frame"]["name"]}
    assert both[1]["CUDA"]["0"]["num_sms"] == 132
    faster = _node(k_plain["frame"]["name"], {"time (ns)": 1e6, "count": 2, "flops16": 4e9, "bytes": 10})
    d = {r["name"]: r for r in pt.diff(_profile([faster]), both, "tflop/s")}
    assert d[k_plain["frame"]["name"]]["diff"] == pytest.approx(4.0 - 2.0)
    assert d[cublas["frame"]["name"]]["diff"] is None                # only in one profile
    s = pt.summarize(both, useful="matmul")
    assert s["flops"] == 4e9 and s["time_ns"] == 3e6 and s["kernels"] == 2


# ---- the experiments on the CPU ---------------------------------------------------------------------------
def _compose(*overrides):
    from harness.specs import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _run(tmp_path, exp, *overrides):
    from harness.runner import run_job
    from harness.store import load_experiment
    cfg = _compose(f"experiment={exp}", "run.device=cpu", "run.progress=false", f"run.results_dir={tmp_path}",
                   *overrides)
    run_job(cfg)
    return load_experiment(tmp_path / "cpu" / exp)


def test_fig8_on_cpu_checks_numerics_and_says_proton_is_unavailable(tmp_path):
    df = _run(tmp_path, "proton_fig8", "experiment.params.dtypes=[f16]", "experiment.cpu.K=[64]",
              "experiment.params.variants=[naive,persistent,cublas]")
    pts = df.drop_duplicates("point_hash")
    assert len(pts) == 3 * 2                                          # variants x flatten
    assert set(pts["status"]) == {"unavailable"}
    assert pts["error"].str.contains("Proton's CUPTI profiler needs a CUDA GPU; numerics checked").all()
    assert set(df["device"]) == {"cpu-interpreter"}


def test_fig9_on_cpu_checks_numerics_and_says_proton_is_unavailable(tmp_path):
    df = _run(tmp_path, "proton_fig9", "experiment.cpu.per_expert=[3]")
    pts = df.drop_duplicates("point_hash")
    assert list(pts["status"]) == ["unavailable"] and "numerics checked" in pts["error"].iloc[0]


def test_fig10_plans_every_split_and_says_how_many_gpus(tmp_path, monkeypatch):
    df = _run(tmp_path, "proton_fig10")
    pts = df.drop_duplicates("point_hash")
    assert len(pts) == 9 and set(pts["status"]) == {"unavailable"}
    assert pts["error"].str.contains("split needs [0-9] GPUs").all()
    # on a GPU run with one GPU visible (the machine's GPU count is the only thing simulated here)
    from harness.benchmarks import proton_cases as pc
    assert pc.gpu_gate(2, 1) == "needs 2 GPUs, 1 visible" and pc.gpu_gate(2, 2) is None
    monkeypatch.setattr(pc, "visible_gpus", lambda: 1)
    from harness.runner import build_context
    ctx, bench, points = build_context(_compose("experiment=proton_fig10", "run.device=cpu"))
    ctx.device = "cuda"
    with pytest.raises(Unavailable, match="needs 2 GPUs, 1 visible"):
        bench.run(next(p for p in points if dict(p.params)["tp"] * dict(p.params)["ep"] == 2), ctx)
    with pytest.raises(Unavailable, match="needs 8 GPUs, 1 visible"):
        bench.run(next(p for p in points if dict(p.params)["tp"] * dict(p.params)["ep"] == 8), ctx)


def test_fig12_rows_say_blackwell_only(tmp_path):
    from harness.runner import build_context
    from harness.specs import GpuSpec
    df = _run(tmp_path, "proton_fig12")
    pts = df.drop_duplicates("point_hash")
    assert list(pts["status"]) == ["unsupported"] and "sm_100" in pts["error"].iloc[0]
    ctx, bench, points = build_context(_compose("experiment=proton_fig12", "run.device=cpu"))
    ctx.gpu = GpuSpec.load("h200")
    with pytest.raises(Unsupported, match="h200 is sm_90"):
        bench.run(points[0], ctx)
    ctx.gpu = GpuSpec.load("b200")
    with pytest.raises(Unavailable, match="no Gluon attention kernel"):
        bench.run(points[0], ctx)


@pytest.mark.parametrize("override, msg", [
    ("experiment.params.K=[100]", "multiple of 16"),
    ("experiment.params.variants=[naive,splitk]", "splitk"),
])
def test_fig8_bad_config_fails_before_running(override, msg):
    from harness.runner import build_context
    from harness.specs import ConfigError
    with pytest.raises(ConfigError, match=msg):
        build_context(_compose("experiment=proton_fig8", "run.device=cpu", override, "experiment.cpu.K=null"))


def test_fig10_bad_split_fails_before_running():
    from harness.runner import build_context
    from harness.specs import ConfigError
    with pytest.raises(ConfigError, match="EP must divide"):
        build_context(_compose("experiment=proton_fig10", "run.device=cpu", "experiment.params.splits=[[1,3]]"))


# ---- figures ----------------------------------------------------------------------------------------------
def test_figures_draw_rows_shaped_like_the_benchmarks(tmp_path):
    """The plotting code on rows with the benchmarks' columns and metric names (values are arbitrary test
    inputs, never written to results/), and the flattening diff read from two merged profiles."""
    import pandas as pd

    from harness.figures import FIGURES, TABLES, load_experiments
    load_experiments()
    rows = []

    def row(exp, ph, params, metric, value, **kw):
        rows.append(dict(experiment=exp, gpu="h200", device="cuda", status="ok", error="", point_hash=ph, layer="",
                         impl=kw.pop("impl", "triton"), workload=kw.pop("workload", ""), params=json.dumps(params),
                         K=kw.pop("K", None), weight_dtype=kw.pop("dtype", "fp8"), metric=metric, value=value))
    for k in (512, 1024):
        for fl in (False, True):
            for v in ("naive", "persistent", "cublas"):
                for m in ("tflops", "events_tflops", "proton_ms", "latency_ms", "rel_err", "profile_bytes"):
                    row("proton_fig8", f"{k}{fl}{v}", {"flatten": fl}, m, 1.0 + k / 512, impl=v, K=k)
    for pe in (4, 64, 1024):
        for m in ("tflops", "matmul_tflops", "intensity", "tbs", "step_ms", "routed_rows", "rel_err"):
            row("proton_fig9", f"pe{pe}", {"per_expert": pe, "tp": 1, "ep": 1}, m, float(pe), workload="moe_mlp")
    for m in ("memset_tbs", "copy_tbs", "cublas_fp8_tflops"):
        row("proton_fig9", "probe", {}, m, 100.0, impl="probe")
    for tp, ep in ((1, 2), (2, 1)):
        for m in ("tflops_imbalance", "flop_imbalance", "compute_time_imbalance", "rank0/time_ms", "rank1/time_ms"):
            row("proton_fig10", f"{tp}{ep}", {"per_expert": 16, "tp": tp, "ep": ep}, m, 0.1 * ep, workload="moe_mlp")
    df = pd.DataFrame(rows)
    art = tmp_path / "h200" / "proton_fig8" / "artifacts"
    art.mkdir(parents=True)
    for name, t in (("matmul_fp8.hatchet", 2e6), ("matmul_fp8_flatten.hatchet", 1e6)):
        (art / name).write_text(json.dumps(_profile([_node("matmul_persistent [M=8, N=8, K=512]",
                                                           {"time (ns)": t, "count": 1, "flops8": 4e9})])))
    for exp in ("proton_fig8", "proton_fig9", "proton_fig10"):
        d = df[df["experiment"] == exp].copy()
        d.attrs["results_dir"] = str(tmp_path)
        figs = [f for f in FIGURES.values() if f.experiment == exp]
        assert figs and all(f.fn(d) is not None for f in figs), exp
        for title, (e, fn) in TABLES.items():
            if e == exp:
                assert not fn(d).empty, title
    d = df[df["experiment"] == "proton_fig8"].copy()
    d.attrs["results_dir"] = str(tmp_path)
    t = next(fn for title, (e, fn) in TABLES.items() if e == "proton_fig8" and "diff" in title)(d)
    assert t["flatten_minus_no_flatten"].tolist() == [pytest.approx(4.0 - 2.0)]
