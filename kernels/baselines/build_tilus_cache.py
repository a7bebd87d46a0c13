"""Build the Tilus compiled-kernel cache on a machine without a GPU.

    python -m kernels.baselines.build_tilus_cache --out build/tilus_cache [--only fig9,fig13] [--tar build/tilus_cache.tgz]

On the GPU machine, point tilus at the result (``TILUS_CACHE_DIR=<dir>``, which
``tilus_baseline._import_tilus`` passes on) and ``prepare_tilus`` only transpiles (Python),
finds every candidate's ``programs/<hash>/module/lib.so`` and loads it; no nvcc runs.

How the tilus 0.2.0 cache works (tilus/drivers.py, tilus/lang/instantiated_script.py):

* ``<cache>/programs/<h>/``: one compiled candidate; ``h = sha256(str(options) + str(program))[:12]``
  where options include the *target* (the GPU machine auto-detects ``sm90a`` on an H200, so we
  build for ``nvgpu_sm90a``, not ``sm90``) and the program text holds the schedule, dtypes, group
  size and the constant arguments (N, K). M is *not* in it.
* ``<cache>/scripts/<script>/<N>-<K>-<divisibility of M>-<hash>/``: per jit key; the M divisibility
  is always 1 in tilus 0.2.0, so one set of candidates serves every M. ``dispatch_table.pickle``
  (M bucket -> candidate) is filled on the GPU by benchmarking the loaded candidates once per M
  bucket (no compiling), so large M (Fig. 13) needs no other kernels.

Building here: ``compile_source`` refuses without CUDA (patched off for this process); nvcc links
``-lcuda`` although nothing uses the driver API (lib.so has no NEEDED libcuda), so an empty
``libcuda.so`` stub made here satisfies the linker; host code is built with ``-march=x86-64-v2``
instead of ``native`` (the GPU host's CPU may differ; the flag is not part of the cache key).
"""
import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

K_N_FIG9 = [(8192, 8192), (8192, 57344), (28672, 8192)]
FMTS_FIG9 = ["u8", "f6e3m2", "u4", "u2", "u1", "i4"]
FMTS_FIG10 = ([f"u{b}" for b in range(1, 9)] + [f"i{b}" for b in range(2, 9)]
              + ["f3e1m1", "f4e2m1", "f5e2m2", "f5e3m1", "f6e2m3", "f6e3m2", "f7e3m3", "f7e4m2", "f8e4m3"])


def points(only=("fig9", "fig13", "fig10")):
    """(fmt, group, act, K, N) in priority order, without duplicates."""
    from kernels.baselines.tilus_baseline import supports

    out = []
    for fig in only:
        if fig == "fig9":
            for K, N in K_N_FIG9:
                for f in FMTS_FIG9:
                    out.append((f, -1 if f.startswith("f") else 128, "f16", K, N))
        elif fig == "fig13":
            out += [("u4", 128, "f16", 8192, 57344), ("f6e3m2", -1, "f16", 8192, 57344)]
        elif fig == "fig10":
            out += [(f, -1, "f16", 8192, 57344) for f in FMTS_FIG10]
        else:
            raise ValueError(fig)
    seen, res = set(), []
    for p in out:
        if p not in seen and supports(p[0], p[1], p[2]) is None:
            seen.add(p)
            res.append(p)
    return res


def _setup(out, stub_dir, march):
    os.environ["TILUS_CACHE_DIR"] = str(out)
    import tilus
    import tilus.hidet.backend.build as hb
    from tilus.target import nvgpu_sm90a, set_current_target

    tilus.option.cache_dir(str(out))
    set_current_target(nvgpu_sm90a)

    class _Torch:  # compile_source only asks torch whether CUDA is available
        class cuda:
            @staticmethod
            def is_available():
                return True

    hb.torch = _Torch
    stub_dir.mkdir(parents=True, exist_ok=True)
    stub = stub_dir / "libcuda.so"
    if not stub.exists():
        subprocess.run(["gcc", "-shared", "-o", str(stub), "-Wl,-soname,libcuda.so.1", "-x", "c", "/dev/null"],
                       check=True)
    orig = hb.NVCC.run_compile_command

    def run_compile_command(self, command, src_path, out_lib_path, keep_files):
        command = command.replace("-march=native", f"-march={march}").replace(" -lcuda ", f" -L{stub_dir} -lcuda ")
        return orig(self, command, src_path, out_lib_path, keep_files)

    hb.NVCC.run_compile_command = run_compile_command
    return tilus


def candidate_programs(fmt_name, group_size, act, K, N):
    """[(name, Program, BuildOptions, jit_instance)] for the repack kernel and every matmul candidate."""
    import tilus
    from kernels.baselines import tilus_kernel as tk
    from kernels.baselines.tilus_baseline import tilus_dtype
    from kernels.lowbit.formats import parse_format

    fmt = parse_format(fmt_name)
    a_t = tilus.float16 if act == "f16" else tilus.bfloat16
    w_t = tilus_dtype(fmt)
    group = K if group_size == -1 else group_size
    rp = tk.TilusWeightRepack(a_t, w_t)._jit_instance_for(K, N, 0, 0)
    mm = tk.TilusWeightOnlyMatmul(group, a_t, w_t, fmt.kind == "uint")._jit_instance_for(1, N, K, 0, 0, 0, 0, 0)
    jobs = [("repack", p, rp.build_options) for p in rp.transpiled_programs]
    jobs += [(f"mm{s}", p, mm.build_options) for s, p in zip(mm.transpiled_schedules, mm.transpiled_programs)]
    return jobs, mm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/tilus_cache")
    ap.add_argument("--only", default="fig9,fig13,fig10", help="comma list of fig9, fig13, fig10 (priority order)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N points (for timing)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--march", default="x86-64-v2")
    ap.add_argument("--tar", default="", help="write a .tgz of the cache (top folder 'tilus_cache')")
    args = ap.parse_args(argv)

    out = Path(args.out).resolve()
    tilus = _setup(out, out.parent / "cuda_stub", args.march)
    tilus.option.parallel_workers(args.workers)
    from tilus.drivers import get_cache_dir
    from tilus.lang.instantiated_script import JitInstance
    from tilus.runtime.compiled_program import compiled_program_exists
    from tilus.utils.multiprocess import parallel_imap

    pts = points(tuple(args.only.split(",")))
    if args.limit:
        pts = pts[:args.limit]
    t0 = time.time()
    jobs, owners, n_failed_sched, queued = [], {}, 0, set()
    for p in pts:
        js, mm = candidate_programs(*p)
        n_failed_sched += len(mm.failed_scheduling)
        for name, prog, opts in js:
            d = get_cache_dir(prog, opts)
            owners.setdefault(d, []).append((p, name))
            if d not in queued and not compiled_program_exists(d):
                queued.add(d)
                jobs.append((prog, opts))
        print(f"transpiled {p}: {len(js)} programs ({len(mm.failed_scheduling)} schedules failed)", flush=True)
    t1 = time.time()
    print(f"{len(pts)} points, {len(owners)} programs, {len(jobs)} to compile; transpile {t1 - t0:.0f}s", flush=True)
    failed = []
    for i, res in enumerate(parallel_imap(JitInstance._build_program, jobs, num_workers=args.workers)):
        d = get_cache_dir(jobs[i][0], jobs[i][1])
        if res != "success":
            failed.append((d, res))
            print(f"FAILED {d}: {owners[d]}\n{res[-2000:]}", flush=True)
        if (i + 1) % 10 == 0 or i + 1 == len(jobs):
            print(f"compiled {i + 1}/{len(jobs)}  {time.time() - t1:.0f}s", flush=True)
    t2 = time.time()
    ok = [p for p in pts if all(compiled_program_exists(d) for d, o in owners.items() if any(q == p for q, _ in o))]
    print(f"done: compile {t2 - t1:.0f}s, total {t2 - t0:.0f}s; {len(ok)}/{len(pts)} points complete, "
          f"{len(failed)} build failures, {n_failed_sched} scheduling failures", flush=True)
    with open(out / "POINTS.txt", "w") as f:
        for p in pts:
            f.write(f"{'ok' if p in ok else 'INCOMPLETE'} {p}\n")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as t:
            t.add(str(out), arcname="tilus_cache")
        print("wrote", args.tar, f"{os.path.getsize(args.tar) / 2**20:.1f} MiB", flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
