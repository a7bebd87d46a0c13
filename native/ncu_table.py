"""Per-kernel means of an `ncu` details print (the text `ncu --section ...` or `ncu --metrics ...` writes to stdout):
the tables of native/NOTES.md sections 38-39 are this over the files in results/checks.

    python -m native.ncu_table FILE [--weights K*N] [--metrics "Duration,Issued Instructions,..."]

Kernels are grouped by their full template name, in the order they first appear; each metric is the mean over that
kernel's launches. --weights adds the issued (warp) instructions per weight (x 32 lanes / weights) where the file has
`Issued Instructions` or `smsp__inst_executed.sum`, and the sum of the `smsp__average_warps_issue_stalled_*` ratios
(cycles per issued instruction) where it has them.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

DEFAULT_METRICS = ("Duration", "gpu__time_duration.sum", "No Eligible", "Eligible Warps Per Scheduler",
                   "Active Warps Per Scheduler", "Registers Per Thread", "DRAM Throughput",
                   "smsp__issue_active.avg.pct_of_peak_sustained_active",
                   "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                   "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
                   "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
                   "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio")
_KERNEL = re.compile(r"^  (\S.*?)\((\w+)\) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", re.M)
_ROW = re.compile(r"^ {4}(\S.*?\S)\s{2,}(?:\S+\s+)?([\d.,]+)\s*$")
_STALL = re.compile(r"smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio")


def launches(text: str) -> list[tuple[str, dict]]:
    """[(kernel, {metric: value})] per profiled launch, in file order."""
    heads = list(_KERNEL.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        vals = {}
        for line in body.splitlines():
            m = _ROW.match(line)
            if m:
                vals[m.group(1)] = float(m.group(2).replace(",", ""))
        out.append((h.group(1).strip().removeprefix("void "), vals))
    return out


def table(text: str, metrics=DEFAULT_METRICS, weights: int = 0) -> list[tuple[str, int, dict]]:
    """[(kernel, launches, {metric: mean})] for the metrics present in the file (plus the derived ones)."""
    groups: dict[str, list[dict]] = {}
    for name, vals in launches(text):
        derived = dict(vals)
        inst = vals.get("Issued Instructions", vals.get("smsp__inst_executed.sum"))
        if weights and inst is not None:
            derived["instructions per weight"] = inst * 32 / weights
        stalls = [v for k, v in vals.items() if _STALL.fullmatch(k)]
        if stalls:
            derived["cycles per issue (sum of stalls)"] = sum(stalls)
        groups.setdefault(name, []).append(derived)
    keys = list(metrics) + ["instructions per weight", "cycles per issue (sum of stalls)"]
    return [(name, len(rows), {k: statistics.fmean(r[k] for r in rows) for k in keys if all(k in r for r in rows)})
            for name, rows in groups.items()]


def _weights(text: str) -> int:
    out = 1
    for f in text.lower().replace("x", "*").split("*"):
        if not f.strip().isdigit() or int(f) <= 0:
            raise ValueError(f"--weights: {text!r} is not a product of positive integers (e.g. 8192*57344)")
        out *= int(f)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="an ncu details print (text)")
    ap.add_argument("--weights", default=None, help="weights per launch, e.g. 8192*57344 (for instructions / weight)")
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="metric names, comma separated")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.file):
        ap.error(f"{a.file!r} is not a file")
    try:
        weights = _weights(a.weights) if a.weights else 0
    except ValueError as e:
        ap.error(str(e))
    with open(a.file, errors="replace") as fh:
        rows = table(fh.read(), [m.strip() for m in a.metrics.split(",") if m.strip()], weights)
    if not rows:
        ap.error(f"{a.file!r} holds no ncu kernel launches")
    for name, n, means in rows:
        print(f"{name}  ({n} launches)")
        for k, v in means.items():
            print(f"    {k:<80} {v:10.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
