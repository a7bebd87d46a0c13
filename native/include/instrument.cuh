// instrument.cuh -- in-kernel scope instrumentation for native CUDA kernels.
//
// Layout of the global profile buffer (all little-endian uint32 words), one region per block,
// block b at word offset b * instr::block_words(num_warps, capacity):
//
//   block header (INSTR_BLOCK_HEADER_WORDS = 16 words), written by warp 0 in end(): a block that
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
// Modes (template parameter MODE; the buffer layout is the same in every mode):
//   INSTR_MODE_STAGED (default): lane 0 of each warp writes its records into a small shared-memory
//     batch (BATCH records per warp); every BATCH records, and at end(), the whole warp copies the
//     batch to the global buffer with one coalesced store per lane.  A record costs a clock read, a
//     shared store and a counter update; global memory sees full-line writes instead of one 8-byte
//     write per record.
//     A warp with fewer than BATCH records in all (short kernels) writes its header and records at end()
//     with one coalesced store (lanes 0-1 header, lanes 2.. records).
//   INSTR_MODE_WARP0: the same, but only warp 0 of each block records (the others write their
//     warp header with 0 records): for short memory-bound kernels where 8 warps x 2 records per
//     scope is measurable.
//   INSTR_MODE_DIRECT: lane 0 stores every record straight to global memory (the original design).
// Every thread of a warp must call begin/enter/exit/end in warp-uniform control flow (they already
// had to: end() is called by every thread).  With ENABLED = false every member is an empty inline
// function and the kernel compiles to the uninstrumented code.
#pragma once
#include <cstdint>
#include <type_traits>

#define INSTR_MAGIC 0x54534E49u
#define INSTR_BLOCK_HEADER_WORDS 16
#define INSTR_WARP_HEADER_WORDS 4
#define INSTR_RECORD_WORDS 2
#define INSTR_END_FLAG 0x80000000u
#define INSTR_FLAG_GLOBALTIMER 1u
#define INSTR_MODE_DIRECT 0
#define INSTR_MODE_STAGED 1
#define INSTR_MODE_WARP0 2
// Diagnostic bits, or-ed into a mode, to take the header apart in timing runs (native/instr_diag.py); the
// buffer they leave is not decodable:
#define INSTR_DIAG_NOSTORE 0x10u   // end() stores nothing to global memory (no headers, no records)
#define INSTR_DIAG_NOGTIME 0x20u   // no %globaltimer reads (block start / end stamps 0)
#define INSTR_DIAG_NORECORD 0x40u  // enter() / exit() record nothing (begin / end only)
#define INSTR_MODE_BASE(m) ((m) & 0xF)

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
// MAX_WARPS: warps per block the shared-memory batches are sized for (blocks of up to 32*MAX_WARPS threads).
// FLAT: the kernel's blocks are 1-D and its grid at most 2-D (every kernel of native/): thread, warp and block
// ids from threadIdx.x / blockIdx.x,y only -- begin() runs before the kernel's first loads, so its few dozen
// instructions of 3-D index arithmetic delay every block (native/NOTES.md section 12).
template <bool ENABLED, bool USE_GLOBALTIMER = false, int MODE = INSTR_MODE_STAGED, int MAX_WARPS = 8,
          int BATCH = 16, bool FLAT = false>
struct Profiler {
  static_assert(BATCH >= 1 && BATCH <= 32 && (BATCH & (BATCH - 1)) == 0, "BATCH: a power of two <= 32");
  static constexpr bool STAGED = INSTR_MODE_BASE(MODE) != INSTR_MODE_DIRECT;
  static constexpr bool NOSTORE = MODE & INSTR_DIAG_NOSTORE, NOGTIME = MODE & INSTR_DIAG_NOGTIME,
                        NORECORD = MODE & INSTR_DIAG_NORECORD;

  struct Shared {
    uint2 rec[MAX_WARPS][BATCH];   // staged records (tag, stamp)
    uint32_t *whead[MAX_WARPS];    // each warp's header in the global buffer (computed once, in begin())
    uint32_t begin_stamp[MAX_WARPS];
    unsigned long long clock0, gtime0;
    uint32_t bid;                  // linear block id (the block header's word 1)
  };
  __device__ __forceinline__ static Shared &shared() {
    __shared__ Shared s;
    return s;
  }

  uint32_t *buffer = nullptr;
  uint32_t capacity = 0;
  uint32_t count = 0;
  uint32_t begin_stamp = 0;     // DIRECT mode keeps it in a register
  bool recording = false;       // this warp records (all warps, or warp 0 in WARP0 mode)

  __device__ __forceinline__ uint32_t stamp() const {
    if constexpr (USE_GLOBALTIMER) {
      return (uint32_t)globaltimer();
    } else {
      return (uint32_t)clock();
    }
  }

  __device__ __forceinline__ static uint32_t tid_() {
    if constexpr (FLAT) return threadIdx.x;
    else return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  }
  __device__ __forceinline__ static uint32_t nwarps_() {
    if constexpr (FLAT) return (blockDim.x + 31) / 32;
    else return (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
  }
  __device__ __forceinline__ static uint64_t bid_() {
    if constexpr (FLAT) return blockIdx.x + (uint64_t)gridDim.x * blockIdx.y;
    else return blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
  }
  __device__ __forceinline__ uint32_t *block_base() const { return buffer + bid_() * block_words(nwarps_(), capacity); }
  // The warp's header: computed once in begin() (64-bit block offset from the 3-D block id and block size) and
  // kept in shared memory, so end() -- on every block's critical path -- loads it instead of recomputing it
  // (the recomputation was ~100 dependent instructions per warp at the end of each block).
  __device__ __forceinline__ static uint32_t *warp_header(uint32_t warp) { return shared().whead[warp]; }

  // Call once per block, by every thread, before the first scope. Nothing is stored to global memory here.
  __device__ __forceinline__ void begin(uint32_t *buf, uint32_t cap) {
    if constexpr (ENABLED) {
      buffer = buf;
      capacity = cap;
      count = 0;
      const uint32_t tid = tid_(), warp = tid / 32;
      recording = INSTR_MODE_BASE(MODE) != INSTR_MODE_WARP0 || warp == 0;
      if (tid == 0) {  // clocks of the block start (the header is written in end())
        shared().clock0 = clock();
        shared().gtime0 = NOGTIME ? 0ull : globaltimer();
        shared().bid = (uint32_t)bid_();
      }
      // every lane computes it (block-uniform terms on the uniform datapath, no branch around it), lane 0 stores it
      // (32-bit words per warp and per block -- a buffer region of < 2^32 words per block, i.e. capacity < 2^26
      // records per warp -- and one 64-bit product for the block's offset)
      const uint32_t ww = INSTR_WARP_HEADER_WORDS + cap * INSTR_RECORD_WORDS;
      uint32_t *const wh = buf + (uint64_t)(uint32_t)bid_() * (INSTR_BLOCK_HEADER_WORDS + nwarps_() * ww) +
                           (INSTR_BLOCK_HEADER_WORDS + warp * ww);
      if ((tid & 31) == 0) shared().whead[warp] = wh;
      const uint32_t s = stamp();
      if constexpr (STAGED) {
        if ((tid & 31) == 0) shared().begin_stamp[warp] = s;
      } else {
        begin_stamp = s;
      }
    }
  }

  // copy the last n staged records of this warp to their global slots (all lanes of the warp)
  __device__ __forceinline__ void flush_batch(uint32_t n) {
    __syncwarp();
    const uint32_t lane = tid_() & 31, warp = tid_() / 32;
    const uint32_t first = count - n;  // record index of the first staged record
    // when n > capacity only the newest `capacity` records survive: the others are not written, so no
    // two lanes of one store target the same slot
    if (!NOSTORE && lane < n && lane + capacity >= n) {  // (the __syncwarp above also publishes whead)
      const uint2 r = shared().rec[warp][(first + lane) & (BATCH - 1)];
      store2(warp_header(warp) + INSTR_WARP_HEADER_WORDS + (uint64_t)((first + lane) % capacity) * INSTR_RECORD_WORDS,
             r.x, r.y);
    }
    __syncwarp();
  }

  __device__ __forceinline__ void record(uint32_t tag) {
    if constexpr (ENABLED && !NORECORD) {
      if (!recording) return;
      const uint32_t t = stamp();
      const uint32_t tid = tid_();
      if constexpr (STAGED) {
        if ((tid & 31) == 0) shared().rec[tid / 32][count & (BATCH - 1)] = make_uint2(tag, t);
        ++count;
        if ((count & (BATCH - 1)) == 0) flush_batch(BATCH);
      } else {
        if ((tid & 31) == 0)
          store2(warp_header(tid / 32) + INSTR_WARP_HEADER_WORDS + (uint64_t)(count % capacity) * INSTR_RECORD_WORDS,
                 tag, t);
        ++count;
      }
    }
  }

  __device__ __forceinline__ void enter(uint32_t scope_id) { record(scope_id & ~INSTR_END_FLAG); }
  __device__ __forceinline__ void exit(uint32_t scope_id) { record(scope_id | INSTR_END_FLAG); }

  // Call once per block, by every thread, after the last scope (no early returns in between).
  // No barrier: each warp finishes on its own; warp 0 writes the block header when it ends.
  __device__ __forceinline__ void end() {
    if constexpr (ENABLED) {
      const uint32_t tid = tid_(), lane = tid & 31, warp = tid / 32;
      bool header_done = false;
      if constexpr (STAGED) {
        if (count < BATCH && count <= capacity) {
          // Short scopes (softmax / layer_norm: 6 records per warp; every non-recording warp of WARP0
          // mode: 0): nothing was flushed yet, so the warp header and every record are one contiguous
          // run of 8-byte words -- lanes 0, 1 the header, lanes 2.. records 0.. (slot = index, as
          // count <= capacity) -- written by a single coalesced store instead of a batch flush plus two
          // header stores.  The words written are the same as on the general path below.
          __syncwarp();  // lane 0's staged records become visible to the other lanes
          const uint32_t e = stamp();
          uint2 v = make_uint2(warp, count);
          if (lane == 1) v = make_uint2(shared().begin_stamp[warp], e);
          if (lane >= 2 && lane < count + 2) v = shared().rec[warp][lane - 2];
          if (!NOSTORE && lane < count + 2) store2(warp_header(warp) + 2 * lane, v.x, v.y);
          header_done = true;
        } else if (!NOSTORE && recording && (count & (BATCH - 1))) {
          flush_batch(count & (BATCH - 1));
        }
      }
      if (!header_done) {
        const uint32_t e = stamp();
        if (!NOSTORE && lane == 0) {
          uint32_t *wh = warp_header(warp);
          const uint32_t b = STAGED ? shared().begin_stamp[warp] : begin_stamp;
          reinterpret_cast<uint2 *>(wh)[0] = make_uint2(warp, count);
          reinterpret_cast<uint2 *>(wh)[1] = make_uint2(b, e);
        }
      }
      if (warp == 0) {  // block header: 8 x 8 bytes, one per lane of warp 0
        __syncwarp();   // lane 0's begin() writes of clock0 / gtime0 become visible to the other lanes
        const uint64_t c = clock();
        const uint64_t g = NOGTIME ? 0ull : globaltimer();
        const uint64_t c0 = shared().clock0, g0 = shared().gtime0;
        uint2 v = make_uint2(0u, 0u);
        switch (lane) {
          case 0: v = make_uint2(INSTR_MAGIC, shared().bid); break;
          case 1: v = make_uint2(smid(), nwarps_()); break;
          case 2: v = make_uint2(capacity, USE_GLOBALTIMER ? INSTR_FLAG_GLOBALTIMER : 0u); break;
          case 3: v = make_uint2((uint32_t)c0, (uint32_t)(c0 >> 32)); break;
          case 4: v = make_uint2((uint32_t)c, (uint32_t)(c >> 32)); break;
          case 5: v = make_uint2((uint32_t)g0, (uint32_t)(g0 >> 32)); break;
          case 6: v = make_uint2((uint32_t)g, (uint32_t)(g >> 32)); break;
          default: break;
        }
        if (!NOSTORE && lane < 8) reinterpret_cast<uint2 *>(warp_header(0) - INSTR_BLOCK_HEADER_WORDS)[lane] = v;
      }
    }
  }
};

// Host side: f(std::integral_constant<int, M>{}) for the mode M among MODES that equals `mode`; false if none.
// The launchers instantiate their instrumented kernels for exactly these modes.
template <int... MODES, class F>
inline bool with_mode(int mode, F &&f) {
  return ((mode == MODES ? (f(std::integral_constant<int, MODES>{}), true) : false) || ...);
}
#define INSTR_LAUNCH_MODES                                                                                 \
  INSTR_MODE_STAGED, INSTR_MODE_WARP0, INSTR_MODE_DIRECT, INSTR_MODE_STAGED | INSTR_DIAG_NOSTORE,         \
      INSTR_MODE_STAGED | INSTR_DIAG_NOGTIME, INSTR_MODE_STAGED | INSTR_DIAG_NORECORD,                    \
      INSTR_MODE_STAGED | INSTR_DIAG_NOSTORE | INSTR_DIAG_NOGTIME | INSTR_DIAG_NORECORD

// The Profiler of native/'s kernels: 1-D blocks, grids of at most 2 dimensions.
template <bool ENABLED, int MODE = INSTR_MODE_STAGED, int MAX_WARPS = 8>
using FlatProfiler = Profiler<ENABLED, false, MODE, MAX_WARPS, 16, true>;

// RAII helper: instr::Scope<P> s(prof, ID); ... exits at the end of the C++ scope.
template <typename P>
struct Scope {
  P &p;
  uint32_t id;
  __device__ __forceinline__ Scope(P &prof, uint32_t scope_id) : p(prof), id(scope_id) { p.enter(id); }
  __device__ __forceinline__ ~Scope() { p.exit(id); }
};

}  // namespace instr
