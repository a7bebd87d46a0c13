"""`python -m harness.merge [RESULTS_DIR]`: validate every shard under RESULTS_DIR/<gpu>/<experiment>/shards/
and fold it into that experiment's results.csv (default RESULTS_DIR: results/ of this checkout).

`python -m harness.merge --replace NEW.csv [--where "M == 16"] RESULTS.csv`: fold another run's results.csv into a
committed one, replacing every row of each point that NEW measured (store.replace_points): how the re-measured rows of
results/h200/ were folded in (results/h200/RUNS.md).

Exit status: 0 when every shard folded, 1 when a shard failed validation (named on stderr), 2 for a
RESULTS_DIR that does not exist or is not a folder (or, with --replace, a file that is not a results CSV)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .provenance import ROOT
from .store import SchemaError, merge, replace_points


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.merge", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", nargs="?", default=str(ROOT / "results"), help="default: %(default)s")
    ap.add_argument("--replace", metavar="NEW.csv", help="fold NEW.csv's points into the results.csv given as the "
                    "argument, replacing every earlier row of each point it measured")
    ap.add_argument("--where", metavar="QUERY", help="with --replace: only the points of NEW with a row matching this "
                    "pandas query (each taken whole)")
    a = ap.parse_args(argv)
    if a.replace or a.where:
        return _replace(a)
    root = Path(a.results_dir)
    if not root.is_dir():
        print(f"merge: {root} is not a folder", file=sys.stderr)
        return 2
    bad = n = 0
    for shards in sorted(root.glob("*/*/shards")):
        if not any(shards.glob("*.csv")):
            continue
        try:
            out = merge(shards.parent)
            n += 1
            print(f"merged {out}")
        except SchemaError as e:
            print(f"schema error: {e}", file=sys.stderr)
            bad += 1
    if not n and not bad:
        print(f"merge: no shards under {root}/<gpu>/<experiment>/shards/: nothing to fold")
    return 1 if bad else 0


def _replace(a) -> int:
    if not a.replace:
        print("merge: --where needs --replace NEW.csv", file=sys.stderr)
        return 2
    for f in (a.replace, a.results_dir):
        if not Path(f).is_file():
            print(f"merge: {f} is not a results CSV file", file=sys.stderr)
            return 2
    try:
        dropped, added = replace_points(Path(a.results_dir), Path(a.replace), a.where)
    except SchemaError as e:
        print(f"merge: {e}", file=sys.stderr)
        return 2
    print(f"{a.results_dir}: {dropped} rows replaced by {added} rows of {a.replace}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
