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


def test_proton_fig15_overhead_and_timeline_from_a_decoded_buffer(tmp_path):
    """Overhead bars from tidy rows, and the warp timeline from a trace our native decoder wrote."""
    from native import decode

    exp = tmp_path / "h200" / "proton_fig15"
    w = ShardWriter(exp / "shards" / "fx.csv")
    for kernel, plain, inst in (("layer_norm", 0.100, 0.117), ("matmul", 1.50, 1.52), ("native_matmul", 2.0, 2.02)):
        for prof, ms, params in (("none", plain, ""), ("proton" if "native" not in kernel else "native", inst,
                                                          "" if "native" not in kernel else '{"buffer_records": 8}')):
            native = kernel.startswith("native_")
            prm = dict(size="llm", **({"buffer_records": 8} if native and prof != "none" else {}))
            w.write_point([dict(experiment="proton_fig15", figure="proton_fig15", workload=kernel.removeprefix("native_"),
                                impl="native" if native else "triton", profiler=prof,
                                params=__import__("json").dumps(prm, sort_keys=True), metric="latency_ms", value=ms, unit="ms", status="ok",
                                device="cuda", gpu_name="fixture", point_hash=f"{kernel}{prof}",
                                ts_utc="2026-01-01")])
    merge(exp)
    # two warps of one block entering load then mma, decoded and written as a Chrome trace
    warps = [[(0, False, 100), (0, True, 400), (1, False, 420), (1, True, 900)],
             [(0, False, 110), (0, True, 380), (1, False, 400), (1, True, 950)]]
    raw = decode.encode([dict(block_id=0, sm_id=3, clock_start=0, clock_end=1000, gtime_start=0, gtime_end=500,
                              warps=warps)], capacity=8, num_warps=2)
    prof = decode.decode(raw, ("load", "mma"), kernel="native_matmul")
    art = exp / "artifacts" / "native"
    art.mkdir(parents=True)
    prof.write_trace(str(art / "matmul.chrome_trace.json"))
    paper = tmp_path / "paper"
    paper.mkdir()
    import shutil
    from pathlib import Path
    shutil.copy(Path(__file__).resolve().parent.parent / "results" / "paper" / "proton_instrumentation.csv", paper)
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert (tmp_path / "figures" / "proton_fig15.png").exists()
    assert (tmp_path / "figures" / "proton_fig15_timeline.png").exists()
    assert "paper GH200" in text and "ours h200 default" in text
    row = [l for l in text.splitlines() if l.startswith("| layer_norm |")][0]
    assert "1.17" in row                     # ours: 0.117 / 0.100; paper GH200: 1.173


def test_every_figure_regenerates_from_the_committed_results(tmp_path):
    """`make figures` on a copy of results/: every GPU experiment with rows gets its figures and tables."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "results"
    for sub in ("paper", "h200"):
        if (src / sub).exists():
            shutil.copytree(src / sub, tmp_path / sub)
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    for exp in sorted(p.name for p in (tmp_path / "h200").iterdir()):
        assert f"## {exp}" in text
        assert f"No GPU results are committed for this experiment yet" not in text.split(f"## {exp}")[1].split("\n## ")[0]
    pngs = {p.stem for p in (tmp_path / "figures").glob("*.png")}
    assert {"gemm_shapes_roofline", "tilus_fig10", "tilus_fig14", "proton_fig15", "proton_fig15_timeline"} <= pngs


def test_fig9_targets_table_shows_host_time_when_recorded():
    from experiments.tilus_fig10.figures import targets
    rows = []
    for impl, ms, host in (("cublas", 0.048, 0.01), ("triton", 0.20, 0.19), ("tilus", 0.031, None)):
        wd = "f16" if impl == "cublas" else "i4"
        base = dict(gpu="h200", model="llama3_70b", layer="o", M=1, K=8192, N=8192, weight_dtype=wd, act_dtype="f16",
                    impl=impl, status="ok")
        rows += [{**base, "metric": "latency_ms", "value": ms}, {**base, "metric": "roofline_frac", "value": 0.0085 / ms}]
        if host is not None:
            rows.append({**base, "metric": "host_ms", "value": host})
    t = targets(pd.DataFrame(rows))
    r = t.iloc[0]
    assert r["ours ms"] == 0.20 and r["tilus ms"] == 0.031 and r["ours host ms"] == 0.19
    assert r["ours <= tilus"] == "no" and abs(r["ours % of floor"] - 4.25) < 1e-9
    # committed rows from before host_ms existed: no column, no error
    assert "ours host ms" not in targets(pd.DataFrame([x for x in rows if x["metric"] != "host_ms"])).columns
