/*
 * The real NCCL functions behind our hooks, looked up once per symbol and cached:
 * dlsym(RTLD_NEXT, name), else the already-loaded libnccl.so.2 (dlopen RTLD_NOLOAD) —
 * the second path covers an NCCL that an RTLD_LOCAL dlopen put outside the global
 * scope (RTLD_NEXT can't see it). A function that is still missing makes the hook
 * return ncclInternalError with one log line; it is looked up again next call (the
 * application may load NCCL later).
 */
#ifndef C4D_SHIM_REAL_NCCL_H
#define C4D_SHIM_REAL_NCCL_H

#include <atomic>

#include "c4d/nccl_abi.h"

namespace c4d {

void* real_lookup(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self);

/* Fast path: one acquire load. */
inline void* real_fn(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self) {
  void* p = cache->load(std::memory_order_acquire);
  return p ? p : real_lookup(cache, logged, name, self);
}

/* Query functions we call but do not hook; ncclInternalError when missing. */
ncclResult_t real_comm_count(ncclComm_t comm, int* count);
ncclResult_t real_comm_user_rank(ncclComm_t comm, int* rank);
ncclResult_t real_comm_cu_device(ncclComm_t comm, int* device);
ncclResult_t real_comm_get_async_error(ncclComm_t comm, ncclResult_t* async_error);
int real_nccl_version();  // 0 unknown

}  // namespace c4d

/* Declares `real`, the original of `name` (a hooked function of nccl_abi.h), or
 * returns ncclInternalError from the hook when NCCL lacks it. */
#define C4D_ORIGINAL(name)                                                                                  \
  static std::atomic<void*> c4d_real_cache_;                                                                \
  static std::atomic<bool> c4d_real_logged_;                                                                \
  auto real = reinterpret_cast<decltype(&name)>(                                                            \
      ::c4d::real_fn(&c4d_real_cache_, &c4d_real_logged_, #name, reinterpret_cast<const void*>(&name)));    \
  if (!real) return ncclInternalError

#endif  // C4D_SHIM_REAL_NCCL_H
