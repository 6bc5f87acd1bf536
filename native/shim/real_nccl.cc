#include "real_nccl.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "shim.h"

namespace c4d {

namespace {

constexpr int kBound = 8;
std::atomic<uintptr_t> g_bound[kBound];  // load bases of the NCCL objects we bound to (logged once each)
std::atomic<void*> g_bound_handle;       // the first of them, searched first for later names

/* `name` in the object loaded at path `file` (already loaded: RTLD_NOLOAD), NCCL's strong
 * alias pnccl* first (never interposed by anyone), not `self`. */
void* in_object(const char* file, const char* name, const void* self, void** handle_out) {
  if (!file || !*file) return nullptr;
  void* h = dlopen(file, RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL);
  if (!h) return nullptr;
  char pname[96];
  void* p = nullptr;
  if (snprintf(pname, sizeof pname, "p%s", name) < int(sizeof pname)) p = dlsym(h, pname);
  if (!p || p == self) p = dlsym(h, name);
  if (p == self) p = nullptr;
  if (p && handle_out) *handle_out = h;  // keeps the reference: the object stays loaded anyway
  else dlclose(h);
  return p;
}

struct PhdrSearch {
  const char* name;
  const void* self;
  const char* skip;  // our own object's path
  void* found;
  void* handle;
};

int each_object(struct dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<PhdrSearch*>(data);
  const char* file = info->dlpi_name;
  if (!file || !*file || (s->skip && !strcmp(file, s->skip))) return 0;  // the program itself, or us
  s->found = in_object(file, s->name, s->self, &s->handle);
  return s->found ? 1 : 0;
}

/* One line the first time a given NCCL object is bound: which file, which version. */
void note_bound(void* fn, const char* how, void* handle) {
  Dl_info info;
  if (!dladdr(fn, &info) || !info.dli_fbase) return;
  uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  int i = 0;
  for (; i < kBound; ++i) {
    uintptr_t cur = 0;
    if (g_bound[i].compare_exchange_strong(cur, base, std::memory_order_acq_rel)) break;  // a new one
    if (cur == base) return;  // noted before
  }
  if (i == kBound) return;  // more NCCLs than we note: bound silently
  void* h = handle;
  if (!h && info.dli_fname) h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    void* expected = nullptr;
    g_bound_handle.compare_exchange_strong(expected, h, std::memory_order_acq_rel);
  }
  int v = 0;
  auto ver = h ? reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(h, "pncclGetVersion")) : nullptr;
  if (!ver && h) ver = reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(h, "ncclGetVersion"));
  if (!ver || ver(&v) != ncclSuccess) v = 0;
  if (shim_mode() == kPassThrough) return;  // C4D_ENABLE=0: not a word
  char path[512];
  printable(info.dli_fname ? info.dli_fname : "?", path, sizeof path);
  if (v > 0)
    C4D_LOG(kInfo, "NCCL %d.%d.%d bound from %s (%s)", v / 10000, (v % 10000) / 100, v % 100, path, how);
  else
    C4D_LOG(kInfo, "NCCL (version unknown) bound from %s (%s)", path, how);
}

}  // namespace

void* real_lookup(std::atomic<void*>* cache, std::atomic<bool>* logged, const char* name, const void* self,
                  const void* caller) {
  const char* how = "RTLD_NEXT";
  void* handle = nullptr;
  void* p = dlsym(RTLD_NEXT, name);
  if (p == self) p = nullptr;
  if (!p) {  // an NCCL that an RTLD_LOCAL dlopen put outside the global scope
    how = "the loaded libnccl.so.2";
    p = in_object("libnccl.so.2", name, self, &handle);
  }
  if (!p) {  // NCCL found before, maybe inside another library
    if (void* h = g_bound_handle.load(std::memory_order_acquire)) {
      how = "the NCCL bound before";
      p = dlsym(h, name);
      if (p == self) p = nullptr;
    }
  }
  Dl_info me;
  const char* mine = dladdr(reinterpret_cast<const void*>(&real_lookup), &me) ? me.dli_fname : nullptr;
  if (!p && caller) {  // NCCL linked into the calling library (e.g. a source build of PyTorch)
    Dl_info info;
    if (dladdr(caller, &info) && info.dli_fname && (!mine || strcmp(info.dli_fname, mine) != 0)) {
      how = "the calling object";
      p = in_object(info.dli_fname, name, self, &handle);
    }
  }
  if (!p) {  // any loaded object that defines it
    how = "a loaded object";
    PhdrSearch s{name, self, mine, nullptr, nullptr};
    dl_iterate_phdr(each_object, &s);
    p = s.found;
    handle = s.handle;
  }
  if (p) {
    note_bound(p, how, handle);
    cache->store(p, std::memory_order_release);
  } else if (logged && !logged->exchange(true, std::memory_order_relaxed)) {
    log_write(kError, "%s: not found in the loaded NCCL; returning ncclInternalError", name);
  }
  return p;
}

void* real_nccl_handle() { return g_bound_handle.load(std::memory_order_acquire); }

namespace {
template <typename F>
F lookup(std::atomic<void*>* cache, const char* name) {
  return reinterpret_cast<F>(real_fn(cache, nullptr, name, nullptr, nullptr));
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
