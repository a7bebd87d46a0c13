"""Figures and reports on fixture rows written through the store (temp dirs, never results/)."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fixture_rows import matmul, row, write
from harness import figures as F
from harness.report import build, build_cpu, build_main
from harness.store import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "results" / "paper"


def _gemm(tmp_path, device="cuda", gpu="h200"):
    rows = []
    for dt in ("f16", "bf16"):
        for M in (1, 16, 2048):
            for layer, K, N in (("qkv", 8192, 10240), ("gate_up", 8192, 57344)):
                for model in ("llama3_70b", "llama3_3_70b"):       # two cards with the same shapes
                    sec = max(2 * K * N / 4.0e12, 2 * M * K * N / 700e12)
                    axes = dict(model=model, layer=layer, M=M, K=K, N=N, weight_dtype=dt, act_dtype=dt,
                                group_size=-1, impl="cublas", device=device, gpu_name="fixture")
                    rows += [row("gemm_shapes", "latency_ms", sec * 1e3, unit="ms", **axes),
                             row("gemm_shapes", "tflops", 2 * M * K * N / sec / 1e12, **axes),
                             row("gemm_shapes", "bandwidth_tbs", 2 * K * N / sec / 1e12, **axes)]
    rows.append(row("gemm_shapes", "hbm_read_bw", 4.1, layer="probe", impl="probe", device=device))
    write(tmp_path, "gemm_shapes", rows, gpu=gpu)


def _paper(tmp_path):
    shutil.copytree(PAPER, tmp_path / "paper")


def test_report_draws_gpu_figures_tables_and_claims(tmp_path):
    _gemm(tmp_path)
    _paper(tmp_path)
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    for name in ("gemm_shapes_roofline", "gemm_shapes_bandwidth"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 10_000
        assert (tmp_path / "figures" / f"{name}.pdf").exists()
        assert f"figures/{name}.png" in text
    assert "## gemm_shapes" in text and "| h200 | cuda | fixture |" in text
    # the report opens with the verdicts and the environment, then the experiments
    assert text.index("## Verdicts") < text.index("## Environment") < text.index("## Experiments") < text.index("## gemm_shapes")
    assert (tmp_path / "claims.csv").exists()
    # our earlier H200 timings are labelled as such, one row per model card (never averaged)
    earlier = text.split("### Our earlier H200 cuBLAS timings")[1].split("\n### ")[0]
    assert "llama3_70b (gate_up)" in earlier and "llama3_3_70b (gate_up)" in earlier
    assert "Paper vs. this reproduction" not in text


def test_cpu_rows_go_to_their_own_report_never_the_committed_one(tmp_path):
    _gemm(tmp_path)
    _gemm(tmp_path, device="cpu-interpreter", gpu="cpu")
    smoke = []
    for impl in ("cublas", "triton"):
        smoke += matmul("smoke", impl, "f16" if impl == "cublas" else "u4", 1, 256, 128, 0.5, rel_err=1e-4,
                        device="cpu-interpreter")
    write(tmp_path, "smoke", [{**r, "device": "cpu-interpreter"} for r in smoke], gpu="cpu")
    main = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "| cpu | cpu-interpreter |" not in main and "smoke_numerics" not in main
    assert not (tmp_path / "figures" / "smoke_numerics.png").exists()
    cpu = (tmp_path / "cpu" / "REPORT.md").read_text()
    assert "figures/smoke_numerics.png" in cpu and (tmp_path / "cpu" / "figures" / "smoke_numerics.png").exists()
    assert "gemm_shapes_roofline" not in cpu            # performance is never drawn from CPU rows


def test_only_cpu_rows_mean_no_gpu_results(tmp_path):
    _gemm(tmp_path, device="cpu-interpreter", gpu="cpu")
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "gemm_shapes_roofline" not in text
    assert "No GPU results are committed for this experiment yet" in text.split("## gemm_shapes")[1]


def test_a_broken_cpu_shard_is_skipped_with_a_warning(tmp_path, capsys):
    _gemm(tmp_path)
    bad = tmp_path / "cpu" / "smoke" / "shards" / "torn.csv"
    bad.parent.mkdir(parents=True)
    bad.write_text("experiment,metric\n\x00\x01garbage\n")
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "gemm_shapes_roofline" in text and "torn.csv" not in text      # the GPU report is untouched
    err = capsys.readouterr().err
    assert "warning: skipping" in err and "torn.csv" in err and "columns do not match" in err
    assert "torn.csv" in (tmp_path / "cpu" / "REPORT.md").read_text()


def test_a_failing_figure_is_named_in_the_report(tmp_path, monkeypatch):
    _gemm(tmp_path)

    def broken(df):
        raise ValueError("no such column")
    monkeypatch.setitem(F.FIGURES, "gemm_shapes_broken", F.FigureDef("gemm_shapes_broken", "gemm_shapes", broken))
    out, failures = build_main(tmp_path)
    text = out.read_text()
    assert "figure gemm_shapes_broken failed: ValueError: no such column" in text
    assert "figures/gemm_shapes_roofline.png" in text          # the rest of the report is there
    assert len(failures) == 1


def _tilus(tmp_path):
    rows = [row("tilus_fig10", "hbm_read_bw", 4.2, layer="probe", impl="probe")]
    for K, N in ((8192, 8192), (8192, 57344)):
        for M in (1, 16):
            rows += matmul("tilus_fig10", "cublas", "f16", M, K, N, 0.20, host_ms=0.01)
            for wdt, t in (("u4", 0.10), ("f6e3m2", 0.16)):
                rows += matmul("tilus_fig10", "tilus", wdt, M, K, N, t, roofline_frac=0.5, floor_ms=0.05)
                rows += matmul("tilus_fig10", "triton", wdt, M, K, N, t * 0.9, roofline_frac=0.55,
                               host_ms=0.2 if N == 8192 else 0.01)
                rows += matmul("tilus_fig10", "triton_plain", wdt, M, K, N, t * 1.7)
    write(tmp_path, "tilus_fig10", rows)
    rows = []
    for M in (1, 4, 2048, 4096):
        rows += matmul("tilus_fig14", "cublas", "f16", M, 8192, 57344, 0.2 * max(1, M / 16))
        rows += matmul("tilus_fig14", "triton", "u4", M, 8192, 57344, 0.1 * max(1, M / 16))
    write(tmp_path, "tilus_fig14", rows)


def test_the_report_is_deterministic(tmp_path):
    """Same CSVs, same bytes: REPORT.md, claims.csv and every PNG/PDF, built twice."""
    _tilus(tmp_path)
    _paper(tmp_path)
    first = {}
    for i in range(2):
        build(tmp_path, tmp_path / "REPORT.md")
        files = sorted((tmp_path / "figures").iterdir()) + [tmp_path / "REPORT.md", tmp_path / "claims.csv"]
        snap = {p.name: p.read_bytes() for p in files}
        if i == 0:
            first = snap
    assert snap == first and {"tilus_fig10.png", "tilus_fig10.pdf", "tilus_fig14.png"} <= set(snap)
    assert b"CreationDate" not in snap["tilus_fig10.pdf"] and b"Matplotlib" not in snap["tilus_fig10.png"]
    text = snap["REPORT.md"].decode()
    # the Tilus rows flow into the claims: our Tilus kernel against its plain Triton baseline
    v = pd.read_csv(tmp_path / "claims.csv", keep_default_na=False).set_index("claim_id")
    assert v.loc["tilus_vs_triton", "verdict"] == "holds" and v.loc["tilus_vs_triton", "measured_value"] == "1.7"
    assert "Triton (Tilus' baseline design)" in text and "our kernel in Tilus 0.2.0" in text


def test_proton_fig15_overhead_and_timeline_from_a_decoded_buffer(tmp_path):
    """Overhead bars from tidy rows, and the warp timeline from a trace our native decoder wrote."""
    from native import decode

    rows = []
    for kernel, plain, inst in (("layer_norm", 0.100, 0.117), ("matmul", 1.50, 1.52), ("native_matmul", 2.0, 2.02)):
        native = kernel.startswith("native_")
        for prof, ms in (("none", plain), ("native" if native else "proton", inst)):
            prm = dict(size="llm", **({"buffer_records": "auto"} if native and prof != "none" else {}))
            rows.append(row("proton_fig15", "latency_ms", ms, p10=ms * 0.99, p90=ms * 1.01, unit="ms", model="-",
                            workload=kernel.removeprefix("native_"), impl="native" if native else "triton",
                            profiler=prof, params=json.dumps(prm, sort_keys=True)))
    exp = write(tmp_path, "proton_fig15", rows)
    warps = [[(0, False, 100), (0, True, 400), (1, False, 420), (1, True, 900)],
             [(0, False, 110), (0, True, 380), (1, False, 400), (1, True, 950)]]
    raw = decode.encode([dict(block_id=0, sm_id=3, clock_start=0, clock_end=1000, gtime_start=0, gtime_end=500,
                              warps=warps)], capacity=8, num_warps=2)
    prof = decode.decode(raw, ("load", "mma"), kernel="native_matmul")
    art = exp / "artifacts" / "native"
    art.mkdir(parents=True)
    prof.write_trace(str(art / "matmul.chrome_trace.json"))
    _paper(tmp_path)
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    assert (tmp_path / "figures" / "proton_fig15.png").exists()
    assert (tmp_path / "figures" / "proton_fig15_timeline.png").exists()
    assert "paper GH200" in text and "ours h200 default" in text
    line = [x for x in text.splitlines() if x.startswith("| layer_norm |")][0]
    assert "1.17" in line                     # ours: 0.117 / 0.100; paper GH200: 1.173
    # the native header's verdict line gives its geomean with the bounds from both timings' p10 / p90:
    # 2.02 * 0.99 / (2.0 * 1.01) = 0.990 .. 2.02 * 1.01 / (2.0 * 0.99) = 1.030
    assert "native_matmul 1.010x; geomean 1.010x (0.990-1.030x from the p10/p90 of both timings)" in text


def test_proton_fig15_native_target_keeps_the_regs_variant_beside_it(tmp_path):
    """The native header's target is over the native kernels with the low-bit one in its `auto` variant; the regs
    variant's row (what `timed` runs at that point) gets its own ratio and the geomean with it in auto's place."""
    rows = []
    for kernel, plain, inst in (("native_matmul", 2.0, 2.02), ("native_lowbit", 1.0, 1.02),
                                ("native_lowbit_regs", 0.9, 0.972)):
        for prof, ms in (("none", plain), ("native", inst)):
            prm = dict(size="llm", **({"buffer_records": "auto", "mode": "staged"} if prof != "none" else {}))
            rows.append(row("proton_fig15", "latency_ms", ms, p10=ms * 0.99, p90=ms * 1.01, unit="ms", model="-",
                            workload=kernel.removeprefix("native_"), impl="native", profiler=prof,
                            params=json.dumps(prm, sort_keys=True)))
    write(tmp_path, "proton_fig15", rows)
    _paper(tmp_path)
    text = build(tmp_path, tmp_path / "REPORT.md").read_text()
    line = [x for x in text.splitlines() if x.startswith("- Our native header")][0]
    # sqrt(1.02 * 1.01) = 1.015: met; with regs (0.972 / 0.9 = 1.08) instead: sqrt(1.08 * 1.01) = 1.044: missed
    assert "native_lowbit 1.020x and native_matmul 1.010x; geomean 1.015x" in line, line
    assert "is met; with the low-bit kernel's regs variant" in line and "1.080x) in place of `auto`'s: geomean 1.044x, missed" in line


def test_every_figure_regenerates_from_the_committed_results(tmp_path):
    """`make figures` on a copy of results/: every GPU experiment with rows gets its figures, tables, findings."""
    src = ROOT / "results"
    for sub in ("paper", "h200"):
        if (src / sub).exists():
            shutil.copytree(src / sub, tmp_path / sub)
    out, failures = build_main(tmp_path)
    text = out.read_text()
    assert not failures, failures
    for exp in sorted(p.name for p in (tmp_path / "h200").iterdir() if p.is_dir()):
        sec = text.split(f"\n## {exp}\n")[1].split("\n## ")[0]
        assert "No GPU results are committed for this experiment yet" not in sec
    pngs = {p.stem for p in (tmp_path / "figures").glob("*.png")}
    assert {"gemm_shapes_roofline", "tilus_fig10", "tilus_fig11", "tilus_fig14", "proton_fig15",
            "proton_fig15_timeline"} <= pngs


# ---- findings: numbers in prose come from the rows -------------------------------------------------------

def _lat(impl, wdt, ms, M=16, K=8192, N=57344, **kw):
    base = dict(gpu="h200", model="llama3_70b", layer="gate_up", M=M, K=K, N=N, weight_dtype=wdt, act_dtype="f16",
                impl=impl, status="ok", p10=ms, p90=ms, device="cuda")
    return [{**base, "metric": "latency_ms", "value": ms}] + [{**base, "metric": k, "value": v} for k, v in kw.items()]


def test_fig11_level_means_within_three_percent():
    from experiments.tilus_fig11.figures import findings
    rows = _lat("cublas", "f16", 0.23)
    for wdt, tilus, ours in (("i5", 0.1000, 0.1036), ("i7", 0.1000, 0.1020), ("u4", 0.10, 0.16), ("i2", 0.15, 0.10)):
        rows += _lat("tilus", wdt, tilus) + _lat("triton", wdt, ours)
    df = pd.DataFrame(rows)
    df.attrs["results_dir"] = str(ROOT / "results")
    text = " ".join(findings(df))
    assert "level (within 3%) for i7" in text
    assert "behind by more than 3% for i5 and u4" in text and "ahead by more than 3% for i2" in text


def test_fig10_host_time_sentence_names_only_the_shapes_where_it_holds():
    from experiments.tilus_fig10.figures import findings
    rows = []
    for K, N, host in ((8192, 8192, 0.09), (8192, 57344, 0.03), (28672, 8192, 0.05)):
        for M in (1, 16):
            rows += _lat("cublas", "f16", 0.2, M=M, K=K, N=N)
            rows += _lat("tilus", "u4", 0.06, M=M, K=K, N=N, roofline_frac=0.5)
            rows += _lat("triton", "u4", 0.04 if K == 8192 else 0.045 + 0.01 * (M == 16), M=M, K=K, N=N,
                         roofline_frac=0.6, host_ms=host)
    df = pd.DataFrame(rows)
    df.attrs["results_dir"] = str(ROOT / "results")
    text = " ".join(findings(df))
    assert "exceeds the kernel time at every point of K=8192, N=8192 (host 0.090 ms, kernel 0.040 ms)" in text
    assert "At K=8192, N=57344 the host time stays below" in text
    assert "K=28672, N=8192 (1 of 2)" in text


def test_fig14_paper_prefill_range_is_computed_not_typed():
    from experiments.tilus_fig14.figures import findings
    df = pd.DataFrame(_lat("cublas", "f16", 1.0, M=4096) + _lat("triton", "u4", 1.05, M=4096))
    df.attrs["results_dir"] = str(ROOT / "results")
    text = " ".join(findings(df))
    assert "The paper's Tilus (L40S) at M >= 2048: 0.87-0.98x of cuBLAS f16, below 1x at 8 of its 8 points" in text


def test_fig9_targets_table_shows_host_time_when_recorded():
    from experiments.tilus_fig10.figures import targets
    rows = []
    for impl, ms, host in (("cublas", 0.048, 0.01), ("triton", 0.20, 0.19), ("tilus", 0.031, None)):
        wd = "f16" if impl == "cublas" else "i4"
        rows += _lat(impl, wd, ms, M=1, K=8192, N=8192, roofline_frac=0.0085 / ms,
                     **({"host_ms": host} if host is not None else {}))
    t = targets(pd.DataFrame(rows))
    r = t.iloc[0]
    assert r["ours ms"] == 0.20 and r["tilus ms"] == 0.031 and r["ours host ms"] == 0.19
    assert r["ours <= tilus"] == "no" and abs(r["ours % of floor"] - 4.25) < 1e-9
    assert "ours host ms" not in targets(pd.DataFrame([x for x in rows if x["metric"] != "host_ms"])).columns


@pytest.mark.parametrize("values, text", [([1.234, 1.5], "1.23-1.50"), ([2.0, 2.001], "2.00"), ([], "")])
def test_span(values, text):
    assert F.span(values) == text


def test_build_cpu_without_cpu_rows_writes_nothing(tmp_path):
    _gemm(tmp_path)
    assert build_cpu(tmp_path)[0] is None and not (tmp_path / "cpu").exists()


def test_schema_fixture_rows_match_the_store():
    assert set(row("x", "m", 1.0)) <= set(SCHEMA)


def test_the_explanatory_figures_draw_from_the_default_sweep_and_from_the_larger_committed_one():
    """proton_overhead_sweep / proton_noise: the committed rows (the 4-shape sweep, both workloads) and the
    subset the smaller default sweep writes (2 shapes; train only) both give their figures and tables."""
    import matplotlib.pyplot as plt

    from experiments.proton_noise import figures as noise
    from experiments.proton_overhead_sweep import figures as sweep

    def rows(exp):
        df = pd.read_csv(ROOT / "results" / "h200" / exp / "results.csv")
        df.insert(0, "gpu", "h200")
        return df

    ov = rows("proton_overhead_sweep")
    small = ov[ov.set_index(["batch", "seq_len"]).index.isin([(1, 128), (8, 2048)])]
    for df, n_shapes in ((ov, 4), (small, 2)):
        w = sweep.wide(df)
        assert w.groupby("model")["shape"].nunique().to_dict() == {"llama3_1_8b": n_shapes, "tinyllama_1_1b": n_shapes}
        assert w["launches_per_s"].notna().all()
        for fn in (sweep.overhead_vs_rate, sweep.breakdown):
            fig = fn(df)
            assert fig is not None
            plt.close(fig)
        assert len(sweep.summary(df)) == 2 * n_shapes * 3
    nz = rows("proton_noise")
    for df, wls in ((nz, ["infer", "train"]), (nz[nz["workload"] == "train"], ["train"])):
        fig = noise.noise(df)
        assert sorted(ax.get_title().split(":")[0] for ax in fig.axes) == wls
        plt.close(fig)
        assert len(noise.counters(df)) == 4 * len(wls) and len(noise.said(df)) == len(wls)


def test_status_names_timings_exposed_to_the_host():
    """The report lists the matmul points whose timing kept more than a tenth of its samples exposed to the host."""
    from harness.report import _exposed
    base = dict(gpu="h200", model="llama3_70b", weight_dtype="u4", K=8192, N=57344, metric="exposed_samples")
    df = pd.DataFrame([dict(base, impl="native", M=1, value=0, n_samples=50),
                       dict(base, impl="triton", M=1, value=5, n_samples=50),      # a tenth: not listed
                       dict(base, impl="tilus", M=16, value=31, n_samples=50),
                       dict(base, impl="native", M=16, metric="latency_ms", value=0.1, n_samples=50)])
    text = _exposed(df)
    assert "exposed to the host" in text and "| tilus |" in text and "| 31 |" in text
    assert "| triton |" not in text and "| native |" not in text
    assert _exposed(df[df["impl"] != "tilus"]) == ""
