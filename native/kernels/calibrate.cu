// Calibration kernel: every warp spins `spin_cycles` SM cycles (clock64) inside scope 0 ("spin").
// The decoded scope length must equal spin_cycles (plus the few cycles of one clock read).
#include <cuda_runtime.h>
#include "instrument.cuh"
#include "launchers.h"

namespace {
template <bool PROF, int MODE = INSTR_MODE_STAGED>
__global__ void calibrate_kernel(uint64_t spin_cycles, unsigned long long *sink, uint32_t *prof_buf, uint32_t cap) {
  instr::FlatProfiler<PROF, MODE, 32> prof;  // up to 1024 threads
  prof.begin(prof_buf, cap);
  prof.enter(0);
  const uint64_t t0 = instr::clock();
  uint64_t t = t0;
  unsigned long long spins = 0;
  while (t - t0 < spin_cycles) {
    t = instr::clock();
    ++spins;
  }
  prof.exit(0);
  prof.end();
  if (threadIdx.x == 0 && spins == 0xFFFFFFFFFFFFFFFFull) sink[blockIdx.x] = spins;  // keep the loop alive
}
}  // namespace

int native_calibrate(uint64_t spin_cycles, int blocks, int threads, unsigned long long *sink, uint32_t *prof,
                     uint32_t capacity, int mode, void *stream) {
  if (threads < 1 || threads > 1024) return (int)cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  if (!prof) {
    calibrate_kernel<false><<<blocks, threads, 0, s>>>(spin_cycles, sink, nullptr, 0);
  } else if (!instr::capacity_ok(capacity) || !instr::with_mode<INSTR_LAUNCH_MODES>(mode, [&](auto m) {
               calibrate_kernel<true, decltype(m)::value><<<blocks, threads, 0, s>>>(spin_cycles, sink, prof, capacity);
             })) {
    return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
