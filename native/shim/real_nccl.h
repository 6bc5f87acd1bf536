/*
 * The real NCCL functions behind our hooks, looked up once per symbol and cached, in order:
 *   1. dlsym(RTLD_NEXT, name): a libnccl.so.2 in the global scope (PyPI PyTorch wheels);
 *   2. the already-loaded libnccl.so.2 (dlopen RTLD_NOLOAD): one an RTLD_LOCAL dlopen put
 *      outside the global scope;
 *   3. the NCCL object bound before (other names of the same NCCL);
 *   4. the calling object (dladdr on the hook's return address): NCCL linked into the
 *      library that calls it, loaded RTLD_LOCAL (a source build of PyTorch);
 *   5. every loaded object (dl_iterate_phdr).
 * Steps 2-5 prefer NCCL's pnccl* alias, which nobody interposes. The first time an NCCL
 * object is bound, one line names its file and ncclGetVersion. A function still missing
 * makes the hook return ncclInternalError with one log line; it is looked up again next
 * call (the application may load NCCL later).
 */
#ifndef C4D_SHIM_REAL_NCCL_H
#define C4D_SHIM_REAL_NCCL_H

#include <atomic>

#include "c4d/nccl_abi.h"

namespace c4d {

void* real_lookup(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self,
                  const void* caller);

/* Fast path: one acquire load. `caller`: an address in the object that called the hook. */
inline void* real_fn(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self,
                     const void* caller) {
  void* p = cache->load(std::memory_order_acquire);
  return p ? p : real_lookup(cache, logged, name, self, caller);
}

/* dlopen handle of the first NCCL object bound (null before): the CUDA runtime may be
 * linked into the same library (cuda_rt.cc looks there too). */
void* real_nccl_handle();

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
  auto real = reinterpret_cast<decltype(&name)>(::c4d::real_fn(&c4d_real_cache_, &c4d_real_logged_, #name,      \
                                                                reinterpret_cast<const void*>(&name),         \
                                                                __builtin_return_address(0)));                \
  if (!real) return ncclInternalError

#endif  // C4D_SHIM_REAL_NCCL_H
