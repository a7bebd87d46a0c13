"""CPU tests of the native low-bit matmul (native/lowbit*.py, native/include/lowbit_*.cuh).

What runs without a GPU: the recipes (every format, both tensor-core dtypes) emulated bit for bit on
packed words against kernels.lowbit.formats; the fragment layout against the PTX m16n8k16 operand
layout; the kernel's schedule (stream-K ranges, stage table, scale slots, group flushes, atomics,
x split) emulated in float64 against x @ dequantize_ref; the generated header being up to date;
nvcc (sm_90a) compiles of every instantiation and a g++ syntax check of the bindings; the main
loop's instruction count per weight (SASS)."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import Unavailable, Unsupported
from kernels.baselines import Case
from kernels.lowbit.formats import ALL_FORMAT_NAMES, dequantize_ref, parse_format, random_quantized
from native import build, lowbit
from native import lowbit_layout as LL
from native.lowbit_emulate import emulate_fused, emulate_gemv, xperm, xtiles

ACTS = {"f16": torch.float16, "bf16": torch.bfloat16}


# ---------------------------------------------------------------- recipes and layout

@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("fmt", ALL_FORMAT_NAMES)
def test_recipe_round_trip_every_format(fmt, act):
    """pack -> the recipe's LOP3/shift/fma emulation gives the exact value of every code."""
    f = parse_format(fmt)
    rec, xsplit = LL.recipe_for(f, act)
    assert xsplit == (act == "f16" and f.kind == "float" and f.exp_bits >= 5)
    assert rec.target == ("bf16" if act == "bf16" or xsplit else "f16")
    K, N = 2 * rec.kstep - 32, 256 + 48                 # padding in K and N
    L = LL.Layout.of(K, N, -1, rec.kstep)
    codes = torch.randint(0, 1 << f.bits, (K, N), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    assert torch.unique(codes).numel() == 1 << f.bits  # every bit pattern occurs (incl. int -2^(b-1), float -0)
    words = LL.pack_codes(rec, codes, L)
    assert words.shape == (L.nblocks, L.iters, LL.WARPS, L.chunks * rec.bits // 4, 32, 4)
    assert words.numel() * 4 == L.Kpad * L.Npad * f.bits // 8   # no byte inflation
    vals = LL.emulate_values(rec, words, L)[:K, :N]
    want = torch.from_numpy(LL.code_values(f))[codes.long()]
    fold = LL.FOLD_BIAS and LL.fold_ok(f, LL.TARGETS[rec.target])
    assert rec.bias == (LL.TARGETS[rec.target].magic_value if fold else 0.0)
    assert torch.equal(vals - rec.bias, want)         # exact: value + bias is an integer below 2^(mantissa + 1)
    if LL.fold_ok(f, LL.TARGETS[rec.target]):          # the packing with the magic number left in (FOLD_BIAS)
        frec = LL._pack(rec.fmt, rec.target, True)
        fvals = LL.emulate_values(frec, LL.pack_codes(frec, codes, L), L)[:K, :N]
        assert frec.bias == LL.TARGETS[rec.target].magic_value and torch.equal(fvals - frec.bias, want)


@pytest.fixture
def folded(monkeypatch):
    """Recipes with the magic number left in (lowbit_layout.FOLD_BIAS), for the tests of that path (which the
    OFFSET packing of u1 / u2 / u4 takes precedence over: off here)."""
    monkeypatch.setattr(LL, "FOLD_BIAS", True)
    monkeypatch.setattr(LL, "OFFSET", False)
    LL.build_recipe.cache_clear()
    yield
    LL.build_recipe.cache_clear()


def test_biased_recipes_flush_every_stage(folded):
    """A recipe that leaves the magic number in (Recipe.bias) gets a stage table that flushes the partial sums at
    every stage's end, whatever the group size (per channel included); the others flush at group ends only; and
    the kernel's schedule with the bias added to the zero point matches float64."""
    for fmt, g, M in [("u4", -1, 3), ("u2", 64, 16), ("u7", 96, 1)]:
        qw = random_quantized(384, 512, fmt, g, torch.float16, seed=5)
        pw = lowbit.pack(qw)
        assert pw.rec.bias == 1024.0
        x = torch.randn(M, 384, generator=torch.Generator().manual_seed(1)).to(torch.float16)
        y, _ = emulate_gemv(pw, x, 3, defer=fmt == "u4")
        ref = x.double() @ dequantize_ref(qw)
        assert torch.allclose(y, ref, rtol=1e-10, atol=1e-12), (fmt, float((y - ref).abs().max()))
    for fmt, g in [("u4", -1), ("u2", -1), ("u4", 256), ("u8", 128), ("i4", -1), ("u1", -1)]:
        qw = random_quantized(1024, 256, fmt, g, torch.float16)
        pw = lowbit.pack(qw)
        masks = [(int(t) >> 20) & 0xFF for t in pw.stab]
        last = 1 << (pw.L.chunks - 1)
        if pw.rec.bias:
            assert all(m & last for m in masks), (fmt, g)
        elif g == -1:
            assert not any(masks), (fmt, g)


def test_recipe_costs_are_what_the_header_says():
    head = (build.INCLUDE / "lowbit_recipes.cuh").read_text()
    for r in LL.all_recipes():
        c = r.cost()
        assert f"// {r.fmt} on {r.target} tensor cores: {c['total']} instructions per 32 weights" in head
        assert c["per_weight"] < (3.5 if r.bits == 8 and r.target == "bf16" else 2.7), r.name
    assert LL._pack("u4", "f16", False).cost()["per_weight"] == 1.125     # 1 lop3 + 1 hfma2 per pair, 1 shf / 4 pairs
    assert LL._pack("u1", "f16", False).cost()["per_weight"] < 1.05
    # OFFSET recipes: deq_off() = 1 lop3 per pair + the shifts (u1 7, u2 6, u4 8 per chunk); deq() 1 hfma2 more
    offs = {f: LL._pack_offset(f, "f16") for f in ("u1", "u2", "u4", "u8", "i2", "i4", "i8")}
    assert {f: r.cost_off()["total"] for f, r in offs.items()} == {"u1": 23, "u2": 22, "u4": 24, "u8": 24, "i2": 22,
                                                                  "i4": 24, "i8": 24}
    assert all(r.cost()["total"] == r.cost_off()["total"] + 16 and r.deq_cost() == r.cost_off() for r in offs.values())
    assert all(f"deq_off: value + offset per pair, {offs[f].cost_off()['total']} instructions" in head
               for f in LL.OFFSET_FORMATS)
    assert [r.name for r in LL.all_recipes() if r.offs] == [f"f16_{f}" for f in LL.OFFSET_FORMATS]
    # the magic number left in (Recipe.bias, FOLD_BIAS): u4 = per word 4 lop3, 2 shf, 1 hfma2 per pair whose code is
    # not at the mantissa's bottom; u8 = per word 2 lop3 + 1 shf
    assert LL._pack("u4", "f16", True).cost()["per_weight"] == 0.875
    assert LL._pack("u8", "f16", True).cost()["per_weight"] == 0.75
    for r in LL.all_recipes():
        assert r.bias == 0.0 or LL.FOLD_BIAS
        f = parse_format(r.fmt)
        if LL.fold_ok(f, LL.TARGETS[r.target]):   # uint, 2-7 (f16: 8) bits: cheaper with the magic number left in
            assert LL._pack(r.fmt, r.target, True).cost()["total"] < LL._pack(r.fmt, r.target, False).cost()["total"]


@pytest.mark.parametrize("fmt", ["u1", "u2", "u4", "u8", "i2", "i4", "i8"])
def test_offset_recipes(fmt):
    """OFFSET packing (lowbit_layout._pack_offset): deq_off() gives value + offset, the offset a power of two (plus
    2^(b-1) for int codes, stored offset binary) that depends on the pair's k half only (the kernels' one A tile
    {1, OFFA0, 1, OFFA1} for the sum's mma), and deq() the exact value; every bit of every code of the chunk is placed
    once (random and extreme codes)."""
    f = parse_format(fmt)
    rec = LL._pack_offset(fmt, "f16")
    assert LL.offset_packable(f, LL.F16) and (LL.build_recipe(fmt, "f16") == rec) == (fmt in LL.OFFSET_FORMATS)
    ob = 2.0 ** (f.bits - 1) if f.kind == "int" else 0.0
    assert rec.offs and rec.bias == 0.0 and rec.zero == (f.kind == "uint")
    assert all(rec.offs[i] == rec.off_groups[(i >> 1) & 1] for i in range(LL.PAIRS))
    assert {o - ob for o in rec.off_groups} <= {2.0 ** e for e in range(1, 11)} and len(set(rec.off_groups)) == 2
    hi = (1 << rec.bits) - 1
    codes = torch.cat([torch.randint(0, hi + 1, (500, LL.PAIRS, 2), generator=torch.Generator().manual_seed(7)),
                       torch.full((1, LL.PAIRS, 2), hi), torch.zeros(1, LL.PAIRS, 2, dtype=torch.int64)])
    words = LL.pack_chunk(rec, codes).numpy()
    vals = codes.numpy() - ob
    assert np.array_equal(LL.emulate_chunk(rec, words), vals)
    assert np.array_equal(LL.emulate_chunk_off(rec, words), vals + np.array(rec.offs)[None, :, None])
    # one stored bit -> exactly one value moves, by 2^(its bit within the code)
    base = LL.emulate_chunk(rec, np.zeros((1, rec.bits), dtype=np.int64))
    for w in range(rec.bits):
        for bit in range(32):
            one = np.zeros((1, rec.bits), dtype=np.int64)
            one[0, w] = 1 << bit
            d = LL.emulate_chunk(rec, one) - base
            assert (d != 0).sum() == 1 and d.max() == 2 ** ((bit % 16) % rec.bits)
    struct = LL.render_recipe(rec)
    assert "static constexpr bool OFFS = true;" in struct and "deq_off(" in struct and "hfma2_f16" in struct
    assert f"MAGIC = 0x{LL.OFF_EXP:08x}u" in struct
    head = (build.INCLUDE / "lowbit_recipes.cuh").read_text()
    assert (struct in head) == (fmt in LL.OFFSET_FORMATS)


def test_generated_header_is_up_to_date():
    committed = (build.INCLUDE / "lowbit_recipes.cuh").read_text()
    assert committed == LL.render_header(), "run: python -c 'from native import lowbit_layout as L; " \
                                            "open(\"native/include/lowbit_recipes.cuh\",\"w\").write(L.render_header())'"


@pytest.mark.parametrize("kstep", [128, 256])
def test_fragment_layout_matches_the_ptx_mma_operands(kstep):
    """Pair i of chunk kg of lane (g, t) must hold the A-fragment elements of mma (r, nt) that the
    PTX m16n8k16 layout gives that lane, with the logical k the B fragment (x[m][8t..8t+8) as one
    16-byte load) pairs them with."""
    L = LL.Layout.of(2 * kstep, 2 * LL.BN, -1, kstep)
    nn, kk = LL.fragment_nk(L)                       # [nb, it, w, lane, chunk, pair, half]
    for lane in (0, 5, 18, 31):
        g, t = lane // 4, lane % 4
        for i in range(LL.PAIRS):
            r, nt, j = i // 8, (i // 4) % 2, i % 4   # mma (k-block r, n16 tile nt), A register j
            for h in (0, 1):
                # PTX: a{2j+h}: row = groupID + 8 * (j & 1), col = 2 * tid_in_group + h + 8 * (j >> 1)
                row, col = g + 8 * (j & 1), 2 * t + h + 8 * (j >> 1)
                # B fragment of k-block r: rows (logical k) 2t, 2t+1 <- x words [2r] = k 8t+4r+{0,1};
                # rows 2t+8, 2t+9 <- x word [2r+1] = k 8t+4r+{2,3}
                kphys = 8 * t + 4 * r + (col - 2 * t if col < 8 else 2 + col - 8 - 2 * t)
                for nb, it, w, kg in ((0, 0, 0, 0), (1, 1, 3, L.chunks - 1)):
                    assert int(nn[nb, it, w, lane, kg, i, h]) == nb * LL.BN + w * 32 + nt * 16 + row
                    assert int(kk[nb, it, w, lane, kg, i, h]) == it * kstep + kg * LL.KG + kphys


def test_scales_layout_and_stage_table():
    qw = random_quantized(384, 512, "u3", 64, torch.float16, seed=2)
    L = LL.Layout.of(qw.K, qw.N, qw.group_size, 128)
    sc = LL.pack_scales(qw, L)
    assert sc.shape == (L.nblocks, LL.WARPS, L.ngroups, 2, 8, 4)
    # channel n = nb*256 + w*32 + nt*16 + jn*8 + g, group G: (s_g, s_g+8, z_g, z_g+8)
    for nb, w, G, nt, g, jn in [(0, 0, 0, 0, 0, 0), (1, 7, 5, 1, 7, 1), (1, 3, 2, 0, 4, 1)]:
        n = nb * 256 + w * 32 + nt * 16 + jn * 8 + g
        assert sc[nb, w, G, nt, g, jn] == qw.scales[G, n] and sc[nb, w, G, nt, g, 2 + jn] == qw.zeros[G, n]
    tab = LL.stage_table(L)
    assert [(int(v) & 0xFFFF, (int(v) >> 16) & 0xF, (int(v) >> 20) & 0xFF) for v in tab] == \
        [(0, 2, 0b1010), (2, 2, 0b1010), (4, 2, 0b1010)]
    assert LL.stage_slots(tab) == 2


# ---------------------------------------------------------------- the kernel's schedule

SCHEDULES = [  # fmt, act, group, K, N, M, grid
    ("u4", "f16", 128, 1024, 512, 1, 1),       # one block per n-block range: direct stores
    ("u4", "f16", 128, 1024, 512, 1, 3),       # stream-K pieces across n-blocks
    ("i4", "f16", -1, 384 + 8, 300, 5, 7),      # K, N padding, per channel, open-group flushes
    ("u1", "f16", 64, 1024, 256, 16, 5),       # kstep 256, 4 groups per stage
    ("u2", "f16", 32, 512, 512, 9, 3),         # 8 groups per stage (all scale slots)
    ("u8", "bf16", 96, 384, 512, 3, 4),         # group not dividing the stage
    ("f6e3m2", "f16", -1, 256, 256, 3, 2),
    ("f8e5m2", "f16", -1, 256, 512, 4, 3),      # x split: bf16 tensor cores, rows m and m+M summed
    ("f7e6m0", "f16", 128, 256, 256, 8, 1),     # x split with direct-store-sized ranges (still atomics)
    ("f4e2m1", "bf16", 256, 768, 256, 2, 5),    # group spanning stages
    ("f3e1m1", "f16", 32, 224, 256, 1, 100),    # more blocks than work items
    ("i8", "bf16", 128, 256, 256, 16, 3),       # two-term bf16 8-bit recipe
]


@pytest.mark.parametrize("fmt,act,group,K,N,M,grid", SCHEDULES)
def test_schedule_emulation_matches_float64_reference(fmt, act, group, K, N, M, grid):
    dt = ACTS[act]
    qw = random_quantized(K, N, fmt, group, dt, seed=K + N + M)
    pw = lowbit.pack(qw)
    assert pw.decode_group_ok
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(dt)
    ref = x.double() @ dequantize_ref(qw)
    for defer in (False, True):   # counts added after each piece / at the block's end (bulk 4-bit: DEFER)
        y, stats = emulate_gemv(pw, x, grid, defer=defer)
        assert torch.isfinite(y).all()
        assert torch.allclose(y, ref, rtol=1e-10, atol=1e-12), float((y - ref).abs().max())
        assert stats["direct"] + stats["finished"] == pw.L.nblocks      # every n-block stored exactly once
    if grid == 1 and not pw.xsplit:
        assert stats["atomic_pieces"] == 0
    if (pw.L.nblocks * pw.L.iters) % min(grid, pw.L.nblocks * pw.L.iters) or pw.xsplit:
        assert stats["atomic_pieces"] > 0


def test_decode_variants_exist_for_every_choice():
    """_mt() only asks for variants native/include/lowbit_launch.cuh builds."""
    src = (build.INCLUDE / "lowbit_launch.cuh").read_text()
    assert "launch_gemv<R, 1, false, false, false>" in src and "launch_gemv<R, 2, false, false, false>" in src
    assert "launch_gemv<R, 2, true, false, false>" in src
    assert "launch_gemv<R, 2, false, true, false>" in src and "launch_gemv<R, 4, false, true, false>" in src
    for fmt, act in [("u4", "f16"), ("i8", "bf16"), ("f8e5m2", "f16")]:
        qw = random_quantized(256, 256, fmt, -1, ACTS[act])
        pw = lowbit.pack(qw)
        for M in range(1, lowbit.DECODE_MAX_M + 1):
            mt = lowbit._mt(pw, M)
            assert (2 * M if pw.xsplit else M) <= 8 * mt
            assert (pw.rec.target, pw.xsplit, mt) in {("f16", False, 1), ("f16", False, 2), ("bf16", False, 2),
                                                      ("bf16", True, 2), ("bf16", True, 4)}


def test_decode_variants_are_built_for_the_tuned_recipes():
    """Variants lean / lean3 exist for LL.TUNED (f16, no x split) only, bulk / bulk1 / regs for LL.BULK (every f16
    recipe; bulk / bulk1 also for the bf16 recipes of x split); LowbitMatmul falls back to base for every other
    recipe; the tuning extension compiles exactly the TUNED recipes."""
    head = (build.INCLUDE / "lowbit_recipes.cuh").read_text()
    for r in LL.all_recipes():
        assert f"static constexpr bool TUNE = {'true' if r.name in LL.TUNED else 'false'};" in head.split(
            f"struct rec_{r.name} {{")[1].split("};")[0]
    assert all(n.startswith("f16_") for n in LL.TUNED)
    assert "#define LOWBIT_RECIPES_TUNED(X) " + " ".join(f"X(rec_{n})" for n in
                                                        [r.name for r in LL.all_recipes() if r.name in LL.TUNED]) in head
    src = (build.INCLUDE / "lowbit_launch.cuh").read_text()
    for v in (1, 2, 3):
        for mt in (1, 2):
            assert f"launch_gemv<R, {mt}, false, false, false, {v}>" in src
    assert set(lowbit.DECODE_VARIANTS.values()) == {0, 1, 2, 3, 4, 5, 6, 7}
    # bulk1 (5): bulk's builds with one block per SM, wherever bulk is dispatched (plain, instrumented, x split)
    assert "if (p.variant == VBULK1)" in src and "q.variant = 3;" in src and "grid > 0 ? grid : sms" in src
    # regs (4, lowbit_regs.cuh): the BULK recipes at one and two tiles, plain, and (R::PROF) instrumented
    for mt in (1, 2):
        assert f"p.variant == VREGS && mt == {mt}" in src and f"launch_regs<R, {mt}, false>(p," in src
        assert f"launch_regs_prof<R, {mt}>(prof," in src
    assert "R::BULK" in src and set(LL.TUNED) <= set(LL.BULK)
    xsplit = {r.name for r in LL.all_recipes() if r.target == "bf16" and LL.target_for(parse_format(r.fmt), "f16")[1]}
    assert xsplit and all(parse_format(n[5:]).exp_bits >= 5 for n in xsplit)
    for r in LL.all_recipes():   # bulk: every f16 recipe, and the bf16 ones that serve f16 activations with x split
        assert (r.name in LL.BULK) == (r.target == "f16" or r.name in xsplit), r.name
    for mt in (2, 4):
        assert f"launch_gemv<R, {mt}, false, true, false, 3>(p," in src
    for fmt, act, lean, bulk in [("u4", "f16", 1, 3), ("f8e5m2", "f16", 0, 3), ("u4", "bf16", 0, 0), ("u3", "f16", 0, 3),
                                 ("f8e5m2", "bf16", 0, 0)]:
        pw = lowbit.pack(random_quantized(256, 256, fmt, -1, ACTS[act]))
        assert lowbit.variant_for(pw, "lean") == lean
        assert lowbit.variant_for(pw, "bulk") == lowbit.variant_for(pw, "bulk1") - 2 * (bulk > 0) == bulk
        assert lowbit.variant_for(pw, "regs") == (4 if pw.rec.target == "f16" else 0)
        assert lowbit.variant_for(pw, "base") == 0
    srcs = build.tune_sources(Path(__import__("tempfile").mkdtemp()))
    assert [p.name for p in srcs if p.name.startswith("tune_")] == [f"tune_{n}.cu" for n in LL.TUNED]


def test_default_variant_per_recipe_and_tiles():
    """The default ("auto", native/NOTES.md sections 9, 12, 13 and 30): bulk for u2, u4, i4, u8 and f6e3m2, base for u1 at
    M > 8 (mt2), lean for every other TUNED recipe; base for u3 / i3 / f3e1m1 at one and two tiles (bulk measured
    slower), bulk for the other BULK recipes; base for everything without variants; every variant stays selectable."""
    assert lowbit.DEFAULT_VARIANT == "timed"
    assert set(lowbit.VARIANT_CHOICES) == {"timed", "auto", *lowbit.DECODE_VARIANTS}
    assert all(name in LL.BULK and v in lowbit.DECODE_VARIANTS for (name, _), v in lowbit.AUTO_VARIANT.items())
    for fmt, act in [("u1", "f16"), ("u2", "f16"), ("u4", "f16"), ("i4", "f16"), ("u8", "f16"), ("f6e3m2", "f16"),
                     ("u3", "f16"), ("u4", "bf16"), ("f8e5m2", "f16"), ("i8", "f16"), ("f8e4m3", "f16"), ("u5", "f16"),
                     ("u8", "bf16"), ("i3", "f16"), ("f3e1m1", "f16"), ("f4e2m1", "f16"), ("i2", "f16")]:
        pw = lowbit.pack(random_quantized(256, 256, fmt, -1, ACTS[act]))
        tuned = pw.rec.name in LL.TUNED and not pw.xsplit
        for M in range(1, lowbit.DECODE_MAX_M + 1):
            mt = lowbit._mt(pw, M)
            bulk = pw.rec.name in LL.BULK and (pw.rec.target == "f16" or pw.xsplit)
            regs = bulk and not pw.xsplit
            want = (0 if fmt == "u1" and M > 8 else 3 if fmt in ("u2", "u4", "i4", "u8", "f6e3m2") else 1) if tuned else \
                (0 if fmt in ("u3", "i3", "f3e1m1") and mt <= 2 else 3 if bulk else 0)
            assert lowbit.variant_for(pw, "auto", mt) == want, (fmt, act, M)
            assert lowbit.variant_for(pw, "timed", mt) == want   # before (or without) a timing: auto's choice
            cands = lowbit.decode_candidates(pw, mt)   # what "timed" times: auto's first, each built, once
            assert cands[0] == want and len(set(cands)) == len(cands)
            assert set(cands) == {0} | ({1} if tuned else set()) | ({3, 5} if bulk else set()) | \
                ({4} if regs else set())
            assert set(cands) <= lowbit.PROF_VARIANTS      # every candidate has an instrumented build
            assert lowbit.variant_for(pw, "base", mt) == 0
            assert lowbit.variant_for(pw, "lean3", mt) == (2 if tuned else 0)
            assert lowbit.variant_for(pw, "bulk", mt) == (3 if bulk else 0)
            assert lowbit.variant_for(pw, "bulk1", mt) == (5 if bulk else 0)
            assert lowbit.variant_for(pw, "regs", mt) == (4 if regs else 0)
    with pytest.raises(KeyError):
        lowbit.variant_for(pw, "fast")


def test_instrumented_decode_runs_the_plain_calls_variant():
    """An instrumented decode call (profiled) runs the instrumented build of the variant the plain call runs,
    so proton_fig15's overhead ratio compares one kernel with itself; the header builds exactly PROF_VARIANTS
    for the PROF recipes (f16 u4), at both tile counts, and nothing else is asked for."""
    src = (build.INCLUDE / "lowbit_launch.cuh").read_text()
    for v in (0, 1, 2, 3):
        for mt in (1, 2):
            assert (f"launch_prof<R, {mt}, {v}>(prof," in src) == (v in lowbit.PROF_VARIANTS), (v, mt)
    # launch_prof builds each of them in every mode of PROF_MODES (instrument.cuh's ids), and nothing else
    body = src[src.index("int launch_prof("):src.index("int launch_regs_prof(")]
    assert body.count("launch_gemv<R, MT, false, false, true, V") == len(lowbit.PROF_MODES) == 2
    assert "prof == INSTR_MODE_STAGED" in body and "prof == INSTR_MODE_WARP0" in body
    body = src[src.index("int launch_regs_prof("):src.index("// prof: 0 = the plain kernel")]   # regs's
    assert body.count("launch_regs<R, MT, true") == len(lowbit.PROF_MODES)
    assert "prof == INSTR_MODE_STAGED" in body and "prof == INSTR_MODE_WARP0" in body
    from native.native_kernels import MODES
    assert all(MODES[m] == v for m, v in lowbit.PROF_MODES.items())
    pw = lowbit.pack(random_quantized(256, 256, "u4", -1, ACTS["f16"]))
    assert pw.rec.name == "f16_u4"
    for M in (1, 16):
        mt = lowbit._mt(pw, M)
        assert lowbit.variant_for(pw, "auto", mt, prof=True) == lowbit.variant_for(pw, "auto", mt) == 3
        assert lowbit.variant_for(pw, "base", mt, prof=True) == 0
        with pytest.raises(Unsupported, match="instrumented"):
            lowbit.variant_for(pw, "lean3", mt, prof=True)


def test_lean_variant_smem_fits_its_occupancy():
    """The lean variants stage all MT*8 rows of x: the ring must still fit 2 (lean) / 3 (lean3 where the
    weights allow) blocks per SM of an H200 (227 KB of shared memory per SM, 1 KB reserved per block)."""
    for name in LL.TUNED:
        rec = next(r for r in LL.all_recipes() if r.name == name)
        L = LL.Layout.of(8192, 57344, 128, rec.kstep)
        stab = LL.stage_table(L)
        slots = LL.stage_slots(stab)
        kst = rec.kstep
        for mt in (1, 2):
            stage = 8 * 32 * (kst // 32) * rec.bits * 4 + 8 * slots * (128 if rec.zero else 64) + mt * 8 * (2 * kst + 64)
            tab = ((L.iters * 4 + 15) // 16) * 16
            stages = {1: 5, 2: 4, 3: 5, 4: 4}.get(rec.bits, 3)
            if not (rec.bits == 8 and mt == 2):   # u8 at M > 8: 1 block per SM, as base at M = 16 (grid132 on the H200)
                assert 2 * (tab + stages * stage + 1024) <= 227 * 1024, (name, mt)
            if rec.bits == 4:   # u1 / u2 (256 k stages) and u8 / f6 stay at 2 blocks (the runtime occupancy query)
                assert 3 * (tab + (stages - 1) * stage + 1024) <= 227 * 1024, (name, mt)


# ---------------------------------------------------------------- API

def test_supports():
    assert lowbit.supports(Case("u4", "f16", 128, 8192, 57344)) is None
    assert lowbit.supports(Case("f8e5m2", "bf16", -1, 8192, 8192)) is None
    assert lowbit.supports(Case("u4", "f16", 8, 64, 64)) is None          # prefill path (dequantize + cuBLAS)
    assert "multiple of 8" in lowbit.supports(Case("u4", "f16", 12, 96, 64))
    assert "K=" in lowbit.supports(Case("u4", "f16", -1, 100, 64))
    assert "dense" in lowbit.supports(Case("f16", "f16", -1, 64, 64))
    assert "unknown" in lowbit.supports(Case("u9", "f16", -1, 64, 64))
    assert lowbit.supports(Case("u4", "fp32", -1, 64, 64))


def test_pack_prefill_only_group_sizes():
    """Group sizes the decode kernel cannot stage (8: 16 groups per 128-k stage) pack for the prefill path
    (the H200 self-check's u4 g8 case failed in pack with a bare assert)."""
    qw = random_quantized(1152, 600, "u4", 8, torch.float16, seed=0)
    pw = lowbit.pack(qw)
    assert not pw.decode_group_ok and pw.slots == 0 and pw.stab.numel() == pw.L.iters
    with pytest.raises(ValueError, match="at most 8 groups"):
        LL.stage_table(pw.L)


@pytest.mark.parametrize("fmt", ["f7e6m0", "f8e6m1", "f8e7m0", "f8e5m2", "u4"])
def test_self_check_inputs_of_wide_floats(fmt):
    """native.check: f16 scales of floats with >= 6 exponent bits are the smallest f16 has, so the exact
    output fits f16 where it can; f8e7m0 (max 2^64) cannot and is skipped with the reason."""
    from native.check import narrow_scales, unrepresentable
    qw = random_quantized(1000, 700, fmt, -1, torch.float16, seed=3)
    q2 = narrow_scales(qw, 3)
    wide = parse_format(fmt).exp_bits >= 6 if parse_format(fmt).kind == "float" else False
    assert (q2 is not qw) == wide
    assert narrow_scales(random_quantized(64, 64, fmt, -1, torch.bfloat16), 0).scales.dtype == torch.bfloat16
    x = torch.randn(16, 1000, generator=torch.Generator().manual_seed(1)).half()
    ref = x.double() @ dequantize_ref(q2)
    why = unrepresentable(ref, torch.float16)
    assert (why is not None) == (fmt == "f8e7m0"), why
    if wide:
        assert unrepresentable(x.double() @ dequantize_ref(qw), torch.float16)   # the old inputs overflowed
        assert q2.scales.min() >= 2.0 ** -24 and ref.abs().max() > 1.0


def test_prepare_without_gpu_is_unavailable():
    if torch.cuda.is_available():
        pytest.skip("GPU present")
    qw = random_quantized(256, 256, "u4", 128, torch.float16)
    with pytest.raises(Unavailable):
        lowbit.prepare(qw, torch.float16)


@pytest.mark.parametrize("nblocks", [1, 2, 3, 5, 7, 14, 56, 224, 1001])
def test_prefill_schedules_cover_every_n_block(nblocks):
    cands = lowbit.prefill_schedules(nblocks)
    assert "whole" in cands and cands["whole"] == (nblocks,)
    assert len(set(cands.values())) == len(cands)               # no chunking timed twice
    for name, sched in cands.items():
        assert sum(sched) == nblocks and min(sched) >= 1, (name, sched)
        assert len(sched) == min(len(lowbit.PREFILL_SCHEDULES[name]), nblocks)
    for name, parts in lowbit.PREFILL_SCHEDULES.items():   # a fixed choice is valid even where it was deduplicated
        sched = lowbit.chunk_sizes(parts, nblocks)
        assert sum(sched) == nblocks and min(sched) >= 1
    if nblocks >= 8:   # a ramp's chunks grow: the first (exposed) dequantize is the smallest
        r = cands.get("ramp", lowbit.chunk_sizes(lowbit.PREFILL_SCHEDULES["ramp"], nblocks))
        assert list(r) == sorted(r) and r[0] < r[-1]


# ---------------------------------------------------------------- the fused prefill kernel

def test_xperm_puts_each_fragment_k_where_the_wgmma_reads_it():
    """Logical position 16r + 8jk + 2t + e of every 32 k holds physical k 8t + 4r + 2jk + e (the k the decode
    layout gives thread t's register pair (r, jk), half e: _fragment_view); zero past K."""
    K, Kpad = 72, 96
    xp = xperm(torch.arange(K, dtype=torch.float64)[None] + 1, Kpad)[0]
    L = LL.Layout.of(96, 256, -1, 128)
    _, kk = LL.fragment_nk(L)
    for c in range(Kpad // 32):
        for t in range(4):
            for r in range(2):
                for jk in range(2):
                    for e in range(2):
                        phys = 32 * c + 8 * t + 4 * r + 2 * jk + e
                        assert xp[32 * c + 16 * r + 8 * jk + 2 * t + e] == (phys + 1 if phys < K else 0)
    # the same physical k the layout's fragment view puts at (lane t, chunk c, pair 8r + 2jk, half e)
    assert int(kk[0, 0, 0, 1, 0, 8 * 1 + 2 * 1, 1]) == 8 * 1 + 4 * 1 + 2 * 1 + 1


@pytest.mark.parametrize("bm", [128, 256])
def test_xtiles_are_the_wgmma_b_layout_of_every_ring_slot(bm):
    """lowbit_xperm_kernel writes x as the fused kernel's ring-slot images (each warp's lane 0 bulk-copies an eighth
    of one): read back the way the wgmma descriptor reads a slot (128-byte swizzle, K-major: sub-tile of 64 k,
    8-row groups 1024 bytes apart, rows 128 bytes, 16-byte chunk c of row r at c ^ (r % 8)), every element is the
    logical x it stands for, and each (m-tile, stage) image is one contiguous 32 KB run: 128 rows x 128 k (two
    sub-tiles), or for the wide build 256 rows x 64 k (one)."""
    Mp, Kpad = 512, 384
    fk = 64 if bm == 256 else 128
    x = torch.randn(Mp, Kpad, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    img = xtiles(x, bm)
    assert img.numel() == Mp * Kpad
    m = torch.arange(Mp)[:, None].expand(Mp, Kpad)
    k = torch.arange(Kpad)[None, :].expand(Mp, Kpad)
    mt, rr, fs, kin = m // bm, m % bm, k // fk, k % fk
    h, c, e = kin // 64, (kin % 64) // 8, kin % 8
    slot = (mt * (Kpad // fk) + fs) * (128 * 128)             # elements of one 32 KB image (16-bit x)
    assert bm * fk == 128 * 128
    addr = slot + h * bm * 64 + (rr // 8) * 512 + (rr % 8) * 64 + (c ^ (rr % 8)) * 8 + e
    assert torch.equal(img[addr], x)
    assert sorted(addr.flatten().tolist()) == list(range(Mp * Kpad))   # a bijection: nothing written twice


FUSED = [  # fmt, act, group, K, N, M
    ("u4", "f16", 128, 512, 512, 40),
    ("u4", "bf16", 64, 384, 300, 130),       # N not a multiple of 256, two m-tiles with a partial one
    ("i4", "f16", -1, 200, 256, 17),         # K padded to the stage (200 -> 256), per channel
    ("u2", "f16", 32, 512, 256, 20),         # kstep 256: two fused stages per layout stage, 4 groups per stage
    ("u1", "bf16", 8, 512, 256, 9),          # groups of 8: a different group per thread in a chunk
    ("u8", "f16", 128, 256, 512, 33),
    ("f6e3m2", "bf16", -1, 256, 256, 64),
    ("f8e5m2", "bf16", 128, 256, 256, 24),   # a bf16 recipe in its own dtype (not the x split)
    ("u3", "f16", 64, 192, 256, 31),
]


@pytest.mark.parametrize("fmt,act,group,K,N,M", FUSED)
def test_fused_emulation_matches_float64_reference(fmt, act, group, K, N, M):
    """The fused kernel's arithmetic walked its way on the CPU (emulate_fused: registers -> wgmma rows and logical
    k, scales by each thread's group, one rounding per weight, the permuted x) against x @ dequantize_ref, within
    what one rounding of each weight to the activation dtype costs (the harness's f16 / bf16 tolerances)."""
    dt = ACTS[act]
    qw = random_quantized(K, N, fmt, group, dt, seed=K + N + M)
    pw = lowbit.pack(qw)
    assert not pw.xsplit
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(dt)
    ref = x.double() @ dequantize_ref(qw)
    y = emulate_fused(pw, x)
    err = float((y - ref).norm() / ref.norm())
    assert err < (2e-3 if act == "f16" else 1e-2) / 2, err
    wrong = x.double() @ dequantize_ref(qw)[torch.randperm(K)]   # a mapping error would look like this
    assert float((wrong - ref).norm() / ref.norm()) > 0.1


def test_fused_kernel_choice_and_sources():
    """fused is a prefill choice; its instantiations cover every recipe (4 translation units of 2 parts each) and
    the tuning extension builds it for the TUNED recipes."""
    assert lowbit.FUSED in lowbit.PREFILL_CHOICES and lowbit.FUSED not in lowbit.PREFILL_SCHEDULES
    parts = sorted((build.ROOT / "kernels").glob("lowbit_fused_part*.cu"))
    assert len(parts) * 2 == LL.PARTS
    for i, p in enumerate(parts):
        text = p.read_text()
        assert f"LOWBIT_RECIPES_PART{2 * i}(LOWBIT_FUSED_DEFINE)" in text
        assert f"LOWBIT_RECIPES_PART{2 * i + 1}(LOWBIT_FUSED_DEFINE)" in text
    head = (build.INCLUDE / "lowbit_fused.cuh").read_text()   # the builds Python names are those the launcher knows
    assert "enum { FUSED_DIAG_NODEQ = 1, FUSED_DIAG_NOLOAD = 2 };" in head and "#define LOWBIT_FUSED_G 1" in head
    assert "#define LOWBIT_FUSED_OPT 1" in head   # the default build: hoist
    assert "enum { FUSED_OPT_HOIST = 1, FUSED_OPT_WIDE = 2 };" in head and "b == (1 | FUSED_OPT_HOIST << 8)" in head
    assert "b == (1 | W << 8)" in head and "if constexpr (R::BITS % 2 == 0)" in head
    assert lowbit.FUSED_BUILDS == {"g1": 1, "g2": 2, "nodeq": 1 | 1 << 4, "noload": 1 | 2 << 4, "bare": 1 | 3 << 4,
                                   "hoist": 1 | 1 << 8, "wide": 1 | 2 << 8, "wide_nodeq": 1 | 1 << 4 | 2 << 8,
                                   "wide_noload": 1 | 2 << 4 | 2 << 8, "wide_bare": 1 | 3 << 4 | 2 << 8}
    # the wide builds: x images of 256 rows, even widths only (a stage's words are whole 16-byte vectors)
    assert [lowbit.fused_bm(b) for b in (1, 2, 1 | 2 << 8, 1 | 3 << 4 | 2 << 8)] == [128, 128, 256, 256]
    assert lowbit.fused_built_for(1 | 2 << 8, 4) and not lowbit.fused_built_for(1 | 2 << 8, 3)
    assert lowbit.fused_built_for(1, 1) and lowbit.fused_built_for(1 | 1 << 8, 5)
    from native.fused_diag import for_width   # fused_diag times only what a width has, and names the rest
    have, missing = for_width(lowbit.FUSED_BUILDS, 3)
    assert missing == ["wide", "wide_nodeq", "wide_noload", "wide_bare"] and "hoist" in have and "bare" in have
    assert for_width(lowbit.FUSED_BUILDS, 4) == (lowbit.FUSED_BUILDS, [])
    srcs = build.tune_sources(Path(__import__("tempfile").mkdtemp()))
    assert any(p.name == "lowbit_fused.cu" for p in srcs)
    assert all("LOWBIT_FUSED_DEFINE" in p.read_text() for p in srcs if p.name.startswith("tune_"))


def test_prefill_choice_is_checked_before_gpu_work():
    qw = random_quantized(256, 256, "u4", 128, torch.float16)
    with pytest.raises(ValueError, match="prefill schedule 'thirds'"):
        lowbit.prepare(qw, torch.float16, prefill="thirds")


def test_prefill_tune_points_are_checked_before_gpu_work(capsys):
    from native import prefill_tune
    assert prefill_tune.parse_points(None) == prefill_tune.DEFAULT_POINTS
    assert prefill_tune.parse_points("u4,128,1024,512,64") == [("u4", 128, 1024, 512, 64)]
    for bad, msg in (("u4,128,1024,512", "FMT,GROUP,K,N,M"), ("u4,128,1024,512,8", "M > 16"),
                     ("u4,x,1024,512,64", "FMT,GROUP,K,N,M")):
        with pytest.raises(ValueError, match=msg):
            prefill_tune.parse_points(bad)
    assert prefill_tune.main(["--points", "u4,100,1024,512,64"]) == 2   # group 100: not a multiple of 8
    assert "config error" in capsys.readouterr().out


# ---------------------------------------------------------------- compile checks

def _need_nvcc():
    if build.find_nvcc() is None:
        pytest.skip("nvcc not on PATH / CUDA_HOME")


# one recipe of each kind of variant: f16 int (+ instrumented), f16 float, bf16 two-term 8-bit, bf16 float
# with the x-split variants, bf16 kstep-256
SUBSET = ["f16_u4", "f16_f6e3m2", "bf16_u8", "bf16_f8e5m2", "bf16_u2"]


def test_compile_lowbit_instantiations(tmp_path):
    """nvcc -gencode sm_90a of the decode / dequantize / fused prefill instantiations: a representative subset and the
    dispatchers by default (~40 s on 2 cores); every recipe (the 8 + 4 parts, ~4 min) with NATIVE_COMPILE_ALL=1."""
    _need_nvcc()
    parts = sorted((build.ROOT / "kernels").glob("lowbit_part*.cu"))
    assert len(parts) == LL.PARTS
    listed = " ".join(f"X(rec_{r.name})" for r in LL.all_recipes())
    assert all(f"LOWBIT_RECIPES_PART{i}(LOWBIT_DEFINE)" in p.read_text() for i, p in enumerate(parts))
    assert listed in (build.INCLUDE / "lowbit_recipes.cuh").read_text()
    if os.environ.get("NATIVE_COMPILE_ALL") == "1":
        srcs = parts
    else:
        # two translation units that include the same headers, as the real parts do, so the link below
        # catches a non-inline definition in a header (the H200 build once failed exactly so)
        srcs = []
        for i, part in enumerate((SUBSET[:2], SUBSET[2:])):
            sub = tmp_path / f"lowbit_subset{i}.cu"
            sub.write_text('#include "lowbit_launch.cuh"\n' + "".join(f"LOWBIT_DEFINE(rec_{r})\n" for r in part))
            srcs.append(sub)
        sub = tmp_path / "lowbit_fused_subset.cu"   # the fused prefill kernel of the same recipes
        sub.write_text('#include "lowbit_fused.cuh"\n#include "lowbit_recipes.cuh"\n'
                       + "".join(f"LOWBIT_FUSED_DEFINE(rec_{r})\n" for r in SUBSET))
        srcs.append(sub)
    if os.environ.get("NATIVE_COMPILE_ALL") == "1":
        srcs += sorted((build.ROOT / "kernels").glob("lowbit_fused_part*.cu"))
    srcs += [build.ROOT / "kernels" / f for f in ("lowbit_dispatch.cu", "lowbit_fused.cu", "lowbit_lut.cu")]
    res = build.compile_check(sources=srcs, link=True)
    bad = {k: msg[-3000:] for k, (ok, msg) in res.items() if not ok}
    assert not bad, bad
    assert "link" in res


def test_bindings_syntax():
    _need_nvcc()
    try:
        ok, msg = build.check_bindings()
    except Unavailable as e:
        pytest.skip(str(e))
    assert ok, msg[-3000:]


def _cuobjdump():
    import triton
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return p if p.exists() else None


def test_sass_main_loop_instruction_budget(tmp_path):
    """The steady-state loop (one group flush per stage, no range end) of the f16 u4 and u1 decode
    kernels: instructions per weight as native/NOTES.md states them (bounds with a little slack)."""
    _need_nvcc()
    if _cuobjdump() is None:
        pytest.skip("no cuobjdump")
    from native.sass import loop_stats
    stats = loop_stats(["f16_u4", "f16_u1"], tmp_path)
    st = {(s["recipe"], s["mt"], s["variant"]): s for s in stats if not s["prof"] and s["fc"] == 0}
    assert st[("f16_u4", 1, 0)]["per_weight"] < 2.8 and st[("f16_u4", 2, 0)]["per_weight"] < 3.3
    assert st[("f16_u1", 1, 0)]["per_weight"] < 2.1
    # the lean variant (1): the per-stage loader / B-fragment overhead cut (native/NOTES.md section 8)
    assert st[("f16_u4", 1, 1)]["per_weight"] < 2.5 and st[("f16_u4", 2, 1)]["per_weight"] < 2.8
    assert st[("f16_u4", 1, 1)]["per_weight"] < st[("f16_u4", 1, 0)]["per_weight"]
    assert {v for (_, _, v) in st} == {0, 1, 2, 3, 4}
    # regs (4): the weights by LDG straight into registers (VEC 16-byte loads per stage), no block barrier in the loop,
    # cp.async for the scales only; fewer instructions per weight than lean (native/NOTES.md section 23)
    # at two tiles (M > 8) x comes through a ring of stage slots (one cp.async per thread and stage, KSTEP 128),
    # guarded by mbarriers (SYNCS) instead of a block barrier
    # ring depth (regs_depth): ~48 words per lane at one tile, ~32 at two: u4 3 / 2 stages, u1 4 / 4
    for rec, vec, depths in (("f16_u4", 4, (3, 2)), ("f16_u1", 2, (4, 4))):
        for mt, depth in zip((1, 2), depths):
            s = st[(rec, mt, 4)]
            assert s["stages_per_loop"] == depth and s["ops"].get("LDG", 0) == vec * depth, s["ops"]
            assert s["ops"].get("BAR", 0) == 0 and s["ops"].get("LDGSTS", 0) <= (2 + 2 * (mt - 1)) * depth
            assert (s["ops"].get("SYNCS", 0) >= 2 * depth) == (mt == 2), (rec, mt, s["ops"])
        assert st[(rec, 1, 4)]["per_weight"] < st[(rec, 1, 1)]["per_weight"]
    assert st[("f16_u4", 1, 4)]["per_weight"] < 2.2 and st[("f16_u1", 1, 4)]["per_weight"] < 1.7
    # bulk (3): lean with the weights' per-thread cp.async replaced by one bulk copy per stage and an mbarrier wait
    for mt in (1, 2):
        ops = st[("f16_u4", mt, 3)]["ops"]
        assert ops.get("UBLKCP", 0) >= 1 and ops.get("SYNCS", 0) >= 2, ops
        assert ops.get("LDGSTS", 0) < st[("f16_u4", mt, 1)]["ops"]["LDGSTS"]
    # the builds with the stage's group ends compiled in (lowbit_kernel.cuh decode_fc): u4 FC 4 at both tiles, u1 4 and 8
    # at one tile and 8 at two (4 spilled there), none spilling; the steady loop (LOWBIT_SASS_STEADY: one group per
    # stage, its end known) is the same code with the ends compiled in (FC = the stage's chunks) as without
    fcs = {(s["recipe"], s["mt"], s["fc"]): s for s in stats if s["variant"] == 4 and not s["prof"]}
    assert set(fcs) == {("f16_u4", 1, 0), ("f16_u4", 1, 4), ("f16_u4", 2, 0), ("f16_u4", 2, 4), ("f16_u1", 1, 0),
                        ("f16_u1", 1, 4), ("f16_u1", 1, 8), ("f16_u1", 2, 0), ("f16_u1", 2, 8)}, set(fcs)
    for (rec, mt, fc), s in fcs.items():
        assert "LDL" not in s["ops"] and "STL" not in s["ops"], (rec, mt, fc)
        if fc * LL.KG == (128 if rec == "f16_u4" else 256):
            assert s["instructions"] == fcs[(rec, mt, 0)]["instructions"], (rec, mt, fc)
    for (rec, mt, v), s in st.items():
        assert s["ops"].get("HMMA", 0) > 0
        if not (v == 2 and mt == 2):   # lean3 at M > 8 spills at its 80 registers (native/NOTES.md section 8)
            assert "LDL" not in s["ops"] and "STL" not in s["ops"], (rec, mt, v)


def test_decode_fc_agrees_with_the_stage_table():
    """Where a decode launcher runs a build with the group ends compiled in (lowbit_kernel.cuh decode_fc, mirrored by
    lowbit_layout.decode_fc), every stage's flush mask is what that build assumes: FC < chunks, a group ends with every
    FC-th chunk; FC = chunks, at most with the stage's last chunk (read from the table); with or without the flush of
    every stage (Recipe.bias), for groups that do and do not fit the stage, per channel, and K not a whole number of
    stages (0: the table read at run time)."""
    seen = set()
    for kstep in (128, 256):
        chunks = kstep // LL.KG
        for K in (1024, 1152, 1280, 4096, 8192, 28672, 1056):
            for g in (32, 64, 128, 256, 512, -1):
                if g != -1 and (K % g or g > K):
                    continue
                L = LL.Layout.of(K, 256, g, kstep)
                fc = LL.decode_fc(kstep, K, K if L.per_channel else g)
                seen.add((kstep, fc))
                for each in (False, True):
                    masks = [(int(v) >> 20) & 0xFF for v in LL.stage_table(L, each)]
                    if fc and fc < chunks:
                        want = sum(1 << q for q in range(fc - 1, chunks, fc))
                        assert all(m == want for m in masks), (kstep, K, g, each, masks)
                    elif fc == chunks:
                        assert all(m & ~(1 << (chunks - 1)) == 0 for m in masks), (kstep, K, g, each, masks)
                if K % kstep:
                    assert fc == 0
    assert seen >= {(128, 0), (128, 4), (256, 0), (256, 4), (256, 8)}


def test_decode_fc_mirror_matches_the_launchers_rule(tmp_path):
    """lowbit_layout.decode_fc is the launchers' rule (lowbit_kernel.cuh decode_fc), compiled and run on the host: the
    same FC for every stage depth, K (whole stages or not), group size and one group per channel."""
    _need_nvcc()
    import subprocess
    cases = [(kstep, K, g) for kstep in (128, 256) for K in (1000, 1024, 1056, 1152, 1280, 4096, 8192, 28672)
             for g in (8, 32, 64, 128, 256, 512, 1024, K) if K % g == 0]
    src = tmp_path / "fc.cu"
    src.write_text('#include <cstdio>\n#include "lowbit_kernel.cuh"\nint main() {\n' + "".join(
        f'  std::printf("%d\\n", lowbit::decode_fc({k}, {K}, {-(-K // k)}, {g}));\n' for k, K, g in cases) + "}\n")
    exe = tmp_path / "fc"
    subprocess.run([build.find_nvcc(), build.GENCODE, "-std=c++17", "-diag-suppress", "177", f"-I{build.INCLUDE}",
                    str(src), "-o", str(exe)], check=True, capture_output=True, text=True, timeout=300)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == [LL.decode_fc(k, K, g) for k, K, g in cases]
    assert {4, 8} <= set(got) and 0 in got


def test_check_group_cases_are_valid_weights():
    """Every extra group-size case of native.check is a weight the formats accept (a group that does not divide K
    failed the H200 run of 0884d8f before any kernel ran)."""
    from kernels.lowbit.formats import parse_format
    from native.check import GROUP_CASES
    for fmt, act, g, K in GROUP_CASES:
        parse_format(fmt)
        assert act in ("f16", "bf16") and K % g == 0, (fmt, g, K)
    assert any(g > 128 for _, _, g, _ in GROUP_CASES)      # a group over two 128-k stages


# ---- the lut variant (u1 at M = 1 through a table of partial sums of x; native/lowbit_lut.py)

@pytest.mark.parametrize("K,N,g,ks", [(1024, 300, 128, 512), (1000, 257, -1, 512), (1152, 64, 32, 512),
                                      (1280, 70, 64, 256), (2048, 33, 256, 512), (1536, 40, 512, 256),
                                      (896, 48, 896, 256), (3072, 16, -1, 512)])
def test_lut_layout_round_trip_and_arithmetic_against_float64(K, N, g, ks):
    """pack / unpack round-trip the codes (K padded to whole 128-k units with zero codes), and the kernel's
    arithmetic (emulate: the subset-sum table per quad of k, one lookup per nibble, the zero point through the sum
    of x per group, the scale per group within each block's k slice) meets float64 at every group kind."""
    import native.lowbit_lut as LUT
    qw = random_quantized(K, N, "u1", g, torch.float16, seed=K + N)
    codes = qw.codes()
    words = LUT.pack(codes)
    assert words.dtype == torch.int32 and tuple(words.shape) == (-(-K // 128), N, 4)
    assert torch.equal(LUT.unpack(words, K), codes)
    # bit j of word i of (unit u, column n) is the code of k = 128 u + 32 i + j
    u, n, i, j = (K - 1) // 128, N - 1, ((K - 1) % 128) // 32, (K - 1) % 32
    assert (int(words[u, n, i]) >> j) & 1 == int(codes[K - 1, n])
    x = torch.randn(K, dtype=torch.float16)
    ref = x.double() @ dequantize_ref(qw)
    y = LUT.emulate(words, x, qw.scales, qw.zeros, K, g, ks)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
    tiles, slices = LUT.grid(K, N, ks)
    assert tiles == -(-N // 256) and slices == -(-(-(-K // 128)) // (ks // 128))
    assert LUT.grid(K, N, ks, 4)[0] == -(-tiles // 4) and LUT.grid(K, N, ks, 4)[1] == slices
    # the span form's layout: codes and (scale, zero point) pairs blocked per 4 columns x 32 units, zero beyond K
    # and N; its arithmetic (a slot per unit, per word at g32, per pair at g64) from that layout meets float64
    w, sz = LUT.span_pack(words, qw.scales, qw.zeros, K, g)
    S, C, slots = -(-(-(-K // 128)) // 32), -(-N // 4), {32: 4, 64: 2}.get(g, 1)
    assert tuple(w.shape) == (S, C, 4, 32, 4) and tuple(sz.shape) == (S, C, 4, 32, slots, 2)
    assert torch.equal(LUT.span_unpack(w, K, N), words)
    assert int(w[S - 1, C - 1, 3, 31].abs().sum()) == 0 or (N % 4 == 0 and -(-K // 128) == 32 * S)
    assert float(sz[0, 0, 0, 0, 0, 0]) == float(qw.scales[0, 0]) and float(sz[0, 0, 0, 0, 0, 1]) == float(qw.zeros[0, 0])
    ys = LUT.span_emulate(w, sz, x, K, N)
    assert float((ys.double() - ref).norm() / ref.norm()) < 1e-5
    assert LUT.span_slices(K) == S and 1 <= LUT.span_nbx(K, N, 132, 2) <= C


def test_lut_column_tiles_per_block_leave_four_blocks_per_sm():
    import native.lowbit_lut as LUT
    assert LUT.KS_DEFAULT == 256
    assert LUT.default_ct(8192, 57344, 132) == 4        # 56 x 32 blocks
    assert LUT.default_ct(28672, 8192, 132) == 4        # 8 x 112
    assert LUT.default_ct(8192, 8192, 132) == 1         # 32 x 32 (2 tiles: 512 blocks, under 4 per SM)
    assert LUT.default_ct(8192, 57344, 132, 512) == 4 and LUT.default_ct(28672, 8192, 132, 512) == 2
    assert LUT.default_ct(8192, 57344, 132, group=32) == 1 and LUT.default_ct(8192, 57344, 132, group=64) == 1
    for K, N in [(8192, 57344), (28672, 8192), (5120, 27648), (1000, 300)]:
        ct = LUT.default_ct(K, N, 132)
        assert ct in LUT.CT_CHOICES
        assert ct == 1 or LUT.grid(K, N, LUT.KS_DEFAULT, ct)[0] * LUT.grid(K, N)[1] >= 4 * 132


def test_lutspan_grid_fills_one_wave_of_its_blocks_per_sm():
    """span_nbx: bps blocks per SM over all the k spans (floor: no block left for a second wave), at most one block per
    4 columns, at least one; blocks per SM outside SPAN_CONFIGS refused."""
    import native.lowbit_lut as LUT
    assert all(th in (256, 512, 1024) for th, _ in LUT.SPAN_CONFIGS)
    assert LUT.default_span(128) == LUT.default_span(-1) == (1024, 1) and LUT.default_span(32) == (256, 2)
    assert all(LUT.default_span(g) in LUT.SPAN_CONFIGS for g in (32, 64, 128, 256, -1))
    assert (LUT.span_slices(8192), LUT.span_nbx(8192, 57344, 132, 1)) == (2, 66)   # 132 = 1 x 132 blocks
    assert (LUT.span_slices(8192), LUT.span_nbx(8192, 57344, 132, 2)) == (2, 132)  # 264 = 2 x 132 blocks
    assert (LUT.span_slices(8192), LUT.span_nbx(8192, 57344, 132, 3)) == (2, 198)  # 396 = 3 x 132 blocks
    assert (LUT.span_slices(28672), LUT.span_nbx(28672, 8192, 132, 3)) == (7, 56)  # 392 <= 396
    assert LUT.span_nbx(28672, 8192, 132, 2) == 37                                 # 259 <= 264
    assert LUT.span_nbx(1024, 8, 132, 3) == 2                                        # 2 column chunks of 4
    assert LUT.span_nbx(600000, 4096, 4, 1) == 1                                  # more spans than slots
    with pytest.raises(ValueError):
        LUT.span_nbx(8192, 8192, 132, 4)


def test_lut_supports_u1_and_its_group_sizes_only():
    import native.lowbit_lut as LUT
    assert LUT.supports(random_quantized(256, 64, "u1", 128)) is None
    assert LUT.supports(random_quantized(256, 64, "u1", -1)) is None
    assert "u1 weights" in LUT.supports(random_quantized(256, 64, "u2", 128))
    assert "u1 weights" in LUT.supports(random_quantized(256, 64, "i4", 128))
    for g, ok in [(32, True), (64, True), (128, True), (256, True), (96, False), (8, False), (16, False),
                  (160, False), (1024, True), (-1, True)]:
        assert (LUT.group_ok(1024, g) is None) == ok, g
    with pytest.raises(ValueError):
        LUT.emulate(torch.zeros(8, 4, 4, dtype=torch.int32), torch.zeros(1024), torch.ones(1, 4), torch.ones(1, 4),
                    1024, 96)
    # the C++ rule is the same one (the bindings refuse what native_lowbit_lut_ok refuses)
    src = (build.ROOT / "kernels" / "lowbit_lut.cu").read_text()
    assert "return group == 32 || group == 64 || group == -1 || group == K || (group > 0 && group % 128 == 0 && K % " \
           "group == 0);" in src


def test_lut_variant_is_u1_at_one_tile_and_not_instrumented():
    """variant_for: lut for u1 weights (its layout packed beside the mma layout) at one tile, base elsewhere (the
    launch itself is M = 1 only: LowbitMatmul._launchable); the instrumented call refuses it (no such build), and
    the module-level candidates (those with an instrumented build) leave it out."""
    for fmt, g, want in [("u1", 128, 6), ("u1", -1, 6), ("u1", 96, 0), ("u2", 128, 0)]:
        pw = lowbit.pack(random_quantized(1152 if g == 96 else 1024, 64, fmt, g))
        assert (pw.lut is not None) == (want == 6) == (pw.span is not None)
        for name in ("lut", "lutspan"):
            num = lowbit.DECODE_VARIANTS[name] if want else 0
            assert lowbit.variant_for(pw, name, 1) == num
            assert lowbit.variant_for(pw, name, 2) == 0
            assert lowbit.DECODE_VARIANTS[name] not in lowbit.decode_candidates(pw, 1)
            if want:
                with pytest.raises(Unsupported):
                    lowbit.variant_for(pw, name, 1, prof=True)


@pytest.mark.parametrize("argv,msg", [(["--points", "8192,57344"], "expected K,N,GROUP"),
                                      (["--points", "8192,x,128"], "expected K,N,GROUP"),
                                      (["--points", "1152,64,96"], "group size 96"),
                                      (["--points", "0,64,128"], "must be positive"),
                                      (["--samples", "0"], "at least 1"),
                                      (["--samples", "many"], "invalid int value"),
                                      (["--json", "."], "is a directory"),
                                      (["--json", "/nonexistent-dir/x.json"], "folder does not exist")])
def test_lut_tune_rejects_bad_arguments_before_any_gpu_work(argv, msg, capsys):
    from native import lut_tune
    with pytest.raises(SystemExit) as e:
        lut_tune.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1] and "Traceback" not in "\n".join(err)
    assert lut_tune.parse_points("8192,57344,128; 1000,300,-1") == [(8192, 57344, 128), (1000, 300, -1)]


def test_lut_tune_layout_xor_is_what_reading_each_word_once_gives():
    """The probes' check value: the XOR of every 32-bit word of the span layout's codes and of its (scale, zero) slots
    (f16 pairs), the same whatever the dtype the bytes are viewed as; changing one word changes it by that word."""
    import native.lowbit_lut as LUT
    from native.lut_tune import layout_xor
    K, N, g = 8192, 40, 128
    qw = random_quantized(K, N, "u1", g, torch.float16, seed=3)
    w, sz = LUT.span_pack(LUT.pack(qw.codes()), qw.scales, qw.zeros, K, g)
    words = [int(v) & 0xFFFFFFFF for v in w.reshape(-1).tolist()]
    want = 0
    for v in words:
        want ^= v
    assert layout_xor(w) == want != 0
    slots = sz.contiguous().view(torch.int32).reshape(-1).tolist()
    want_s = 0
    for v in slots:
        want_s ^= int(v) & 0xFFFFFFFF
    assert layout_xor(sz) == want_s
    w2 = w.clone()
    w2.view(-1)[17] ^= 0x5A5A5A5A
    assert layout_xor(w2) == want ^ 0x5A5A5A5A
    with pytest.raises(ValueError, match="whole 32-bit words"):
        layout_xor(torch.zeros(3, dtype=torch.uint8))


def test_wg_budget_probe_counts_the_whole_loop(tmp_path):
    """native/probes/wgdec_budget.cu (native/NOTES.md section 40): every instantiation keeps all of its wgmma live
    (4 per 32-k chunk, two stages per loop: none replaced by ptxas' dead-result placeholders), the per-channel loop
    has no fold in it and is the cheapest, and only the folds that read one accumulator set while the other's wgmma
    are in flight are serialized by ptxas."""
    _need_nvcc()
    if _cuobjdump() is None:
        pytest.skip("no cuobjdump")
    from native.wg_budget import loop_stats
    st = {(s["recipe"], s["mode"], s["drain"]): s for s in loop_stats(tmp_path)}
    assert {(r, m) for r, m, _ in st} == {(r, m) for r in ("f16_u1", "f16_u2", "f16_u4")
                                          for m in ("perch", "fold", "scale")}
    for (rec, mode, drain), s in st.items():
        chunks = 2 * (256 if rec in ("f16_u1", "f16_u2") else 128) // 32
        assert s["wgmma"] == 4 * chunks and s["dead_wgmma"] == 0, (rec, mode, drain, s["wgmma"], s["dead_wgmma"])
        assert s["ops"].get("HGMMA", 0) == 4 * chunks, (rec, mode, drain)
        assert "LDL" not in s["ops"] and "STL" not in s["ops"]
        assert s["serialized"] == (mode != "perch" and not drain), (rec, mode, drain)
        if mode == "perch":
            assert "FFMA" not in s["ops"]
            assert all(s["per_weight"] < o["per_weight"] for (r, m, _), o in st.items() if r == rec and m != "perch")
        else:
            assert s["ops"]["FFMA"] >= 16 * chunks // 4   # 16 values per thread and 128-k group
    for rec in ("f16_u1", "f16_u2", "f16_u4"):   # the fold with the corrections costs more than the scale alone
        assert st[(rec, "fold", True)]["per_weight"] > st[(rec, "scale", True)]["per_weight"]
