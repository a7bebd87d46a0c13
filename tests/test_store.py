"""Resume skips exactly the finished points; a killed run loses nothing; merge rejects bad shards."""
import csv
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pandas as pd

from harness.store import SCHEMA, SchemaError, ShardWriter, load_experiment, merge, read_csv

ROOT = Path(__file__).resolve().parent.parent


def _harness(*args, results, **kw):
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    return [sys.executable, "-m", "harness", *overrides, f"run.results_dir={results}", "run.device=cpu",
            "run.progress=false", *flags]


def _row(i, status="ok", metric="latency_ms"):
    r = {k: "" for k in SCHEMA}
    r.update(experiment="t", model="m", layer="l", M=i, K=8, N=8, impl="cublas", metric=metric, value=float(i),
             status=status, point_hash=f"h{i}", ts_utc=f"2026-01-01T00:00:{i:02d}")
    return r


def test_resume_skips_exactly_the_finished_points(tmp_path):
    args = ("experiment=gemm_shapes", "model=tinyllama_1_1b,llama3_1_8b", "precision=f16", "-m")
    r1 = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0, r1.stderr
    df1 = load_experiment(tmp_path / "cpu" / "gemm_shapes")
    n_points = df1["point_hash"].nunique()
    assert n_points == 2 * 4 * 3 and set(df1["status"]) == {"ok"}
    # drop two points' rows: a rerun must measure exactly those two again
    merged = tmp_path / "cpu" / "gemm_shapes" / "results.csv"
    gone = sorted(df1["point_hash"].unique())[:2]
    kept = df1[~df1["point_hash"].isin(gone)]
    kept.to_csv(merged, index=False, columns=SCHEMA)
    r2 = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    ran = sum(int(re.search(r"(\d+) to run", line).group(1)) for line in r2.stdout.splitlines()
              if "already done" in line)
    assert ran == 2
    df2 = load_experiment(tmp_path / "cpu" / "gemm_shapes")
    assert df2["point_hash"].nunique() == n_points
    r3 = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    lines = [l for l in r3.stdout.splitlines() if "to run" in l]
    assert len(lines) == 2 and all(l.endswith("0 to run -> " + l.split(" -> ")[1]) for l in lines)


def test_killed_run_loses_no_finished_point(tmp_path):
    args = ("experiment=gemm_shapes", "precision=f16,bf16", "-m")          # 14 models x 2 = 28 jobs
    exp_dir = tmp_path / "cpu" / "gemm_shapes"
    p = subprocess.Popen(_harness(*args, results=tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (exp_dir / "results.csv").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(p.pid, signal.SIGKILL)                     # no clean-up code runs
    p.wait()
    before = load_experiment(exp_dir)
    assert len(before) > 0
    finished = set(before["point_hash"])
    # every point that has rows has all of them (a point is written in one piece)
    per_point = before.groupby("point_hash")["metric"].nunique()
    assert set(per_point) <= {1, 5}
    r = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    after = load_experiment(exp_dir)
    assert finished <= set(after["point_hash"])
    assert after["point_hash"].nunique() == 28 * 12
    merged_alone = read_csv(exp_dir / "results.csv")              # complete on its own: the killed shard was folded
    assert merged_alone["point_hash"].nunique() == 28 * 12
    assert not list((exp_dir / "shards").glob("*.csv"))
    # the finished rows were kept, not measured again
    old = before.set_index(["point_hash", "metric"])["ts_utc"]
    new = after.set_index(["point_hash", "metric"])["ts_utc"]
    assert (new.loc[old.index] == old).all()


def test_torn_last_line_is_dropped(tmp_path):
    w = ShardWriter(tmp_path / "shards" / "a.csv")
    w.write_point([_row(1)])
    with open(w.path, "a") as f:
        f.write("t,,m,l,2,8")                               # killed mid-write
    assert list(read_csv(w.path)["point_hash"]) == ["h1"]


def test_merge_combines_shards_and_rejects_a_schema_mismatch(tmp_path):
    ShardWriter(tmp_path / "shards" / "a.csv").write_point([_row(1)])
    ShardWriter(tmp_path / "shards" / "b.csv").write_point([_row(2), _row(2, metric="tflops")])
    out = merge(tmp_path)
    df = read_csv(out)
    assert sorted(df["point_hash"]) == ["h1", "h2", "h2"]
    assert not list((tmp_path / "shards").glob("*.csv"))
    bad = tmp_path / "shards" / "c.csv"
    with open(bad, "w", newline="") as f:
        csv.writer(f).writerow([c for c in SCHEMA if c != "status"] + ["state"])
        csv.writer(f).writerow(["x"] * len(SCHEMA))
    with pytest.raises(SchemaError, match=r"c\.csv.*missing \['status'\].*unexpected \['state'\]"):
        merge(tmp_path)
    assert read_csv(out)["point_hash"].tolist() == df["point_hash"].tolist()   # merged file untouched


def test_unknown_status_is_refused(tmp_path):
    with pytest.raises(SchemaError, match="status 'fine'"):
        ShardWriter(tmp_path / "s.csv").write_point([_row(1, status="fine")])


def test_failed_point_is_a_row_and_the_sweep_goes_on(tmp_path):
    """precision=f16 with kernel=triton: every point is unsupported, each says why, the job still ends well."""
    r = subprocess.run(_harness("experiment=smoke", "precision=f16", "kernel=triton", results=tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    df = load_experiment(tmp_path / "cpu" / "smoke")
    assert set(df["status"]) == {"unsupported"}
    assert df["error"].str.contains("dense f16 weights: this is a low-bit kernel").all()
    assert "unsupported: triton" in r.stdout + r.stderr


def test_concurrent_jobs_write_their_own_shards_and_fold_them(tmp_path):
    """Three jobs at once (submitit's local executor, one process each), as on several GPUs or nodes."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    args = ("experiment=gemm_shapes", "model=llama3_70b,gemma2_9b,qwen2_5_32b", "precision=f16",
            "hydra/launcher=local_gpus", "hydra.launcher.gpus_per_node=0", f"hydra.sweep.dir={tmp_path}/multirun", "-m")
    r = subprocess.run(_harness(*args, results=tmp_path / "res"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    exp = tmp_path / "res" / "cpu" / "gemm_shapes"
    df = read_csv(exp / "results.csv")
    assert df["point_hash"].nunique() == 3 * 12
    assert set(df["model"]) == {"llama3_70b", "gemma2_9b", "qwen2_5_32b"}
    assert not list((exp / "shards").glob("*.csv"))


def test_a_later_attempt_replaces_every_row_of_the_earlier_one(tmp_path):
    """ok rows (latency, tflops) then an error row of the same point: only the error remains, and the
    point is not done (it is retried)."""
    from harness.store import done_hashes
    w = ShardWriter(tmp_path / "shards" / "a.csv")
    w.write_point([_row(1), _row(1, metric="tflops")])
    later = dict(_row(1, status="error", metric="latency_ms"), ts_utc="2026-01-01T00:00:01.500000+00:00")
    w.write_point([later])
    w.close()
    df = load_experiment(tmp_path)
    assert df[["metric", "status"]].values.tolist() == [["latency_ms", "error"]]
    assert done_hashes(tmp_path) == set()
    merge(tmp_path)
    assert read_csv(tmp_path / "results.csv")["status"].tolist() == ["error"]


def test_garbage_lines_are_named_not_taken_for_points(tmp_path):
    w = ShardWriter(tmp_path / "shards" / "a.csv")
    w.write_point([_row(1)])
    with open(w.path, "a") as f:
        f.write("a,b,c\n")                                   # a complete line with the wrong field count
    with pytest.raises(SchemaError, match=r"a\.csv: line 3: 3 fields"):
        read_csv(w.path)


def test_changing_a_timing_setting_measures_again(tmp_path):
    args = ("experiment=smoke", "kernel=cublas", "precision=f16")
    r1 = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0, r1.stderr
    r2 = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    assert " 0 to run" in r2.stdout and "(4 ok)" in r2.stdout, r2.stdout
    for setting in ("timing.samples=7", "timing.cpu_samples=2", "timing.flush_l2=false", "timing.host_ahead=false"):
        r = subprocess.run(_harness(*args, setting, results=tmp_path), capture_output=True, text=True, timeout=300)
        assert "0 already done, 4 to run" in r.stdout, (setting, r.stdout)
    df = load_experiment(tmp_path / "cpu" / "smoke")
    assert '"samples": 7' in " ".join(df["timing"])          # the row says how it was measured


def test_a_killed_jobs_shard_is_folded_by_the_next_run(tmp_path):
    """A shard nobody holds (its job died) is folded into results.csv by any later run, which says so."""
    exp = tmp_path / "cpu" / "smoke"
    args = ("experiment=smoke", "kernel=cublas", "precision=f16")
    assert subprocess.run(_harness(*args, results=tmp_path), capture_output=True, timeout=300).returncode == 0
    rows = read_csv(exp / "results.csv")
    orphan = exp / "shards" / "killed.csv"
    orphan.parent.mkdir(exist_ok=True)
    rows.iloc[:1].assign(point_hash="from-a-killed-job").to_csv(orphan, index=False, columns=SCHEMA)
    r = subprocess.run(_harness(*args, results=tmp_path), capture_output=True, text=True, timeout=300)
    assert "folded 1 shard(s) left by an interrupted run" in r.stdout, r.stdout
    assert "from-a-killed-job" in set(read_csv(exp / "results.csv")["point_hash"])
    assert not list((exp / "shards").glob("*.csv"))


def test_a_live_jobs_shard_is_not_an_orphan(tmp_path):
    from harness.store import orphan_shards
    w = ShardWriter(tmp_path / "shards" / "live.csv")
    w.write_point([_row(1)])
    code = ("import sys; sys.path.insert(0, %r); from harness.store import orphan_shards; "
            "print(len(orphan_shards(%r)))" % (str(ROOT), str(tmp_path)))
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "0"
    w.close()
    assert orphan_shards(tmp_path) == [w.path]


def test_shard_lock_is_held_before_the_shard_exists(tmp_path, monkeypatch):
    """A job that starts while another creates its shard must never see that shard unlocked (it would fold it as
    an orphan and delete it under the writer: the concurrent-jobs test once lost a job's 12 points that way)."""
    import fcntl
    from harness.store import orphan_shards
    shard = tmp_path / "shards" / "a.csv"
    seen = []
    real = fcntl.flock

    def spy(f, op):
        seen.append(shard.exists())
        return real(f, op)

    monkeypatch.setattr(fcntl, "flock", spy)
    w = ShardWriter(shard)
    assert seen[0] is False and shard.exists()
    monkeypatch.setattr(fcntl, "flock", real)
    assert orphan_shards(tmp_path) == []
    w.close()
    assert orphan_shards(tmp_path) == [shard]


def test_replace_points_folds_a_rerun_point_by_point(tmp_path):
    """harness.merge --replace: every row of a point the new run measured replaces the point's earlier rows, whatever
    code measured them; other points stay; a bad query or a file that is not a results CSV stops with one line."""
    from harness.merge import main as merge_main
    from harness.store import replace_points
    base = dict.fromkeys(SCHEMA, "")
    row = lambda M, metric, value, code: {**base, "experiment": "e", "M": M, "K": 64, "N": 64, "impl": "native",  # noqa: E731
                                          "metric": metric, "value": value, "status": "ok", "point_hash": f"{code}{M}",
                                          "code_version": code, "ts_utc": "2026-12-04T00:00:00+00:00"}
    old = tmp_path / "results.csv"
    pd.DataFrame([row(1, "latency_ms", 1.0, "a"), row(1, "floor_ms", 0.5, "a"), row(16, "latency_ms", 2.0, "a")]
                 ).to_csv(old, index=False, columns=SCHEMA)
    new = tmp_path / "new.csv"
    pd.DataFrame([row(1, "latency_ms", 0.9, "b"), row(16, "latency_ms", 1.8, "b"), row(16, "read_ref_ms", 1.5, "b")]
                 ).to_csv(new, index=False, columns=SCHEMA)
    assert replace_points(old, new, where="M == 16") == (1, 2)
    df = read_csv(old).set_index(["M", "metric"])["value"]
    assert df.to_dict() == {(1, "latency_ms"): 1.0, (1, "floor_ms"): 0.5, (16, "latency_ms"): 1.8,
                            (16, "read_ref_ms"): 1.5}
    # a query on a per-row column picks points, never half of one: both M = 16 rows come in, not only read_ref_ms
    pd.DataFrame([row(1, "latency_ms", 1.0, "a"), row(16, "latency_ms", 2.0, "a")]).to_csv(old, index=False,
                                                                                           columns=SCHEMA)
    assert replace_points(old, new, where="metric == 'read_ref_ms'") == (1, 2)
    assert read_csv(old).set_index(["M", "metric"])["value"].to_dict() == {
        (1, "latency_ms"): 1.0, (16, "latency_ms"): 1.8, (16, "read_ref_ms"): 1.5}
    assert merge_main(["--replace", str(new), str(old)]) == 0            # M = 1 too: its floor_ms row goes with it
    assert read_csv(old).set_index(["M", "metric"])["value"].to_dict() == {
        (1, "latency_ms"): 0.9, (16, "latency_ms"): 1.8, (16, "read_ref_ms"): 1.5}
    assert merge_main(["--replace", str(new), "--where", "M ==", str(old)]) == 2
    assert merge_main(["--replace", str(tmp_path), str(old)]) == 2       # a folder, not a CSV
    assert merge_main(["--where", "M == 1", str(old)]) == 2
