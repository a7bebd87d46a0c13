"""Build the Tilus kernel cache for the whole-model runs (tilus_fig12/13) on a machine without a GPU.

    python -m experiments.tilus_fig12.tilus_cache --models gemma2_9b qwen2_5_32b --out build/tilus_cache_e2e

harness.tilus_cache plans kernel-level sweeps (points with K and N); an llm_e2e point names a model, so
here the points are the model cards' linear shapes (harness.shapes.linear_layers: qkv, o, gate_up, down)
for each precision. The compiling is kernels.baselines.build_tilus_cache.build (target sm90a, 6 matmul
candidates + repack + dequantize per shape). On the GPU machine: TILUS_CACHE_DIR=<out> (carry the folder);
prepare_tilus then only transpiles and loads lib.so files, no nvcc. Valid while
kernels/baselines/tilus_kernel.py is unchanged.
"""
from __future__ import annotations

import argparse
import os
import sys


def points(models, precisions=("u4",), group=128, act="f16") -> list[tuple]:
    from omegaconf import OmegaConf

    from harness.shapes import linear_layers
    from harness.specs import CONF_DIR, ModelCard
    out = []
    for m in models:
        card = ModelCard.from_cfg(OmegaConf.load(CONF_DIR / "model" / f"{m}.yaml"))
        for prec in precisions:
            for l in linear_layers(card):
                key = (prec, group, act, l.K, l.N)
                if key not in out:
                    out.append(key)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gemma2_9b", "qwen2_5_32b"])
    ap.add_argument("--precisions", nargs="+", default=["u4"])
    ap.add_argument("--out", default="build/tilus_cache_e2e")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--tar", default="")
    a = ap.parse_args(argv)
    pts = points(a.models, a.precisions)
    print("points:", pts, flush=True)
    from kernels.baselines.build_tilus_cache import build
    return build(pts, a.out, a.workers, "x86-64-v2", a.tar)


if __name__ == "__main__":
    sys.exit(main())
