/*
 * Communicator lifecycle: unique ids, InitRank and friends, Split, Shrink, Destroy,
 * Abort, and the shared-memory plumbing (bell, data segments) the collectives use.
 * All of it runs on the calling host thread, except ensure_data/peer_data, which
 * only the stream worker executing the comm's ops calls (ops of one comm never run
 * concurrently: tickets serialize them).
 */
#include "comm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common.h"
#include "config.h"
#include "profiler.h"
#include "stream.h"

namespace sim {
namespace {

constexpr char kIdMagic[8] = {'S', 'I', 'M', 'N', 'C', 'C', 'L', '\0'};
constexpr size_t kNameMax = NCCL_UNIQUE_ID_BYTES - sizeof(kIdMagic);
constexpr int kNoColor = -1; /* NCCL_SPLIT_NOCOLOR */

std::string job_name() {
  static const std::string job = [] {
    const char* j = getenv("SIMNCCL_JOB");
    if (j && *j) {
      bool ok = strlen(j) <= 48;
      for (const char* p = j; ok && *p; ++p)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
             *p == '.' || *p == '-';
      if (ok) return std::string(j);
      logf("SIMNCCL_JOB=%s must be at most 48 of [A-Za-z0-9_.-]; using the default p%d", j, int(getpid()));
    }
    return "p" + std::to_string(getpid());
  }();
  return job;
}

std::string hex64(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

/* "/simnccl-<job>-<hex>" → "/simnccl-<job>-" */
std::string name_prefix(const std::string& name) { return name.substr(0, name.rfind('-') + 1); }

int env_global_rank() {
  const char* s = getenv("RANK");
  if (!s || !*s) return -1;
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  return (*end || v < 0 || v > (1 << 24)) ? -1 : int(v);
}

size_t ctl_size(int n) {
  size_t sz = sizeof(CtlHeader) + size_t(n) * sizeof(Member) + size_t(n) * size_t(n) * sizeof(P2PChan);
  return (sz + 4095) & ~size_t(4095);
}

void unmap_all(ncclComm* c) {
  for (auto& pm : c->peer_map)
    if (pm.first) munmap(pm.first, pm.second);
  c->peer_map.clear();
  if (c->data) munmap(c->data, c->data_len);
  c->data = nullptr;
  if (c->data_fd >= 0) close(c->data_fd);
  c->data_fd = -1;
  if (c->ctl) munmap(c->ctl, c->ctl_len);
  c->ctl = nullptr;
}

std::string data_name(const ncclComm* c, int r) { return c->name + "-d" + std::to_string(r); }

/* First half of init, into the caller's comm object: map the control segment, claim our
 * rank on `device`, create our data segment. Does not wait for peers, so one process may
 * attach several ranks. On failure c holds no mapping (the caller frees it or keeps it as
 * a failed nonblocking comm). */
ncclResult_t attach(const std::string& name, int nranks, int rank, uint64_t id, int global_rank, int device,
                    ncclComm* c) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    warnf("comm init: rank %d is not in [0, nranks=%d)", rank, nranks);
    return ncclInvalidArgument;
  }
  size_t len = ctl_size(nranks);
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) {
    warnf("comm init: shm_open(%s): %s", name.c_str(), strerror(errno));
    return ncclSystemError;
  }
  struct stat st;
  /* posix_fallocate reserves the tmpfs pages now: a full /dev/shm fails here with a
   * message, not later with SIGBUS on first touch. */
  if (fstat(fd, &st) != 0 || (size_t(st.st_size) < len && posix_fallocate(fd, 0, off_t(len)) != 0)) {
    warnf("comm init: sizing %s to %zu bytes failed (is /dev/shm full?)", name.c_str(), len);
    close(fd);
    return ncclSystemError;
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    warnf("comm init: mmap %s: %s", name.c_str(), strerror(errno));
    return ncclSystemError;
  }
  c->name = name;
  c->nranks = nranks;
  c->rank = rank;
  c->id = id;
  c->device = device;
  context_on_device(c->device); /* NCCL allocates on the caller's device at init */
  c->global_rank = global_rank >= 0 ? global_rank : rank;
  c->ctl = static_cast<CtlHeader*>(p);
  c->ctl_len = len;
  c->members = reinterpret_cast<Member*>(reinterpret_cast<char*>(p) + sizeof(CtlHeader));
  c->chans = reinterpret_cast<P2PChan*>(reinterpret_cast<char*>(c->members) + size_t(nranks) * sizeof(Member));
  c->peer_map.assign(size_t(nranks), {nullptr, 0});
  c->send_idx.assign(size_t(nranks), 0);
  c->recv_idx.assign(size_t(nranks), 0);

  int32_t expect = 0;
  if (!c->ctl->nranks.compare_exchange_strong(expect, nranks) && expect != nranks) {
    warnf("comm init: this rank says nranks=%d but a peer said %d (%s)", nranks, expect, name.c_str());
    unmap_all(c);
    return ncclInvalidUsage;
  }
  Member& me = c->members[rank];
  uint32_t zero = 0;
  if (!me.joined.compare_exchange_strong(zero, 1)) {
    warnf("comm init: rank %d of %s was claimed twice", rank, name.c_str());
    unmap_all(c);
    return ncclInvalidUsage;
  }
  me.global_rank = c->global_rank;
  me.pid = int32_t(getpid());
  me.device = c->device;
  me.seed = config().seed;
  c->data_fd = shm_open(data_name(c, rank).c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (c->data_fd < 0) {
    warnf("comm init: shm_open(%s): %s", data_name(c, rank).c_str(), strerror(errno));
    unmap_all(c);
    return ncclSystemError;
  }
  c->ctl->magic.store(kCtlMagic);
  c->ctl->njoined.fetch_add(1);
  c->ctl->bell.fetch_add(1);
  futex_wake_all(&c->ctl->bell, true);
  return ncclSuccess;
}

/* Second half of init: wait (on the bell) until every rank has attached. */
void wait_joined(ncclComm* c) {
  uint64_t warn_at = now_ns() + 30000000000ull;
  for (;;) {
    uint32_t b = c->ctl->bell.load();
    uint32_t j = c->ctl->njoined.load();
    if (j >= uint32_t(c->nranks)) break;
    if (now_ns() > warn_at) {
      logf("comm init: rank %d (global %d) still waits for %u of %d ranks to join %s", c->rank, c->global_rank,
           uint32_t(c->nranks) - j, c->nranks, c->name.c_str());
      warn_at = now_ns() + 60000000000ull;
    }
    futex_wait(&c->ctl->bell, b, 20000000ull, true);
  }
  c->granks.resize(size_t(c->nranks));
  for (int r = 0; r < c->nranks; ++r) c->granks[size_t(r)] = c->members[r].global_rank;
  c->seed = c->members[0].seed;
  profiler_comm_init(c);
}

/* NCCL_COMM_BLOCKING: the blocking mode of a comm whose config leaves it undefined. */
bool env_blocking() {
  static const bool b = env_long("NCCL_COMM_BLOCKING", 1, 0, 1) != 0;
  return b;
}

/* config->blocking (NCCL 2.30.7 src/init.cc parseCommConfig): NULL config → `inherit`. */
ncclResult_t config_blocking(const ncclConfig_t* config, bool inherit, bool* blocking) {
  *blocking = inherit;
  if (!config) return ncclSuccess;
  const c4d_nccl_config_head* h = reinterpret_cast<const c4d_nccl_config_head*>(config);
  if (h->magic != NCCL_API_MAGIC || h->size < sizeof(c4d_nccl_config_head)) {
    warnf("Invalid config: the ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (h->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = h->blocking != 0;
  else *blocking = env_blocking();
  return ncclSuccess;
}

ncclResult_t init_from_id(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  if (!comm) return ncclInvalidArgument;
  *comm = nullptr;
  if (memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0 || id.internal[NCCL_UNIQUE_ID_BYTES - 1] != 0) {
    warnf("comm init: the ncclUniqueId was not made by simnccl's ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    warnf("Invalid rank requested : %d/%d", rank, nranks);
    return ncclInvalidArgument;
  }
  config(); /* report malformed SIMNCCL_* once, at the first comm */
  std::string name(id.internal + sizeof kIdMagic);
  uint64_t cid = fnv1a(id.internal, NCCL_UNIQUE_ID_BYTES);
  int grank = env_global_rank(), device = current_device(); /* the caller's device, as NCCL takes it */
  ncclComm* c = new ncclComm;
  c->blocking = blocking;
  if (!blocking) {
    /* Nonblocking (src/init.cc ncclCommInitRankDev: the comm is handed out at once with
     * initState ncclInProgress, an async job thread does the init). */
    c->device = device;
    start_job(c);
    *comm = c;
    std::thread([=] {
      ncclResult_t r = attach(name, nranks, rank, cid, grank, device, c);
      if (r == ncclSuccess) wait_joined(c);
      finish_job(c, r);
    }).detach();
    return ncclInProgress;
  }
  ncclResult_t r = attach(name, nranks, rank, cid, grank, device, c);
  if (r != ncclSuccess) {
    delete c;
    return r;
  }
  wait_joined(c);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t detach(ncclComm* c) {
  if (!c->ctl) { /* a nonblocking init that failed: nothing attached */
    c->magic = 0;
    delete c;
    return ncclSuccess;
  }
  profiler_comm_finalize(c);
  shm_unlink(data_name(c, c->rank).c_str());
  if (c->ctl->ndetached.fetch_add(1) + 1 == uint32_t(c->nranks)) shm_unlink(c->name.c_str());
  unmap_all(c);
  c->magic = 0;
  delete c;
  return ncclSuccess;
}

/* Waits until the stream worker finished every op issued on c (or c was aborted); first
 * (`jobs`) until the nonblocking launches on helper threads are done. */
void drain(ncclComm* c, uint64_t timeout_ns, bool jobs = true) {
  uint64_t deadline = timeout_ns ? now_ns() + timeout_ns : 0;
  for (; jobs;) {
    uint32_t j = c->jobs.load();
    if (j == 0 || (deadline && now_ns() > deadline)) break;
    futex_wait(&c->jobs, j, 20000000ull, false);
  }
  for (;;) {
    uint32_t d = c->ticket_done.load();
    if (d == c->ticket_issued) return;
    if (deadline && now_ns() > deadline) return;
    futex_wait(&c->ticket_done, d, 20000000ull, false);
  }
}

}  // namespace

void start_job(ncclComm* c) {
  c->async_error.store(ncclInProgress);
  c->jobs.fetch_add(1);
}

void finish_job(ncclComm* c, ncclResult_t r) {
  int in_progress = ncclInProgress; /* an error found meanwhile stays */
  c->async_error.compare_exchange_strong(in_progress, int(r));
  c->jobs.fetch_sub(1);
  futex_wake_all(&c->jobs, false);
}

ncclResult_t ensure_ready(ncclComm* c) {
  if (c->async_error.load() != ncclInProgress) return ncclSuccess; /* (a blocking comm: only while revoked) */
  warnf("Attempt to use communicator before the previous operation returned ncclSuccess");
  return ncclInvalidArgument;
}

void ring_bell(ncclComm* c) {
  Member& me = c->members[c->rank];
  me.bell.fetch_add(1); /* seq_cst: a waiter either sees the bump or is counted in waiters */
  if (me.waiters.load() > 0) futex_wake_all(&me.bell, true);
}

bool ensure_data(ncclComm* c, size_t bytes) {
  if (bytes <= c->data_len) return true;
  size_t want = std::max((bytes + (1u << 20) - 1) & ~size_t((1u << 20) - 1), c->data_len * 2);
  int err = posix_fallocate(c->data_fd, 0, off_t(want)); /* reserve: no SIGBUS on a full /dev/shm */
  if (err != 0) {
    warnf("growing %s to %zu bytes: %s (is /dev/shm full?)", data_name(c, c->rank).c_str(), want, strerror(err));
    return false;
  }
  void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, c->data_fd, 0);
  if (p == MAP_FAILED) {
    warnf("mapping %s (%zu bytes): %s", data_name(c, c->rank).c_str(), want, strerror(errno));
    return false;
  }
  if (c->data) munmap(c->data, c->data_len);
  c->data = static_cast<char*>(p);
  c->data_len = want;
  c->members[c->rank].data_cap.store(want);
  return true;
}

const char* peer_data(ncclComm* c, int r, size_t off, size_t len) {
  if (r == c->rank) return off + len <= c->data_len ? c->data + off : nullptr;
  auto& pm = c->peer_map[size_t(r)];
  if (off + len > pm.second) {
    if (pm.first) munmap(pm.first, pm.second);
    pm = {nullptr, 0};
    int fd = shm_open(data_name(c, r).c_str(), O_RDONLY, 0);
    if (fd < 0) return nullptr;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
      void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) pm = {static_cast<char*>(p), size_t(st.st_size)};
    }
    close(fd);
    if (off + len > pm.second) return nullptr;
  }
  return pm.first + off;
}

}  // namespace sim

using namespace sim;

#define SIM_ALIAS(name) \
  extern "C" __attribute__((alias(#name), visibility("default"))) decltype(name) p##name;

SIM_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = 23102; /* reports NCCL 2.31.2: the ABI nccl_abi.h declares */
  return ncclSuccess;
}
SIM_ALIAS(ncclGetVersion)

SIM_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "NCCL operation timed out";
    default: return "unknown result code";
  }
}
SIM_ALIAS(ncclGetErrorString)

/* The last WARN's message, whatever NCCL_DEBUG says (src/init.cc ncclGetLastError). */
SIM_API const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error();
}
SIM_ALIAS(ncclGetLastError)

SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  static std::atomic<uint64_t> counter{0};
  uint64_t salt = mix64(uint64_t(getpid()) << 32 ^ now_ns() ^ mix64(counter.fetch_add(1)));
  std::string name = "/simnccl-" + job_name() + "-" + hex64(salt);
  if (name.size() >= kNameMax) return ncclInternalError; /* job names are capped well below */
  memset(uniqueId->internal, 0, NCCL_UNIQUE_ID_BYTES);
  memcpy(uniqueId->internal, kIdMagic, sizeof kIdMagic);
  memcpy(uniqueId->internal + sizeof kIdMagic, name.c_str(), name.size());
  return ncclSuccess;
}
SIM_ALIAS(ncclGetUniqueId)

SIM_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_from_id(comm, nranks, commId, rank, env_blocking());
}
SIM_ALIAS(ncclCommInitRank)

SIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                            ncclConfig_t* config) {
  bool blocking;
  if (ncclResult_t r = config_blocking(config, env_blocking(), &blocking)) return r;
  return init_from_id(comm, nranks, commId, rank, blocking);
}
SIM_ALIAS(ncclCommInitRankConfig)

SIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                              ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) return ncclInvalidArgument;
  bool blocking;
  if (ncclResult_t r = config_blocking(config, env_blocking(), &blocking)) return r;
  return init_from_id(newcomm, nranks, commIds[0], myrank, blocking); /* id 0 names the comm */
}
SIM_ALIAS(ncclCommInitRankScalable)

SIM_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return ncclInvalidArgument;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id); /* through the PLT, as NCCL does */
  if (r != ncclSuccess) return r;
  std::string name(id.internal + sizeof kIdMagic);
  uint64_t hid = fnv1a(id.internal, NCCL_UNIQUE_ID_BYTES);
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  for (int i = 0; i < ndev; ++i) {
    int dev = devlist ? devlist[i] : i;
    if (dev < 0) return ncclInvalidArgument;
    ncclComm* c = new ncclComm;
    r = attach(name, ndev, i, hid, i, dev, c); /* one process holds every rank: global rank = i */
    if (r != ncclSuccess) {
      delete c;
      return r;
    }
    comms[i] = c;
  }
  for (int i = 0; i < ndev; ++i) wait_joined(comms[i]);
  return ncclSuccess;
}
SIM_ALIAS(ncclCommInitAll)

SIM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                   ncclConfig_t* config) {
  ncclComm* c = as_comm(comm);
  if (!c || !newcomm || color < kNoColor) return ncclInvalidArgument;
  *newcomm = nullptr;
  if (ncclResult_t r = ensure_ready(c)) return r;
  bool blocking; /* a NULL config inherits the parent's; simnccl splits synchronously either way */
  if (ncclResult_t r = config_blocking(config, c->blocking, &blocking)) return r;
  /* Exchange (color, key) over the parent. Split k uses slot k % 2: a member writes
   * slot k % 2 again only at split k + 2, after passing split k + 1's barrier, which
   * every member enters only after it finished reading split k. */
  uint32_t k = ++c->split_count;
  SplitSlot& mine = c->members[c->rank].split[k % 2];
  mine.color = color;
  mine.key = key;
  mine.seq.store(k, std::memory_order_release);
  ring_bell(c);
  bool ok = wait_all(c, [&](int m) { return c->members[m].split[k % 2].seq.load(std::memory_order_acquire) == k; });
  if (!ok) return ncclInvalidUsage; /* parent aborted */
  if (color == kNoColor) return ncclSuccess;
  struct Entry {
    int key, prank;
  };
  std::vector<Entry> group;
  for (int r = 0; r < c->nranks; ++r) {
    const SplitSlot& s = c->members[r].split[k % 2];
    if (s.color == color) group.push_back({s.key, r});
  }
  std::sort(group.begin(), group.end(),
            [](const Entry& a, const Entry& b) { return a.key != b.key ? a.key < b.key : a.prank < b.prank; });
  int child_rank = 0;
  for (size_t i = 0; i < group.size(); ++i)
    if (group[i].prank == c->rank) child_rank = int(i);
  struct {
    uint64_t parent;
    uint32_t index;
    int32_t color;
  } key_bytes = {c->id, k - 1, color};
  uint64_t child_id = fnv1a(&key_bytes, sizeof key_bytes);
  ncclComm* child = new ncclComm;
  child->blocking = blocking;
  ncclResult_t r = attach(name_prefix(c->name) + hex64(child_id), int(group.size()), child_rank, child_id,
                          c->global_rank, c->device, child);
  if (r != ncclSuccess) {
    delete child;
    return r;
  }
  wait_joined(child);
  *newcomm = child;
  return ncclSuccess;
}
SIM_ALIAS(ncclCommSplit)

SIM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                    ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  (void)shrinkFlags;
  ncclComm* c = as_comm(comm);
  if (!c || !newcomm || excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
    return ncclInvalidArgument;
  *newcomm = nullptr;
  if (ncclResult_t r = ensure_ready(c)) return r;
  bool blocking;
  if (ncclResult_t r = config_blocking(config, c->blocking, &blocking)) return r;
  std::vector<bool> excluded(size_t(c->nranks), false);
  for (int i = 0; i < excludeRanksCount; ++i) {
    int r = excludeRanksList[i];
    if (r < 0 || r >= c->nranks) return ncclInvalidArgument;
    excluded[size_t(r)] = true;
  }
  if (excluded[size_t(c->rank)]) {
    warnf("ncclCommShrink: rank %d is in its own exclude list", c->rank);
    return ncclInvalidArgument;
  }
  /* Only the remaining ranks call Shrink: no exchange over the parent; every caller
   * derives the same child from the same exclude list. */
  int child_rank = 0, child_n = 0;
  for (int r = 0; r < c->nranks; ++r) {
    if (excluded[size_t(r)]) continue;
    if (r == c->rank) child_rank = child_n;
    ++child_n;
  }
  uint32_t k = c->shrink_count++;
  struct {
    uint64_t parent;
    uint32_t index;
    int32_t nexcluded;
  } key_bytes = {c->id, 0x80000000u | k, excludeRanksCount};
  uint64_t child_id = fnv1a(&key_bytes, sizeof key_bytes); /* profiler_abi.h documents this id */
  if (excludeRanksCount > 0)
    child_id = fnv1a(excludeRanksList, sizeof(int) * size_t(excludeRanksCount), child_id);
  ncclComm* child = new ncclComm;
  child->blocking = blocking;
  ncclResult_t r = attach(name_prefix(c->name) + hex64(child_id), child_n, child_rank, child_id, c->global_rank,
                          c->device, child);
  if (r != ncclSuccess) {
    delete child;
    return r;
  }
  wait_joined(child);
  *newcomm = child;
  return ncclSuccess;
}
SIM_ALIAS(ncclCommShrink)

/* NCCL 2.30: stops the comm's in-flight ops and refuses new ones; the comm is in progress
 * until quiescent, then may be destroyed, split or shrunk (nccl.h, ncclCommRevoke). */
SIM_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  if (revokeFlags != 0) {
    warnf("ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT (0)");
    return ncclInvalidArgument;
  }
  if (c->revoked.exchange(true)) return ncclSuccess;
  c->aborted.store(true); /* waiting workers give up within 20 ms; queued ops are skipped */
  start_job(c);
  std::thread([c] {
    drain(c, 0, false); /* this job is one of c's: wait for the ops only */
    c->aborted.store(false); /* quiescent: destroy may detach, a later split may use the parent */
    finish_job(c, ncclSuccess);
  }).detach();
  return ncclSuccess;
}
SIM_ALIAS(ncclCommRevoke)

SIM_API ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  (void)flags; /* NCCL_SUSPEND_MEM: simnccl holds no device memory to release */
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  if (ncclResult_t r = ensure_ready(c)) return r;
  drain(c, 0);
  c->suspended.store(true);
  return ncclSuccess;
}
SIM_ALIAS(ncclCommSuspend)

SIM_API ncclResult_t ncclCommResume(ncclComm_t comm) {
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  c->suspended.store(false);
  return ncclSuccess;
}
SIM_ALIAS(ncclCommResume)

/* Adding ranks to a live communicator is not simulated. */
SIM_API ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                  ncclComm_t* newcomm, ncclConfig_t* config) {
  (void)comm, (void)nRanks, (void)uniqueId, (void)rank, (void)config;
  if (newcomm) *newcomm = nullptr;
  warnf("ncclCommGrow: not simulated by simnccl");
  return ncclInvalidUsage;
}
SIM_ALIAS(ncclCommGrow)

SIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  if (c->revoked.load()) {
    warnf("ncclCommFinalize: invalid after ncclCommRevoke");
    return ncclInvalidUsage;
  }
  drain(c, 0);
  return ncclSuccess;
}
SIM_ALIAS(ncclCommFinalize)

SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  drain(c, 0); /* like NCCL: outstanding work on the comm finishes first */
  return detach(c);
}
SIM_ALIAS(ncclCommDestroy)

SIM_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ncclComm* c = as_comm(comm);
  if (!c) return ncclInvalidArgument;
  c->aborted.store(true);
  c->async_error.store(ncclInvalidUsage);
  drain(c, 500000000ull); /* waiting workers notice the abort within 20 ms */
  if (c->ticket_done.load() != c->ticket_issued) {
    /* A worker is stuck in a kernel that never ends and still holds c: leak it. */
    return ncclSuccess;
  }
  return detach(c);
}
SIM_ALIAS(ncclCommAbort)

SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclComm* c = as_comm(comm);
  if (!c || !count) return ncclInvalidArgument;
  if (ncclResult_t r = ensure_ready(c)) return r; /* src/init.cc: ncclCommEnsureReady */
  *count = c->nranks;
  return ncclSuccess;
}
SIM_ALIAS(ncclCommCount)

SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclComm* c = as_comm(comm);
  if (!c || !rank) return ncclInvalidArgument;
  if (ncclResult_t r = ensure_ready(c)) return r; /* src/init.cc: ncclCommEnsureReady */
  *rank = c->rank;
  return ncclSuccess;
}
SIM_ALIAS(ncclCommUserRank)

SIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclComm* c = as_comm(comm);
  if (!c || !device) return ncclInvalidArgument;
  if (ncclResult_t r = ensure_ready(c)) return r; /* src/init.cc: ncclCommEnsureReady */
  *device = c->device;
  return ncclSuccess;
}
SIM_ALIAS(ncclCommCuDevice)

SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclComm* c = as_comm(comm);
  if (!c || !asyncError) return ncclInvalidArgument;
  *asyncError = ncclResult_t(c->async_error.load());
  return ncclSuccess;
}
SIM_ALIAS(ncclCommGetAsyncError)
