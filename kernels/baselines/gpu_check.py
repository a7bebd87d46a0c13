"""Dev check of every baseline on the GPU: correctness vs float64, then timing.

    python -m kernels.baselines.gpu_check            # K=8192, N=57344, M=1,16

Correctness: fresh random quantized weights and activations; the output columns
``cols`` are compared with x(float64) @ dequantize_ref(W[:, cols]) (the reference
runs on the CPU, so a column slice keeps it fast). Timing: triton.testing.do_bench
median (it flushes L2 between runs). Dev tool only: the harness does the real timing.
"""
import os
import sys
import time
import traceback

import torch

from kernels import Unavailable, Unsupported
from kernels.baselines import BASELINES
from kernels.lowbit.formats import QuantizedWeight, codes_of, dequantize_ref, pack_bits, random_quantized

K, N = 8192, 57344
MS = (1, 16)
CASES = [  # (baseline, fmt, group, act)
    ("torch_int4", "i4", 128, "bf16"),
    ("torch_int4", "u4", 128, "bf16"),
    ("fp8", "f8e4m3", -1, "bf16"),
    ("fp8", "f8e5m2", -1, "f16"),
    ("tilus", "i4", 128, "f16"),
    ("tilus", "i8", 128, "f16"),
    ("tilus", "f6e3m2", 128, "f16"),
    ("tilus", "u4", 128, "f16"),
    ("gemlite", "u4", 128, "f16"),
    ("gemlite", "i4", 128, "f16"),
    ("gemlite", "i8", 128, "f16"),
    ("marlin", "i4", 128, "f16"),
    ("bitblas", "i4", 128, "f16"),
    ("quantllm", "f6e3m2", -1, "f16"),
]
ACT = {"f16": torch.float16, "bf16": torch.bfloat16}


def sub_weight(qw, cols):
    """The same quantized weight restricted to columns ``cols``, on the CPU."""
    q = codes_of(qw)[:, cols].cpu()
    return QuantizedWeight(pack_bits(q, qw.fmt.bits), qw.scales[:, cols].cpu(),
                           None if qw.zeros is None else qw.zeros[:, cols].cpu(),
                           qw.fmt, qw.K, len(cols), qw.group_size, qw.act_dtype)


def bench(fn):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(argv):
    only = set(argv[1:])
    dev = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    cols = torch.cat([torch.arange(0, 256), torch.arange(N - 256, N)]).to(dev)
    rows = []
    # cuBLAS f16 for scale
    w16 = torch.randn(K, N, device=dev, dtype=torch.float16)
    for M in MS:
        x = torch.randn(M, K, device=dev, dtype=torch.float16)
        rows.append(("cublas", "f16", "-", "f16", M, "ok", "-", bench(lambda: x @ w16), ""))
        print(rows[-1], flush=True)
    del w16
    for seed, (name, fmt, g, act) in enumerate(CASES):
        if only and name not in only:
            continue
        b = BASELINES[name]
        t0 = time.time()
        try:
            qw = random_quantized(K, N, fmt, g, ACT[act], seed=seed, device=dev)
            fn = b.prepare(qw, ACT[act])
        except (Unsupported, Unavailable) as e:
            rows.append((name, fmt, g, act, "-", type(e).__name__.lower(), "-", float("nan"), str(e)[:160]))
            print(rows[-1], flush=True)
            continue
        except Exception as e:
            traceback.print_exc()
            rows.append((name, fmt, g, act, "-", "error", "-", float("nan"), f"{type(e).__name__}: {e}"[:160]))
            print(rows[-1], flush=True)
            continue
        prep_s = time.time() - t0
        wsub = dequantize_ref(sub_weight(qw, cols))
        for M in MS:
            x = torch.randn(M, K, device=dev, dtype=ACT[act])
            try:
                y = fn(x)
                torch.cuda.synchronize()
                ref = x.double().cpu() @ wsub
                err = ((y[:, cols].double().cpu() - ref).norm() / ref.norm()).item()
                status = "ok" if err <= b.tolerance else "numerics_fail"
                ms = bench(lambda: fn(x)) if status == "ok" else float("nan")
                cfg = getattr(fn, "chosen_config", lambda m: None)(M)
                rows.append((name, fmt, g, act, M, status, f"{err:.2e}", ms, f"prep {prep_s:.0f}s {cfg or ''}"))
            except Exception as e:
                traceback.print_exc()
                rows.append((name, fmt, g, act, M, "error", "-", float("nan"), f"{type(e).__name__}: {e}"[:160]))
            print(rows[-1], flush=True)
        _write(rows)
        del fn, qw
        torch.cuda.empty_cache()
    print()
    print(_write(rows))


def _write(rows):
    hdr = ("impl", "fmt", "g", "act", "M", "status", "rel_err", "ms", "note")
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        r = list(r)
        r[7] = "-" if r[7] != r[7] else f"{r[7]:.4f}"
        lines.append("| " + " | ".join(str(v) for v in r) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_check.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv)
