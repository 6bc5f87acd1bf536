#include "lifecycle.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "c4d/record.h"
#include "cuda_rt.h"
#include "event_pool.h"
#include "log.h"
#include "op_pool.h"
#include "real_nccl.h"
#include "shim.h"
#include "timing.h"

namespace c4d {

namespace {

std::atomic<uint32_t> g_init_all_counter{0};

/* The comm's shape from NCCL, else from the hints; sets its device up for timing. `ask`:
 * NCCL may be queried (a nonblocking comm only once settled: querying one in progress is
 * an NCCL WARN, which also sets ncclGetLastError, src/init.cc ncclCommEnsureReady). */
void refresh_shape(CommSlot* s, int rank_hint, int nranks_hint, int device_hint, bool ask) {
  int rank = -1, nranks = -1, device = -1;
  bool asked = ask && real_comm_user_rank(s->handle, &rank) == ncclSuccess &&
               real_comm_count(s->handle, &nranks) == ncclSuccess &&
               real_comm_cu_device(s->handle, &device) == ncclSuccess && rank >= 0 && nranks > 0;
  if (!asked) {
    rank = rank_hint;
    nranks = nranks_hint;
    device = device_hint;
  }
  if (device < 0) device = s->device.load(std::memory_order_relaxed);
  comm_set_shape(s, rank, nranks, device);  // not ready yet (shape unknown): comm_refresh retries
  if (device >= 0 && g_cuda.ok && event_pool_ensure(device, g_cfg.event_pool)) timing_device_init(device);
}

/* A nonblocking comm settled (ncclCommGetAsyncError no longer says ncclInProgress)? */
bool settled(const CommSlot* s) {
  if (!s->nonblocking.load(std::memory_order_relaxed)) return true;
  ncclResult_t ae = ncclInProgress;
  return real_comm_get_async_error(s->handle, &ae) == ncclSuccess && ae != ncclInProgress;
}

void emit(uint8_t event, const CommSlot* s, ncclComm_t handle, ncclResult_t r, uint64_t id, uint64_t parent_id,
          int color, int key, int rank, int nranks, int device) {
  uint32_t i = take_any_slot();
  if (i == kNone) {
    count(g_counters.dropped_full);
    return;
  }
  OpSlot& o = g_ops.at(i);
  o.kind = kSlotComm;
  o.lane = kNoLane;  // freed to the shared list: lifecycle entries take the shared path
  o.op = event;
  o.comm = s ? comm_index(s) : kNone;
  o.result = r;
  o.issue_ns = host_now_ns();
  o.seq = id;               // kSlotComm: comm id
  o.count = parent_id;      // kSlotComm: parent id
  o.stream = reinterpret_cast<uint64_t>(handle);
  o.peer = color;
  o.group_id = uint64_t(int64_t(key));
  o.device = device;
  o.bytes = (uint64_t(uint32_t(rank)) << 32) | uint32_t(nranks);  // kSlotComm: rank, nranks
  o.state.store(kReturned, std::memory_order_relaxed);
  if (!g_ops.submit(i)) {
    g_ops.release(i);
    count(g_counters.dropped_full);
  }
}

}  // namespace

uint64_t id_of_unique_id(const ncclUniqueId* id) { return fnv1a(id->internal, sizeof id->internal); }

uint64_t id_of_split(uint64_t parent_id, uint32_t split_index, int color) {
  uint64_t h = fnv1a(&parent_id, sizeof parent_id);
  h = fnv1a(&split_index, sizeof split_index, h);
  int32_t c = color;
  return fnv1a(&c, sizeof c, h);
}

uint64_t id_of_shrink(uint64_t parent_id, uint32_t shrink_index, const int* excluded, int n_excluded) {
  struct {
    uint64_t parent;
    uint32_t index;
    int32_t n;
  } key = {parent_id, 0x80000000u | shrink_index, n_excluded};
  static_assert(sizeof key == 16, "no padding: the id is over these 16 bytes");
  uint64_t h = fnv1a(&key, sizeof key);
  if (excluded && n_excluded > 0) h = fnv1a(excluded, sizeof(int) * size_t(n_excluded), h);
  return h;
}

uint64_t id_of_init_all() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  int32_t pid = getpid();
  uint32_t n = g_init_all_counter.fetch_add(1, std::memory_order_relaxed);
  uint64_t h = fnv1a(host, strlen(host));
  h = fnv1a(&pid, sizeof pid, h);
  return fnv1a(&n, sizeof n, h);
}

void comm_created(uint8_t event, const ncclComm_t* out, ncclResult_t r, uint64_t id, uint64_t parent_id, int color,
                  int key, int rank_hint, int nranks_hint, int device_hint) {
  if (shim_mode() != kActive) return;
  bool made = r == ncclSuccess || r == ncclInProgress;
  ncclComm_t handle = (made && out) ? *out : nullptr;
  if (made && !handle) return;  // split with NCCL_SPLIT_NOCOLOR: this rank got no comm
  if (device_hint < 0) device_hint = cuda_current_device();  // NCCL binds the caller's device
  pthread_mutex_lock(&g_init_mutex);
  CommSlot* s = handle ? comm_register(handle, id, parent_id, event, color, key) : nullptr;
  if (s) {
    s->device.store(device_hint, std::memory_order_relaxed);
    s->nonblocking.store(r == ncclInProgress, std::memory_order_relaxed);  // its shape comes once settled
    refresh_shape(s, rank_hint, nranks_hint, device_hint, r != ncclInProgress);
    s->live.store(true, std::memory_order_release);  // the agent's snapshots see it complete
  }
  int rank = s ? s->rank.load(std::memory_order_relaxed) : rank_hint;
  int nranks = s ? s->nranks.load(std::memory_order_relaxed) : nranks_hint;
  int device = s ? s->device.load(std::memory_order_relaxed) : device_hint;
  emit(event, s, handle, r, id, parent_id, color, key, rank, nranks, device);
  pthread_mutex_unlock(&g_init_mutex);
}

void comm_ended(uint8_t event, ncclComm_t comm, CommSlot* s, ncclResult_t r, bool remove) {
  if (!s || shim_mode() != kActive) return;  // untracked comm: nothing to say about it
  pthread_mutex_lock(&g_init_mutex);
  emit(event, s, comm, r, s->id, s->parent_id, s->color, s->key, s->rank.load(std::memory_order_relaxed),
       s->nranks.load(std::memory_order_relaxed), s->device.load(std::memory_order_relaxed));
  if (remove && (r == ncclSuccess || event == C4D_COMM_ABORT)) comm_unregister_slot(s);
  pthread_mutex_unlock(&g_init_mutex);
}

void comm_refresh(CommSlot* c, bool is_settled) {
  constexpr uint32_t kMaxTries = 64;  // then the comm stays shapeless: p2p seq unknown, no events
  if (c->refresh_tries.load(std::memory_order_relaxed) >= kMaxTries) return;
  if (pthread_mutex_trylock(&g_init_mutex) != 0) return;
  if (!c->ready.load(std::memory_order_relaxed) && (is_settled || settled(c))) {
    c->refresh_tries.fetch_add(1, std::memory_order_relaxed);
    refresh_shape(c, c->rank.load(std::memory_order_relaxed), c->nranks.load(std::memory_order_relaxed),
                  c->device.load(std::memory_order_relaxed), true);
  }
  pthread_mutex_unlock(&g_init_mutex);
}

}  // namespace c4d
