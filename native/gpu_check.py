"""Dev script (GPU only): suite kernels at "llm" size with/without Proton instrumentation, native
extension build + kernels + calibration. Writes a JSON summary (and a few artifacts) to argv[1].

    python native/gpu_check.py $OUT [time_budget_s] [sections]

sections (comma list, default all): suite (correctness plain/instrumented + Proton trees), modes (Proton
mode variants + one chrome trace), cupti (kernel device time plain vs instrumented, via torch.profiler
inside the Proton session: the session's per-launch host processing makes CUDA-event timing useless),
native (build, calibration, native kernels, decode, proton-viewer).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import traceback

T0 = time.time()
OUTDIR = sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out"
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 200.0
SECTIONS = set((sys.argv[3] if len(sys.argv) > 3 else "suite,modes,cupti,native").split(","))
os.makedirs(OUTDIR, exist_ok=True)
SUMMARY: dict = {"suite": {}, "modes": {}, "cupti": {}, "native": {}, "errors": []}


def save():
    SUMMARY["elapsed_s"] = round(time.time() - T0, 1)
    with open(os.path.join(OUTDIR, "summary.json"), "w") as f:
        json.dump(SUMMARY, f, indent=1, default=str)


def left():
    return BUDGET - (time.time() - T0)


# build the native extension in the background while the Triton kernels run
build_proc = subprocess.Popen([sys.executable, "-c", "from native.build import build; build()"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.suite import SUITE  # noqa: E402
from kernels.suite.proton_modes import make_mode  # noqa: E402
from kernels.suite.proton_run import profile_case  # noqa: E402

props = torch.cuda.get_device_properties(0)
SUMMARY["env"] = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
                  "triton": triton.__version__}


def time_ms(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def tree_scopes(path):
    """{scope path: cycles} from a Proton / native hatchet JSON."""
    with open(path) as f:
        data = json.load(f)
    out = {}

    def walk(n, pre):
        name = n["frame"]["name"]
        p = pre + [name]
        m = n.get("metrics", {})
        if "cycles" in m and name != "ROOT":
            out["/".join(p[2:]) or name] = {"cycles": m["cycles"], "normalized_cycles": m.get("normalized_cycles")}
        for c in n.get("children", []):
            walk(c, p)
    walk(data[0], [])
    return out


# ------------------------------------------------------------------ Triton suite at llm size
ORDER = ["layer_norm", "fused_softmax", "matmul", "swiglu", "low_memory_dropout", "topk", "persistent_matmul",
         "grouped_gemm", "moe_matmul", "fused_attention"]
for name in (ORDER if "suite" in SECTIONS else []):
    if left() < 60:
        SUMMARY["errors"].append(f"skipped {name}: time budget")
        continue
    case = SUITE[name]
    r = SUMMARY["suite"][name] = {}
    try:
        inputs = case.make_inputs("llm", "cuda", seed=0)
        out = case.run(inputs)
        ref = case.reference(inputs)
        ok, err = case.check(inputs, out)
        r.update(ok_plain=ok, err_plain=err)
        del ref
        r["ms_plain"] = time_ms(lambda: case.run(inputs))
        fl, by = case.flops_bytes(inputs)
        r["tflops"] = fl / r["ms_plain"] / 1e9
        r["tbps"] = by / r["ms_plain"] / 1e9
        stem = os.path.join(OUTDIR, "proton", name)
        path = profile_case(case, inputs, stem, data="tree", warmup=False)
        r["proton_file"] = os.path.basename(path)
        r["proton_bytes"] = os.path.getsize(path)
        try:
            r["proton_scopes"] = tree_scopes(path)
        except Exception as e:  # noqa: BLE001
            r["proton_scopes"] = f"unreadable: {e}"
        # correctness + time of the instrumented binary inside a session
        import triton.profiler as proton
        proton.start(stem + "_timed", backend="instrumentation")
        try:
            out_i = case.run(inputs, instrument=True)
            torch.cuda.synchronize()
            ok_i, err_i = case.check(inputs, out_i)
            r.update(ok_instr=ok_i, err_instr=err_i)
            r["ms_instr_session"] = time_ms(lambda: case.run(inputs, instrument=True), reps=5)
        finally:
            proton.finalize()
        r["overhead"] = r["ms_instr_session"] / r["ms_plain"]
        del inputs, out
    except Exception as e:  # noqa: BLE001
        r["error"] = f"{type(e).__name__}: {e}"
        r["trace"] = traceback.format_exc()[-1500:]
    torch.cuda.empty_cache()
    save()
    print(name, {k: v for k, v in r.items() if k not in ("proton_scopes", "trace")}, flush=True)

# ------------------------------------------------------------------ Proton modes and one chrome trace
if "modes" in SECTIONS and left() > 50:
    for kname in ("fused_softmax", "topk", "persistent_matmul"):  # CTA granularity on more kernels
        try:
            kc = SUITE[kname]
            kin = kc.make_inputs("llm", "cuda", seed=2)
            p = profile_case(kc, kin, os.path.join(OUTDIR, "modes", f"{kname}_cta"), mode=make_mode(0, "cta"),
                             warmup=False)
            SUMMARY["modes"][f"cta_{kname}"] = {"bytes": os.path.getsize(p), "scopes": tree_scopes(p)}
        except Exception as e:  # noqa: BLE001
            SUMMARY["modes"][f"cta_{kname}"] = {"error": f"{type(e).__name__}: {e}"}
    case = SUITE["layer_norm"]
    inputs = case.make_inputs("llm", "cuda", seed=1)
    for label, mode in [("cta", make_mode(0, "cta")), ("clock32", make_mode(0, "warp", True, False)),
                        ("time_shift", make_mode(0, "warp", False, True)),
                        ("buf1024_obj", make_mode(1024, "warp", False, False, as_object=True))]:
        try:
            p = profile_case(case, inputs, os.path.join(OUTDIR, "modes", f"layer_norm_{label}"), mode=mode,
                             warmup=False)
            SUMMARY["modes"][label] = {"mode": str(mode), "bytes": os.path.getsize(p), "scopes": tree_scopes(p)}
        except Exception as e:  # noqa: BLE001
            SUMMARY["modes"][label] = {"mode": str(mode), "error": f"{type(e).__name__}: {e}"}
    try:
        pm = SUITE["persistent_matmul"]
        pin = {"a": torch.randn(2048, 2048, device="cuda").half(), "b": torch.randn(2048, 2048, device="cuda").half()}
        p = profile_case(pm, pin, os.path.join(OUTDIR, "trace", "persistent_matmul"), data="trace", warmup=False)
        SUMMARY["modes"]["trace"] = {"file": p, "bytes": os.path.getsize(p)}
        with open(p) as f:
            head = f.read(3000)
        SUMMARY["modes"]["trace"]["head"] = head[:600]
    except Exception as e:  # noqa: BLE001
        SUMMARY["modes"]["trace"] = {"error": f"{type(e).__name__}: {e}"}
    del inputs
    save()
    print("modes", json.dumps(SUMMARY["modes"], default=str)[:2000], flush=True)

# ------------------------------------------------------------------ device times (CUPTI via torch.profiler)
def device_us(fn, reps, match):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    ts = []
    ok = match if callable(match) else (lambda n: match in n)
    for e in prof.events():
        if ok(e.name):
            t = getattr(e, "device_time", None)
            ts.append(t if t is not None else e.cuda_time)
    ts = sorted(t for t in ts if t and t > 0)
    return (ts[len(ts) // 2] if ts else None), len(ts)


def kernel_names(name):
    import importlib
    mod = importlib.import_module(f"kernels.suite.{name}")
    return [v.__name__ for v in vars(mod).values() if isinstance(v, triton.runtime.JITFunction)]


if "cupti" in SECTIONS:
    import triton.profiler as proton
    import triton.profiler.language as pl
    pl.enable_semantic("triton")
    for name in ORDER:
        if left() < 70:
            SUMMARY["errors"].append(f"cupti skipped {name}: time budget")
            continue
        r = SUMMARY["cupti"][name] = {}
        try:
            case = SUITE[name]
            kname = kernel_names(name)[0]
            inputs = case.make_inputs("llm", "cuda", seed=0)
            r["kernel"] = kname
            r["us_plain"], r["n_plain"] = device_us(lambda: case.run(inputs), 10, kname)
            proton.start(os.path.join(OUTDIR, "cupti", name), backend="instrumentation")
            try:
                case.run(inputs, instrument=True)
                torch.cuda.synchronize()
                r["us_instr"], r["n_instr"] = device_us(lambda: case.run(inputs, instrument=True), 3, kname)
            finally:
                proton.finalize()
            if r["us_plain"] and r["us_instr"]:
                r["overhead"] = r["us_instr"] / r["us_plain"]
            del inputs
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {e}"
            r["trace"] = traceback.format_exc()[-1200:]
        torch.cuda.empty_cache()
        save()
        print("cupti", name, r, flush=True)

# ------------------------------------------------------------------ native
nat = SUMMARY["native"]
try:
    if "native" not in SECTIONS:
        raise SystemExit
    out_b, _ = build_proc.communicate(timeout=max(10, left() - 30))
    nat["build_rc"] = build_proc.returncode
    nat["build_log_tail"] = out_b[-1500:]
    from native import native_kernels as nk
    from native import decode as D
    mod_t = time.time()
    nk.run("calibrate", nk.make_inputs("calibrate", "llm", "cuda"))  # loads the built module
    nat["load_s"] = time.time() - mod_t
    info = {"CUDA": {"0": {"clock_rate": props.clock_rate if hasattr(props, "clock_rate") else 1980000,
                           "memory_clock_rate": 3201000, "bus_width": 6144, "arch": "90",
                           "num_sms": props.multi_processor_count}}}
    # calibration
    cal = nat["calibrate"] = {}
    for spin in (100_000, 1_000_000, 10_000_000):
        cin = {"spin_cycles": spin, "blocks": 2 * props.multi_processor_count, "threads": 128}
        _, raw = nk.run("calibrate", cin, instrument=True, buffer_records=4)
        p = D.decode(raw, nk.SCOPES["calibrate"], "native_calibrate")
        t = p.scope_totals()["spin"]
        ev = time_ms(lambda: nk.run("calibrate", cin), reps=3)
        ns = p.ns_per_unit()
        cal[str(spin)] = {"decoded_mean_cycles": t["normalized_cycles"], "spans": t["count"],
                          "error_pct": 100 * (t["normalized_cycles"] - spin) / spin,
                          "ns_per_cycle_from_headers": ns, "spin_ns_decoded": t["normalized_cycles"] * ns,
                          "kernel_span_ns_globaltimer": p.kernel_span_ns(), "event_ms_plain": ev,
                          "dropped": p.dropped, "unmatched": p.unmatched}
    # CUPTI duration of the calibration kernel
    try:
        import triton.profiler as proton
        cin = {"spin_cycles": 1_000_000, "blocks": 2 * props.multi_processor_count, "threads": 128}
        stem = os.path.join(OUTDIR, "native", "cal_cupti")
        os.makedirs(os.path.dirname(stem), exist_ok=True)
        proton.start(stem, backend="cupti")
        nk.run("calibrate", cin)
        torch.cuda.synchronize()
        proton.finalize()
        with open(glob.glob(stem + "*")[0]) as f:
            d = json.load(f)
        found = []

        def walk(n):
            m = n.get("metrics", {})
            if any(k.startswith("time") for k in m) and n["frame"]["name"] != "ROOT":
                found.append((n["frame"]["name"], {k: v for k, v in m.items() if k.startswith("time")}))
            for c in n.get("children", []):
                walk(c)
        walk(d[0])
        cal["cupti"] = found
    except Exception as e:  # noqa: BLE001
        cal["cupti"] = f"{type(e).__name__}: {e}"
    save()
    # kernels
    for name, caps in (("softmax", 8), ("layer_norm", 8), ("matmul", 1100)):
        r = nat[name] = {}
        try:
            inputs = nk.make_inputs(name, "llm", "cuda", seed=0)
            out, _ = nk.run(name, inputs)
            ok, err = nk.suite_case(name).check(inputs, out)
            out_i, raw = nk.run(name, inputs, instrument=True, buffer_records=caps)
            ok_i, err_i = nk.suite_case(name).check(inputs, out_i)
            r.update(ok_plain=ok, err_plain=err, ok_instr=ok_i, err_instr=err_i)
            words = nk.buffer_words(name, inputs, caps)[0]
            buf = torch.zeros(words, dtype=torch.int32, device="cuda")
            plain = lambda: nk.run(name, inputs)  # noqa: E731
            instr = lambda: nk.run(name, inputs, instrument=True, buffer_records=caps, buffer=buf,  # noqa: E731
                                   host=False, clear=False)
            mp, mi = [], []
            for _ in range(3):  # interleaved
                mp.append(time_ms(plain, reps=20))
                mi.append(time_ms(instr, reps=20))
            r["ms_plain"], r["ms_instr"] = sorted(mp)[1], sorted(mi)[1]
            r["overhead"] = r["ms_instr"] / r["ms_plain"]
            kn = {"matmul": "matmul_kernel", "softmax": "softmax_kernel", "layer_norm": "layer_norm_kernel"}[name]
            try:
                up, _ = device_us(plain, 20, lambda n: kn in n and ("ILb0" in n or "<false" in n))
                ui, _ = device_us(instr, 20, lambda n: kn in n and ("ILb1" in n or "<true" in n))
                r.update(us_plain_cupti=up, us_instr_cupti=ui, overhead_cupti=(ui / up if up and ui else None))
            except Exception as e:  # noqa: BLE001
                r["cupti_error"] = str(e)
            td = time.time()
            p = D.decode(raw, nk.SCOPES[name], nk.KERNEL_NAMES[name])
            r["decode_s"] = time.time() - td
            r.update(dropped=p.dropped, unmatched=p.unmatched, missing_blocks=p.missing_blocks, records=p.records,
                     kernel_span_ns=p.kernel_span_ns(), ns_per_cycle=p.ns_per_unit(), scopes=p.scope_totals())
            tp = p.write_tree(os.path.join(OUTDIR, "native", f"native_{name}.json"), info)
            p.write_trace(os.path.join(OUTDIR, "native", f"native_{name}_trace.json"), max_blocks=8)
            if name == "matmul":
                v = subprocess.run(["proton-viewer", "-m", "normalized_cycles", tp], capture_output=True, text=True,
                                   timeout=60)
                r["proton_viewer_rc"] = v.returncode
                r["proton_viewer_out"] = (v.stdout + v.stderr)[-1500:]
            del inputs, out, out_i, raw, buf
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {e}"
            r["trace"] = traceback.format_exc()[-1500:]
        torch.cuda.empty_cache()
        save()
        print("native", name, {k: v for k, v in r.items() if k not in ("scopes",)}, flush=True)
except SystemExit:
    build_proc.kill()
except Exception as e:  # noqa: BLE001
    nat["error"] = f"{type(e).__name__}: {e}"
    nat["trace"] = traceback.format_exc()[-2000:]
save()
# one Triton tree through proton-viewer as well
try:
    trees = sorted(glob.glob(os.path.join(OUTDIR, "proton", "layer_norm*.hatchet")))
    if trees:
        v = subprocess.run(["proton-viewer", "-m", "normalized_cycles", trees[0]], capture_output=True, text=True,
                           timeout=60)
        SUMMARY["proton_viewer_triton"] = (v.stdout + v.stderr)[-1200:]
except Exception as e:  # noqa: BLE001
    SUMMARY["proton_viewer_triton"] = str(e)
save()
print("summary", json.dumps({k: v for k, v in SUMMARY.items() if k != "suite"}, default=str)[:6000])
print("done in", time.time() - T0)
