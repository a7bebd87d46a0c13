"""Host-side decoder of the profile buffers written by native/include/instrument.cuh
(pure Python + numpy). Layout constants mirror the header; see its top comment.

    prof = decode(raw_uint32, scope_names=("loop", "load", "mma", "store"), kernel="native_matmul")
    prof.tree(device_info)      # hatchet-compatible list, the same shape as Proton's tree output
    prof.chrome_trace()         # {"traceEvents": [...]}: one track per warp (pid = SM, tid = block/warp)
    prof.dropped                # records lost to the circular buffer (sum over warps)
    prof.scope_totals()         # {"loop/load": {"cycles", "count", "warps", "normalized_cycles"}, ...}

encode(blocks) builds a synthetic buffer the way the device does (used by the CPU tests).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

MAGIC = 0x54534E49
BLOCK_HEADER_WORDS = 16
WARP_HEADER_WORDS = 8              # [0] warp [1] count [2] begin [3] end stamp [4..7] 0: one 32-byte sector
RECORD_WORDS = 2
END_FLAG = 0x80000000
NEXT_FLAG = 0x40000000          # a transition record: leave scope (bits 15..29), enter scope (bits 0..14)
MIN_CAPACITY = 16               # records per warp the launchers accept at least (one register batch); any decodes
CAPACITY_ALIGN = 4              # ... and a multiple of it (4 records: one 32-byte sector)
FLAG_GLOBALTIMER = 1
M32 = 0xFFFFFFFF
UNKNOWN_SCOPE = "<dropped>"


def block_words(num_warps: int, capacity: int) -> int:
    return BLOCK_HEADER_WORDS + num_warps * (WARP_HEADER_WORDS + capacity * RECORD_WORDS)


# --------------------------------------------------------------------------- encoder (mirror of the device)

def tag_word(sid, kind) -> int:
    """word0 of a record: kind False = enter scope sid, True = exit it, "next" = leave sid[0] and enter sid[1] at
    one stamp (instrument.cuh next_tag: ids < 2^15)."""
    if kind == "next":
        a, b = sid
        return NEXT_FLAG | (int(a) & 0x7FFF) << 15 | (int(b) & 0x7FFF)
    return (int(sid) & 0x3FFFFFFF) | (END_FLAG if kind else 0)


def encode(blocks: list[dict], capacity: int, num_warps: int) -> np.ndarray:
    """Synthetic buffer. Each block dict: block_id, sm_id, clock_start, clock_end, gtime_start, gtime_end,
    optional flags, and warps: list (len num_warps) of event lists [(scope_id, is_end, stamp64), ...] in
    program order (a transition record: ((from_id, to_id), "next", stamp64), see tag_word). Records go to slot i % capacity exactly as Profiler::record does; a block dict with
    "missing": True is left as zeros (a block that never ran)."""
    bw = block_words(num_warps, capacity)
    buf = np.zeros(len(blocks) * bw, dtype=np.uint32)
    for b, blk in enumerate(blocks):
        if blk.get("missing"):
            continue
        base = b * bw
        h = buf[base:base + BLOCK_HEADER_WORDS]
        h[0], h[1], h[2], h[3], h[4] = MAGIC, blk["block_id"], blk["sm_id"], num_warps, capacity
        h[5] = blk.get("flags", 0)
        for i, key in ((6, "clock_start"), (8, "clock_end"), (10, "gtime_start"), (12, "gtime_end")):
            v = int(blk[key])
            h[i], h[i + 1] = v & M32, (v >> 32) & M32
        for w, events in enumerate(blk["warps"]):
            wb = base + BLOCK_HEADER_WORDS + w * (WARP_HEADER_WORDS + capacity * RECORD_WORDS)
            buf[wb] = w
            buf[wb + 1] = len(events)
            if events:  # begin / end stamps of the warp (the device takes them around its records)
                buf[wb + 2] = (int(events[0][2]) - 1) & M32
                buf[wb + 3] = (int(events[-1][2]) + 1) & M32
            for i, (sid, is_end, stamp) in enumerate(events):
                slot = i % capacity
                r = wb + WARP_HEADER_WORDS + slot * RECORD_WORDS
                buf[r] = tag_word(sid, is_end)
                buf[r + 1] = int(stamp) & M32
    return buf


# --------------------------------------------------------------------------- decoder

@dataclass
class Profile:
    kernel: str
    scope_names: tuple
    timer: str                      # "clock" (cycles) or "globaltimer" (ns)
    headers: np.ndarray             # [blocks, 16] uint64 view of the valid block headers (see columns())
    dropped: int                    # records overwritten in the circular buffers
    unmatched: int                  # retained enter / exit events without a partner (a transition is two)
    missing_blocks: int             # blocks whose header was never written
    records: int                    # retained records
    # one row per matched span:
    span_warp: np.ndarray = field(repr=False)    # global warp index (block_row * num_warps + warp)
    span_start: np.ndarray = field(repr=False)   # stamp units since its block's start
    span_dur: np.ndarray = field(repr=False)     # stamp units
    span_path: np.ndarray = field(repr=False)    # index into paths
    paths: list = field(repr=False)              # list of tuples of scope names
    num_warps: int = 0

    # ---- per-block header columns
    @property
    def block_ids(self):
        return self.headers[:, 0]

    @property
    def sm_ids(self):
        return self.headers[:, 1]

    @property
    def clock_start(self):
        return self.headers[:, 2]

    @property
    def clock_end(self):
        return self.headers[:, 3]

    @property
    def gtime_start(self):
        return self.headers[:, 4]

    @property
    def gtime_end(self):
        return self.headers[:, 5]

    @property
    def metric(self) -> str:
        return "cycles" if self.timer == "clock" else "time (ns)"

    def ns_per_unit(self, clock_ghz: float | None = None) -> float:
        """ns per stamp unit: 1 for globaltimer; for cycles the SM clock estimated from the block
        headers (globaltimer span / clock64 span over blocks longer than 20 us), else 1/clock_ghz."""
        if self.timer == "globaltimer":
            return 1.0
        if clock_ghz:
            return 1.0 / clock_ghz
        dg = self.gtime_end.astype(np.float64) - self.gtime_start.astype(np.float64)
        dc = self.clock_end.astype(np.float64) - self.clock_start.astype(np.float64)
        ok = (dg >= 20_000) & (dc > 0) & (self.gtime_end >= self.gtime_start)
        if ok.any():
            return float(dg[ok].sum() / dc[ok].sum())
        return 1.0 / 1.98  # H200 max SM clock

    def kernel_span_ns(self) -> float:
        """First block start to last block end, from %globaltimer (ns)."""
        if len(self.headers) == 0:
            return 0.0
        return float(self.gtime_end.max()) - float(self.gtime_start.min())

    def scope_totals(self) -> dict:
        """{"a/b": {"cycles"|"time (ns)": total, "count": spans, "warps": warps, "normalized_...": total/warps}}"""
        out = {}
        if len(self.span_dur) == 0:
            return out
        tot = np.bincount(self.span_path, weights=self.span_dur.astype(np.float64), minlength=len(self.paths))
        cnt = np.bincount(self.span_path, minlength=len(self.paths))
        seen = np.zeros((len(self.paths), int(self.span_warp.max()) + 1), dtype=bool)
        seen[self.span_path, self.span_warp] = True
        nw = seen.sum(axis=1)
        for i, p in enumerate(self.paths):
            if cnt[i] == 0:
                continue
            out["/".join(p)] = {self.metric: int(tot[i]), "count": int(cnt[i]), "warps": int(nw[i]),
                                "normalized_" + ("cycles" if self.timer == "clock" else "time (ns)"):
                                    float(tot[i]) / max(int(nw[i]), 1)}
        return out

    def tree(self, device_info: dict | None = None, device_id: int = 0, exclusive: bool = False) -> list:
        """Hatchet literal in Proton's layout: [ROOT{kernel{scopes...}}, device_info]. Scope nodes carry
        "cycles" (sum over warps and occurrences), "normalized_cycles" (per warp that ran the scope),
        "count", "device_id", "device_type" (strings; "1" = CUDA as Proton 3.6 writes). exclusive=True: the two
        time metrics less those of the node's children -- what a hatchet file holds, since hatchet (and so
        proton-viewer, via update_inclusive_columns) adds the children's values to their parent's; write_tree
        writes that.  exclusive=False: every node's own totals (scope_totals)."""
        metric = "cycles" if self.timer == "clock" else "time (ns)"
        norm = "normalized_" + metric
        totals = self.scope_totals()

        def node(name):
            return {"frame": {"name": name, "type": "function"}, "metrics": {}, "children": []}

        kern = node(self.kernel)
        index = {(): kern}
        for path in sorted((tuple(k.split("/")) for k in totals), key=len):
            for d in range(1, len(path) + 1):
                pre = path[:d]
                if pre not in index:
                    n = node(pre[-1])
                    index[pre[:-1]]["children"].append(n)
                    index[pre] = n
            t = totals["/".join(path)]
            index[path]["metrics"] = {metric: t[metric], norm: t[norm], "count": t["count"],
                                      "device_id": str(device_id), "device_type": "1"}
        if exclusive:   # parents first: their children's metrics are still the totals
            for path in sorted((p for p in index if p), key=len):
                m = index[path]["metrics"]
                for c in index[path]["children"]:
                    for k in (metric, norm):
                        m[k] = m.get(k, 0) - c["metrics"].get(k, 0)
        root = {"frame": {"name": "ROOT", "type": "function"}, "metrics": {metric: 0, norm: 0},
                "children": [kern]}
        return [root, device_info if device_info is not None else {}]

    def chrome_trace(self, max_blocks: int | None = None, clock_ghz: float | None = None) -> dict:
        """Chrome trace (Perfetto): pid = SM, tid = one per (block, warp), complete events (ph "X") in us
        from the first block's start. max_blocks keeps the first N blocks (by block id)."""
        ns = self.ns_per_unit(clock_ghz)
        nblk = len(self.headers)
        keep = np.ones(nblk, dtype=bool)
        if max_blocks is not None and nblk > max_blocks:
            keep[np.argsort(self.block_ids)[max_blocks:]] = False
        t0 = float(self.gtime_start[keep].min()) if keep.any() else 0.0
        events, seen_pid, seen_tid = [], set(), set()
        nw = max(self.num_warps, 1)
        for i in np.flatnonzero(keep[self.span_warp // nw]):
            row, warp = divmod(int(self.span_warp[i]), nw)
            pid, bid = int(self.sm_ids[row]), int(self.block_ids[row])
            tid = bid * nw + warp
            if pid not in seen_pid:
                seen_pid.add(pid)
                events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"SM {pid}"}})
            if (pid, tid) not in seen_tid:
                seen_tid.add((pid, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"block {bid} warp {warp}"}})
            start_ns = float(self.gtime_start[row]) - t0 + float(self.span_start[i]) * ns
            p = self.paths[int(self.span_path[i])]
            events.append({"name": p[-1], "cat": self.kernel, "ph": "X", "pid": pid, "tid": tid,
                           "ts": start_ns / 1000.0, "dur": float(self.span_dur[i]) * ns / 1000.0,
                           "args": {self.metric: int(self.span_dur[i]), "path": "/".join(p)}})
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"kernel": self.kernel, "dropped_records": self.dropped,
                              "unmatched_records": self.unmatched, "missing_blocks": self.missing_blocks,
                              "ns_per_" + ("cycle" if self.timer == "clock" else "ns"): ns}}

    def write_tree(self, path: str, device_info: dict | None = None) -> str:
        with open(path, "w") as f:
            json.dump(self.tree(device_info, exclusive=True), f)
        return path

    def write_trace(self, path: str, **kw) -> str:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(**kw), f)
        return path


def _as_words(raw) -> np.ndarray:
    if hasattr(raw, "detach"):  # torch tensor
        raw = raw.detach().cpu().numpy()
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint32)
    a = np.ascontiguousarray(raw)
    return a.view(np.uint32).reshape(-1) if a.dtype != np.uint32 else a.reshape(-1)


def decode(raw, scope_names, kernel: str = "kernel", num_warps: int | None = None,
           capacity: int | None = None) -> Profile:
    """Decode a raw profile buffer. num_warps / capacity default to the first valid block header."""
    w = _as_words(raw)
    names = tuple(scope_names)
    if num_warps is None or capacity is None:
        valid0 = None
        # headers sit at multiples of the (unknown) stride; the first block is at 0 unless it never ran
        if len(w) >= BLOCK_HEADER_WORDS and w[0] == MAGIC:
            valid0 = 0
        if valid0 is None:
            raise ValueError("first block header is not valid; pass num_warps and capacity")
        num_warps = int(w[3]) if num_warps is None else num_warps
        capacity = int(w[4]) if capacity is None else capacity
    bw = block_words(num_warps, capacity)
    nblocks = len(w) // bw
    if nblocks * bw != len(w):
        raise ValueError(f"buffer of {len(w)} words is not a whole number of {bw}-word blocks")
    blk = w.reshape(nblocks, bw)
    hdr = blk[:, :BLOCK_HEADER_WORDS].astype(np.uint64)
    valid = hdr[:, 0] == MAGIC
    missing = int((~valid).sum())
    hdr, blk = hdr[valid], blk[valid]
    nb = len(hdr)
    timer = "globaltimer" if nb and int(hdr[0, 5]) & FLAG_GLOBALTIMER else "clock"
    lo_hi = lambda i: hdr[:, i] | (hdr[:, i + 1] << np.uint64(32))  # noqa: E731
    headers = np.stack([hdr[:, 1], hdr[:, 2], lo_hi(6), lo_hi(8), lo_hi(10), lo_hi(12)], axis=1) \
        if nb else np.zeros((0, 6), dtype=np.uint64)

    warps = blk[:, BLOCK_HEADER_WORDS:].reshape(nb, num_warps, WARP_HEADER_WORDS + capacity * RECORD_WORDS)
    total = warps[:, :, 1].astype(np.int64).reshape(-1)                         # [nb*nw]
    recs = warps[:, :, WARP_HEADER_WORDS:].reshape(nb * num_warps, capacity, RECORD_WORDS)
    kept = np.minimum(total, capacity)
    dropped = int(np.maximum(total - capacity, 0).sum())
    first = np.where(total > capacity, total % max(capacity, 1), 0)
    j = np.arange(capacity)[None, :]
    slot = (first[:, None] + j) % capacity
    ok = j < kept[:, None]
    ordered = np.take_along_axis(recs, slot[:, :, None], axis=1)                 # chronological
    wid = np.broadcast_to(np.arange(nb * num_warps)[:, None], ok.shape)[ok]      # global warp index
    pos = np.broadcast_to(j, ok.shape)[ok]
    tag = ordered[:, :, 0][ok].astype(np.int64)
    stamp = ordered[:, :, 1][ok].astype(np.int64)
    n_raw = len(tag)
    # a transition record (next()) is the exit of one scope and the enter of the next at one stamp: expand it into
    # those two records, so that everything below sees what exit(); enter() would have left
    nxt = ((tag & NEXT_FLAG) != 0) & ((tag & END_FLAG) == 0)
    if nxt.any():
        rep = 1 + nxt.astype(np.int64)
        idx = np.repeat(np.arange(n_raw), rep)
        sub = np.arange(len(idx)) - np.repeat(np.cumsum(rep) - rep, rep)    # 0, or 1 for a transition's enter
        t = tag[idx]
        tag = np.where(nxt[idx], np.where(sub == 0, ((t >> 15) & 0x7FFF) | END_FLAG, t & 0x7FFF), t)
        wid, stamp, pos = wid[idx], stamp[idx], 2 * pos[idx] + sub
    else:
        pos = 2 * pos
    n = len(tag)
    is_end = (tag & END_FLAG) != 0
    sid = tag & 0x7FFFFFFF

    # nesting level: enters at depth-before, exits at depth-after; shifted so each warp's minimum is 0
    step = np.where(is_end, -1, 1)
    csum = np.cumsum(step)
    starts = np.r_[0, np.flatnonzero(np.diff(wid)) + 1] if n else np.zeros(0, dtype=np.int64)
    base = np.zeros(n, dtype=np.int64)
    if n:
        seg_base = csum[starts] - step[starts]
        base = np.repeat(seg_base, np.diff(np.r_[starts, n]))
    depth_after = csum - base
    level = np.where(is_end, depth_after, depth_after - step)
    if n:
        seg_min = np.minimum.reduceat(level, starts)
        level = level - np.repeat(seg_min, np.diff(np.r_[starts, n]))

    # pair: within (warp, level) in program order an enter is followed by its exit
    order = np.argsort(wid.astype(np.int64) * (int(level.max()) + 1 if n else 1) + level, kind="stable")
    o_w, o_l, o_e, o_s = wid[order], level[order], is_end[order], sid[order]
    pair = np.zeros(max(n - 1, 0), dtype=bool)
    if n > 1:
        pair = (~o_e[:-1]) & o_e[1:] & (o_w[:-1] == o_w[1:]) & (o_l[:-1] == o_l[1:]) & (o_s[:-1] == o_s[1:])
    ent = order[:-1][pair] if n > 1 else np.zeros(0, dtype=np.int64)
    ext = order[1:][pair] if n > 1 else np.zeros(0, dtype=np.int64)
    unmatched = n - 2 * len(ent)

    # ancestors: the scope open at level l around record i is closed by the next exit at level l in the
    # same warp; if it never closes (buffer end), it is the last enter at level l before i.
    maxl = int(level[ent].max()) if len(ent) else 0
    key = wid.astype(np.int64) * (2 * capacity + 2) + pos
    anc = np.full((len(ent), maxl + 1), -1, dtype=np.int64)
    e_level, e_key, e_wid = level[ent], key[ent], wid[ent]
    for lv in range(maxl):
        need = e_level > lv
        if not need.any():
            continue
        xs = np.flatnonzero(is_end & (level == lv))  # already in key order
        idx = np.searchsorted(key[xs], e_key[need], side="right")
        got = np.full(need.sum(), -1, dtype=np.int64)
        inb = idx < len(xs)
        same = np.zeros_like(inb)
        same[inb] = wid[xs[idx[inb]]] == e_wid[need][inb]
        got[same] = sid[xs[idx[same]]]
        if (~same).any():
            es = np.flatnonzero(~is_end & (level == lv))
            k2 = np.searchsorted(key[es], e_key[need][~same], side="left") - 1
            fb = np.full(len(k2), -1, dtype=np.int64)
            okk = k2 >= 0
            fb[okk] = np.where(wid[es[k2[okk]]] == e_wid[need][~same][okk], sid[es[k2[okk]]], -1)
            got[~same] = fb
        anc[np.flatnonzero(need), lv] = got
    rows = np.arange(len(ent))
    anc[rows, e_level] = sid[ent]
    anc[np.arange(anc.shape[1])[None, :] > e_level[:, None]] = -2          # beyond this span's depth
    if len(ent):  # one int64 key per path (digits = scope id + 2 in base max_id + 3), then unique
        radix = int(max(int(sid.max()), 0)) + 3
        code = np.zeros(len(ent), dtype=np.int64)
        for lv in range(anc.shape[1]):
            code = code * radix + (anc[:, lv] + 2)
        if int(code.max()) < 1 << 26:  # small code space: O(n) table lookup instead of a sort
            ucode = np.flatnonzero(np.bincount(code))
            lut = np.zeros(int(ucode[-1]) + 1, dtype=np.int64)
            lut[ucode] = np.arange(len(ucode))
            inv = lut[code]
        else:
            ucode, inv = np.unique(code, return_inverse=True)
            inv = inv.reshape(-1)
        uniq = np.zeros((len(ucode), anc.shape[1]), dtype=np.int64)
        for lv in range(anc.shape[1] - 1, -1, -1):
            uniq[:, lv] = ucode % radix - 2
            ucode = ucode // radix
    else:
        uniq, inv = np.zeros((0, 1), dtype=np.int64), np.zeros(0, dtype=np.int64)

    def nm(s):
        s = int(s)
        if s == -1:
            return UNKNOWN_SCOPE
        return names[s] if 0 <= s < len(names) else f"scope_{s}"
    paths = [tuple(nm(s) for s in row if s != -2) for row in uniq]

    blk_row = wid // num_warps
    start_lo = headers[:, 4 if timer == "globaltimer" else 2].astype(np.int64) & M32 if nb else np.zeros(0, np.int64)
    span_start = (stamp[ent] - start_lo[blk_row[ent]]) & M32
    span_dur = (stamp[ext] - stamp[ent]) & M32
    return Profile(kernel=kernel, scope_names=names, timer=timer, headers=headers, dropped=dropped,
                   unmatched=int(unmatched), missing_blocks=missing, records=int(n_raw), span_warp=wid[ent],
                   span_start=span_start, span_dur=span_dur, span_path=inv, paths=paths, num_warps=num_warps)


def warp_record_counts(raw) -> np.ndarray:
    """Records each warp wrote (its header's count, which goes on past the capacity), read from the headers only:
    [valid blocks, warps]."""
    w = _as_words(raw)
    nw, cap = int(w[3]), int(w[4])
    blk = w.reshape(-1, block_words(nw, cap))
    blk = blk[blk[:, 0] == MAGIC]
    return blk[:, BLOCK_HEADER_WORDS:].reshape(len(blk), nw, -1)[:, :, 1].astype(np.int64)


def dropped_records(raw) -> int:
    """Records lost to overflow, read from the headers only."""
    return int(np.maximum(warp_record_counts(raw) - int(_as_words(raw)[4]), 0).sum())
