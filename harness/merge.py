"""`python -m harness.merge [results_dir]`: validate and fold every shard into results.csv."""
from __future__ import annotations

import sys
from pathlib import Path

from .provenance import ROOT
from .store import SchemaError, merge


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else ROOT / "results"
    bad = 0
    for shards in sorted(root.glob("*/*/shards")):
        try:
            out = merge(shards.parent)
            print(f"merged {out}")
        except SchemaError as e:
            print(f"schema error: {e}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
