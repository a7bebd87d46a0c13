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
//   then per warp w (INSTR_WARP_HEADER_WORDS = 8 words + capacity records):
//     [0] warp id   [1] total records written by the warp (may exceed capacity)
//     [2] low 32 bits of the stamp at begin()   [3] low 32 bits of the stamp at end()   [4..7] reserved (0)
//   (a multiple of 4 records per warp -- the launchers refuse others -- keeps every warp header and every 4 slots
//   on one 32-byte sector: the STAGED / WARP0 stores write whole sectors, which L2 takes without reading the
//   sector from DRAM first; a partial sector's write missed L2 and waited for that read: native/NOTES.md section 17)
//   (the block's end time in [8..9] / [12..13] is warp 0's end: end() has no block barrier)
//     records, INSTR_RECORD_WORDS = 2 words each:
//       word0 = scope id (bits 0..29) | end flag (bit 31: 1 = exit, 0 = enter), or a transition (bit 30 set, bit 31
//               clear): bits 0..14 the scope entered, bits 15..29 the scope left at the same stamp (next(): one
//               record where exit(a); enter(b) took two; the decoder expands it into those two)
//       word1 = low 32 bits of the stamp (clock64 or %globaltimer)
//     Record i of a warp goes to slot i % capacity (circular buffer): when total > capacity the
//     oldest total - capacity records were overwritten; the decoder reports them as dropped.
//
// Modes (template parameter MODE; the buffer layout is the same in every mode):
//   INSTR_MODE_STAGED (default): records are batched BATCH (16) at a time per warp: lane 4 + i of the warp
//     holds record i of the current batch in registers (or lane 0 stages the batch in shared memory:
//     SHARED_BATCH); every BATCH records, and at end(), the batch goes to the global buffer with one
//     store per lane (consecutive slots).  A record costs a clock read and a predicated register move.
//     A warp with fewer than BATCH records in all (short kernels) writes its header and records at end()
//     with one coalesced store (lanes 0-3 header, lanes 4.. records, padded with zero records to whole sectors).
//   INSTR_MODE_WARP0: the same, but only warp 0 of each block records; the other warps branch around every
//     record and end() and write nothing (their warp headers stay zero -- the launcher zeroes the buffer --
//     which the decoder reads as 0 records): for short kernels, where the header's instructions are the cost.
//   Transition records (next(a, b): exit a and enter b at one stamp, one slot) halve a loop's records.
//   INSTR_MODE_DIRECT: lane 0 stores every record straight to global memory (the original design;
//     v1::Profiler, instrument_v1.cuh).
//   | INSTR_OPT_V1: the previous STAGED / WARP0 design (v1::Profiler), for an A/B timing run.
// Every thread of a warp must call begin/enter/exit/end in warp-uniform control flow (they already
// had to: end() is called by every thread).  With ENABLED = false every member is an empty inline
// function and the kernel compiles to the uninstrumented code.
#pragma once
#include <cstdint>
#include <type_traits>

#define INSTR_MAGIC 0x54534E49u
#define INSTR_BLOCK_HEADER_WORDS 16
#define INSTR_WARP_HEADER_WORDS 8
#define INSTR_RECORD_WORDS 2
#define INSTR_END_FLAG 0x80000000u
#define INSTR_NEXT_FLAG 0x40000000u
// records per warp of a profile buffer: at least one register batch (the launchers refuse less), so that a batch's
// slots wrap the circular buffer at most once (record_offset: one compare and subtract)
#define INSTR_MIN_CAPACITY 16
// ... and a multiple of this many (one 32-byte sector of records)
#define INSTR_CAPACITY_ALIGN 4
#define INSTR_FLAG_GLOBALTIMER 1u
#define INSTR_MODE_DIRECT 0
#define INSTR_MODE_STAGED 1
#define INSTR_MODE_WARP0 2
// Diagnostic bits, or-ed into a mode, to take the header apart in timing runs (native/instr_diag.py); the
// buffer they leave is not decodable:
#define INSTR_DIAG_NOSTORE 0x10u   // no global stores (v1: left out; now: issued predicated off, values computed)
#define INSTR_DIAG_NOGTIME 0x20u   // no %globaltimer reads (block start / end stamps 0)
#define INSTR_DIAG_NORECORD 0x40u  // enter() / exit() record nothing (begin / end only)
// Option bit, or-ed into a mode: the previous design (v1::Profiler, instrument_v1.cuh: shared-memory batches, warp
// header address and block-start clocks stored to shared memory in begin()), for one A/B timing run beside this
// one; the same buffer and words, so it decodes like the mode it is or-ed into.
#define INSTR_OPT_V1 0x100u
#define INSTR_MODE_BASE(m) ((m) & 0xF)

namespace instr {

// Record tags (word0): enter / exit of a scope (ids < 2^30), and a transition: leave `from`, enter `to` at one stamp
// (ids < 2^15).  A kernel whose next record is one of two, decided at run time, selects the tag (one select, no
// branch: `prof.record(last ? exit_tag(A) : next_tag(A, B))`).
__host__ __device__ constexpr uint32_t enter_tag(uint32_t id) { return id & ~(INSTR_END_FLAG | INSTR_NEXT_FLAG); }
__host__ __device__ constexpr uint32_t exit_tag(uint32_t id) { return (id & ~INSTR_NEXT_FLAG) | INSTR_END_FLAG; }
__host__ __device__ constexpr uint32_t next_tag(uint32_t from, uint32_t to) {
  return INSTR_NEXT_FLAG | (from & 0x7FFFu) << 15 | (to & 0x7FFFu);
}

// Records per warp a launcher accepts (it refuses the launch otherwise): at least one register batch, in whole sectors.
__host__ __device__ constexpr bool capacity_ok(uint32_t capacity) {
  return capacity >= INSTR_MIN_CAPACITY && capacity % INSTR_CAPACITY_ALIGN == 0;
}

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

// The low 32 bits of a record's stamp: %globaltimer (ns) or the SM cycle counter (both Profiler designs).
template <bool GT>
__device__ __forceinline__ uint32_t stamp32() {
  if constexpr (GT) return (uint32_t)globaltimer();
  else return (uint32_t)clock();
}

// Thread, warp-count and linear block ids (both designs). FLAT: 1-D blocks and grids of at most 2 dimensions.
template <bool FLAT>
struct Ids {
  __device__ __forceinline__ static uint32_t tid() {
    if constexpr (FLAT) return threadIdx.x;
    else return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  }
  __device__ __forceinline__ static uint32_t nwarps() {
    if constexpr (FLAT) return (blockDim.x + 31) / 32;
    else return (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
  }
  __device__ __forceinline__ static uint64_t bid() {
    if constexpr (FLAT) return blockIdx.x + (uint64_t)gridDim.x * blockIdx.y;
    else return blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
  }
};

// USE_GLOBALTIMER: stamp records with %globaltimer (ns) instead of the SM cycle counter.
// MAX_WARPS: warps per block the SHARED_BATCH records are sized for (blocks of up to 32*MAX_WARPS threads).
// FLAT: the kernel's blocks are 1-D and its grid at most 2-D (every kernel of native/): thread, warp and block
// ids from threadIdx.x / blockIdx.x,y only (the 3-D index arithmetic is a few dozen instructions more).
// SHARED_BATCH: the current batch waits in shared memory (lane 0 stores each record there, v1's way) instead of
// in registers: for a kernel at its register cap (layer_norm, __maxnreg__(80): the held stamp spilled).
//
// Why it looks like this (native/NOTES.md section 14).  On the short kernels (8192 one-row blocks in 15-20 waves)
// every instruction begin() issues before the kernel's first load delays every block, and every one after the
// kernel's last store holds the block's slot; and a branch ends ptxas's scheduling region (v1's `if (tid == 0)`
// in begin() kept the kernel's own address arithmetic below it: first load at instruction 91 against the plain
// kernel's 45).  So begin() reads the two clocks and nothing else (warp-uniform, into uniform registers: no
// shared memory, no branch); a record is a clock read and a predicated register move (lane 4 + i holds record i
// of the current batch); a full batch is one store per lane straight from those registers; end() computes the
// warp header's address and stores header + unflushed records with one store per lane, and warp 0 the block
// header with one more, from registers (no __syncwarp, no shared loads, no switch over lanes, no division).
// Modes STAGED and WARP0; a DIRECT FlatProfiler is v1::Profiler (the design DIRECT was measured with).
template <bool ENABLED, bool USE_GLOBALTIMER = false, int MODE = INSTR_MODE_STAGED, int MAX_WARPS = 8,
          int BATCH = 16, bool FLAT = false, bool SHARED_BATCH = false>
struct Profiler {
  // lanes HEAD .. HEAD + BATCH - 1 hold a batch; capacity >= INSTR_MIN_CAPACITY >= BATCH; a full batch is whole sectors
  static_assert(BATCH >= INSTR_CAPACITY_ALIGN && BATCH <= INSTR_MIN_CAPACITY && (BATCH & (BATCH - 1)) == 0,
                "BATCH: a power of two, 4 .. 16");
  // lanes of end()'s store that write the warp header (one 8-byte pair each); lane HEAD + i holds record i of a batch
  static constexpr uint32_t HEAD = INSTR_WARP_HEADER_WORDS / 2;
  static_assert(INSTR_MODE_BASE(MODE) != INSTR_MODE_DIRECT, "DIRECT: v1::Profiler");
  static constexpr bool NOSTORE = MODE & INSTR_DIAG_NOSTORE, NOGTIME = MODE & INSTR_DIAG_NOGTIME,
                        NORECORD = MODE & INSTR_DIAG_NORECORD;
  static_assert(!(USE_GLOBALTIMER && NOGTIME), "NOGTIME: clock64 stamps only");

  uint32_t *buffer = nullptr;
  uint32_t capacity = 0;
  uint32_t count = 0;               // records of this warp so far
  uint32_t slot0 = 0;               // slot of the current batch's first record: (count - count % BATCH) % capacity
  uint32_t clock0 = 0, gtime0 = 0;  // low 32 bits of clock64 / %globaltimer at begin()
  uint2 held = make_uint2(0u, 0u);  // lane HEAD + i: record i of the current batch (tag, stamp)

  __device__ __forceinline__ static uint2 (&shared_batch())[MAX_WARPS][BATCH] {
    __shared__ uint2 rec[MAX_WARPS][BATCH];
    return rec;
  }
  __device__ __forceinline__ uint32_t stamp() const { return stamp32<USE_GLOBALTIMER>(); }

  __device__ __forceinline__ static uint32_t tid_() { return Ids<FLAT>::tid(); }
  __device__ __forceinline__ static uint32_t lane_() { return tid_() & 31; }
  __device__ __forceinline__ static uint32_t warp_() { return tid_() / 32; }
  __device__ __forceinline__ static uint32_t nwarps_() { return Ids<FLAT>::nwarps(); }
  __device__ __forceinline__ static uint64_t bid_() { return Ids<FLAT>::bid(); }
  // WARP0 mode: only warp 0 records; the other warps branch around every record and around end() (they write
  // nothing: their warp headers stay as the launcher zeroed them, 0 records), so they issue ~2 instructions per
  // record site instead of the record -- on the short kernels, which are issue-bound, the instructions are the cost.
  static constexpr bool WARP0 = INSTR_MODE_BASE(MODE) == INSTR_MODE_WARP0;
  __device__ __forceinline__ static bool recording_() { return !WARP0 || warp_() == 0; }
  // The warp's header in the buffer: 32-bit words per warp and per block (a region of < 2^32 words per block, i.e.
  // capacity < 2^26 records per warp) and one 64-bit product for the block's offset.  Computed where it is used
  // (end(), a flush): in begin() it would delay the first loads or hold two registers through the kernel.
  __device__ __forceinline__ uint32_t *warp_header() const {
    const uint32_t ww = INSTR_WARP_HEADER_WORDS + capacity * INSTR_RECORD_WORDS;
    return buffer + (uint64_t)(uint32_t)bid_() * (INSTR_BLOCK_HEADER_WORDS + nwarps_() * ww) +
           (INSTR_BLOCK_HEADER_WORDS + warp_() * ww);
  }
  // INSTR_DIAG_NOSTORE keeps the stores and everything they store, predicated off at run time (the launchers never
  // pass a null buffer): that mode differs from its base by the stores' memory traffic only
  __device__ __forceinline__ void put(uint32_t *p, uint2 v) const {
    if (!NOSTORE || buffer == nullptr) store2(p, v.x, v.y);
  }
  // the record this lane holds (lane HEAD + i: record i of the current batch)
  __device__ __forceinline__ uint2 held_() const {
    if constexpr (SHARED_BATCH) {
      __syncwarp();  // lane 0's shared stores become visible to the other lanes
      return shared_batch()[warp_()][(lane_() - HEAD) & (BATCH - 1)];
    } else {
      return held;
    }
  }

  // Call once per block, by every thread, before the first scope.  Two clock reads into registers, nothing else
  // (every lane reads them; warp 0's become the block header's start values in end()).
  __device__ __forceinline__ void begin(uint32_t *buf, uint32_t cap) {
    if constexpr (ENABLED) {
      clock0 = (uint32_t)clock();
      gtime0 = NOGTIME ? 0u : (uint32_t)globaltimer();
      buffer = buf;
      capacity = cap;
    }
  }

  // Word offset from the warp header of the slot of lane HEAD + i (record i of the current batch): slot (slot0 + i) %
  // capacity without a division -- capacity >= INSTR_MIN_CAPACITY >= BATCH (the launchers refuse less), so the slots
  // of one batch wrap the buffer at most once; i = lane - HEAD (the header lanes: a large value).
  __device__ __forceinline__ uint32_t record_offset(uint32_t i) const {
    uint32_t s = slot0 + (i & (BATCH - 1));
    if (s >= capacity) s -= capacity;
    return INSTR_WARP_HEADER_WORDS + s * INSTR_RECORD_WORDS;
  }
  // a full batch: lanes HEAD .. HEAD + BATCH - 1 store their records (consecutive slots, one store per lane: whole
  // sectors, since slot0 and capacity are multiples of 4)
  __device__ __forceinline__ void flush() {
    const uint32_t i = lane_() - HEAD;
    const uint2 h = held_();
    if (i < BATCH) put(warp_header() + record_offset(i), h);
    slot0 += BATCH;
    if (slot0 >= capacity) slot0 -= capacity;
  }

  __device__ __forceinline__ void record(uint32_t tag) {
    if constexpr (ENABLED && !NORECORD) {
      // (count advances in every warp: in straight-line kernels it stays a compile-time constant, so the batch
      // test folds away; a WARP0 idle warp's count is never stored)
      if (recording_()) {
        const uint32_t t = stamp();
        if constexpr (SHARED_BATCH) {
          if (lane_() == 0) shared_batch()[warp_()][count & (BATCH - 1)] = make_uint2(tag, t);
        } else {
          if (lane_() - HEAD == (count & (BATCH - 1))) held = make_uint2(tag, t);
          // the stamp's select happens here: left to the compiler it sinks to end(), its one use, and keeps every
          // stamp in a register of its own through the kernel (the tag's select may sink: constants in
          // straight-line kernels)
          asm volatile("" : "+r"(held.y));
        }
      }
      if ((++count & (BATCH - 1)) == 0 && recording_()) flush();
    }
  }

  __device__ __forceinline__ void enter(uint32_t scope_id) { record(enter_tag(scope_id)); }
  __device__ __forceinline__ void exit(uint32_t scope_id) { record(exit_tag(scope_id)); }
  // exit(from); enter(to) in one record (one clock read, one slot): where one scope ends, the next begins
  __device__ __forceinline__ void next(uint32_t from, uint32_t to) { record(next_tag(from, to)); }

  // Call once per block, by every thread, after the last scope (no early returns in between).
  // No barrier: each warp finishes on its own; warp 0 writes the block header when it ends.
  __device__ __forceinline__ void end() {
    if constexpr (ENABLED) {
      if (!recording_()) return;
      const uint64_t c = clock();
      const uint64_t g = NOGTIME ? 0ull : globaltimer();
      const uint32_t lane = lane_(), warp = warp_();
      uint32_t *const wh = warp_header();
      // One store per lane: lanes 0 .. HEAD - 1 the warp header (warp, count | begin, end stamp | 0, 0 ...), lanes
      // HEAD + i the records not flushed yet (i < n), then zero records up to a multiple of 4 -- whole 32-byte
      // sectors -- where those slots never held a record (record index count - n + i < capacity; in a ring that
      // has wrapped they hold the oldest records kept, and are left alone).  With fewer than BATCH records in all
      // (softmax / layer_norm: 4) that is one contiguous run of whole sectors from the warp header on.  The words
      // are those one store per record leaves, and zeros (decode.encode; tests/test_native.py models this store).
      // (selects, no branch: every lane computes both, so the tail is one straight run to the store)
      const uint32_t n = count & (BATCH - 1), i = lane - HEAD;
      const uint32_t roff = record_offset(i);
      const bool rec = i < n, pad = i < ((n + INSTR_CAPACITY_ALIGN - 1) & ~(INSTR_CAPACITY_ALIGN - 1)) &&
                                    count - n + i < capacity;
      const uint2 h = held_();
      const bool head = lane < HEAD;
      const uint2 v = rec ? h
                      : lane == 0 ? make_uint2(warp, count)
                      : lane == 1 ? (USE_GLOBALTIMER ? make_uint2(gtime0, (uint32_t)g)
                                                     : make_uint2(clock0, (uint32_t)c))
                                  : make_uint2(0u, 0u);
      if (head || rec || pad) put(wh + (head ? 2 * lane : roff), v);
      if (warp == 0 && lane < 8) {
        // block header, 8 x 8 bytes: lanes 3..6 the clocks, the start values widened from the low 32 bits kept since
        // begin() -- exact while the block runs < 2^32 cycles / ns, which the decoder assumes anyway (it takes every
        // stamp modulo 2^32 from the block start)
        const uint64_t c0 = c - (uint32_t)((uint32_t)c - clock0), g0 = g - (uint32_t)((uint32_t)g - gtime0);
        const uint32_t k = lane - 3u;
        const uint64_t t = k & 2 ? (k & 1 ? g : g0) : (k & 1 ? c : c0);
        uint2 h = k < 4 ? make_uint2((uint32_t)t, (uint32_t)(t >> 32)) : make_uint2(0u, 0u);
        if (lane == 0) h = make_uint2(INSTR_MAGIC, (uint32_t)bid_());
        if (lane == 1) h = make_uint2(smid(), nwarps_());
        if (lane == 2) h = make_uint2(capacity, USE_GLOBALTIMER ? INSTR_FLAG_GLOBALTIMER : 0u);
        put(wh - INSTR_BLOCK_HEADER_WORDS + 2 * lane, h);
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
      INSTR_MODE_STAGED | INSTR_DIAG_NOSTORE | INSTR_DIAG_NOGTIME | INSTR_DIAG_NORECORD,                  \
      INSTR_MODE_STAGED | INSTR_OPT_V1

}  // namespace instr
#include "instrument_v1.cuh"
namespace instr {

// The Profiler of native/'s kernels: 1-D blocks, grids of at most 2 dimensions (v1::Profiler under INSTR_OPT_V1 and in
// DIRECT mode).
template <bool ENABLED, int MODE = INSTR_MODE_STAGED, int MAX_WARPS = 8, bool SHARED_BATCH = false>
using FlatProfiler =
    std::conditional_t<(MODE & INSTR_OPT_V1) || INSTR_MODE_BASE(MODE) == INSTR_MODE_DIRECT,
                       v1::Profiler<ENABLED, false, MODE, MAX_WARPS, 16, true>,
                       Profiler<ENABLED, false, MODE, MAX_WARPS, 16, true, SHARED_BATCH>>;

// RAII helper: instr::Scope<P> s(prof, ID); ... exits at the end of the C++ scope.
template <typename P>
struct Scope {
  P &p;
  uint32_t id;
  __device__ __forceinline__ Scope(P &prof, uint32_t scope_id) : p(prof), id(scope_id) { p.enter(id); }
  __device__ __forceinline__ ~Scope() { p.exit(id); }
};

}  // namespace instr
