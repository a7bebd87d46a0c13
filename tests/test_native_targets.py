"""experiments/native_targets.py: issue 13's target tables from rows (no GPU needed)."""
import pandas as pd
import pytest

from experiments.native_targets import bits, decode_targets, floor_target, prefill_targets


def _rows(impl, wt, M, metric, value, K=8192, N=57344, code="c1"):
    return {"impl": impl, "weight_dtype": wt, "act_dtype": "f16", "M": M, "K": K, "N": N, "metric": metric,
            "value": value, "p10": value * 0.98, "p90": value * 1.02, "status": "ok", "gpu": "h200",
            "model": "m", "layer": "gate_up", "group_size": 128, "code_version": code}


def test_bits_and_targets():
    assert [bits(t) for t in ("u1", "i2", "u4", "f6e3m2", "f8e4m3", "f16")] == [1, 2, 4, 6, 8, 16]
    assert floor_target("u2") == 0.75 and floor_target("u3") == 0.90 and floor_target("f3e1m1") == 0.90


def test_decode_targets_met_missed_and_faster():
    rows = []
    for wt, nat, frac in (("u8", 0.120, 0.93), ("u2", 0.080, 0.40)):
        rows += [_rows("native", wt, 1, "latency_ms", nat), _rows("native", wt, 1, "roofline_frac", frac),
                 _rows("native", wt, 1, "floor_ms", nat * frac), _rows("triton", wt, 1, "latency_ms", 0.100),
                 _rows("tilus", wt, 1, "latency_ms", 0.150)]
    rows.append(_rows("triton", "u4", 1, "latency_ms", 0.09))          # no native row: not in the table
    t = decode_targets(pd.DataFrame(rows)).set_index("weight_dtype")
    assert list(t.index) == ["u2", "u8"]
    assert t.loc["u8", "met"] == "yes" and t.loc["u8", "why"] == "" and t.loc["u8", "faster than both"] == "no"
    assert t.loc["u2", "met"] == "no" and "issue-bound" in t.loc["u2", "why"]
    assert t.loc["u2", "faster than both"] == "yes" and abs(t.loc["u2", "% of floor"] - 40) < 1e-9
    assert t.loc["u8", "within spread"] == t.loc["u2", "within spread"] == "no"   # p10-p90 of +-2%: apart


def test_low_bit_reason_by_batch():
    """1-2 bit points: at M = 16 the reason is the two-tile ncu (section 38), at M = 1 the one-tile one."""
    rows = []
    for M in (1, 16):
        rows += [_rows("native", "u2", M, "latency_ms", 0.080), _rows("native", "u2", M, "roofline_frac", 0.40),
                 _rows("native", "u2", M, "floor_ms", 0.032)]
    t = decode_targets(pd.DataFrame(rows)).set_index("M")
    assert "M=16 on an H100" in t.loc[16, "why"] and "M=16 on an H100" not in t.loc[1, "why"]
    assert "M=1 (regs)" in t.loc[1, "why"]
    assert decode_targets(pd.DataFrame([_rows("triton", "u4", 1, "latency_ms", 0.09)])).empty


def test_decode_targets_say_when_a_verdict_is_within_the_spread():
    """DESIGN.md: a difference is believed only where the p10-p90 bands do not overlap; the band compared is the
    faster rival's (Tilus here), and a point without bands has no say."""
    rows = [_rows("native", "i4", 1, "latency_ms", 0.0970), _rows("tilus", "i4", 1, "latency_ms", 0.0955),
            _rows("triton", "i4", 1, "latency_ms", 0.2000),                 # 1.6% apart, bands of +-2%: overlap
            _rows("native", "u4", 1, "latency_ms", 0.0900), _rows("tilus", "u4", 1, "latency_ms", 0.0930)]
    t = decode_targets(pd.DataFrame(rows)).set_index("weight_dtype")
    assert t.loc["i4", "faster than both"] == "no" and t.loc["i4", "within spread"] == "yes"
    assert t.loc["u4", "faster than both"] == "yes" and t.loc["u4", "within spread"] == "yes"
    from experiments.native_targets import decode_summary
    s = decode_summary(pd.DataFrame(rows))[1]
    assert "behind at i4 M=1" in s and "1 of the wins, 1 of the losses (i4 M=1 (8192, 57344))" in s
    wide = [dict(r, p10=float("nan"), p90=float("nan")) for r in rows]
    assert (decode_targets(pd.DataFrame(wide))["within spread"] == "").all()


def test_decode_targets_name_the_variant_and_its_limit():
    """A missed 3-8 bit point names its measured limit by the decode variant the native row ran (impl_config)."""
    rows = []
    for wt, cfg in (("u4", "native decode regs (timed ms: regs 0.0795) f16_u4 mt1"), ("i4", "native decode bulk f16_i4"),
                    ("u8", "native decode (timed ms: base 0.1) f16_u8 mt2"), ("u3", "native decode f16_u3 mt1")):
        rows += [dict(_rows("native", wt, 1, "latency_ms", 0.08), impl_config=cfg),
                 dict(_rows("native", wt, 1, "roofline_frac", 0.73), impl_config=cfg)]
    cfg = "native decode regs (timed ms: regs 0.1161) f16_u4 mt2"   # two tiles: another limit
    rows += [dict(_rows("native", "u4", 16, "latency_ms", 0.116), impl_config=cfg),
             dict(_rows("native", "u4", 16, "roofline_frac", 0.5), impl_config=cfg)]
    t = decode_targets(pd.DataFrame(rows))
    t16 = t[t["M"] == 16].set_index("weight_dtype")
    assert t16.loc["u4", "variant"] == "regs" and "issue-bound at two tiles" in t16.loc["u4", "why"]
    t = t[t["M"] == 1].set_index("weight_dtype")
    assert t.loc["u4", "variant"] == "regs" and "the loop (regs" in t.loc["u4", "why"]
    assert t.loc["i4", "variant"] == "bulk" and "loop stalls" in t.loc["i4", "why"]
    assert t.loc["u8", "variant"] == t.loc["u3", "variant"] == "base"   # chosen_config leaves base's name out
    # u1 at M = 1 through the table lookups (lutspan): its own limit, not the mma kernels' issue count
    cfg = "native decode lutspan (timed ms: regs 0.056, lut 0.044, lutspan 0.034) f16_u1 span 1024 threads"
    rows = [dict(_rows("native", "u1", 1, m, v), impl_config=cfg) for m, v in (("latency_ms", 0.034),
                                                                                ("roofline_frac", 0.5))]
    t = decode_targets(pd.DataFrame(rows)).set_index("weight_dtype")
    assert t.loc["u1", "variant"] == "lutspan" and "table lookups" in t.loc["u1", "why"]


def test_prefill_targets_ratio_and_job():
    rows = [_rows("cublas", "f16", 2048, "latency_ms", 2.9, code="old"), _rows("native", "u4", 2048, "latency_ms", 3.2),
            _rows("cublas", "f16", 4096, "latency_ms", 5.8, code="old"), _rows("native", "u4", 4096, "latency_ms", 6.0)]
    t = prefill_targets(pd.DataFrame(rows)).set_index("M")
    assert t.loc[2048, ">= 0.95x"] == "no" and t.loc[4096, ">= 0.95x"] == "yes"
    assert "fused" in t.loc[2048, "why (if missed)"] and t.loc[4096, "why (if missed)"] == ""
    assert abs(t.loc[2048, "x cuBLAS"] - 2.9 / 3.2) < 1e-12
    assert (t["cuBLAS rows"] == "another job (other code)").all()


def test_decode_targets_same_bytes_cublas_pace():
    """read_ref_ms (cuBLAS f16 on a weight of the same bytes, same job) gives each point the issue's own yardstick;
    a point that reads at that pace is explained by it, one that does not keeps its measured limit."""
    rows = []
    for wt, nat, ref in (("u4", 0.0800, 0.0790), ("i4", 0.0960, 0.0780)):
        rows += [_rows("native", wt, 1, "latency_ms", nat), _rows("native", wt, 1, "roofline_frac", 0.0585 / nat),
                 _rows("native", wt, 1, "floor_ms", 0.0585), _rows("native", wt, 1, "read_ref_ms", ref),
                 _rows("triton", wt, 1, "read_ref_ms", ref * 1.02)]      # every impl's row has it: the median
    t = decode_targets(pd.DataFrame(rows)).set_index("weight_dtype")
    ref_u4 = 1e3 * (0.0790 + 0.0790 * 1.02) / 2
    assert abs(t.loc["u4", "cuBLAS same bytes us"] - ref_u4) < 1e-9
    assert abs(t.loc["u4", "x cuBLAS pace"] - ref_u4 / 80.0) < 1e-9
    assert abs(t.loc["u4", "cuBLAS same bytes % of floor"] - 100 * 58.5 / ref_u4) < 1e-9
    assert t.loc["u4", "met"] == "no" and "reads as fast as cuBLAS" in t.loc["u4", "why"]
    assert t.loc["i4", "x cuBLAS pace"] < 0.9 and "reads as fast" not in t.loc["i4", "why"]
    assert t.loc["i4", "why"].startswith("0.82x the pace of cuBLAS f16 on the same bytes")   # and its limit after it
    assert "loop stalls" in t.loc["i4", "why"]
    old = [r for r in rows if r["metric"] != "read_ref_ms"]                # rows from before the reference
    t = decode_targets(pd.DataFrame(old))
    assert t["x cuBLAS pace"].isna().all() and not t["why"].str.contains("reads as fast").any()


def test_read_ref_shape_holds_the_same_bytes():
    from harness.benchmarks.matmul import read_ref_n
    from harness.specs import Precision
    u4 = Precision(name="u4", kind="uint", bits=4, exp_bits=0, man_bits=0, act_dtype="f16", group_size=128)
    for K, N in ((8192, 57344), (28672, 8192), (8192, 8192), (1000, 700)):
        wb = u4.weight_bytes(K, N)
        n = read_ref_n(wb, K)
        assert n % 8 == 0 and abs(2 * K * n - wb) <= 8 * K          # within half a step of 8 columns
    assert read_ref_n(10, 4096) == 8                                 # never an empty weight


def test_decode_summary_counts_from_the_table():
    rows = []
    for wt, nat, frac, ref in (("u8", 0.120, 0.93, 0.119), ("u2", 0.080, 0.40, 0.050)):
        rows += [_rows("native", wt, 1, "latency_ms", nat), _rows("native", wt, 1, "roofline_frac", frac),
                 _rows("native", wt, 1, "floor_ms", nat * frac), _rows("native", wt, 1, "read_ref_ms", ref),
                 _rows("triton", wt, 1, "latency_ms", 0.100), _rows("tilus", wt, 1, "latency_ms", 0.150)]
    from experiments.native_targets import decode_summary
    s = decode_summary(pd.DataFrame(rows))
    assert "met at 1 of 2 points" in s[0] and "93.0% (u8 M=1 (8192, 57344))" in s[0]
    assert "at 1 of 2 points; behind at u8 M=1" in s[1] and "none of the wins, none of the losses" in s[1]
    assert "beyond the vendor's own reader at 1 of 2 points" in s[2] and "at 1 of 2 points (u8 M=1" in s[2]
    assert decode_summary(pd.DataFrame([_rows("triton", "u4", 1, "latency_ms", 0.09)])) == []


def test_pace_figure_draws_native_and_the_reference_or_nothing():
    from experiments.native_targets import pace_figure
    rows = []
    for wt, M, nat, ref in (("u4", 1, 0.080, 0.073), ("u4", 16, 0.110, 0.073), ("u8", 1, 0.126, 0.127)):
        rows += [_rows("native", wt, M, "latency_ms", nat), _rows("native", wt, M, "roofline_frac", 0.058 / nat),
                 _rows("native", wt, M, "floor_ms", 0.058), _rows("native", wt, M, "read_ref_ms", ref)]
    fig = pace_figure(pd.DataFrame(rows), "t")
    ax = fig.axes[0]
    ys = [sorted(o.get_offsets()[:, 1].round(1)) for o in ax.collections if type(o).__name__ == "PathCollection"]
    assert ys == [[80.0, 126.0], [73.0, 127.0], [110.0], [73.0]]   # per M: native, then the same-bytes cuBLAS
    assert pace_figure(pd.DataFrame([r for r in rows if r["metric"] != "read_ref_ms"]), "t") is None


def test_later_changes_name_the_rows_that_predate_a_kernel_change():
    """A native row measured at a commit before LOWBIT_XT's default (205031c) is named for the points the change
    moves (uint at two tiles), a row of 205031c itself or of other points is not; no sentence where git cannot place
    the sha."""
    from harness.provenance import lacks
    from experiments.native_targets import later_changes
    before, with_it = "0ed3af6", "205031c"
    if lacks(before, with_it) is not True or lacks(with_it, with_it) is not False:
        pytest.skip("git history without these commits (a shallow clone)")
    rows = [dict(_rows("native", "u2", 16, "latency_ms", 0.09), git_sha=before),
            dict(_rows("native", "u4", 16, "latency_ms", 0.10), git_sha=with_it),
            dict(_rows("native", "i2", 16, "latency_ms", 0.08), git_sha=before),    # int: not moved by the change
            dict(_rows("native", "u2", 1, "latency_ms", 0.06), git_sha=before)]     # one tile: not moved
    s = later_changes(pd.DataFrame(rows))
    assert len(s) == 1 and "1 native point(s), u2 M=16 (8192, 57344)." in s[0] and "git 0ed3af6" in s[0]
    assert later_changes(pd.DataFrame(rows[1:])) == []
    assert later_changes(pd.DataFrame([dict(rows[0], git_sha="not-a-sha")])) == []
    assert lacks("not-a-sha", with_it) is None
    steps = pd.DataFrame([dict(rows[0], model="gemma2_9b", batch=16, K=float("nan"), N=float("nan"))])   # tilus_fig12's
    s = later_changes(steps, ["model", "weight_dtype", "batch"], lambda r: f"{r['model']} {r['weight_dtype']} b{r['batch']}")
    assert len(s) == 1 and "1 native point(s), gemma2_9b u2 b16." in s[0]
