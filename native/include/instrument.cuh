// instrument.cuh -- in-kernel scope instrumentation for native CUDA kernels.
//
// Layout of the global profile buffer (all little-endian uint32 words), one region per block,
// block b at word offset b * instr::block_words(num_warps, capacity):
//
//   block header (INSTR_BLOCK_HEADER_WORDS = 16 words), written by thread 0 in end(): a block that
//   never reaches end() keeps a zero header and the decoder counts it as missing
//     [0]  magic INSTR_MAGIC ('INST')
//     [1]  linear block id                  [2]  SM id (%smid)
//     [3]  number of warps in the block     [4]  capacity (records per warp)
//     [5]  flags: bit0 = stamps are %globaltimer (ns) instead of clock64 (cycles)
//     [6..7]   clock64 at block start       [8..9]   clock64 at block end
//     [10..11] %globaltimer at block start  [12..13] %globaltimer at block end   (ns)
//     [14..15] reserved (0)
//   then per warp w (INSTR_WARP_HEADER_WORDS = 4 words + capacity records):
//     [0] warp id   [1] total records written by the warp (may exceed capacity)
//     [2] low 32 bits of the stamp at begin()   [3] low 32 bits of the stamp at end()
//   (the block's end time in [8..9] / [12..13] is warp 0's end: end() has no block barrier)
//     records, INSTR_RECORD_WORDS = 2 words each:
//       word0 = scope id (bits 0..30) | end flag (bit 31: 1 = exit, 0 = enter)
//       word1 = low 32 bits of the stamp (clock64 or %globaltimer)
//     Record i of a warp goes to slot i % capacity (circular buffer): when total > capacity the
//     oldest total - capacity records were overwritten; the decoder reports them as dropped.
//
// Only lane 0 of each warp writes records. With ENABLED = false every member is an empty inline
// function and the kernel compiles to the uninstrumented code.
#pragma once
#include <cstdint>

#define INSTR_MAGIC 0x54534E49u
#define INSTR_BLOCK_HEADER_WORDS 16
#define INSTR_WARP_HEADER_WORDS 4
#define INSTR_RECORD_WORDS 2
#define INSTR_END_FLAG 0x80000000u
#define INSTR_FLAG_GLOBALTIMER 1u

namespace instr {

__host__ __device__ inline uint64_t block_words(uint32_t num_warps, uint32_t capacity) {
  return INSTR_BLOCK_HEADER_WORDS +
         (uint64_t)num_warps * (INSTR_WARP_HEADER_WORDS + (uint64_t)capacity * INSTR_RECORD_WORDS);
}

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// volatile (never merged or dropped, ordered with the other stamps) but no memory clobber, so the
// compiler keeps scheduling loads and stores freely around the stamps.
__device__ __forceinline__ uint64_t clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void store2(uint32_t *p, uint32_t a, uint32_t b) {
  // one 8-byte streaming store (evict-first: the records should not push the kernel's data out of L2)
  __stcs(reinterpret_cast<uint2 *>(p), make_uint2(a, b));
}

// USE_GLOBALTIMER: stamp records with %globaltimer (ns) instead of the SM cycle counter.
template <bool ENABLED, bool USE_GLOBALTIMER = false>
struct Profiler {
  uint32_t *block_base = nullptr;
  uint32_t *warp_records = nullptr;
  uint32_t count = 0;
  uint32_t slot = 0;
  uint32_t capacity = 0;
  uint32_t begin_stamp = 0;
  uint64_t start_clock = 0, start_gtime = 0;
  bool writer = false;

  __device__ __forceinline__ uint32_t stamp() const {
    if constexpr (USE_GLOBALTIMER) {
      return (uint32_t)globaltimer();
    } else {
      return (uint32_t)clock();
    }
  }

  // Call once per block, by every thread, before the first scope. The block header is written by
  // thread 0 in end() (begin() only reads the clocks), so nothing is stored on the way in.
  __device__ __forceinline__ void begin(uint32_t *buffer, uint32_t cap) {
    if constexpr (ENABLED) {
      const uint32_t nwarps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
      const uint32_t tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
      const uint64_t bid = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
      const uint32_t warp = tid / 32;
      capacity = cap;
      block_base = buffer + bid * block_words(nwarps, cap);
      warp_records = block_base + INSTR_BLOCK_HEADER_WORDS +
                     (uint64_t)warp * (INSTR_WARP_HEADER_WORDS + (uint64_t)cap * INSTR_RECORD_WORDS) +
                     INSTR_WARP_HEADER_WORDS;
      writer = (tid % 32) == 0;
      count = 0;
      slot = 0;
      if (tid == 0) {  // only register reads here; the header is written in end()
        start_clock = clock();
        start_gtime = globaltimer();
      }
      begin_stamp = stamp();
    }
  }

  __device__ __forceinline__ void record(uint32_t tag) {
    if constexpr (ENABLED) {
      const uint32_t t = stamp();
      if (writer) store2(warp_records + (uint64_t)slot * INSTR_RECORD_WORDS, tag, t);
      ++count;
      slot = (slot + 1 == capacity) ? 0u : slot + 1;  // circular: slot == count % capacity
    }
  }

  __device__ __forceinline__ void enter(uint32_t scope_id) { record(scope_id & ~INSTR_END_FLAG); }
  __device__ __forceinline__ void exit(uint32_t scope_id) { record(scope_id | INSTR_END_FLAG); }

  // Call once per block, by every thread, after the last scope (no early returns in between).
  // No barrier: each warp finishes on its own; thread 0 stamps the block end when warp 0 ends.
  __device__ __forceinline__ void end() {
    if constexpr (ENABLED) {
      const uint32_t tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
      if (writer) {
        uint32_t *wh = warp_records - INSTR_WARP_HEADER_WORDS;
        wh[0] = tid / 32;
        wh[1] = count;
        wh[2] = begin_stamp;
        wh[3] = stamp();
      }
      if (tid == 0) {
        const uint64_t c = clock();
        const uint64_t g = globaltimer();
        const uint32_t nwarps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
        const uint64_t bid = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
        uint2 *h = reinterpret_cast<uint2 *>(block_base);  // 16 words as 8-byte stores (8-byte aligned)
        h[0] = make_uint2(INSTR_MAGIC, (uint32_t)bid);
        h[1] = make_uint2(smid(), nwarps);
        h[2] = make_uint2(capacity, USE_GLOBALTIMER ? INSTR_FLAG_GLOBALTIMER : 0u);
        h[3] = make_uint2((uint32_t)start_clock, (uint32_t)(start_clock >> 32));
        h[4] = make_uint2((uint32_t)c, (uint32_t)(c >> 32));
        h[5] = make_uint2((uint32_t)start_gtime, (uint32_t)(start_gtime >> 32));
        h[6] = make_uint2((uint32_t)g, (uint32_t)(g >> 32));
        h[7] = make_uint2(0u, 0u);
      }
    }
  }
};

// RAII helper: instr::Scope<P> s(prof, ID); ... exits at the end of the C++ scope.
template <typename P>
struct Scope {
  P &p;
  uint32_t id;
  __device__ __forceinline__ Scope(P &prof, uint32_t scope_id) : p(prof), id(scope_id) { p.enter(id); }
  __device__ __forceinline__ ~Scope() { p.exit(id); }
};

}  // namespace instr
