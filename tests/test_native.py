"""CPU tests of native/: nvcc compile check, header/decoder layout agreement, decoder on synthetic buffers."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from kernels import Unavailable
from native import build, decode as D
from native.native_kernels import SCOPES

HEADER = Path(build.ROOT / "include" / "instrument.cuh").read_text()


SUITE_SOURCES = ["matmul.cu", "softmax.cu", "layer_norm.cu", "calibrate.cu"]


def test_compile_check_with_local_nvcc():
    """The instrumented suite kernels, every instrumentation mode (the low-bit kernels: test_native_lowbit.py)."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not on PATH / CUDA_HOME")
    assert set(SUITE_SOURCES) < {p.name for p in build.KERNEL_SOURCES}
    res = build.compile_check(sources=[build.ROOT / "kernels" / f for f in SUITE_SOURCES], extra=("-Xptxas", "-v"))
    assert set(res) == set(SUITE_SOURCES)
    bad = {k: msg for k, (ok, msg) in res.items() if not ok}
    assert not bad, bad
    for f in SUITE_SOURCES:   # each launcher instantiates every mode of INSTR_LAUNCH_MODES
        src = (build.ROOT / "kernels" / f).read_text()
        assert "with_mode<INSTR_LAUNCH_MODES>" in src, f
    # the instrumentation must not cost occupancy: every instrumented build of a 256-thread suite kernel keeps
    # the plain build's blocks per SM (layer_norm's staged build once took 82 registers against the plain 79:
    # 2 blocks per SM instead of 3, and 1.59x the plain time on the H200). The row kernels (softmax, layer_norm)
    # are built twice, for 16-byte and 2-byte accesses (row_io.cuh VEC = 8 / 1, their last template argument):
    # each instrumented build against the plain build of its VEC.
    for f in ("matmul.cu", "softmax.cu", "layer_norm.cu"):
        assert re.search(r"THREADS = 256\b", (build.ROOT / "kernels" / f).read_text()), f
        regs = build.kernel_registers(res[f][1])
        vecs = ("",) if f == "matmul.cu" else ("1", "8")

        def vec(name):
            return "" if f == "matmul.cu" else re.search(r"Li(\d+)EEEv", name).group(1)
        for v in vecs:
            # plain / instrumented entry points: kernel<false, ...> / kernel<true, MODE, ...>, or (layer_norm)
            # *_plain / *_prof<MODE, ...>
            plain = [r for n, r in regs.items() if ("ILb0E" in n or "_plainI" in n or "_plainE" in n) and vec(n) == v]
            prof = {n: r for n, r in regs.items() if ("ILb1E" in n or "_profI" in n) and vec(n) == v}
            assert len(plain) == 1 and len(prof) == 8, (f, v, regs)  # INSTR_LAUNCH_MODES: 3 + 4 diagnostic + staged_v1
            want = build.blocks_per_sm(plain[0], 256)
            got = {n: build.blocks_per_sm(r, 256) for n, r in prof.items()}
            assert all(b >= want for b in got.values()), (f, v, plain[0], want, prof, got)


def test_blocks_per_sm():
    assert build.blocks_per_sm(79, 256) == 3 and build.blocks_per_sm(80, 256) == 3
    assert build.blocks_per_sm(81, 256) == 2 and build.blocks_per_sm(64, 256) == 4
    assert build.blocks_per_sm(126, 256) == 2 and build.blocks_per_sm(255, 128) == 2
    log = ("ptxas info    : Compiling entry function '_Zk1' for 'sm_90a'\n"
           "ptxas info    : Function properties for _Zk1\n    0 bytes stack frame\n"
           "ptxas info    : Used 79 registers, used 1 barriers, 32 bytes smem\n")
    assert build.kernel_registers(log) == {"_Zk1": 79}


def test_build_unavailable_without_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("GPU present")
    with pytest.raises(Unavailable):
        build.build()


@pytest.mark.parametrize("macro,value", [("INSTR_MAGIC", D.MAGIC), ("INSTR_BLOCK_HEADER_WORDS", D.BLOCK_HEADER_WORDS),
                                         ("INSTR_WARP_HEADER_WORDS", D.WARP_HEADER_WORDS),
                                         ("INSTR_RECORD_WORDS", D.RECORD_WORDS), ("INSTR_END_FLAG", D.END_FLAG),
                                         ("INSTR_NEXT_FLAG", D.NEXT_FLAG),
                                         ("INSTR_FLAG_GLOBALTIMER", D.FLAG_GLOBALTIMER)])
def test_header_and_decoder_agree(macro, value):
    m = re.search(rf"#define {macro} (0x[0-9A-Fa-f]+|\d+)u?", HEADER)
    assert m, macro
    assert int(m.group(1), 0) == value
    assert D.MAGIC.to_bytes(4, "little") == b"INST"


def test_scope_ids_match_kernel_enums():
    src = {"matmul": "S_LOOP = 0, S_LOAD = 1, S_MMA = 2, S_STORE = 3", "softmax": "S_LOAD = 0, S_REDUCE = 1, S_STORE = 2",
           "layer_norm": "S_LOAD = 0, S_STATS = 1, S_NORM_STORE = 2"}
    for k, enum in src.items():
        assert enum in (build.ROOT / "kernels" / f"{k}.cu").read_text()
        assert len(SCOPES[k]) == enum.count("=")
    from native import lowbit
    assert "enum { S_WAIT = 0, S_COMPUTE = 1, S_OUTPUT = 2 };" in (build.INCLUDE / "lowbit_kernel.cuh").read_text()
    assert SCOPES["lowbit"] == lowbit.SCOPES == ("wait", "compute", "output")


def test_modes_match_header():
    from native.native_kernels import AB_MODES, DIAG_MODES, MODES, mode_id
    for name, v in MODES.items():
        assert re.search(rf"#define INSTR_MODE_{name.upper()} {v}\b", HEADER), name
    bits = {k: int(v, 0) for k, v in re.findall(r"#define INSTR_DIAG_(\w+) (0x[0-9A-Fa-f]+)u", HEADER)}
    assert set(bits) == {"NOSTORE", "NOGTIME", "NORECORD"}
    want = {"staged_nostore": bits["NOSTORE"], "staged_nogtime": bits["NOGTIME"], "staged_norecord": bits["NORECORD"],
            "staged_bare": bits["NOSTORE"] | bits["NOGTIME"] | bits["NORECORD"]}
    assert DIAG_MODES == {k: v | MODES["staged"] for k, v in want.items()}
    opts = {k: int(v, 0) for k, v in re.findall(r"#define INSTR_OPT_(\w+) (0x[0-9A-Fa-f]+)u", HEADER)}
    assert AB_MODES == {"staged_v1": MODES["staged"] | opts["V1"]}
    # every mode the Python side names is instantiated by the launchers (INSTR_LAUNCH_MODES)
    launch = re.search(r"#define INSTR_LAUNCH_MODES(.*?)\n\n", HEADER, re.S).group(1).replace("\\", "")
    names = {**{f"INSTR_MODE_{k.upper()}": i for k, i in MODES.items()}, **{f"INSTR_DIAG_{k}": b for k, b in bits.items()},
             **{f"INSTR_OPT_{k}": b for k, b in opts.items()}}
    launched = set()
    for term in filter(None, (t.strip() for t in launch.split(","))):
        v = 0
        for name in term.split("|"):
            v |= names[name.strip()]
        launched.add(v)
    assert {mode_id(m) for m in [*MODES, *AB_MODES, *DIAG_MODES]} == launched
    with pytest.raises(ValueError):
        mode_id("bogus")


# ---------------------------------------------------------------- staged records (model of instrument.cuh)

def staged_buffer(events, capacity, batch):
    """What Profiler<.., INSTR_MODE_STAGED, .., BATCH> leaves in one warp's record slots: records staged
    in a BATCH ring in shared memory; every BATCH records (and at end()) lanes 0..n-1 copy the last n to
    slot (index % capacity), lanes whose record is older than the newest `capacity` skip (flush_batch)."""
    slots = np.zeros(capacity * D.RECORD_WORDS, dtype=np.uint32)
    ring = [None] * batch
    count = 0

    def flush(n):
        first = count - n
        for lane in range(32):
            if lane < n and lane + capacity >= n:
                tag, stamp = ring[(first + lane) & (batch - 1)]
                s = ((first + lane) % capacity) * D.RECORD_WORDS
                slots[s], slots[s + 1] = tag, stamp
    for sid, is_end, stamp in events:
        ring[count & (batch - 1)] = (D.tag_word(sid, is_end), stamp & D.M32)
        count += 1
        if count & (batch - 1) == 0:
            flush(batch)
    if count & (batch - 1):
        flush(count & (batch - 1))
    return slots, count


@pytest.mark.parametrize("capacity,batch,iters", [(64, 16, 5), (16, 16, 10), (4, 16, 3), (5, 8, 7), (1, 16, 2),
                                                  (1024, 16, 1)])
def test_staged_flush_writes_what_direct_mode_writes(capacity, batch, iters):
    """The staged mode must leave the same buffer as one store per record (decode.encode mirrors that):
    the decoder's output is identical whatever the mode."""
    nw = 2
    blocks = make_blocks(1, nw, iters, wrap=False)
    direct = D.encode(blocks, capacity=capacity, num_warps=nw)
    for w, events in enumerate(blocks[0]["warps"]):
        slots, count = staged_buffer(events, capacity, batch)
        wb = D.BLOCK_HEADER_WORDS + w * (D.WARP_HEADER_WORDS + capacity * D.RECORD_WORDS)
        assert direct[wb + 1] == count
        got = direct[wb + D.WARP_HEADER_WORDS: wb + D.WARP_HEADER_WORDS + capacity * D.RECORD_WORDS]
        assert np.array_equal(got, slots)


def assert_model_writes_what_direct_mode_writes(model, capacity, nw, iters, wrap=True):
    """model(events, warp, begin_stamp, end_stamp) -> the words a device design leaves in one warp's region; they
    must be those of one store per record (decode.encode) for every warp of a synthetic block."""
    blocks = make_blocks(1, nw, iters, wrap=wrap)
    direct = D.encode(blocks, capacity=capacity, num_warps=nw)
    stride = D.WARP_HEADER_WORDS + capacity * D.RECORD_WORDS
    for w, events in enumerate(blocks[0]["warps"]):
        wb = D.BLOCK_HEADER_WORDS + w * stride
        got = model(events, w, int(direct[wb + 2]), int(direct[wb + 3]))
        assert got is not None and np.array_equal(direct[wb:wb + stride], got)


HEAD = D.WARP_HEADER_WORDS // 2   # lanes of end()'s store that write the warp header (instrument.cuh Profiler::HEAD)


def staged_end_single_store(events, capacity, batch, warp, begin_stamp, end_stamp):
    """Profiler::end()'s short path (count < BATCH, count <= capacity): lane l writes 8-byte word pair l of
    [warp header | records]: lanes 0 .. HEAD - 1 the header (warp, count | begin, end | zeros), lane HEAD + i record
    i, then zero records up to a multiple of 4 (whole sectors).  None when the path does not apply."""
    count = len(events)
    if not (count < batch and count <= capacity):
        return None
    words = np.zeros(D.WARP_HEADER_WORDS + capacity * D.RECORD_WORDS, dtype=np.uint32)
    lanes = [(warp, count), (begin_stamp & D.M32, end_stamp & D.M32)] + [(0, 0)] * (HEAD - 2)
    lanes += [(D.tag_word(sid, is_end), stamp & D.M32) for sid, is_end, stamp in events]
    lanes += [(0, 0)] * (-count % D.CAPACITY_ALIGN)
    assert len(lanes) <= 32
    for lane, (a, b) in enumerate(lanes):
        words[2 * lane], words[2 * lane + 1] = a, b
    return words


@pytest.mark.parametrize("capacity,iters", [(64, 1), (1024, 1), (16, 0)])
def test_staged_single_store_end_writes_what_direct_mode_writes(capacity, iters):
    """A warp with fewer than BATCH records writes header + records with one store at end(): the same
    words as the direct mode (decode.encode), so the decoder's output is unchanged."""
    def model(events, w, begin, end):
        assert len(events) < 16
        return staged_end_single_store(events, capacity, 16, w, begin, end)
    assert_model_writes_what_direct_mode_writes(model, capacity, 3, iters, wrap=False)
    # a warp without records: its header only
    empty = staged_end_single_store([], capacity, 16, 5, 7, 9)
    assert list(empty[:4]) == [5, 0, 7, 9] and not empty[4:].any()


def register_batch_warp(events, capacity, batch, warp, clock0, end_stamp):
    """What Profiler<.., INSTR_MODE_STAGED, .., BATCH> (instrument.cuh) leaves in one warp's region: lane HEAD + i
    holds record i of the current batch; a full batch is stored by lanes HEAD.. at slot (slot0 + i) % capacity
    (record_offset: one compare and subtract, since capacity >= INSTR_MIN_CAPACITY >= BATCH); end() is one store per
    lane: lanes 0 .. HEAD - 1 the warp header, lanes HEAD.. the unflushed records, then zero records up to a multiple
    of 4 in slots that never held a record.  No two lanes of one store may write the same slot, and every store of a
    ring that has not wrapped writes whole 32-byte sectors (8 words, counted from the block's start: the warp's region
    starts BLOCK_HEADER_WORDS + warp * (WARP_HEADER_WORDS + 2 * capacity) words into it) -- asserted."""
    assert capacity >= D.MIN_CAPACITY >= batch and capacity % D.CAPACITY_ALIGN == 0
    words = np.zeros(D.WARP_HEADER_WORDS + capacity * D.RECORD_WORDS, dtype=np.uint32)
    base = D.BLOCK_HEADER_WORDS + warp * len(words)
    held = [(0, 0)] * 32
    count = slot0 = 0

    def offset(lane):
        i = (lane - HEAD) & D.M32
        s = slot0 + (i & (batch - 1))
        s -= capacity if s >= capacity else 0
        assert s < capacity
        return i, D.WARP_HEADER_WORDS + s * D.RECORD_WORDS

    def store(pairs, whole):  # one store instruction: {lane: (word offset, (x, y))}
        offs = [o for o, _ in pairs.values()]
        assert len(offs) == len(set(offs))
        for o, (x, y) in pairs.values():
            words[o], words[o + 1] = x, y
        if whole:
            written = {base + o + k for o in offs for k in (0, 1)}
            assert all({8 * (w // 8) + k for k in range(8)} <= written for w in written), sorted(written)
    for sid, is_end, stamp in events:
        held[HEAD + (count & (batch - 1))] = (D.tag_word(sid, is_end), stamp & D.M32)
        count += 1
        if count & (batch - 1) == 0:
            store({lane: (o, held[lane]) for lane in range(32) for i, o in [offset(lane)] if i < batch}, True)
            slot0 += batch
            slot0 -= capacity if slot0 >= capacity else 0
    n = count & (batch - 1)
    last = {0: (0, (warp, count)), 1: (2, (clock0 & D.M32, end_stamp & D.M32))}
    last.update({lane: (2 * lane, (0, 0)) for lane in range(2, HEAD)})
    for lane in range(HEAD, 32):
        i, o = offset(lane)
        if i < n:
            last[lane] = (o, held[lane])
        elif i < n + (-n % D.CAPACITY_ALIGN) and count - n + i < capacity:
            last[lane] = (o, (0, 0))
    store(last, count <= capacity)
    return words


@pytest.mark.parametrize("capacity,batch,iters", [(64, 16, 5), (16, 16, 10), (20, 16, 9), (36, 16, 7), (1024, 16, 1),
                                                  (1024, 16, 0), (16, 8, 7), (20, 4, 6), (1024, 16, 3), (24, 16, 2)])
def test_register_batches_write_what_direct_mode_writes(capacity, batch, iters):
    """The staged mode's register batches leave the same words as one store per record (decode.encode): warp header
    and every retained record, whatever the capacity the launchers accept, so the decoder's output is the same in
    every mode; and (register_batch_warp asserts it) each store writes whole sectors while the ring has not wrapped."""
    assert_model_writes_what_direct_mode_writes(
        lambda events, w, begin, end: register_batch_warp(events, capacity, batch, w, begin, end), capacity, 2, iters)
    empty = register_batch_warp([], capacity, batch, 5, 7, 9)  # a warp without records: header only
    assert list(empty[:4]) == [5, 0, 7, 9] and not empty[4:].any()


def test_fitted_capacity_holds_every_record_of_the_probe():
    """proton_fig15's 'auto' buffer: a probe launch at any capacity counts each warp's records (dropped ones too); the
    fitted capacity is the most a warp wrote, in whole batches of 16, and a buffer of it drops nothing."""
    from native import native_kernels as nk
    ev = lambda n: [(i % 3, i % 2 == 1, 100 + 10 * i) for i in range(n)]  # noqa: E731
    blocks = [dict(block_id=b, sm_id=0, clock_start=0, clock_end=10**6, gtime_start=0, gtime_end=10**6,
                   warps=[ev(n) for n in ns]) for b, ns in enumerate([(0, 5), (37, 2)])]
    probe = D.encode(blocks, capacity=16, num_warps=2)
    assert D.warp_record_counts(probe).tolist() == [[0, 5], [37, 2]]
    assert D.dropped_records(probe) == 37 - 16
    assert nk.fitted_capacity(probe) == 48
    nk.check_capacity(nk.fitted_capacity(probe))
    assert D.dropped_records(D.encode(blocks, capacity=48, num_warps=2)) == 0
    few = [dict(blocks[0], warps=[ev(0), ev(4)])]
    assert nk.fitted_capacity(D.encode(few, capacity=16, num_warps=2)) == 16


def test_capacity_below_one_batch_is_refused_before_launch():
    """The header's one-wrap slot arithmetic needs capacity >= INSTR_MIN_CAPACITY, and whole-sector stores a multiple
    of INSTR_CAPACITY_ALIGN: every launcher refuses others (the CUDA launchers return cudaErrorInvalidValue; the Python
    ones raise before any GPU work)."""
    from native import native_kernels as nk
    assert re.search(rf"#define INSTR_MIN_CAPACITY {D.MIN_CAPACITY}\b", HEADER)
    assert re.search(rf"#define INSTR_CAPACITY_ALIGN {D.CAPACITY_ALIGN}\b", HEADER)
    for f in SUITE_SOURCES:
        assert "!instr::capacity_ok(capacity) ||" in (build.ROOT / "kernels" / f).read_text(), f
    assert "!instr::capacity_ok(p->prof_cap)" in (build.ROOT / "kernels" / "lowbit_dispatch.cu").read_text()
    for bad in (0, 8, 15, 18, 1026, 16.0, True, "16"):
        with pytest.raises(ValueError, match="buffer_records"):
            nk.check_capacity(bad)
    nk.check_capacity(16)
    nk.check_capacity(20)
    with pytest.raises(ValueError, match=">= 16"):
        nk.run("softmax", {}, instrument=True, buffer_records=8)
    with pytest.raises(ValueError, match="multiple of 4"):
        nk.run("softmax", {}, instrument=True, buffer_records=18)


@pytest.mark.parametrize("start,dur", [(1000, 5), ((1 << 32) - 700, 10**6), ((7 << 32) + 123, (1 << 32) - 1),
                                       ((1 << 64) - 10, 20)])
def test_block_start_from_low_bits(start, dur):
    """end() widens the block-start clocks kept as their low 32 bits since begin(): exact for blocks < 2**32 units."""
    end = (start + dur) % (1 << 64)
    c0 = (end - ((end - start) & D.M32)) % (1 << 64)
    assert c0 == start


# ---------------------------------------------------------------- synthetic buffers

LD, MM, ST, GAP = 100, 300, 50, 10


def warp_events(t0, iters):
    """loop{ load, mma } x iters, then store: the matmul kernel's scope pattern."""
    ev, t = [(0, False, t0)], t0 + 5
    for _ in range(iters):
        ev += [(1, False, t), (1, True, t + LD), (2, False, t + LD + 2), (2, True, t + LD + 2 + MM)]
        t += LD + MM + GAP
    ev += [(0, True, t), (3, False, t + 1), (3, True, t + 1 + ST)]
    return ev


def make_blocks(nblocks, nwarps, iters, wrap=True):
    c0 = (1 << 32) - 700 if wrap else 1000  # clock crosses 2**32 inside the block
    return [dict(block_id=b, sm_id=(7 * b) % 5, clock_start=c0 + b, clock_end=c0 + 10**6,
                 gtime_start=5 * 10**9 + 1000 * b, gtime_end=5 * 10**9 + 10**6,
                 warps=[warp_events(c0 + 20 + 3 * w, iters) for w in range(nwarps)]) for b in range(nblocks)]


NAMES = SCOPES["matmul"]


def test_tree_exact_cycles():
    nb, nw, it = 3, 4, 5
    raw = D.encode(make_blocks(nb, nw, it), capacity=64, num_warps=nw)
    p = D.decode(raw, NAMES, "native_matmul")
    assert (p.dropped, p.unmatched, p.missing_blocks) == (0, 0, 0)
    t = p.scope_totals()
    warps = nb * nw
    assert t["loop/load"]["cycles"] == warps * it * LD and t["loop/load"]["count"] == warps * it
    assert t["loop/mma"]["cycles"] == warps * it * MM
    assert t["store"]["cycles"] == warps * ST and t["store"]["normalized_cycles"] == ST
    assert t["loop"]["cycles"] == warps * (5 + it * (LD + MM + GAP))
    assert t["loop"]["warps"] == warps


def test_tree_is_hatchet_literal():
    raw = D.encode(make_blocks(2, 2, 3), capacity=64, num_warps=2)
    p = D.decode(raw, NAMES, "native_matmul")
    info = {"CUDA": {"0": {"clock_rate": 1980000, "memory_clock_rate": 3201000, "bus_width": 6144,
                           "arch": "90", "num_sms": 132}}}
    tree = json.loads(json.dumps(p.tree(info)))  # JSON-serialisable
    assert len(tree) == 2 and tree[1] == info
    root = tree[0]
    assert root["frame"] == {"name": "ROOT", "type": "function"}
    assert set(root["metrics"]) == {"cycles", "normalized_cycles"}
    (kern,) = root["children"]
    assert kern["frame"]["name"] == "native_matmul"
    by_name = {c["frame"]["name"]: c for c in kern["children"]}
    assert set(by_name) == {"loop", "store"}
    assert {c["frame"]["name"] for c in by_name["loop"]["children"]} == {"load", "mma"}
    m = by_name["store"]["metrics"]
    assert m["cycles"] == 4 * ST and m["device_id"] == "0" and isinstance(m["device_type"], str)

    def walk(n):  # every node has frame/metrics/children, as hatchet's from_literal expects
        assert set(n) == {"frame", "metrics", "children"}
        for c in n["children"]:
            walk(c)
    walk(root)
    hatchet = pytest.importorskip("hatchet")
    gf = hatchet.GraphFrame.from_literal(tree[:1])
    assert len(gf.graph) >= 5


def test_written_tree_reads_back_as_the_totals_in_hatchet(tmp_path):
    """write_tree stores exclusive time (a scope less its children), because hatchet -- and proton-viewer through
    update_inclusive_columns -- adds children into parents: read back, every scope's inclusive time is its total
    (the loop, which holds load and mma, is not counted twice)."""
    raw = D.encode(make_blocks(2, 2, 3), capacity=64, num_warps=2)
    p = D.decode(raw, NAMES, "native_matmul")
    t = p.scope_totals()
    exc = {c["frame"]["name"]: c for c in p.tree(exclusive=True)[0]["children"][0]["children"]}
    inner = sum(c["metrics"]["cycles"] for c in exc["loop"]["children"])
    assert exc["loop"]["metrics"]["cycles"] == t["loop"]["cycles"] - inner == t["loop"]["cycles"] - \
        t["loop/load"]["cycles"] - t["loop/mma"]["cycles"]
    assert exc["store"]["metrics"]["cycles"] == t["store"]["cycles"]   # a leaf: its own total
    hatchet = pytest.importorskip("hatchet")
    path = p.write_tree(str(tmp_path / "p.hatchet"))
    gf = hatchet.GraphFrame.from_literal(json.load(open(path))[:1])
    gf.update_inclusive_columns()
    inc = {n.frame["name"]: gf.dataframe.loc[n, "cycles (inc)"] for n in gf.graph.traverse()}
    assert inc["loop"] == pytest.approx(t["loop"]["cycles"]) and inc["load"] == pytest.approx(t["loop/load"]["cycles"])
    assert inc["native_matmul"] == pytest.approx(t["loop"]["cycles"] + t["store"]["cycles"])


def test_chrome_trace():
    nb, nw, it = 2, 3, 2
    raw = D.encode(make_blocks(nb, nw, it), capacity=64, num_warps=nw)
    p = D.decode(raw, NAMES, "native_matmul")
    tr = json.loads(json.dumps(p.chrome_trace(clock_ghz=2.0)))
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == nb * nw * (2 * it + 2)
    tracks = {(e["pid"], e["tid"]) for e in xs}
    assert len(tracks) == nb * nw  # one track per warp
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "block 1 warp 2" in names
    store = [e for e in xs if e["name"] == "store"]
    assert all(abs(e["dur"] - ST / 2.0 / 1000) < 1e-9 for e in store)  # 50 cycles at 2 GHz = 0.025 us
    assert min(e["ts"] for e in xs) >= 0
    assert tr["otherData"]["dropped_records"] == 0
    assert len([e for e in D.decode(raw, NAMES).chrome_trace(max_blocks=1)["traceEvents"] if e["ph"] == "X"]) \
        == nw * (2 * it + 2)


def warp_events_next(t0, iters):
    """The same scopes as warp_events with transition records (next()) where one scope ends as the next begins:
    loop{ load, mma } x iters, store, as the native matmul kernel records them (2 records per iteration)."""
    ev, t = [(0, False, t0), (1, False, t0 + 5)], t0 + 5
    for i in range(iters):
        ev.append(((1, 2), "next", t + LD))
        t_end = t + LD + MM
        ev.append(((2, 1), "next", t_end) if i + 1 < iters else (2, True, t_end))
        t = t_end
    ev += [((0, 3), "next", t + 1), (3, True, t + 1 + ST)]
    return ev


def expand_next(events):
    """What exit(a); enter(b) records at one stamp, for every transition record of events."""
    out = []
    for sid, kind, stamp in events:
        out += [(sid[0], True, stamp), (sid[1], False, stamp)] if kind == "next" else [(sid, kind, stamp)]
    return out


def _blocks(nb, nw, it, make):
    blocks = make_blocks(nb, nw, it)
    for blk in blocks:
        blk["warps"] = [make(ev) for ev in (warp_events_next(blk["clock_start"] + 20 + 3 * w, it) for w in range(nw))]
    return blocks


@pytest.mark.parametrize("it", [1, 5])
def test_transition_records_decode_as_exit_then_enter(it):
    """A next(a, b) record (one clock read, one slot) decodes exactly as exit(a); enter(b) at its stamp: the same
    paths, spans, cycles and counts; half the records of a loop."""
    nb, nw = 3, 4
    raw_next = D.encode(_blocks(nb, nw, it, lambda ev: ev), capacity=64, num_warps=nw)
    raw_pair = D.encode(_blocks(nb, nw, it, expand_next), capacity=64, num_warps=nw)
    p, q = D.decode(raw_next, NAMES, "k"), D.decode(raw_pair, NAMES, "k")
    assert (p.dropped, p.unmatched, p.missing_blocks) == (0, 0, 0) == (q.dropped, q.unmatched, q.missing_blocks)
    assert p.scope_totals() == q.scope_totals()
    assert p.paths == q.paths and np.array_equal(p.span_dur, q.span_dur) and np.array_equal(p.span_start, q.span_start)
    assert p.records == nb * nw * (2 * it + 4) and q.records == nb * nw * (4 * it + 4)
    t = p.scope_totals()
    assert t["loop/load"]["cycles"] == nb * nw * LD * it and t["loop/mma"]["cycles"] == nb * nw * MM * it
    assert t["store"]["cycles"] == nb * nw * ST
    # the word a transition leaves (instrument.cuh next_tag)
    assert D.tag_word((2, 1), "next") == D.NEXT_FLAG | 2 << 15 | 1
    assert "INSTR_NEXT_FLAG | (from & 0x7FFFu) << 15 | (to & 0x7FFFu)" in HEADER


def test_transition_records_overwritten_in_the_ring():
    """With a small ring the oldest transition records go as whole records (both their halves); what survives
    decodes, and the dropped count is in records."""
    nb, nw, it, cap = 2, 2, 10, 8
    raw = D.encode(_blocks(nb, nw, it, lambda ev: ev), capacity=cap, num_warps=nw)
    p = D.decode(raw, NAMES, "k")
    assert p.dropped == nb * nw * (2 * it + 4 - cap) == D.dropped_records(raw)
    assert p.records == nb * nw * cap
    t = p.scope_totals()
    assert t["store"]["cycles"] == nb * nw * ST and t["loop/mma"]["cycles"] % MM == 0
    assert "loop" not in t and p.unmatched >= nb * nw


def test_overflow_circular_drop_counting():
    nb, nw, it, cap = 2, 2, 10, 16
    per_warp = 1 + 4 * it + 3  # 44 records
    raw = D.encode(make_blocks(nb, nw, it), capacity=cap, num_warps=nw)
    p = D.decode(raw, NAMES, "k")
    assert p.dropped == nb * nw * (per_warp - cap) == D.dropped_records(raw)
    assert p.records == nb * nw * cap
    t = p.scope_totals()
    # the newest records survive: the store scope and the last mma iterations, still under "loop"
    assert t["store"]["cycles"] == nb * nw * ST
    assert t["loop/mma"]["cycles"] % MM == 0 and "loop/load" in t
    assert "loop" not in t  # its enter was overwritten: loop exit is unmatched
    assert p.unmatched >= nb * nw
    assert p.chrome_trace()["otherData"]["dropped_records"] == p.dropped


def test_missing_block_and_globaltimer_mode():
    blocks = make_blocks(3, 2, 1, wrap=False)
    blocks[2]["missing"] = True
    for b in blocks:
        b["flags"] = D.FLAG_GLOBALTIMER
        b["clock_start"] = b["gtime_start"]
        b["warps"] = [warp_events(b["gtime_start"] + 10, 1) for _ in range(2)]
    raw = D.encode(blocks, capacity=32, num_warps=2)
    p = D.decode(raw, NAMES)
    assert p.missing_blocks == 1 and p.timer == "globaltimer"
    assert p.scope_totals()["store"]["time (ns)"] == 2 * 2 * ST
    assert p.ns_per_unit() == 1.0


def test_warp0_mode_idle_warps_leave_zero_headers():
    """WARP0 mode: warps 1.. of a block write nothing (instrument.cuh: they branch around end()), so their regions
    stay as the launcher zeroed them; the decoder reads a zero warp header as a warp with no records, and the
    block's profile is warp 0's (the same spans as warp 0 of a staged buffer)."""
    nb, nw, it = 3, 4, 5
    full = D.encode(make_blocks(nb, nw, it), capacity=64, num_warps=nw)
    w0 = full.copy().reshape(nb, -1)
    stride = D.WARP_HEADER_WORDS + 64 * D.RECORD_WORDS
    w0[:, D.BLOCK_HEADER_WORDS + stride:] = 0           # warps 1..3 never wrote
    p, q = D.decode(w0.reshape(-1), NAMES, "k"), D.decode(full, NAMES, "k")
    assert (p.dropped, p.unmatched, p.missing_blocks) == (0, 0, 0)
    assert p.records == nb * (4 * it + 4) and set(p.span_warp % nw) == {0}
    tp, tq = p.scope_totals(), q.scope_totals()
    assert tp.keys() == tq.keys()
    for k in tp:   # warp 0's share of the staged profile: every warp of make_blocks runs the same scopes
        assert tp[k]["count"] * nw == tq[k]["count"] and tp[k]["warps"] == nb
        assert tp[k]["normalized_cycles"] == tq[k]["normalized_cycles"]


def test_calibration_like_decode():
    spin = 1_000_000
    blocks = [dict(block_id=b, sm_id=b, clock_start=10, clock_end=10 + spin + 100, gtime_start=0,
                   gtime_end=(spin + 100) // 2, warps=[[(0, False, 50), (0, True, 50 + spin + 7)]] * 4)
              for b in range(3)]
    p = D.decode(D.encode(blocks, capacity=4, num_warps=4), SCOPES["calibrate"], "native_calibrate")
    t = p.scope_totals()["spin"]
    assert t["normalized_cycles"] == spin + 7
    assert abs(p.ns_per_unit() - 0.5) < 1e-3  # 2 GHz from the headers


def test_raw_bytes_and_bad_buffer():
    raw = D.encode(make_blocks(1, 1, 1), capacity=8, num_warps=1)
    assert D.decode(raw.tobytes(), NAMES).scope_totals() == D.decode(raw, NAMES).scope_totals()
    with pytest.raises(ValueError):
        D.decode(np.zeros(64, dtype=np.uint32), NAMES)


def test_instr_diag_cli_without_gpu(capsys):
    """native.instr_diag refuses unknown kernels, and says `unavailable` (exit 2) where no GPU is visible."""
    torch = pytest.importorskip("torch")
    from native import instr_diag
    assert instr_diag.main(["--kernels", "matmul,bogus"]) == 2
    assert "unknown kernels" in capsys.readouterr().out
    assert instr_diag.main(["--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().out
    assert instr_diag.main(["--buffer-records", "8"]) == 2
    assert "--buffer-records: buffer_records must be an integer >= 16" in capsys.readouterr().out
    assert instr_diag.main(["--buffer-records", "18"]) == 2
    assert "multiple of 4" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert instr_diag.main([]) == 2
        assert "unavailable" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [(["--point", "u9,1,2,3"], "u9"), (["--point", "u4,8192,x,1"], "positive integers"),
                                      (["--point", "u4,1,2"], "fmt,K,N,M"), (["--point", "u4,256,256,1", "--grid-mults", "0"],
                                                                            "--grid-mults"),
                                      (["--grid-mults", "2"], "give --point"), (["--grids", "224"], "give --point"),
                                      (["--data-parallel"], "give --point"),
                                      (["--point", "u4,256,256,1", "--grids", "0"], "--grids"), (["--samples", "0"], "--samples"),
                                      (["--json", "/"], "directory")])
def test_tune_cli_rejects_bad_values_before_gpu_work(argv, msg, capsys):
    pytest.importorskip("torch")
    from native import tune
    assert tune.main(argv) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("config error:") and msg in out and len(out.splitlines()) == 1


def test_tune_point_parsing():
    from native.tune import _parse_points
    assert _parse_points("u4,8192,57344,1; F6E3M2,8192,8192,16;") == [("u4", 8192, 57344, 1, 128),
                                                                       ("f6e3m2", 8192, 8192, 16, -1)]
    assert _parse_points("i8,8192,57344,16,-1;u4,256,256,1,64") == [("i8", 8192, 57344, 16, -1), ("u4", 256, 256, 1, 64)]
    assert _parse_points(None) == []
    for bad, msg in (("u4,1,2", "is not fmt,K,N,M"), ("u4,1,2,3,4,5", "is not fmt,K,N,M"),
                     ("u4,256,256,1,x", "the group is an integer"), ("u4,256,256,1,48", "does not divide K=256"),
                     ("u4,256,256,1,8", "not a multiple of 32"), ("u4,250,256,1", "K=250 is not a multiple of 8")):
        with pytest.raises(ValueError, match=msg):
            _parse_points(bad)


def test_lowbit_inputs_carry_a_checked_decode_variant():
    """native_kernels.make_inputs('lowbit', variant=...) (what native.instr_diag's lowbit_lean / lowbit_bulk use):
    a variant the decode kernel does not have is refused before any weight is made; the default is auto."""
    from native import native_kernels as nk
    assert nk.make_inputs("lowbit", "tiny", "cpu")["variant"] == "auto"
    assert nk.make_inputs("lowbit_regs", "tiny", "cpu")["variant"] == "regs"   # proton_fig15's second low-bit kernel
    assert nk.SCOPES["lowbit_regs"] == nk.SCOPES["lowbit"] and set(nk.LOWBIT_KERNELS) <= set(nk.SCOPES)
    assert nk.make_inputs("lowbit", "tiny", "cpu", variant="bulk")["variant"] == "bulk"
    with pytest.raises(ValueError, match="decode variant 'fast'"):
        nk.make_inputs("lowbit", "tiny", "cpu", variant="fast")
