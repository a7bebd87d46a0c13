"""Figure and report code on a small fixture of tidy rows (written to a temp dir, not results/)."""
import pandas as pd

from harness.report import build
from harness.store import SCHEMA, ShardWriter, merge


def _fixture(tmp_path):
    rows = []
    for dt in ("f16", "bf16"):
        for M in (1, 16, 2048):
            for layer, K, N in (("qkv", 8192, 10240), ("gate_up", 8192, 57344)):
                sec = max(2 * K * N / 4.0e12, 2 * M * K * N / 700e12)
                base = dict(experiment="gemm_shapes", figure="gemm_shapes", model="llama3_70b", layer=layer, M=M,
                            K=K, N=N, weight_dtype=dt, act_dtype=dt, group_size=-1, impl="cublas",
                            profiler="none", status="ok", device="cuda", gpu_name="fixture", git_sha="x",
                            point_hash=f"{dt}{M}{layer}", ts_utc="2026-01-01T00:00:00")
                rows.append([{**base, "metric": "latency_ms", "value": sec * 1e3, "unit": "ms"},
                             {**base, "metric": "tflops", "value": 2 * M * K * N / sec / 1e12, "unit": "TFLOP/s"},
                             {**base, "metric": "bandwidth_tbs", "value": 2 * K * N / sec / 1e12, "unit": "TB/s"}])
    w = ShardWriter(tmp_path / "h200" / "gemm_shapes" / "shards" / "fx.csv")
    for r in rows:
        w.write_point(r)
    probe = dict(experiment="gemm_shapes", model="llama3_70b", layer="probe", impl="probe", metric="hbm_read_bw",
                 value=4.1, unit="TB/s", status="ok", device="cuda", point_hash="probe", ts_utc="2026-01-01")
    w.write_point([probe])
    merge(tmp_path / "h200" / "gemm_shapes")


def test_report_draws_gpu_figures_and_tables(tmp_path):
    _fixture(tmp_path)
    (tmp_path / "paper").mkdir()
    out = build(tmp_path, tmp_path / "REPORT.md")
    text = out.read_text()
    for name in ("gemm_shapes_roofline", "gemm_shapes_bandwidth"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 10_000
        assert (tmp_path / "figures" / f"{name}.pdf").exists()
        assert f"figures/{name}.png" in text
    assert "## gemm_shapes" in text and "| h200 | cuda | fixture |" in text
    assert "Paper vs. this reproduction" in text


def test_cpu_rows_are_never_drawn_as_performance(tmp_path):
    _fixture(tmp_path)
    df = pd.read_csv(tmp_path / "h200" / "gemm_shapes" / "results.csv")
    df["device"] = "cpu-interpreter"
    (tmp_path / "cpu" / "gemm_shapes").mkdir(parents=True)
    df.to_csv(tmp_path / "cpu" / "gemm_shapes" / "results.csv", index=False, columns=SCHEMA)
    (tmp_path / "h200" / "gemm_shapes" / "results.csv").unlink()
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "gemm_shapes_roofline" not in text
    assert "No GPU results are committed for this experiment yet" in text
