"""Our weight-only low-precision matmul kernel in Tilus 0.2.0 (written in the Tilus language
by this project after the paper's design; it is not the paper's Tilus, whose kernels are not
published as a package).

Design (after the Tilus paper, ASPLOS 2026):

* weights are a dense bit stream of any width 1..8 (uN, iN, eXmY); in ``prepare`` a
  small Tilus kernel (``TilusWeightRepack``) rewrites that stream, tile by tile, into
  the order in which the threads of one warp hold a 16x16 tile as the B operand of
  ``mma.m16n8k16`` -- each thread's bits are contiguous, so the matmul loads whole
  bytes from shared memory and *views* them as the low-precision type in registers;
* the matmul (``TilusWeightOnlyMatmul``) streams A, the repacked weights, the scales
  (and zero points for uN) through a multi-stage ``cp.async`` pipeline, dequantizes in
  registers (cast to f16/bf16, ``(q - z) * s`` or ``q * s``), and accumulates with
  tensor-core mma in f32;
* split-K over ``blockIdx.z``; partial results are added in order under a semaphore;
* prefill (M > ``PREFILL_M``): as the Tilus artifact's runner does for m > 256, a Tilus kernel
  (``TilusWeightDequant``) writes the dequantized weight [K, N] in the activation dtype and
  ``torch.matmul`` (cuBLAS) multiplies.

The tuning space is small and recorded (``TUNING_SPACE``); Tilus benchmarks every
candidate once per (shape, M bucket) and caches the choice under its cache dir.

Importing this module needs tilus (and cuda-bindings); building and running the
kernels needs nvcc and an NVIDIA GPU (sm80+).
"""

import tilus
from tilus import Script, float16, bfloat16, float32, int32, uint8, void_p
from tilus.ir.layout.ops import concat, local, reduce, spatial
from tilus.ir.layout.ops import shared_row_major
from tilus.utils import cdiv, gcd

WEIGHT_TILE = (16, 16)  # (k, n) of the tile one warp repacks / dequantizes at once

# (warp_spatial, warp_repeat, num_stages, split_k); block = (16*wsm*wrm, 8*wsn*wrn, 16*wrk)
TUNING_SPACE = [
    [[1, 4], [1, 8, 2], 4, 8],   # 16 x 256 x 32, decode
    [[1, 4], [1, 8, 1], 4, 16],  # 16 x 256 x 16, decode, deeper split
    [[1, 8], [1, 8, 1], 3, 8],   # 16 x 512 x 16, decode, 8 warps
    [[1, 4], [1, 4, 2], 4, 4],   # 16 x 128 x 32, decode, more column blocks
    [[2, 4], [2, 4, 2], 3, 1],   # 64 x 128 x 32, mid M
    [[2, 4], [4, 4, 2], 3, 1],   # 128 x 128 x 32, prefill
]


PREFILL_M = 256                 # M above this: dequantize + cuBLAS (the Tilus artifact's threshold)
DEQUANT_TILE = (32, 128)        # (k, n) of the tile one block of 4 warps dequantizes


def _mma_for(a_dtype):
    from tilus.lang.modules.cuda import cuda

    if a_dtype == float16:
        return cuda.atomic_mma_configs.m16n8k16_f16_f32
    if a_dtype == bfloat16:
        return cuda.atomic_mma_configs.m16n8k16_bf16_f32
    raise ValueError("activations must be float16 or bfloat16, got {}".format(a_dtype))


def tile_layouts(a_dtype, w_dtype):
    """Register layout of one weight tile in a warp, and the same bits viewed as bytes."""
    mma = _mma_for(a_dtype)
    tk, tn = WEIGHT_TILE
    tile_layout = local(tk // mma.k, tn // mma.n) * mma.lb
    bits = tile_layout.local_size * w_dtype.nbits
    if bits % 8:
        raise ValueError("a thread's share of a tile is not whole bytes for {}".format(w_dtype))
    nbytes = bits // 8
    inner = gcd(nbytes, 16)
    byte_layout = local(nbytes // inner).spatial(32).local(inner)
    return tile_layout, byte_layout


class TilusWeightRepack(Script):
    """dense [K, N] stream of ``w_dtype`` -> [K/16, N/16, tile_bytes] in register order."""

    def __init__(self, a_dtype, w_dtype):
        super().__init__()
        self.w_dtype = w_dtype
        self.tile_layout, self.byte_layout = tile_layouts(a_dtype, w_dtype)

    def __call__(self, k_size: int, n_size: int, src_ptr: void_p, dst_ptr: void_p):
        tk, tn = WEIGHT_TILE
        self.attrs.warps = 1
        self.attrs.blocks = [k_size // tk, n_size // tn]
        src = self.global_view(src_ptr, dtype=self.w_dtype, shape=[k_size, n_size])
        dst = self.global_view(dst_ptr, dtype=uint8, shape=[k_size // tk, n_size // tn, self.byte_layout.shape[0]])
        w = self.load_global(src, offsets=[self.blockIdx.x * tk, self.blockIdx.y * tn], shape=[tk, tn])
        self.annotate_layout(w, self.tile_layout)
        w_bytes = self.view(w, layout=self.byte_layout, dtype=uint8)
        self.store_global(dst, w_bytes, offsets=[self.blockIdx.x, self.blockIdx.y, 0], dims=[2])


class TilusWeightDequant(Script):
    """dense [K, N] stream of ``w_dtype`` (+ scales, zero points) -> W[K, N] in the activation dtype."""

    def __init__(self, group_size, a_dtype, w_dtype, has_zeros):
        super().__init__()
        self.group_size = group_size
        self.a_dtype = a_dtype
        self.w_dtype = w_dtype
        self.has_zeros = has_zeros
        tk, tn = DEQUANT_TILE
        # 8 x 16 threads, each holds 4 rows of 8 consecutive columns: whole bytes for every width,
        # 16-byte stores of the f16/bf16 result
        self.layout = spatial(8, 16).local(tk // 8, tn // 16)
        self.layout_meta = reduce(self.layout, dims=[0], keepdims=True)

    def __call__(self, k_size: int, n_size: int, w_ptr: void_p, s_ptr: void_p, z_ptr: void_p, y_ptr: void_p):
        tk, tn = DEQUANT_TILE
        self.attrs.warps = 4
        self.attrs.blocks = [cdiv(k_size, tk), cdiv(n_size, tn)]
        k0 = self.blockIdx.x * tk
        n0 = self.blockIdx.y * tn
        g = self.group_size
        gw = self.global_view(w_ptr, dtype=self.w_dtype, shape=[k_size, n_size])
        gs = self.global_view(s_ptr, dtype=self.a_dtype, shape=[k_size // g, n_size])
        gz = self.global_view(z_ptr, dtype=self.a_dtype, shape=[k_size // g, n_size])
        gy = self.global_view(y_ptr, dtype=self.a_dtype, shape=[k_size, n_size])
        w = self.load_global(gw, offsets=[k0, n0], shape=[tk, tn])
        s = self.load_global(gs, offsets=[k0 // g, n0], shape=[1, tn])
        w_f = self.cast(w, dtype=self.a_dtype)
        if self.has_zeros:
            z = self.load_global(gz, offsets=[k0 // g, n0], shape=[1, tn])
            y = (w_f - z) * s
            self.annotate_layout(z, self.layout_meta)
        else:
            y = w_f * s
        self.store_global(gy, y, offsets=[k0, n0])
        self.annotate_layout(w, self.layout)
        self.annotate_layout(s, self.layout_meta)


@tilus.autotune("warp_spatial, warp_repeat, num_stages, split_k", TUNING_SPACE)
class TilusWeightOnlyMatmul(Script):
    """y[M, N] = x[M, K] @ dequant(W)[K, N]; W repacked by TilusWeightRepack."""

    def __init__(self, group_size, a_dtype, w_dtype, has_zeros, warp_spatial, warp_repeat, num_stages, split_k):
        super().__init__()
        mma_atom = _mma_for(a_dtype)
        self.a_dtype = a_dtype
        self.w_dtype = w_dtype
        self.group_size = group_size
        self.has_zeros = has_zeros
        self.num_stages = num_stages
        self.split_k = split_k
        wsm, wsn = warp_spatial
        wrm, wrn, wrk = warp_repeat
        self.mma = self.cuda.mma_dot_config(
            atomic_mma=mma_atom, warp_spatial=tuple(warp_spatial), warp_repeat=tuple(warp_repeat)
        )
        tk, tn = WEIGHT_TILE
        ktiles_per_warp, ntiles_per_warp = wrk * mma_atom.k // tk, wrn * mma_atom.n // tn
        assert wrk * mma_atom.k % tk == 0 and wrn * mma_atom.n % tn == 0
        self.block_m = mma_atom.m * wsm * wrm
        self.block_n = mma_atom.n * wsn * wrn
        self.block_k = mma_atom.k * wrk
        self.num_warps = wsm * wsn
        assert group_size % self.block_k == 0, "group size must be a multiple of block_k"
        _, byte_layout = tile_layouts(a_dtype, w_dtype)
        self.tile_bytes = byte_layout.size
        # each warp loads the bytes of its own weight tiles; warps along m share them
        self.layout_b_bytes = concat(
            reduce(spatial(1, wsn, wsm, ranks=[0, 2, 1]), dims=[2]).local(ktiles_per_warp, ntiles_per_warp),
            byte_layout,
        )
        self.layout_meta = reduce(self.mma.lb, dims=[0], keepdims=True)  # one scale / zero per column
        self.sb_shape = [num_stages, ktiles_per_warp, wsn * ntiles_per_warp, self.tile_bytes]

    def __call__(
        self,
        m_size: int32,
        n_size: int,
        k_size: int,
        a_ptr: void_p,
        b_ptr: void_p,
        s_ptr: void_p,
        z_ptr: void_p,
        c_ptr: void_p,
    ):
        tk, tn = WEIGHT_TILE
        bm, bn, bk = self.block_m, self.block_n, self.block_k
        stages = self.num_stages
        self.attrs.blocks = [cdiv(m_size, bm), cdiv(n_size, bn), self.split_k]
        self.attrs.warps = self.num_warps

        k_per_split = cdiv(cdiv(k_size, self.split_k), bk) * bk
        k_begin = self.blockIdx.z * k_per_split
        k_end = min(k_begin + k_per_split, k_size)
        off_m: int32 = bm * self.blockIdx.x
        off_n: int32 = bn * self.blockIdx.y

        ga = self.global_view(a_ptr, dtype=self.a_dtype, shape=[m_size, k_size])
        gb = self.global_view(b_ptr, dtype=uint8, shape=[k_size // tk, n_size // tn, self.tile_bytes])
        gs = self.global_view(s_ptr, dtype=self.a_dtype, shape=[k_size // self.group_size, n_size])
        gz = self.global_view(z_ptr, dtype=self.a_dtype, shape=[k_size // self.group_size, n_size])

        sa = self.shared_tensor(dtype=self.a_dtype, shape=[stages, bm, bk])
        sb = self.shared_tensor(dtype=uint8, shape=self.sb_shape)
        ss = self.shared_tensor(dtype=self.a_dtype, shape=[stages, 1, bn])
        sz = self.shared_tensor(dtype=self.a_dtype, shape=[stages, 1, bn])
        acc = self.register_tensor(dtype=float32, shape=[bm, bn], init=0.0)

        # prologue: fill stages 0 .. stages-2
        for st in range(stages - 1):
            k0 = k_begin + st * bk
            self.copy_async(src=ga, dst=sa[st], offsets=[off_m, k0])
            self.copy_async(src=gb, dst=sb[st], offsets=[k0 // tk, off_n // tn, 0])
            self.copy_async(src=gs, dst=ss[st], offsets=[k0 // self.group_size, off_n])
            if self.has_zeros:
                self.copy_async(src=gz, dst=sz[st], offsets=[k0 // self.group_size, off_n])
            self.copy_async_commit_group()
        self.copy_async_wait_group(n=stages - 2)
        self.sync()

        cur: int32 = 0
        nxt: int32 = stages - 1
        for k0 in self.range(k_begin, k_end, bk, unroll=stages):
            a = self.load_shared(sa[cur])
            s = self.load_shared(ss[cur])
            w_bytes = self.load_shared(sb[cur])
            w_q = self.view(w_bytes, dtype=self.w_dtype, layout=self.mma.lb)
            w_f = self.cast(w_q, dtype=self.a_dtype)
            if self.has_zeros:
                z = self.load_shared(sz[cur])
                w = (w_f - z) * s
                self.annotate_layout(z, layout=self.layout_meta)
            else:
                w = w_f * s
            self.dot(a, w, acc, out=acc)

            k1 = k0 + (stages - 1) * bk
            self.copy_async(src=ga, dst=sa[nxt], offsets=[off_m, k1])
            self.copy_async(src=gb, dst=sb[nxt], offsets=[k1 // tk, off_n // tn, 0])
            self.copy_async(src=gs, dst=ss[nxt], offsets=[k1 // self.group_size, off_n])
            if self.has_zeros:
                self.copy_async(src=gz, dst=sz[nxt], offsets=[k1 // self.group_size, off_n])
            self.copy_async_commit_group()
            self.copy_async_wait_group(n=stages - 2)
            cur = (cur + 1) % stages
            nxt = (nxt + 1) % stages
            self.sync()

            self.annotate_layout(a, layout=self.mma.la)
            self.annotate_layout(s, layout=self.layout_meta)
            self.annotate_layout(w_bytes, layout=self.layout_b_bytes)
            self.annotate_layout(w_q, layout=self.mma.lb)

        self.copy_async_wait_all()
        self.sync()
        self.free_shared(sa)
        self.free_shared(sb)
        self.free_shared(ss)
        self.free_shared(sz)

        # accumulator -> activation dtype, re-laid out through shared memory for wide stores
        sc = self.shared_tensor(dtype=self.a_dtype, shape=[bm, bn])
        self.store_shared(sc, self.cast(acc, dtype=self.a_dtype))
        self.sync()
        c = self.load_shared(sc)
        self.free_shared(sc)

        gc = self.global_view(c_ptr, dtype=self.a_dtype, shape=[m_size, n_size])
        if self.split_k == 1:
            self.store_global(gc, c, offsets=[off_m, off_n])
        else:
            sems = self.global_tensor(dtype=int32, shape=[cdiv(m_size, bm), cdiv(n_size, bn)], requires_clean=True)
            sem: ~int32 = sems[self.blockIdx.x, self.blockIdx.y].item_ptr()
            if self.blockIdx.z > 0:
                # wait for the splits before this one, then add their sum
                self.lock_semaphore(sem, value=self.blockIdx.z)
                prev = self.load_global(gc, offsets=[off_m, off_n], shape=[bm, bn])
                self.add(c, prev, out=c)
            self.store_global(gc, c, offsets=[off_m, off_n])
            self.sync()
            self.release_semaphore(sem, value=(self.blockIdx.z + 1) % self.split_k)

        self.annotate_layout(acc, layout=self.mma.lc)
        self.annotate_layout(sb, layout=shared_row_major(*self.sb_shape))
        self.annotate_layout(ss, layout=shared_row_major(stages, 1, bn))
        self.annotate_layout(sz, layout=shared_row_major(stages, 1, bn))
