"""kernels/lowbit/packed.py: the f16x2 dequantization recipes, and the kernel that runs them.

The interpreter cannot execute inline PTX, so on the CPU the recipes are checked two ways:
* emulated bit for bit (numpy) on the words that ``prepare`` writes, for every code of every
  supported width: the recipe must give back exactly the codes of the weight, in k order;
* the real kernel (``_mm_small_kernel`` with PACKED) is compiled for sm_90 with Triton's own
  ptxas, and its SASS main loop is checked for what the design promises: the packed
  instructions are there and the weight tile reaches shared memory as 16-byte vectors.
On a GPU the harness checks every packed result against float64 before timing it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels.lowbit import packed
from kernels.lowbit import triton_matmul as tm
from kernels.lowbit.formats import codes_of, random_quantized

ROOT = Path(__file__).resolve().parent.parent
CASES = [("uint", 1), ("uint", 2), ("uint", 4), ("uint", 8), ("int", 2), ("int", 4), ("int", 8)]


@pytest.mark.parametrize("kind,bits", CASES)
def test_recipe_recovers_every_code_from_prepared_words(kind, bits):
    name = f"{'u' if kind == 'uint' else 'i'}{bits}"
    K, N = 64, 40
    qw = random_quantized(K, N, name, 32, torch.float16, seed=bits)
    pw = tm.prepare(qw)
    r = packed.recipe(kind, bits)
    assert (pw.tkw, pw.tn) == (K // 8, N)                          # one layout block: [K/8, N] row-major
    w0 = pw.parts[0].to(torch.int64).numpy().reshape(K // 8, N).T.reshape(-1)   # -> chunks (n, kw)
    w1 = pw.parts[1].to(torch.int64).numpy().reshape(K // 8, N).T.reshape(-1) if len(pw.parts) > 1 else w0
    by_slot = packed.emulate_codes(r, w0, w1)                      # [N*K/8, 8]
    q = by_slot[:, list(packed.SLOT)]                              # k order within the chunk
    codes = codes_of(qw).numpy().T.reshape(N * K // 8, 8).astype(np.int64)   # [n, kw, j]
    if kind == "int":
        codes = np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
    assert np.array_equal(q, codes)
    # every code value occurs (symmetric ints never use -2^(B-1)), so every mask / offset was exercised
    assert len(np.unique(codes)) == (1 << bits) - (kind == "int")


def test_recipe_constants():
    for kind, bits in CASES:
        r = packed.recipe(kind, bits)
        assert len(r.outputs) == 4
        for o in r.outputs:
            assert max(o.pos) + bits <= 10           # code inside the f16 mantissa: exact
            assert bin(o.mask).count("1") == 2 * bits
            assert o.mask & packed.MAGIC == 0
    with pytest.raises(ValueError, match="not uint3"):
        packed.recipe("uint", 3)
    assert not packed.supported("float", 4) and not packed.supported("int", 1)
    assert sorted(packed.SLOT) == list(range(8))


def _sass_stats(name, cfg):
    """kernels.lowbit.sass in a child process: the compiler cannot run under TRITON_INTERPRET=1."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "kernels.lowbit.sass", name, str(cfg), "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["u4", "i8", "u1"])
def test_packed_kernel_compiles_for_sm90(name):
    for c in [c for c in tm.configs_for(16, 8192, 57344, None, 128) if c.path == "dot"][:2]:   # the default two
        st = _sass_stats(name, c)
        ops, per_thread = st["ops"], st["weights_per_thread"]
        assert ops.get("HFMA2", 0) + ops.get("HMUL2", 0) == per_thread, st      # two f16x2 ops per weight pair
        assert ops.get("LOP3.LUT", 0) >= per_thread // 2, st                   # one LOP3 per pair
        assert "STS.U16" not in ops and ops.get("STS.128", 0) == per_thread // 8, st   # 16-byte tile stores
        assert st["per_weight"] < 7, st


@pytest.mark.parametrize("name", ["u4", "i4"])
def test_packed_m1_kernel_compiles_for_sm90(name):
    c = [c for c in tm.configs_for(1, 8192, 57344, None, 128) if c.path == "fma"][0]
    st = _sass_stats(name, c)
    ops, per_thread = st["ops"], st["weights_per_thread"]
    # per weight pair: one LOP3, one HFMA2 (code), one HFMA2/HMUL2 (dot with x); uint also one HADD2 (zero point)
    assert ops.get("LOP3.LUT", 0) >= per_thread // 2, st
    assert ops.get("HFMA2", 0) + ops.get("HFMA2.MMA", 0) + ops.get("HMUL2", 0) >= per_thread, st
    assert st["per_weight"] < 4.5, st
