"""Claims as checks: every claim of results/paper/claims.yaml computed from fixture rows into the right verdict."""
import json
import math

import pandas as pd
import pytest

from fixture_rows import matmul, row, write
from harness import claims
from harness.claims import ClaimSpec, Outcome, evaluate, judge
from harness.provenance import ROOT
from harness.report import load_rows

PAPER = ROOT / "results" / "paper"


def _evaluate(tmp_path):
    df, warnings = load_rows(tmp_path, cpu=False)
    assert not warnings
    return evaluate(df, PAPER).set_index("claim_id")


def test_every_claim_is_defined_once_with_a_function():
    specs = ClaimSpec.load_all(PAPER / "claims.yaml")
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids)) and set(ids) == set(claims.FUNCS)
    for s in specs:
        assert s.paper in ("Tilus", "Proton") and s.statement and s.how and s.source
        assert s.experiments and all(e.startswith(("tilus_fig", "proton_fig")) for e in s.experiments)


def test_without_rows_every_claim_is_not_measurable_and_says_why(tmp_path):
    (tmp_path / "h200").mkdir()
    c = _evaluate(tmp_path)
    assert set(c["verdict"]) == {"not_measurable"}
    for cid, r in c.iterrows():
        assert f"no H200 rows yet for {r['experiments'].split(', ')[0]}" in r["why"], cid
        assert r["measured_value"] == ""
    # the paper's value is there either way: typed from the text or computed from its artifact's data
    assert c.loc["tilus_vs_triton", "paper_value"] == "1.75"
    assert abs(float(c.loc["proton_e2e_overhead", "paper_value"]) - 1.251) < 1e-3   # GH200 geomean, ten models
    assert abs(float(c.loc["proton_instrumentation_overhead", "paper_value"]) - 1.048) < 1e-3


def _fig10(tmp_path, tilus_ms, plain_ms):
    rows = []
    for K, N in ((8192, 8192), (8192, 57344)):
        for M in (1, 16):
            rows += matmul("tilus_fig10", "cublas", "f16", M, K, N, 0.20)
            rows += matmul("tilus_fig10", "tilus", "u4", M, K, N, tilus_ms)
            if plain_ms:
                rows += matmul("tilus_fig10", "triton_plain", "u4", M, K, N, plain_ms)
    rows.append(row("tilus_fig10", "hbm_read_bw", 4.2, layer="probe", impl="probe", M=0, K=0, N=0))
    rows += [{**r, "status": "unavailable", "value": float("nan"), "metric": "latency_ms",
              "error": "bitblas is not installed (import bitblas: ModuleNotFoundError)"}
             for r in matmul("tilus_fig10", "bitblas", "u4", 1, 8192, 8192, 1.0)]
    write(tmp_path, "tilus_fig10", rows)


@pytest.mark.parametrize("plain_ms, verdict", [(0.175, "holds"), (0.13, "holds_other_magnitude"),
                                               (0.08, "does_not_hold")])
def test_tilus_over_its_triton_baseline(tmp_path, plain_ms, verdict):
    _fig10(tmp_path, tilus_ms=0.10, plain_ms=plain_ms)
    c = _evaluate(tmp_path).loc["tilus_vs_triton"]
    assert c["verdict"] == verdict
    assert math.isclose(float(c["measured_value"]), plain_ms / 0.10, rel_tol=1e-3)
    assert "4 Fig. 10 points" in c["why"] and "4.20 TB/s" in c["why"] and "0.864 TB/s datasheet" in c["why"]
    assert c["gpu"] == "NVIDIA H200 (paper: NVIDIA L40S)"


def test_a_missing_baseline_names_what_was_tried(tmp_path):
    _fig10(tmp_path, tilus_ms=0.10, plain_ms=None)
    c = _evaluate(tmp_path)
    assert c.loc["tilus_vs_triton", "verdict"] == "not_measurable"
    assert "triton_plain has no rows in tilus_fig10" in c.loc["tilus_vs_triton", "why"]
    why = c.loc["tilus_vs_ladder", "why"]
    assert "bitblas is unavailable" in why and "ModuleNotFoundError" in why and "would make it measurable" in why


def _fig13(tmp_path, overheads: dict, sizes: dict | None = None):
    rows = []
    for (model, prof), v in overheads.items():
        axes = dict(model=model, workload="train", profiler=prof, impl="hf+peft+liger", batch=2, seq_len=2048,
                    model_layers=2)
        rows.append(row("proton_fig13", "overhead", v, p10=v - 0.01, p90=v + 0.01, **axes))
        if sizes and (model, prof) in sizes:
            rows.append(row("proton_fig13", "profile_bytes", sizes[(model, prof)], **axes))
    write(tmp_path, "proton_fig13", rows)


def test_proton_overhead_ordering_is_tested_against_the_same_runs(tmp_path):
    _fig13(tmp_path, {("llama3_1_8b", "proton"): 1.22, ("llama3_1_8b", "torch"): 1.60,
                      ("tinyllama_1_1b", "proton"): 1.28, ("tinyllama_1_1b", "torch"): 1.70},
           sizes={("llama3_1_8b", "proton"): 4.0e4, ("llama3_1_8b", "torch"): 7.0e8,
                  ("tinyllama_1_1b", "proton"): 4.0e4, ("tinyllama_1_1b", "torch"): 9.0e8})
    c = _evaluate(tmp_path)
    assert c.loc["proton_e2e_overhead", "verdict"] == "holds"
    # the paper's value over the same two models, not all ten
    assert math.isclose(float(c.loc["proton_e2e_overhead", "paper_value"]),
                        math.sqrt(1.238980 * 39.22 / 32.97), rel_tol=1e-3)
    assert c.loc["torch_profiler_e2e_overhead", "verdict"] in ("holds", "holds_other_magnitude")
    assert c.loc["nsys_e2e_overhead", "verdict"] == "not_measurable"
    assert "nsys has no rows in proton_fig13" in c.loc["nsys_e2e_overhead", "why"]
    size = c.loc["proton_profile_smaller_than_torch"]
    assert size["verdict"] == "holds" and float(size["measured_value"]) > 1e4


def test_proton_above_torch_does_not_hold(tmp_path):
    _fig13(tmp_path, {("llama3_1_8b", "proton"): 1.9, ("llama3_1_8b", "torch"): 1.3})
    c = _evaluate(tmp_path)
    assert c.loc["proton_e2e_overhead", "verdict"] == "does_not_hold"
    assert c.loc["torch_profiler_e2e_overhead", "verdict"] == "does_not_hold"


def _fig15(tmp_path, inst: dict):
    rows = []
    for kernel, ratio in inst.items():
        for prof, ms in (("none", 1.0), ("proton", ratio)):
            rows.append(row("proton_fig15", "latency_ms", ms, p10=ms * 0.99, p90=ms * 1.01, workload=kernel,
                            impl="triton", profiler=prof, params=json.dumps({"size": "llm"}), model="-"))
    write(tmp_path, "proton_fig15", rows)


def test_instrumentation_claims_from_fixture_rows(tmp_path):
    _fig15(tmp_path, {"layer_norm": 1.20, "matmul": 1.02, "topk": 1.08, "moe_matmul": 1.0})
    c = _evaluate(tmp_path)
    o = c.loc["proton_instrumentation_overhead"]
    assert o["verdict"] == "holds" and "4 of the paper's kernels" in o["why"]
    assert math.isclose(float(o["measured_value"]), (1.2 * 1.02 * 1.08 * 1.0) ** 0.25, rel_tol=1e-3)
    w = c.loc["proton_instrumentation_worst_kernel"]
    assert w["verdict"] == "holds" and "layer_norm" in w["why"]


def test_a_different_worst_kernel_does_not_hold(tmp_path):
    _fig15(tmp_path, {"layer_norm": 1.05, "topk": 1.25})
    assert _evaluate(tmp_path).loc["proton_instrumentation_worst_kernel", "verdict"] == "does_not_hold"


def _e2e(tmp_path, f16_ms: dict, u4_ms: dict, f16_mode="cuda_graph", u4_mode="cuda_graph", others=()):
    """others: (impl, {batch: ms}, mode) of further u4 kernels."""
    rows = []
    for (bs, ms), wdt, impl, mode in [(kv, "f16", "cublas", f16_mode) for kv in f16_ms.items()] + \
                                     [(kv, "u4", "tilus", u4_mode) for kv in u4_ms.items()] + \
                                     [(kv, "u4", i, m) for i, ms_, m in others for kv in ms_.items()]:
        rows.append(row("tilus_fig12", "latency_ms", ms, model="gemma2_9b", weight_dtype=wdt, impl=impl,
                        phase="decode", batch=bs, seq_len=2048, model_layers=42, params=json.dumps({"mode": mode})))
    write(tmp_path, "tilus_fig12", rows)


def test_end_to_end_decode_compares_the_same_execution_mode(tmp_path):
    _e2e(tmp_path, {1: 10.0, 16: 11.0}, {1: 4.0, 16: 4.2})
    c = _evaluate(tmp_path).loc["tilus_e2e_decode_u4"]
    assert c["verdict"] == "holds" and "gemma2_9b bs1, gemma2_9b bs16" in c["why"] and "cuda_graph" in c["why"]
    assert math.isclose(float(c["measured_value"]), math.sqrt(10 / 4 * 11 / 4.2), rel_tol=1e-3)


def test_end_to_end_never_compares_modes_silently(tmp_path):
    _e2e(tmp_path, {1: 10.0}, {1: 4.0}, f16_mode="eager", u4_mode="cuda_graph")
    c = _evaluate(tmp_path).loc["tilus_e2e_decode_u4"]
    assert c["verdict"] == "not_measurable"
    # the true reason: the modes differ (not some other status of the impl's rows)
    assert "tilus' u4 rows ran cuda_graph only, the f16 rows eager (gemma2_9b bs1)" in c["why"]
    assert "never compared" in c["why"] and "unsupported" not in c["why"]


def test_end_to_end_eager_tilus_gives_way_to_our_other_u4_kernels_in_the_f16_mode(tmp_path):
    """Tilus' decode rows run eagerly (its launches cannot be captured), f16 as CUDA graphs: the claim is about u4
    weights, so our Triton kernel's CUDA-graph rows are the u4 measurement, never Tilus' eager ones; the why says so."""
    _e2e(tmp_path, {1: 10.0, 16: 11.0}, {1: 30.0, 16: 28.0}, u4_mode="eager",
         others=[("native", {1: 7.0, 16: 9.0}, "cuda_graph"), ("triton", {1: 8.0, 16: 10.0}, "cuda_graph")])
    c = _evaluate(tmp_path).loc["tilus_e2e_decode_u4"]
    assert c["verdict"] in ("holds", "holds_other_magnitude")
    assert math.isclose(float(c["measured_value"]), math.sqrt(10 / 8 * 11 / 10), rel_tol=1e-3)   # Triton first
    assert "stands in for tilus" in c["why"] and "tilus' u4 rows ran eager only, the f16 rows cuda_graph" in c["why"]
    assert "mode cuda_graph" in c["why"]
    # no Triton rows: native's, in the same mode
    _e2e(tmp_path / "b", {1: 10.0, 16: 11.0}, {1: 30.0, 16: 28.0}, u4_mode="eager",
         others=[("native", {1: 7.0, 16: 9.0}, "cuda_graph")])
    c = _evaluate(tmp_path / "b").loc["tilus_e2e_decode_u4"]
    assert math.isclose(float(c["measured_value"]), math.sqrt(10 / 7 * 11 / 9), rel_tol=1e-3)
    # only eager low-bit rows: not measurable, and the why says the modes differ
    _e2e(tmp_path / "c", {1: 10.0, 16: 11.0}, {1: 30.0, 16: 28.0}, u4_mode="eager",
         others=[("triton", {1: 20.0, 16: 21.0}, "eager")])
    c = _evaluate(tmp_path / "c").loc["tilus_e2e_decode_u4"]
    assert c["verdict"] == "not_measurable" and "in one execution mode" in c["why"]
    assert "triton' u4 rows ran eager only" in c["why"] and "tilus' u4 rows ran eager only" in c["why"]


def _qwen_rows(f16: dict, u4: dict, gpu_name: str) -> list:
    return [row("tilus_fig13", "latency_ms", ms, model="qwen2_5_32b", weight_dtype=wdt, impl=impl, phase="decode",
                batch=bs, seq_len=2048, model_layers=64, params=json.dumps({"mode": "cuda_graph"}), gpu_name=gpu_name)
            for (bs, ms), wdt, impl in [(kv, "f16", "cublas") for kv in f16.items()]
            + [(kv, "u4", "triton") for kv in u4.items()]]


def test_a_claim_is_judged_on_its_own_gpus_rows_where_they_exist(tmp_path):
    """tilus_qwen32b_decode_h100 is about an H100: with tilus_fig13 rows of the H200 only, the H200's decide (and the
    why names it); once the H100 has rows too, the H100's decide -- like for like with the paper's GPU."""
    write(tmp_path, "tilus_fig13", _qwen_rows({1: 20.0, 16: 21.0}, {1: 10.0, 16: 14.0}, "NVIDIA H200"))
    c = _evaluate(tmp_path).loc["tilus_qwen32b_decode_h100"]
    assert math.isclose(float(c["measured_value"]), math.sqrt(2.0 * 1.5), rel_tol=1e-3)
    assert "on the H200" in c["why"] and c["gpu"].startswith("NVIDIA H200")
    write(tmp_path, "tilus_fig13", _qwen_rows({1: 26.0, 16: 27.0}, {1: 13.0, 16: 9.0}, "NVIDIA H100 80GB HBM3"),
          gpu="h100_sxm")
    c = _evaluate(tmp_path).loc["tilus_qwen32b_decode_h100"]
    assert math.isclose(float(c["measured_value"]), math.sqrt(2.0 * 3.0), rel_tol=1e-3)
    assert "on the H100 SXM" in c["why"] and c["gpu"].startswith("NVIDIA H100 80GB HBM3")


def _spec(**kw):
    base = dict(id="x", paper="Tilus", figure=10, statement="s", source="s", how="h", paper_value=2.0,
                paper_gpu="NVIDIA L40S", expect="> 1", compare="ratio", tolerance=0.15, experiments=("tilus_fig10",))
    return ClaimSpec(**{**base, **kw})


def test_judge_tolerances():
    assert judge(_spec(), Outcome(2.2, why="w"))[0] == "holds"
    assert judge(_spec(), Outcome(1.5, why="w"))[0] == "holds_other_magnitude"
    assert judge(_spec(), Outcome(0.9, why="w"))[0] == "does_not_hold"
    assert judge(_spec(), Outcome(None, why="why"))[0] == "not_measurable"
    ex = _spec(compare="excess", tolerance=0.5, paper_value=1.05, expect="< 1.1")
    assert judge(ex, Outcome(1.07, why="w"))[0] == "holds"            # +7% against +5%
    assert judge(ex, Outcome(1.09, why="w"))[0] == "holds_other_magnitude"
    f = _spec(compare="factor", tolerance=10, paper_value=2.6e4, expect=">= 100")
    assert judge(f, Outcome(3e3, why="w"))[0] == "holds" and judge(f, Outcome(1e3, why="w"))[0] == "holds_other_magnitude"
    with pytest.raises(ValueError, match="did not decide"):
        judge(_spec(expect="< torch"), Outcome(1.2, why="w"))


def test_claims_csv_columns_and_bytes_are_stable(tmp_path):
    _fig10(tmp_path, tilus_ms=0.10, plain_ms=0.17)
    t = _evaluate(tmp_path).reset_index()
    a, b = claims.write_csv(t, tmp_path / "a.csv"), claims.write_csv(t, tmp_path / "b.csv")
    assert a.read_bytes() == b.read_bytes()
    back = pd.read_csv(a, keep_default_na=False)
    assert list(back.columns) == claims.COLUMNS
    assert set(back["verdict"]) <= set(claims.VERDICTS)


def test_committed_claims_csv_is_computed_from_the_committed_rows(tmp_path):
    """results/claims.csv is what `make figures` computes from the committed rows, never typed."""
    df, _ = load_rows(ROOT / "results", cpu=False)
    t = evaluate(df[df["device"] == "cuda"], PAPER)
    out = claims.write_csv(t, tmp_path / "claims.csv")
    assert out.read_text() == (ROOT / "results" / "claims.csv").read_text()
