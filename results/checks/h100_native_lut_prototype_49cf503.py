"""Prototype (not part of the package): u1 weights at M = 1 through a lookup table of partial sums of x.

For each quad of k (4 consecutive k) the table holds the 16 sums of subsets of x over the quad (f32, in shared
memory); a lane owns one output column and adds T[quad][nibble] for every nibble of its column's code words:
a shift, a mask, a shared load and an add per 4 weights, against a LOP3 + HFMA2 per pair and the mma work of the
tensor-core path. Checked against float64, then timed beside native's chosen decode kernel in one process.
"""
import sys
import torch
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <c10/cuda/CUDAStream.h>

template <int KS>
__global__ void __launch_bounds__(256) lut_u1(const __half* __restrict__ x, const uint4* __restrict__ words,
        const __half* __restrict__ s, const __half* __restrict__ z, float* __restrict__ ws,
        unsigned* __restrict__ cnt, __half* __restrict__ y, int K, int N) {
    constexpr int Q = KS / 4, G = KS / 128;
    extern __shared__ float T[];                // [Q][16]
    __shared__ float xs[G];
    const int split = blockIdx.y, k0 = split * KS, tid = threadIdx.x;
    const int n = blockIdx.x * 256 + tid;
    const int nn = n < N ? n : N - 1;           // loads before the table is built: in flight meanwhile
    const int g0 = k0 / 128;
    uint4 w[G];
    float sc[G], zz[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        w[g] = __ldg(words + (size_t)(g0 + g) * N + nn);
        sc[g] = __half2float(s[(size_t)(g0 + g) * N + nn]);
        zz[g] = __half2float(z[(size_t)(g0 + g) * N + nn]);
    }
    for (int t = tid; t < Q; t += 256) {
        const __half2* xp = reinterpret_cast<const __half2*>(x + k0 + 4 * t);
        float2 a = __half22float2(xp[0]), b = __half22float2(xp[1]);
        float e[16];
        e[0] = 0.f; e[1] = a.x; e[2] = a.y; e[3] = a.x + a.y;
#pragma unroll
        for (int i = 0; i < 4; i++) { e[4 + i] = e[i] + b.x; }
#pragma unroll
        for (int i = 0; i < 8; i++) { e[8 + i] = e[i] + b.y; }
        float4* d = reinterpret_cast<float4*>(T + 16 * t);
#pragma unroll
        for (int i = 0; i < 4; i++) d[i] = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
        float g = e[15];                        // a warp of 32 quads = one group of 128 k
#pragma unroll
        for (int o = 16; o; o >>= 1) g += __shfl_xor_sync(0xffffffff, g, o);
        if ((t & 31) == 0) xs[t >> 5] = g;
    }
    __syncthreads();
    float acc = 0.f;
    if (n < N) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float* Tg = T + g * 32 * 16;
            float a0 = 0.f, a1 = 0.f;
            unsigned v[4] = {w[g].x, w[g].y, w[g].z, w[g].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float t = Tg[(i * 8 + j) * 16 + ((v[i] >> (4 * j)) & 15u)];
                    if (j & 1) a1 += t; else a0 += t;
                }
            }
            acc = fmaf(sc[g], (a0 + a1) - zz[g] * xs[g], acc);
        }
    }
    if (gridDim.y == 1) { if (n < N) y[n] = __float2half(acc); return; }
    if (n < N) atomicAdd(ws + n, acc);
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (tid == 0) last = atomicAdd(cnt + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (last) {
        __threadfence();
        if (n < N) y[n] = __float2half(atomicExch(ws + n, 0.f));
        if (tid == 0) cnt[blockIdx.x] = 0;
    }
}

void run(torch::Tensor x, torch::Tensor words, torch::Tensor s, torch::Tensor z, torch::Tensor ws,
         torch::Tensor cnt, torch::Tensor y, int64_t KS) {
    int K = x.numel(), N = y.numel();
    dim3 grid((N + 255) / 256, K / KS);
    auto st = c10::cuda::getCurrentCUDAStream();
#define L(ks) { auto f = lut_u1<ks>; int sm = ks * 16; \
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, sm); \
    f<<<grid, 256, sm, st>>>((const __half*)x.data_ptr(), (const uint4*)words.data_ptr(), \
        (const __half*)s.data_ptr(), (const __half*)z.data_ptr(), ws.data_ptr<float>(), \
        (unsigned*)cnt.data_ptr(), (__half*)y.data_ptr(), K, N); }
    if (KS == 512) L(512) else if (KS == 1024) L(1024) else if (KS == 2048) L(2048) else TORCH_CHECK(false, "KS");
}
"""
CPP = "void run(torch::Tensor x, torch::Tensor words, torch::Tensor s, torch::Tensor z, torch::Tensor ws, torch::Tensor cnt, torch::Tensor y, int64_t KS);"


def pack_lut(codes):
    """int32 codes [K, N] in {0, 1} -> int32 [K/128, N, 4]: word i of (group g, column n) holds k = 128 g + 32 i + j
    at bit j."""
    K, N = codes.shape
    c = codes.to(torch.int64).reshape(K // 128, 4, 32, N)
    sh = torch.arange(32, device=codes.device, dtype=torch.int64).view(1, 1, 32, 1)
    w = (c << sh).sum(2)                                  # [G, 4, N]
    w = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
    return w.permute(0, 2, 1).contiguous()


def main():
    from harness.timing import Timer
    from kernels.lowbit.formats import random_quantized, dequantize_ref
    from native import lowbit
    mod = load_inline("lut_proto", CPP, cuda_sources=CUDA, functions=["run"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas=-v"], verbose=False)
    timer = Timer(samples=50)
    shapes = [(8192, 57344), (28672, 8192), (8192, 8192)]
    for K, N in shapes:
        qw = random_quantized(K, N, "u1", 128, torch.float16, seed=K + N, device="cuda")
        x = torch.randn(1, K, dtype=torch.float16, device="cuda")
        ref = (x.double() @ dequantize_ref(qw, device="cuda")).squeeze(0)
        words = pack_lut(qw.codes())
        s, z = qw.scales.contiguous(), qw.zeros.contiguous()
        ws = torch.zeros(N, dtype=torch.float32, device="cuda")
        cnt = torch.zeros((N + 255) // 256, dtype=torch.int32, device="cuda")
        y = torch.empty(N, dtype=torch.float16, device="cuda")
        nat = lowbit.prepare(qw, torch.float16, M=1)
        yn = nat(x)
        err_n = ((yn.double().squeeze(0) - ref).norm() / ref.norm()).item()
        fns = {"native": lambda: nat(x)}
        for KS in (512, 1024, 2048):
            if K % KS:
                continue
            y.fill_(float("nan"))
            mod.run(x, words, s, z, ws, cnt, y, KS)
            mod.run(x, words, s, z, ws, cnt, y, KS)     # twice: the workspace must come back zeroed
            err = ((y.double() - ref).norm() / ref.norm()).item()
            ok = err < 2e-3 and bool(torch.isfinite(y).all())
            print(f"K={K} N={N} KS={KS} err {err:.2e} (native {err_n:.2e}) {'ok' if ok else 'FAIL'}", flush=True)
            if ok:
                fns[f"lut{KS}"] = (lambda KS=KS: mod.run(x, words, s, z, ws, cnt, y, KS))
        bytes_ = qw.nbytes
        res = {k: [] for k in fns}
        for _ in range(2):                               # alternate, twice
            for k, f in fns.items():
                res[k].append(timer(f))
        for k, ts in res.items():
            med = [t.median_ms * 1e3 for t in ts]
            sp = [f"{t.p10_ms*1e3:.1f}-{t.p90_ms*1e3:.1f}" for t in ts]
            print(f"  {k:8s} us {med[0]:.1f} / {med[1]:.1f} (p10-p90 {sp[0]} / {sp[1]})  "
                  f"{bytes_ / (min(med) * 1e-6) / 1e12:.2f} TB/s on {bytes_/1e6:.1f} MB", flush=True)
        print("  native:", nat.chosen_config(1), flush=True)
        del qw, words, nat
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
