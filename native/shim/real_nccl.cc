#include "real_nccl.h"

#include <dlfcn.h>

#include "log.h"

namespace c4d {

void* real_lookup(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p || p == self) {
    p = nullptr;
    if (void* lib = dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL)) {
      p = dlsym(lib, name);
      if (p == self) p = nullptr;
      dlclose(lib);  // NOLOAD took a reference on a library that stays loaded anyway
    }
  }
  if (p) {
    cache->store(p, std::memory_order_release);
  } else if (logged && !logged->exchange(true, std::memory_order_relaxed)) {
    log_write(kError, "%s: not found in the loaded NCCL; returning ncclInternalError", name);
  }
  return p;
}

namespace {
template <typename F>
F lookup(std::atomic<void*>* cache, const char* name) {
  return reinterpret_cast<F>(real_fn(cache, nullptr, name, nullptr));
}
std::atomic<void*> g_count_fn, g_rank_fn, g_device_fn, g_version_fn, g_async_fn;
}  // namespace

ncclResult_t real_comm_count(ncclComm_t comm, int* count) {
  auto f = lookup<decltype(&ncclCommCount)>(&g_count_fn, "ncclCommCount");
  return f ? f(comm, count) : ncclInternalError;
}

ncclResult_t real_comm_user_rank(ncclComm_t comm, int* rank) {
  auto f = lookup<decltype(&ncclCommUserRank)>(&g_rank_fn, "ncclCommUserRank");
  return f ? f(comm, rank) : ncclInternalError;
}

ncclResult_t real_comm_cu_device(ncclComm_t comm, int* device) {
  auto f = lookup<decltype(&ncclCommCuDevice)>(&g_device_fn, "ncclCommCuDevice");
  return f ? f(comm, device) : ncclInternalError;
}

ncclResult_t real_comm_get_async_error(ncclComm_t comm, ncclResult_t* async_error) {
  auto f = lookup<decltype(&ncclCommGetAsyncError)>(&g_async_fn, "ncclCommGetAsyncError");
  return f ? f(comm, async_error) : ncclInternalError;
}

int real_nccl_version() {
  auto f = lookup<decltype(&ncclGetVersion)>(&g_version_fn, "ncclGetVersion");
  int v = 0;
  if (!f || f(&v) != ncclSuccess) return 0;
  return v;
}

}  // namespace c4d
