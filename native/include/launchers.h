// Host launchers of the native kernels (defined in native/kernels/*.cu, bound in native/bindings.cpp).
// `prof` == nullptr launches the uninstrumented instantiation; otherwise records go to `prof`
// (sized by instr_buffer_words) with `capacity` records per warp. Returns 0 or a cudaError_t.
#pragma once
#include <cstdint>

// `mode`: INSTR_MODE_DIRECT (0), INSTR_MODE_STAGED (1, default), INSTR_MODE_WARP0 (2) (instrument.cuh).
int native_matmul_f16(const void *a, const void *b, float *c, int M, int N, int K,
                      uint32_t *prof, uint32_t capacity, int mode, void *stream);
int native_softmax_f16(const void *x, void *y, int rows, int cols, uint32_t *prof, uint32_t capacity,
                       int mode, void *stream);
int native_layer_norm_f16(const void *x, const void *w, const void *b, void *y, int rows, int cols,
                          float eps, uint32_t *prof, uint32_t capacity, int mode, void *stream);
int native_calibrate(uint64_t spin_cycles, int blocks, int threads, unsigned long long *sink,
                     uint32_t *prof, uint32_t capacity, int mode, void *stream);
// u1 weights at M = 1 through a table of partial sums of x (native/kernels/lowbit_lut.cu): whether (K, group) is
// launchable, and the launch (ks: k per block, 256 or 512; ct: column tiles of 256 per block, 1, 2 or 4; returns 0,
// a cudaError_t, or < 0 for a bad argument).
int native_lowbit_lut_ok(int K, int group);
int native_lowbit_lut(const void *x, const void *words, const void *s, const void *z, float *ws, unsigned *cnt,
                      void *y, int K, int N, int group, int bf16, int ks, int ct, void *stream);
// its span form (a lane per 128 k, a block per 4096 k and a contiguous range of columns; its own layout, the same
// groups): nbx blocks of `threads` (256 or 512) along N (1 .. N / 4) per 4096 k; sz: (scale, zero point) pairs
// (native/lowbit_lut.py, span_pack).
int native_lowbit_lut_span(const void *x, const void *words, const void *sz, float *ws, unsigned *cnt, void *y, int K,
                           int N, int group, int bf16, int nbx, int threads, void *stream);
// its memory side alone (a diagnostic): the span form's grid (nbx x spans, 1024 threads) and loads of codes and
// slots (groups of whole units: one slot word per cell), `ahead` (1 or 2) chunks in flight per warp, no lookups; the
// XOR of every word read is XOR'ed into *out. contig: 0 lutspan's walk, 1 a contiguous run of chunks per warp;
// slots: 1 the codes and the slots, 0 the codes only.
int native_lowbit_lut_span_probe(const void *words, const void *sz, unsigned *out, int K, int N, int nbx, int ahead,
                                 int contig, int slots, void *stream);
// the plainest fast reader of the same bytes (the probe's yardstick): a[na16] then b[nb16] (16-byte words) read flat,
// 4 loads in flight per thread, grid-stride over `blocks` x `threads` (256, 512 or 1024); the XOR into *out.
int native_stream_read_xor(const void *a, long long na16, const void *b, long long nb16, unsigned *out, int blocks,
                           int threads, void *stream);
