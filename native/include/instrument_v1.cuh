// instrument_v1.cuh -- the previous staged design of instr::Profiler (git f511e0a), kept only so that one timing
// run can put it beside the current one (mode bit INSTR_OPT_V1, native_kernels "staged_v1"; instrument.cuh says
// what changed).  Same buffer layout and words.  Delete this file, INSTR_OPT_V1 and "staged_v1" once measured.
// Included by instrument.cuh only (it uses that header's macros and helpers).
#pragma once

namespace instr {
namespace v1 {

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

  __device__ __forceinline__ uint32_t stamp() const { return stamp32<USE_GLOBALTIMER>(); }

  __device__ __forceinline__ static uint32_t tid_() { return Ids<FLAT>::tid(); }
  __device__ __forceinline__ static uint32_t nwarps_() { return Ids<FLAT>::nwarps(); }
  __device__ __forceinline__ static uint64_t bid_() { return Ids<FLAT>::bid(); }
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

  __device__ __forceinline__ void enter(uint32_t scope_id) { record(enter_tag(scope_id)); }
  __device__ __forceinline__ void exit(uint32_t scope_id) { record(exit_tag(scope_id)); }
  __device__ __forceinline__ void next(uint32_t from, uint32_t to) { record(next_tag(from, to)); }

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

}  // namespace v1
}  // namespace instr
