// u1 weights at M = 1 through a table of partial sums of x (the `lut` decode variant; native/NOTES.md section 33).
//
// For every quad of k (4 consecutive k) a block keeps the 16 sums of the subsets of x over the quad (f32, shared
// memory); lane n owns output column n and adds T[quad][nibble] for each nibble of its column's code words: a
// shift, a mask, a shared load and an add per 4 weights, against the tensor-core path's LOP3 + HFMA2 per pair of
// weights plus its mma and fragment work. The zero point enters through the sum of x per scale group:
//   y[n] = sum_groups s[g, n] * (sum_{k in g} x[k] q[k, n] - z[g, n] * sum_{k in g} x[k]).
// Weight layout (native/lowbit_lut.py): int32 [units, N, 4], unit u = 128 k (K padded with zero codes), word i of
// (u, n) holds k = 128 u + 32 i + j at bit j. A block is 256 columns x one slice of U units of k; slices add their
// partial sums into the shared f32 workspace, and the last block of a column tile (a counter per tile) writes y and
// puts the workspace and its counter back to zero, as the decode kernel does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launchers.h"

namespace {
constexpr int LUT_THREADS = 256;

__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(__half *p, int i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int i, float v) { p[i] = __float2bfloat16_rn(v); }

// sum of the 8 table entries a code word selects (quad q of the word: bits 4q..4q+3), in two chains
// (each chain starts from its first entry: 0.f + t is not t for t = -0, so the compiler keeps an add from zero)
__device__ __forceinline__ float word_sum(const float *Tw, unsigned v) {
  float a0 = Tw[v & 15u], a1 = Tw[16 + ((v >> 4) & 15u)];
#pragma unroll
  for (int q = 2; q < 8; q++) {
    const float t = Tw[q * 16 + ((v >> (4 * q)) & 15u)];
    if (q & 1) a1 += t; else a0 += t;
  }
  return a0 + a1;
}

// WPG: 1 or 2 -- groups of 32 or 64 k, scaled per word (a group's words are whole); 0 -- groups of a multiple of
// 128 k (upg units each; per channel: upg = units), scaled at each group's end and at the slice's end.
// CT: column tiles of 256 per block -- one table serves CT tiles, the next tile's codes load while one is summed.
template <typename T, int U, int WPG, int CT>
__global__ void __launch_bounds__(LUT_THREADS) lowbit_lut_kernel(
    const T *__restrict__ x, const uint4 *__restrict__ words, const T *__restrict__ s, const T *__restrict__ z,
    float *__restrict__ ws, unsigned *__restrict__ cnt, T *__restrict__ y, int K, int N, int units, int upg) {
  constexpr int Q = 32 * U, W = 4 * U, NS = WPG ? W : U;
  __shared__ __align__(16) float tab[Q * 16];
  __shared__ float xw[W];   // sum of x per code word of the slice
  const int tid = threadIdx.x, tile0 = blockIdx.x * CT;
  const int u0 = blockIdx.y * U, nu = min(U, units - u0);
  // per scale slot (a word, or a unit): its group (-1: none), and for units whether a group ends there
  int gidx[NS];
  unsigned ends = 0;
  if (WPG) {
#pragma unroll
    for (int i = 0; i < W; i++) gidx[i] = 32 * (4 * u0 + i) < K ? (4 * u0 + i) / (WPG ? WPG : 1) : -1;
  } else {
    int gi = u0 / upg, r = u0 - gi * upg;
#pragma unroll
    for (int j = 0; j < U; j++) {
      gidx[j] = j < nu ? gi : -1;
      if (++r == upg || j == nu - 1) ends |= 1u << j;
      if (r == upg) { r = 0; gi++; }
    }
  }
  auto load = [&](int tile, uint4 (&w)[U], float (&sc)[NS], float (&zz)[NS]) {
    const int n = tile * LUT_THREADS + tid, nn = n < N ? n : N - 1;
#pragma unroll
    for (int j = 0; j < U; j++) w[j] = j < nu ? __ldg(words + (size_t)(u0 + j) * N + nn) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < NS; i++) {
      sc[i] = gidx[i] >= 0 ? ld(s, (size_t)gidx[i] * N + nn) : 0.f;
      zz[i] = gidx[i] >= 0 ? ld(z, (size_t)gidx[i] * N + nn) : 0.f;
    }
  };
  uint4 w[U];
  float sc[NS], zz[NS];
  load(tile0, w, sc, zz);   // in flight while the table is built
  for (int t = tid; t < Q; t += LUT_THREADS) {   // Q is a multiple of 32: whole warps
    const int k = 128 * u0 + 4 * t;
    float a[4];
#pragma unroll
    for (int b = 0; b < 4; b++) a[b] = k + b < K ? ld(x, k + b) : 0.f;
    float e[16];
    e[0] = 0.f; e[1] = a[0]; e[2] = a[1]; e[3] = a[0] + a[1];
#pragma unroll
    for (int i = 0; i < 4; i++) e[4 + i] = e[i] + a[2];
#pragma unroll
    for (int i = 0; i < 8; i++) e[8 + i] = e[i] + a[3];
    float4 *d = reinterpret_cast<float4 *>(tab + 16 * t);
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
    float sw = e[15];   // the 8 quads of a word are 8 neighbouring lanes
    sw += __shfl_xor_sync(0xffffffffu, sw, 1);
    sw += __shfl_xor_sync(0xffffffffu, sw, 2);
    sw += __shfl_xor_sync(0xffffffffu, sw, 4);
    if ((t & 7) == 0) xw[t >> 3] = sw;
  }
  __syncthreads();
  // the sum of x that each scale slot's zero point multiplies: per word, or per group part ending at a unit
  float xs[NS];
  if (WPG) {
#pragma unroll
    for (int i = 0; i < W; i++) xs[i] = xw[i];
  } else {
    float xg = 0.f;
#pragma unroll
    for (int j = 0; j < U; j++) {
      xg += (xw[4 * j] + xw[4 * j + 1]) + (xw[4 * j + 2] + xw[4 * j + 3]);
      xs[j] = xg;
      if (ends >> j & 1u) xg = 0.f;
    }
  }
  float acc[CT];
#pragma unroll
  for (int c = 0; c < CT; c++) {
    uint4 wn[U];
    float sn[NS], zn[NS];
    if (c + 1 < CT) load(tile0 + c + 1, wn, sn, zn);   // the next tile's codes while this one is summed
    float a = 0.f, ga = 0.f;
#pragma unroll
    for (int j = 0; j < U; j++) {
      if (j < nu) {
        const unsigned v[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
        if (WPG) {
#pragma unroll
          for (int i = 0; i < 4; i++)
            a = fmaf(sc[4 * j + i], word_sum(tab + (32 * j + 8 * i) * 16, v[i]) - zz[4 * j + i] * xs[4 * j + i], a);
        } else {
#pragma unroll
          for (int i = 0; i < 4; i++) ga += word_sum(tab + (32 * j + 8 * i) * 16, v[i]);
          if (ends >> j & 1u) {   // a group ends, or the slice: its share of the group
            a = fmaf(sc[j], ga - zz[j] * xs[j], a);
            ga = 0.f;
          }
        }
      }
    }
    acc[c] = a;
    if (c + 1 < CT) {
#pragma unroll
      for (int j = 0; j < U; j++) w[j] = wn[j];
#pragma unroll
      for (int i = 0; i < NS; i++) { sc[i] = sn[i]; zz[i] = zn[i]; }
    }
  }
  if (gridDim.y == 1) {
#pragma unroll
    for (int c = 0; c < CT; c++) {
      const int n = (tile0 + c) * LUT_THREADS + tid;
      if (n < N) st(y, n, acc[c]);
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < CT; c++) {
    const int n = (tile0 + c) * LUT_THREADS + tid;
    if (n < N) atomicAdd(ws + n, acc[c]);
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) last = atomicAdd(cnt + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (last) {
    __threadfence();
#pragma unroll
    for (int c = 0; c < CT; c++) {
      const int n = (tile0 + c) * LUT_THREADS + tid;
      if (n < N) st(y, n, atomicExch(ws + n, 0.f));
    }
    if (tid == 0) cnt[blockIdx.x] = 0u;
  }
}

template <typename T, int U, int WPG>
int launch_ct(const T *x, const uint4 *w, const T *s, const T *z, float *ws, unsigned *cnt, T *y, int K, int N,
              int units, int upg, int ct, cudaStream_t st) {
  const int tiles = (N + LUT_THREADS - 1) / LUT_THREADS;
  const dim3 grid((tiles + ct - 1) / ct, (units + U - 1) / U);
  if (ct == 4) lowbit_lut_kernel<T, U, WPG, 4><<<grid, LUT_THREADS, 0, st>>>(x, w, s, z, ws, cnt, y, K, N, units, upg);
  else if (ct == 2) lowbit_lut_kernel<T, U, WPG, 2><<<grid, LUT_THREADS, 0, st>>>(x, w, s, z, ws, cnt, y, K, N, units, upg);
  else lowbit_lut_kernel<T, U, WPG, 1><<<grid, LUT_THREADS, 0, st>>>(x, w, s, z, ws, cnt, y, K, N, units, upg);
  return (int)cudaGetLastError();
}

template <typename T, int U>
int launch(const void *x, const void *words, const void *s, const void *z, float *ws, unsigned *cnt, void *y, int K,
           int N, int group, int ct, void *stream) {
  const int units = (K + 127) / 128;
  const auto st = static_cast<cudaStream_t>(stream);
  const T *xt = static_cast<const T *>(x), *sct = static_cast<const T *>(s), *zt = static_cast<const T *>(z);
  const uint4 *wt = static_cast<const uint4 *>(words);
  T *yt = static_cast<T *>(y);
  if (group == 32) return launch_ct<T, U, 1>(xt, wt, sct, zt, ws, cnt, yt, K, N, units, 0, ct, st);
  if (group == 64) return launch_ct<T, U, 2>(xt, wt, sct, zt, ws, cnt, yt, K, N, units, 0, ct, st);
  const int upg = (group == -1 || group == K) ? units : group / 128;
  return launch_ct<T, U, 0>(xt, wt, sct, zt, ws, cnt, yt, K, N, units, upg, ct, st);
}

// ---- the span form: a lane per unit of 128 k, a block spanning 32 units (4096 k) (native/NOTES.md section 34) ----
// Lane l owns unit 32 y + l (y: the block's k span) of every column its warp visits, so each lane looks up tables of
// its own k only: the tables of the block's 32 units sit lane-interleaved (entry row r of lane l at byte 128 r + 4 l),
// every lane in its own bank whatever entry it selects, and a lane's 32 lookups per column are one unit, one scale
// group: no per-word sums, one scale and zero point per column and unit. A warp takes 4 columns at a time, sums each
// over its 32 lanes and adds the 4 results into the workspace; a block's columns are a contiguous range.
// Its own layout (native/lowbit_lut.py, span_pack), so that a warp's loads are contiguous: codes int32
// [spans, N / 4, 4, 32, 4] (span y, 4 columns, column j, lane l = unit 32 y + l, word i) and (scale, zero point)
// pairs [spans, N / 4, 4, 32, slots, 2] in x's dtype (a slot per unit, per word for groups of 32 k, per pair of words
// for 64), zero beyond K and N.
// Table rows (128 B each: a f32 per lane; 512 rows, 64 KB per block): chunk c = 8 i + 2 b + h of the unit (k 4c..4c+3:
// word i, byte b, nibble h) with p = 4 i + b has its entry e at row 32 p + 2 e (h = 0) or 2 p + 1 + 32 e (h = 1) --
// even rows and odd rows, each once -- so a byte moved to bits 8..15 gives both offsets by one mask each:
// (vb & 0xF00) = 256 e and (vb & 0xF000) = 4096 e bytes; three shifts per word, one LOP3 (mask, OR the lane's 4 l)
// per 4 weights.
constexpr int SPAN_UNITS = 32, SPAN_COLS = 4;
constexpr int SPAN_SMEM = SPAN_UNITS * 16 * 32 * 4;   // 32 chunks x 16 entries x 32 lanes x f32 = 64 KB

__device__ __forceinline__ int span_row(int c, int e) {
  const int p = c >> 1;
  return (c & 1) ? 2 * p + 1 + 32 * e : 32 * p + 2 * e;
}

__device__ __forceinline__ float span_ld(const char *tb, unsigned off) { return *reinterpret_cast<const float *>(tb + off); }

// the lookups of one code word (word i of the unit): the sum of x over the k whose code is 1, in two chains
// (each chain starts from its first entry, as word_sum's)
template <int I>
__device__ __forceinline__ float span_word(const char *tb, unsigned v, unsigned lane4) {
  const unsigned v0 = v << 8;
  float a0 = span_ld(tb + 4096 * (4 * I), (v0 & 0xF00u) | lane4);
  float a1 = span_ld(tb + 128 * (8 * I + 1), (v0 & 0xF000u) | lane4);
#pragma unroll
  for (int b = 1; b < 4; b++) {
    const unsigned vb = b == 1 ? v : v >> (8 * (b - 1));
    const int p = 4 * I + b;
    a0 += span_ld(tb + 4096 * p, (vb & 0xF00u) | lane4);
    a1 += span_ld(tb + 128 * (2 * p + 1), (vb & 0xF000u) | lane4);
  }
  return a0 + a1;
}

// NS (scale, zero point) pairs of x's dtype, loaded as NS 32-bit words
template <int NS>
__device__ __forceinline__ void span_ld_sz(const unsigned *p, unsigned (&r)[NS]) {
  if constexpr (NS == 4) {
    const uint4 q = __ldg(reinterpret_cast<const uint4 *>(p));
    r[0] = q.x; r[1] = q.y; r[2] = q.z; r[3] = q.w;
  } else if constexpr (NS == 2) {
    const uint2 q = __ldg(reinterpret_cast<const uint2 *>(p));
    r[0] = q.x; r[1] = q.y;
  } else {
    r[0] = __ldg(p);
  }
}
__device__ __forceinline__ float2 span_pair(unsigned r, const __half *) {
  return __half22float2(*reinterpret_cast<const __half2 *>(&r));
}
__device__ __forceinline__ float2 span_pair(unsigned r, const __nv_bfloat16 *) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r));
}

// WPG: 1 or 2 -- groups of 32 or 64 k (a (scale, zero) slot per word or per pair of words); 0 -- groups of whole
// units (one slot per unit). TH: threads per block, 256 (3 blocks per SM: 80 registers), 512 (2: 64 registers) or
// 1024 (1: 64 registers), one table for all its warps.
template <typename T, int WPG, int TH>
__global__ void __launch_bounds__(TH, TH == 1024 ? 1 : TH == 512 ? 2 : 3) lowbit_lut_span_kernel(
    const T *__restrict__ x, const uint4 *__restrict__ words, const unsigned *__restrict__ sz,
    float *__restrict__ ws, unsigned *__restrict__ cnt, T *__restrict__ y, int K, int N) {
  constexpr int NS = WPG ? 4 / WPG : 1;   // (scale, zero point) slots per unit
  extern __shared__ __align__(16) float tab[];
  const char *tb = reinterpret_cast<const char *>(tab);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned lane4 = 4u * lane;
  const int u = blockIdx.y * SPAN_UNITS + lane;
  const int chunks = (N + SPAN_COLS - 1) / SPAN_COLS;
  const int c0 = (int)((long long)blockIdx.x * chunks / gridDim.x);
  const int c1 = (int)((long long)(blockIdx.x + 1) * chunks / gridDim.x);
  // (chunk c, column j): its codes at words[cell], its slots at sz[cell * NS ..], cell = span0 + 32 (SPAN_COLS c + j);
  // a warp's chunks step by S = TH / 32: pointers advance by a constant, the 4 columns at immediate offsets
  constexpr int S = TH / 32;
  constexpr size_t STEP = (size_t)SPAN_COLS * 32 * S;   // cells from one of a warp's chunks to its next
  const size_t span0 = (size_t)blockIdx.y * chunks * SPAN_COLS * 32 + lane;
  auto load = [&](const uint4 *wq, const unsigned *sq, uint4 (&w)[SPAN_COLS], unsigned (&r)[SPAN_COLS][NS]) {
#pragma unroll
    for (int j = 0; j < SPAN_COLS; j++) {
      w[j] = __ldg(wq + 32 * j);
      span_ld_sz<NS>(sq + 32 * NS * j, r[j]);
    }
  };
  int c = c0 + warp;
  const uint4 *wp = words + span0 + (size_t)SPAN_COLS * 32 * c;
  const unsigned *sp = sz + (span0 + (size_t)SPAN_COLS * 32 * c) * NS;
  // two buffers of codes and slots: the next chunk's load in flight while one is summed
  uint4 wa[SPAN_COLS], wb[SPAN_COLS];
  unsigned ra[SPAN_COLS][NS], rb[SPAN_COLS][NS];
  if (c < c1) load(wp, sp, wa, ra);   // in flight while the tables are built
  // the tables: warp w builds chunks w, w + S, ... of every lane's unit (a lane its own unit's)
#pragma unroll
  for (int q = 0; q < SPAN_UNITS / S; q++) {
    const int ch = warp + S * q, k = 128 * u + 4 * ch;
    float a[4];
#pragma unroll
    for (int b = 0; b < 4; b++) a[b] = k + b < K ? ld(x, (size_t)k + b) : 0.f;
    float e[16];
    e[0] = 0.f; e[1] = a[0]; e[2] = a[1]; e[3] = a[0] + a[1];
#pragma unroll
    for (int i = 0; i < 4; i++) e[4 + i] = e[i] + a[2];
#pragma unroll
    for (int i = 0; i < 8; i++) e[8 + i] = e[i] + a[3];
#pragma unroll
    for (int i = 0; i < 16; i++) tab[32 * span_row(ch, i) + lane] = e[i];
  }
  __syncthreads();
  // the sum of x over each scale slot of the lane's unit (entry 15 of its chunks)
  float xs[NS];
#pragma unroll
  for (int i = 0; i < NS; i++) {
    float t = 0.f;
#pragma unroll
    for (int ch = 32 * i / NS; ch < 32 * (i + 1) / NS; ch++) t += tab[32 * span_row(ch, 15) + lane];
    xs[i] = t;
  }
  // chunk c's 4 column sums from its codes w and slots r, written to y (one span) or added into the workspace
  auto sums = [&](int c, const uint4 (&w)[SPAN_COLS], const unsigned (&r)[SPAN_COLS][NS]) {
    float acc[SPAN_COLS];
#pragma unroll
    for (int j = 0; j < SPAN_COLS; j++) {
      const float t[4] = {span_word<0>(tb, w[j].x, lane4), span_word<1>(tb, w[j].y, lane4),
                          span_word<2>(tb, w[j].z, lane4), span_word<3>(tb, w[j].w, lane4)};
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < NS; i++) {   // slot i: its words' sum, less the zero point times their sum of x, scaled
        const float ti = WPG == 1 ? t[i] : WPG == 2 ? t[2 * i] + t[2 * i + 1] : (t[0] + t[1]) + (t[2] + t[3]);
        const float2 q = span_pair(r[j][i], x);
        a = fmaf(q.x, ti - q.y * xs[i], a);
      }
      acc[j] = a;
    }
    // the 4 columns' sums over the 32 lanes: lane 8 j ends with column j's
    const bool hi = lane & 16, h8 = lane & 8;
    float k0 = hi ? acc[2] : acc[0], k1 = hi ? acc[3] : acc[1];
    k0 += __shfl_xor_sync(0xffffffffu, hi ? acc[0] : acc[2], 16);
    k1 += __shfl_xor_sync(0xffffffffu, hi ? acc[1] : acc[3], 16);
    float v = h8 ? k1 : k0;
    v += __shfl_xor_sync(0xffffffffu, h8 ? k0 : k1, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    const int n = SPAN_COLS * c + (lane >> 3);
    if ((lane & 7) == 0 && n < N) {
      if (gridDim.y == 1) st(y, n, v);
      else atomicAdd(ws + n, v);
    }
  };
  if constexpr (WPG == 0) {   // the buffers in turn (two copies of the loop body)
    for (; c < c1; c += 2 * S, wp += 2 * STEP, sp += 2 * STEP * NS) {
      if (c + S < c1) load(wp + STEP, sp + STEP * NS, wb, rb);   // the next chunk's codes while these are summed
      sums(c, wa, ra);
      if (c + S >= c1) break;
      if (c + 2 * S < c1) load(wp + 2 * STEP, sp + 2 * STEP * NS, wa, ra);
      sums(c + S, wb, rb);
    }
  } else {   // groups of 32 / 64 k: 2-4 slots a column; one body, the next chunk copied in (fewer spills at 64 registers)
    for (; c < c1; c += S, wp += STEP, sp += STEP * NS) {
      const bool more = c + S < c1;
      if (more) load(wp + STEP, sp + STEP * NS, wb, rb);
      sums(c, wa, ra);
      if (more) {
#pragma unroll
        for (int j = 0; j < SPAN_COLS; j++) {
          wa[j] = wb[j];
#pragma unroll
          for (int i = 0; i < NS; i++) ra[j][i] = rb[j][i];
        }
      }
    }
  }
  if (gridDim.y == 1) return;
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) last = atomicAdd(cnt + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (last) {
    __threadfence();
    for (int n = SPAN_COLS * c0 + tid; n < min(SPAN_COLS * c1, N); n += TH) st(y, n, atomicExch(ws + n, 0.f));
    if (tid == 0) cnt[blockIdx.x] = 0u;
  }
}

template <typename T, int WPG, int TH>
int launch_span_th(const T *x, const uint4 *w, const unsigned *sz, float *ws, unsigned *cnt, T *y, int K, int N,
                   int nbx, cudaStream_t st) {
  // 64 KB of dynamic shared memory, above the default 48 KB (an attribute of the current device's function)
  const cudaError_t e = cudaFuncSetAttribute(lowbit_lut_span_kernel<T, WPG, TH>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, SPAN_SMEM);
  if (e != cudaSuccess) return (int)e;
  const dim3 grid(nbx, ((K + 127) / 128 + SPAN_UNITS - 1) / SPAN_UNITS);
  lowbit_lut_span_kernel<T, WPG, TH><<<grid, TH, SPAN_SMEM, st>>>(x, w, sz, ws, cnt, y, K, N);
  return (int)cudaGetLastError();
}

template <typename T, int WPG>
int launch_span_g(const T *x, const uint4 *w, const unsigned *sz, float *ws, unsigned *cnt, T *y, int K, int N,
                  int nbx, int threads, cudaStream_t st) {
  return threads == 1024 ? launch_span_th<T, WPG, 1024>(x, w, sz, ws, cnt, y, K, N, nbx, st)
         : threads == 512  ? launch_span_th<T, WPG, 512>(x, w, sz, ws, cnt, y, K, N, nbx, st)
                           : launch_span_th<T, WPG, 256>(x, w, sz, ws, cnt, y, K, N, nbx, st);
}

template <typename T>
int launch_span(const void *x, const void *words, const void *sz, float *ws, unsigned *cnt, void *y, int K, int N,
                int group, int nbx, int threads, void *stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  const T *xt = static_cast<const T *>(x);
  const uint4 *wt = static_cast<const uint4 *>(words);
  const unsigned *szt = static_cast<const unsigned *>(sz);
  T *yt = static_cast<T *>(y);
  if (group == 32) return launch_span_g<T, 1>(xt, wt, szt, ws, cnt, yt, K, N, nbx, threads, st);
  if (group == 64) return launch_span_g<T, 2>(xt, wt, szt, ws, cnt, yt, K, N, nbx, threads, st);
  return launch_span_g<T, 0>(xt, wt, szt, ws, cnt, yt, K, N, nbx, threads, st);
}
// The span form's memory side alone (a diagnostic, native/NOTES.md section 36): the same grid, the same walk of a
// warp over its chunks and the same loads of codes and slots as lowbit_lut_span_kernel, AHEAD chunks in flight per
// warp, and no tables or lookups: every word read is XOR'ed into *out (one word for the launch), so that the loads
// stay and a caller can check that each word was read once. Groups of whole units (one slot word per cell) only.
// contig: 0 -- lutspan's walk (warp w takes the block's chunks w, w + 32, ...: the 32 warps side by side); 1 -- each
// warp a contiguous run of the block's chunks (an alternative walk, to be measured before any kernel takes it).
// slots: 0 -- the codes only (what the second stream, the slots', costs).
template <int AHEAD, int TH>
__global__ void __launch_bounds__(TH, 1) lowbit_lut_span_probe_kernel(const uint4 *__restrict__ words,
                                                                     const unsigned *__restrict__ sz,
                                                                     unsigned *__restrict__ out, int N, int contig,
                                                                     int slots) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = (N + SPAN_COLS - 1) / SPAN_COLS;
  const int c0 = (int)((long long)blockIdx.x * chunks / gridDim.x);
  const int c1 = (int)((long long)(blockIdx.x + 1) * chunks / gridDim.x);
  constexpr int S = TH / 32;
  const size_t span0 = (size_t)blockIdx.y * chunks * SPAN_COLS * 32;
  uint4 w[AHEAD][SPAN_COLS];
  unsigned r[AHEAD][SPAN_COLS];
  auto load = [&](int a, int c) {   // chunk c into buffer a: its codes and its slots
    const size_t cell = span0 + (size_t)SPAN_COLS * 32 * c + lane;
#pragma unroll
    for (int j = 0; j < SPAN_COLS; j++) {
      w[a][j] = __ldg(words + cell + 32 * j);
      r[a][j] = slots ? __ldg(sz + cell + 32 * j) : 0u;
    }
  };
  unsigned acc = 0u;
  const int q = (c1 - c0 + S - 1) / S;   // a warp's run of chunks (contig)
  const int step = contig ? 1 : S;
  int c = contig ? c0 + warp * q : c0 + warp;
  const int end = contig ? min(c1, c + q) : c1;
#pragma unroll
  for (int a = 0; a < AHEAD; a++)
    if (c + a * step < end) load(a, c + a * step);
  while (c < end) {
#pragma unroll
    for (int a = 0; a < AHEAD; a++) {
      if (c >= end) break;
#pragma unroll
      for (int j = 0; j < SPAN_COLS; j++) acc ^= w[a][j].x ^ w[a][j].y ^ w[a][j].z ^ w[a][j].w ^ r[a][j];
      if (c + AHEAD * step < end) load(a, c + AHEAD * step);
      c += step;
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0 && acc) atomicXor(out, acc);
}

template <int AHEAD>
int launch_probe(const void *words, const void *sz, unsigned *out, int K, int N, int nbx, int contig, int slots,
                 cudaStream_t st) {
  const dim3 grid(nbx, ((K + 127) / 128 + SPAN_UNITS - 1) / SPAN_UNITS);
  lowbit_lut_span_probe_kernel<AHEAD, 1024><<<grid, 1024, 0, st>>>(static_cast<const uint4 *>(words),
                                                                    static_cast<const unsigned *>(sz), out, N, contig,
                                                                    slots);
  return (int)cudaGetLastError();
}

// the plainest fast reader of the same bytes (a yardstick for the probe, lut_tune --probe): two buffers read flat with
// 16-byte loads, U loads in flight per thread, grid-stride, the XOR of every word into *out
template <int U>
__global__ void stream_read_xor_kernel(const uint4 *__restrict__ a, long long na, const uint4 *__restrict__ b,
                                       long long nb, unsigned *__restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  unsigned acc = 0u;
  for (int pass = 0; pass < 2; pass++) {
    const uint4 *p = pass ? b : a;
    const long long n = pass ? nb : na;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
      for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
      const uint4 v = __ldg(p + i);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc) atomicXor(out, acc);
}
}  // namespace

int native_lowbit_lut_span_probe(const void *words, const void *sz, unsigned *out, int K, int N, int nbx, int ahead,
                                 int contig, int slots, void *stream) {
  if (nbx < 1 || nbx > (N + SPAN_COLS - 1) / SPAN_COLS || (contig != 0 && contig != 1) || (slots != 0 && slots != 1))
    return -2;
  const auto st = static_cast<cudaStream_t>(stream);
  return ahead == 1 ? launch_probe<1>(words, sz, out, K, N, nbx, contig, slots, st)
         : ahead == 2 ? launch_probe<2>(words, sz, out, K, N, nbx, contig, slots, st)
                      : -2;   // 3 would spill at the 64 registers of 1024 threads
}

int native_stream_read_xor(const void *a, long long na16, const void *b, long long nb16, unsigned *out, int blocks,
                           int threads, void *stream) {
  if (blocks < 1 || (threads != 256 && threads != 512 && threads != 1024) || na16 < 0 || nb16 < 0) return -2;
  stream_read_xor_kernel<4><<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4 *>(a), na16, static_cast<const uint4 *>(b), nb16, out);
  return (int)cudaGetLastError();
}

int native_lowbit_lut_ok(int K, int group) {
  if (K <= 0) return 0;
  return group == 32 || group == 64 || group == -1 || group == K || (group > 0 && group % 128 == 0 && K % group == 0);
}

int native_lowbit_lut(const void *x, const void *words, const void *s, const void *z, float *ws, unsigned *cnt,
                      void *y, int K, int N, int group, int bf16, int ks, int ct, void *stream) {
  if (!native_lowbit_lut_ok(K, group) || (group > 0 && group != K && K % group)) return -1;
  if ((ks != 256 && ks != 512) || (ct != 1 && ct != 2 && ct != 4)) return -2;
  if (bf16)
    return ks == 256 ? launch<__nv_bfloat16, 2>(x, words, s, z, ws, cnt, y, K, N, group, ct, stream)
                     : launch<__nv_bfloat16, 4>(x, words, s, z, ws, cnt, y, K, N, group, ct, stream);
  return ks == 256 ? launch<__half, 2>(x, words, s, z, ws, cnt, y, K, N, group, ct, stream)
                   : launch<__half, 4>(x, words, s, z, ws, cnt, y, K, N, group, ct, stream);
}


int native_lowbit_lut_span(const void *x, const void *words, const void *sz, float *ws, unsigned *cnt, void *y, int K,
                           int N, int group, int bf16, int nbx, int threads, void *stream) {
  if (!native_lowbit_lut_ok(K, group) || (group > 0 && group != K && K % group)) return -1;
  if (nbx < 1 || nbx > (N + SPAN_COLS - 1) / SPAN_COLS || (threads != 256 && threads != 512 && threads != 1024)) return -2;
  return bf16 ? launch_span<__nv_bfloat16>(x, words, sz, ws, cnt, y, K, N, group, nbx, threads, stream)
              : launch_span<__half>(x, words, sz, ws, cnt, y, K, N, group, nbx, threads, stream);
}
