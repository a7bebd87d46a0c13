"""`python -m harness.merge [RESULTS_DIR]`: validate every shard under RESULTS_DIR/<gpu>/<experiment>/shards/
and fold it into that experiment's results.csv (default RESULTS_DIR: results/ of this checkout).

Exit status: 0 when every shard folded, 1 when a shard failed validation (named on stderr), 2 for a
RESULTS_DIR that does not exist or is not a folder."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .provenance import ROOT
from .store import SchemaError, merge


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.merge", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", nargs="?", default=str(ROOT / "results"), help="default: %(default)s")
    a = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
