/*
 * What the shim's pool stress tests share: a CUDA runtime of counters (no GPU: an event is
 * only a name here, a number from 1) with the definitions the shim's pool sources need, and
 * the start-up of an op pool and two devices' event pools on it. Include once per program.
 */
#ifndef C4D_SHIM_TESTS_POOL_HARNESS_H
#define C4D_SHIM_TESTS_POOL_HARNESS_H

#include <stdint.h>
#include <stdio.h>

#include <atomic>

#include "cuda_rt.h"
#include "event_pool.h"
#include "op_pool.h"

namespace c4d {
CudaRt g_cuda;
int cuda_current_device() { return 0; }
}  // namespace c4d

namespace counting_cuda {

inline std::atomic<int> g_made{0};  // events created

inline int create(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(uintptr_t(g_made.fetch_add(1) + 1));
  return C4D_CUDA_SUCCESS;
}
inline int set_device(int) { return C4D_CUDA_SUCCESS; }

inline int fail(const char* what) {
  printf("FAIL: %s\n", what);
  return 1;
}

/* The counting runtime in place, `slots` op slots, `events` events on each of devices 0
 * and 1. The op pool first, as in the shim: event pools size their kept lists by it. */
inline bool start(uint32_t slots, uint32_t events) {
  c4d::g_cuda.ok = true;
  c4d::g_cuda.eventCreateWithFlags = create;
  c4d::g_cuda.setDevice = set_device;
  const char* missing = !c4d::g_ops.init(slots)                                              ? "op pool"
                        : !c4d::event_pool_ensure(0, events) || !c4d::event_pool_ensure(1, events) ? "pools"
                                                                                                   : nullptr;
  if (missing) fail(missing);
  return !missing;
}

}  // namespace counting_cuda

#endif  // C4D_SHIM_TESTS_POOL_HARNESS_H
