/*
 * A CUDA runtime of counters for the shim's stress tests (no GPU: an event is only a name
 * here, a number from 1): the definitions the shim's pool sources need, and install() to
 * put it in place of the runtime cuda_rt.cc would resolve. Include once per test program.
 */
#ifndef C4D_SHIM_TESTS_COUNTING_CUDA_H
#define C4D_SHIM_TESTS_COUNTING_CUDA_H

#include <stdint.h>

#include <atomic>

#include "cuda_rt.h"

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

inline void install() {
  c4d::g_cuda.ok = true;
  c4d::g_cuda.eventCreateWithFlags = create;
  c4d::g_cuda.setDevice = set_device;
}

}  // namespace counting_cuda

#endif  // C4D_SHIM_TESTS_COUNTING_CUDA_H
