"""Proton tree profiles (the `.hatchet` JSON that `proton.finalize()` writes) without hatchet.

A profile is a JSON list [ROOT, device_info]; each node is {"frame": {"name", "type"}, "metrics": {...},
"children": [...]}. Kernel nodes carry "time (ns)" and "count"; Triton launches with launch_metadata
also carry "flops<8|16|32|64>" and "bytes"; `proton.scope(name, metrics)` nodes carry their metrics
and the kernels launched inside them as children. Frames named `__proton_launch_metadata` hold
kernels launched while computing launch metadata and are dropped (as proton-viewer drops them).

Derived metrics follow proton-viewer: tflop<w>/s = flops<w> / time, tbyte/s = bytes / time, summed over
a frame's subtree (inclusive). `diff` compares two profiles frame by frame, as `proton-viewer -m M
-diff A B` does (hatchet's GraphFrame.sub on the same derived metric).
"""
from __future__ import annotations

import json
from pathlib import Path

METADATA_FRAME = "__proton_launch_metadata"
FLOPS_KEYS = ("flops8", "flops16", "flops32", "flops64", "flops")
SUM_KEYS = ("time (ns)", "count", "bytes") + FLOPS_KEYS


def load(path) -> list:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, list) or not data or "frame" not in data[0]:
        raise ValueError(f"{path}: not a Proton tree profile (expected [ROOT, device_info])")
    return data


def _children(node) -> list:
    return [c for c in node.get("children", []) if c.get("frame", {}).get("name") != METADATA_FRAME]


def inclusive(node) -> dict:
    """Sum of the additive metrics over a node and its subtree."""
    out = {k: 0.0 for k in SUM_KEYS}
    stack = [node]
    while stack:
        n = stack.pop()
        for k, v in n.get("metrics", {}).items():
            if k in out and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] += float(v)
        stack.extend(_children(n))
    return out


def leaves(node) -> list:
    """(name, metrics) of every kernel frame (a frame with a time and no timed children)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        kids = _children(n)
        if "time (ns)" in n.get("metrics", {}) and not any("time (ns)" in inclusive(c) and inclusive(c)["time (ns)"]
                                                         for c in kids):
            out.append((n["frame"]["name"], n["metrics"]))
        stack.extend(kids)
    return out


def top_frames(profile: list) -> dict:
    """name -> node for the frames directly under ROOT."""
    return {c["frame"]["name"]: c for c in _children(profile[0])}


def derived(m: dict) -> dict:
    """proton-viewer's derived metrics of one inclusive metric dict."""
    t = m.get("time (ns)", 0.0)
    flops = sum(m.get(k, 0.0) for k in FLOPS_KEYS)
    d = {"time/ms": t / 1e6, "count": m.get("count", 0.0), "flops": flops, "bytes": m.get("bytes", 0.0)}
    if t > 0:
        d["tflop/s"] = flops / t / 1e3
        d["tbyte/s"] = m.get("bytes", 0.0) / t / 1e3
        for k in ("flops8", "flops16"):
            if m.get(k):
                d[f"tflop{k[5:]}/s"] = m[k] / t / 1e3                # tflop8/s, tflop16/s
    return d


def merge(dst, src) -> Path:
    """Put the frames under src's ROOT into dst's (replacing frames of the same name): one profile for a
    whole sweep, grown one point at a time. dst is created from src when it does not exist."""
    dst, new = Path(dst), load(src)
    if dst.exists():
        old = load(dst)
        frames = {c["frame"]["name"]: c for c in old[0].get("children", [])}
        for c in new[0].get("children", []):
            frames[c["frame"]["name"]] = c
        old[0]["children"] = list(frames.values())
        old[0]["metrics"] = {}
        new = old
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(dst.suffix + ".tmp")
    tmp.write_text(json.dumps(new))
    tmp.replace(dst)
    return dst


def diff(a: list, b: list, metric: str = "tflop/s") -> list[dict]:
    """Per top-level frame present in either profile: {name, a, b, diff = a - b} of a derived metric,
    the quantity `proton-viewer -m <metric> -diff A B` prints (A's frame minus B's)."""
    fa, fb = top_frames(a), top_frames(b)
    rows = []
    for name in sorted(set(fa) | set(fb)):
        va = derived(inclusive(fa[name])).get(metric) if name in fa else None
        vb = derived(inclusive(fb[name])).get(metric) if name in fb else None
        rows.append({"name": name, "a": va, "b": vb,
                     "diff": (va - vb) if va is not None and vb is not None else None})
    return rows


def summarize(profile: list, useful: str = "matmul", exclude_time: tuple = ()) -> dict:
    """The roofline numbers of the artifact's parse_profile: flops and bytes of the top-level frames whose
    name contains `useful`, time of every kernel in the profile (kernels whose name contains one of
    `exclude_time` are left out of `compute_ns`)."""
    flops = nbytes = 0.0
    for name, node in top_frames(profile).items():
        if useful in name:
            m = inclusive(node)
            flops += sum(m[k] for k in FLOPS_KEYS)
            nbytes += m["bytes"]
    ks = leaves(profile[0])
    time_ns = sum(float(m.get("time (ns)", 0.0)) for _, m in ks)
    compute_ns = sum(float(m.get("time (ns)", 0.0)) for n, m in ks if not any(x in n for x in exclude_time))
    return {"flops": flops, "bytes": nbytes, "time_ns": time_ns, "compute_ns": compute_ns, "kernels": len(ks)}
