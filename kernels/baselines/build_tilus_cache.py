"""Build the Tilus compiled-kernel cache on a machine without a GPU.

    python -m harness.tilus_cache --out build/tilus_cache [--experiments tilus_fig10,tilus_fig14] [--tar build/tilus_cache.tgz]

(`harness.tilus_cache` lists the (format, group, activation, K, N) points of the experiments'
sweeps; this module builds the Tilus kernels of given points and knows nothing of them.)

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
  bucket (no compiling), so large M (prefill) needs no other kernels.

Building here: ``compile_source`` refuses without CUDA (patched off for this process); nvcc links
``-lcuda`` although nothing uses the driver API (lib.so has no NEEDED libcuda), so an empty
``libcuda.so`` stub made here satisfies the linker; host code is built with ``-march=x86-64-v2``
instead of ``native`` (the GPU host's CPU may differ; the flag is not part of the cache key).
"""
import os
import subprocess
import tarfile
import time
from pathlib import Path

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
    """[(name, Program, BuildOptions)] for the repack and dequantize (prefill) kernels and every
    matmul candidate, and the matmul's jit instance."""
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
    dq = tk.TilusWeightDequant(group, a_t, w_t, fmt.kind == "uint")._jit_instance_for(K, N, 0, 0, 0, 0)
    jobs = [("repack", p, rp.build_options) for p in rp.transpiled_programs]
    jobs += [("dequant", p, dq.build_options) for p in dq.transpiled_programs]
    jobs += [(f"mm{s}", p, mm.build_options) for s, p in zip(mm.transpiled_schedules, mm.transpiled_programs)]
    return jobs, mm


def build(pts, out="build/tilus_cache", workers=None, march="x86-64-v2", tar=""):
    """Compile every Tilus program of the points [(fmt, group, act, K, N)] into the cache at `out`
    (target sm90a, no GPU); optionally write a .tgz of it (top folder 'tilus_cache').
    Returns 0 when every program built, 1 otherwise."""
    workers = workers or os.cpu_count()
    out = Path(out).resolve()
    tilus = _setup(out, out.parent / "cuda_stub", march)
    tilus.option.parallel_workers(workers)
    from tilus.drivers import get_cache_dir
    from tilus.lang.instantiated_script import JitInstance
    from tilus.runtime.compiled_program import compiled_program_exists
    from tilus.utils.multiprocess import parallel_imap

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
    for i, res in enumerate(parallel_imap(JitInstance._build_program, jobs, num_workers=workers)):
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
    if tar:
        with tarfile.open(tar, "w:gz") as t:
            t.add(str(out), arcname="tilus_cache")
        print("wrote", tar, f"{os.path.getsize(tar) / 2**20:.1f} MiB", flush=True)
    return 0 if not failed else 1


