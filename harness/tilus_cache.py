"""Build the Tilus kernel cache for the points the experiments' sweeps will run, without a GPU.

    python -m harness.tilus_cache --out build/tilus_cache --tar build/tilus_cache.tgz
    python -m harness.tilus_cache --experiments tilus_fig10 --limit 3

The points are planned exactly as `python -m harness experiment=<e> kernel=tilus -m` would
plan them on a GPU (every job of the sweep, full-size shapes); the compiling is
`kernels.baselines.build_tilus_cache.build`. On the GPU machine set TILUS_CACHE_DIR to the
unpacked cache. The cache is valid while kernels/baselines/tilus_kernel.py is unchanged.
"""
from __future__ import annotations

import argparse
import os
import sys

from hydra import compose, initialize_config_dir

from .preflight import expand_jobs
from .runner import build_context
from .specs import CONF_DIR

EXPERIMENTS = ("tilus_fig10", "tilus_fig14", "tilus_fig11")


def points(experiments=EXPERIMENTS) -> list[tuple]:
    """(fmt, group, act, K, N) that the tilus kernel will run in these experiments' sweeps, in
    order, without duplicates, only those tilus supports."""
    out = []
    for e in experiments:
        jobs = expand_jobs([f"experiment={e}", "kernel=tilus", "run.device=cuda"])   # the GPU sweep, even planned here
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for job in jobs:
                _, _, pts = build_context(compose(config_name="config", overrides=job), plan_only=True)
                for p in pts:
                    key = (p.weight_dtype, p.group_size, p.act_dtype, p.K, p.N)
                    if not p.skip_reason and key not in out:        # skip_reason: the registry's supports
                        out.append(key)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/tilus_cache")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS), help="comma list, in priority order")
    ap.add_argument("--limit", type=int, default=0, help="only the first N points (for timing)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--march", default="x86-64-v2")
    ap.add_argument("--tar", default="", help="write a .tgz of the cache (top folder 'tilus_cache')")
    a = ap.parse_args(argv)
    pts = points(tuple(a.experiments.split(",")))
    if a.limit:
        pts = pts[:a.limit]
    from kernels.baselines.build_tilus_cache import build
    return build(pts, a.out, a.workers, a.march, a.tar)


if __name__ == "__main__":
    sys.exit(main())
