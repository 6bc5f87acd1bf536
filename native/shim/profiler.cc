/*
 * The NCCL profiler plugin callbacks (ncclProfiler_v5 / ncclProfiler_v6): NCCL's side of
 * profiler.h's picture. Loaded by NCCL with NCCL_PROFILER_PLUGIN=STATIC_PLUGIN when the
 * shim is preloaded, or NCCL_PROFILER_PLUGIN=$(c4d lib).
 *
 * Threads: init/finalize on the thread creating/destroying a communicator; start/stop/
 * record on NCCL's proxy progress thread (simnccl: the stream worker), possibly several at
 * once. Those three allocate nothing, lock nothing, write nothing but atomics and pool
 * entries they own, and always return ncclSuccess: a profiler must never change NCCL.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c4d/profiler_abi.h"
#include "c4d/record.h"
#include "log.h"
#include "peer_track.h"
#include "profiler.h"
#include "shim.h"
#include "timing.h"

namespace c4d {

PeerTrack g_peer;

template <typename T>
bool Pool<T>::init(uint32_t count) {
  if (items) return n == count;  // sized by an earlier, partly failed attempt
  uint32_t cap = 1;
  while (cap < 2 * count) cap <<= 1;  // at most half full: a push never meets a slow pop's cell
  T* all = static_cast<T*>(calloc(count, sizeof(T)));
  if (!all || !free.init(cap)) {
    ::free(all);
    return false;
  }
  items = all;
  n = count;
  reset();
  return true;
}

template <typename T>
void Pool<T>::reset() {
  free.reset();
  for (uint32_t i = 0; i < n; ++i) free.push(i);
}

template <typename T>
void Pool<T>::give(uint32_t i) {
  if (!free.push(i)) g_peer.untracked.fetch_add(1, std::memory_order_relaxed);  // lost entry, counted
}

template struct Pool<Task>;
template struct Pool<Xfer>;
template struct Pool<Step>;

void task_unref(uint32_t t) {
  std::atomic<uint32_t>& refs = g_peer.tasks.items[t].refs;
  uint32_t r = refs.load(std::memory_order_relaxed);
  while (r && !refs.compare_exchange_weak(r, r - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  if (r == 1) g_peer.tasks.give(t);
}

void xfer_recycle(uint32_t x) {
  Xfer& X = g_peer.xfers.items[x];
  uint32_t task = X.task;
  X.live.store(0, std::memory_order_relaxed);
  uint32_t gen = X.state.load(std::memory_order_relaxed) >> 16;
  X.state.store((((gen + 1) & 0xffff) << 16) | kXferDone, std::memory_order_release);  // stale refs can't join
  g_peer.xfers.give(x);
  task_unref(task);
}

namespace {

pthread_mutex_t g_prof_mu = PTHREAD_MUTEX_INITIALIZER;  // init/finalize only
pid_t g_pid = 0;
bool g_pool_failed_logged = false;
bool g_ctx_full_logged = false;

constexpr int kMask = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep;

inline void untracked() { g_peer.untracked.fetch_add(1, std::memory_order_relaxed); }

inline void note_time(Xfer& X, uint64_t now) {
  uint64_t zero = 0;
  X.first_ns.compare_exchange_strong(zero, now, std::memory_order_relaxed);
  uint64_t last = X.last_ns.load(std::memory_order_relaxed);
  while (last < now && !X.last_ns.compare_exchange_weak(last, now, std::memory_order_relaxed)) {
  }
}

/* NCCL's function names (ncclFuncToString) → enum c4d_op_kind; 255 unknown. */
uint8_t op_of(const char* func) {
  static const char* const kNames[C4D_OP_COUNT] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                                   "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};
  if (!func) return 255;
  for (int i = 0; i < C4D_OP_COUNT; ++i)
    if (!strcmp(func, kNames[i])) return uint8_t(i);
  return 255;
}

ProfCtx* ctx_of(void* context) {
  uint32_t i = kNone;
  const char* b = reinterpret_cast<const char*>(g_peer.ctx);
  const char* p = static_cast<const char*>(context);
  if (p >= b && p < b + sizeof g_peer.ctx && size_t(p - b) % sizeof(ProfCtx) == 0)
    i = uint32_t(size_t(p - b) / sizeof(ProfCtx));
  return i < g_peer.n_ctx.load(std::memory_order_acquire) ? &g_peer.ctx[i] : nullptr;
}

/* Under g_prof_mu: the pools, sized by C4D_PEER_TRACK, once. */
bool ensure_pools() {
  if (g_peer.ready.load(std::memory_order_acquire)) return true;
  uint32_t n = g_cfg.peer_track;
  uint32_t cap = 1;
  while (cap < 2 * n) cap <<= 1;
  static bool done_ring = false;
  done_ring = done_ring || g_peer.done.init(cap);
  static bool stopped_ring = false;
  stopped_ring = stopped_ring || g_peer.stopped.init(cap);
  bool ok = done_ring && stopped_ring && g_peer.tasks.init(n) && g_peer.xfers.init(n) && g_peer.steps.init(n * kStepsPerXfer);
  if (!ok) {
    if (!g_pool_failed_logged) C4D_LOG(kError, "profiler plugin: out of memory for %u transfers; not profiling", n);
    g_pool_failed_logged = true;
    return false;
  }
  g_peer.n_xfers = n;
  g_pid = getpid();
  g_peer.ready.store(true, std::memory_order_release);
  return true;
}

/* ------------------------------------------------------------------ callbacks */

ncclResult_t prof_init(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName;
  (void)logfn;
  if (context) *context = nullptr;
  int m = shim_mode();
  if (m == kConfigured) m = shim_activate() ? kActive : shim_mode();  // a comm created through a path we don't hook
  if (m != kActive) return ncclInternalError;  // C4D_ENABLE=0 (or the shim gave up): NCCL unloads the plugin
  if (!context || !eActivationMask) return ncclInvalidArgument;
  pthread_mutex_lock(&g_prof_mu);
  if (!ensure_pools()) {
    pthread_mutex_unlock(&g_prof_mu);
    return ncclInternalError;
  }
  *eActivationMask = kMask;
  uint32_t i = g_peer.n_ctx.load(std::memory_order_relaxed);
  if (i >= kMaxProfCtx) {
    if (!g_ctx_full_logged) C4D_LOG(kWarning, "profiler plugin: more than %u communicators; later ones not profiled", i);
    g_ctx_full_logged = true;
    pthread_mutex_unlock(&g_prof_mu);
    return ncclSuccess;  // context NULL: its events are ignored
  }
  ProfCtx& c = g_peer.ctx[i];
  c.index = i;
  c.nranks = nranks;
  c.rank = rank;
  c.nnodes = nNodes;
  c.comm_id = commId;
  c.p2p_ord = nullptr;
  if (nranks > 0 && nranks <= (1 << 22))
    c.p2p_ord = static_cast<std::atomic<uint32_t>*>(calloc(2 * size_t(nranks), sizeof(std::atomic<uint32_t>)));
  c.finalized.store(false, std::memory_order_relaxed);
  c.first_kind.store(255, std::memory_order_relaxed);
  c.sem.store(kSemUnknown, std::memory_order_relaxed);
  c.colls.store(0, std::memory_order_relaxed);
  c.slot = 0;
  c.how = kCtxUnresolved;
  c.tries = 0;
  g_peer.n_ctx.store(i + 1, std::memory_order_release);  // the context is complete before anyone can see it
  pthread_mutex_unlock(&g_prof_mu);
  *context = &c;
  C4D_LOG(kDebug, "profiler plugin: context %u for comm %016llx (rank %d of %d, %d nodes)", i,
          (unsigned long long)commId, rank, nranks, nNodes);
  return ncclSuccess;
}

void start_task(ProfCtx* c, const ncclProfilerEventDescr_v5_t* d, void** h) {
  if (!c) return;
  uint32_t t = g_peer.tasks.take();
  if (t == kNone) return untracked();
  Task& k = g_peer.tasks.items[t];
  k.ctx = c->index;
  if (d->type == ncclProfileColl) {
    c->colls.fetch_add(1, std::memory_order_release);
    k.op = op_of(d->coll.func);
    k.p2p = 0;
    k.key = d->coll.seqNumber;
    if (k.op < kCollKinds && c->sem.load(std::memory_order_relaxed) == kSemUnknown) {
      // The first Coll of a second function tells the numbering: it restarts at 0 per function
      // (NCCL) or goes on counting the comm's collectives (simnccl). Same answers until then.
      uint8_t first = 255;
      if (!c->first_kind.compare_exchange_strong(first, k.op, std::memory_order_relaxed) && first != k.op)
        c->sem.store(k.key == 0 ? kSemPerFunc : kSemPerComm, std::memory_order_relaxed);
    }
  } else {
    k.op = op_of(d->p2p.func);
    k.p2p = 1;
    int peer = d->p2p.peer, n = c->nranks;
    bool dir_known = k.op == C4D_OP_SEND || k.op == C4D_OP_RECV;
    k.key = (c->p2p_ord && dir_known && peer >= 0 && peer < n)
                ? c->p2p_ord[(k.op == C4D_OP_RECV ? n : 0) + peer].fetch_add(1, std::memory_order_relaxed)
                : UINT64_MAX;
  }
  for (std::atomic<uint64_t>& x : k.xf) x.store(0, std::memory_order_relaxed);
  k.stopped.store(0, std::memory_order_relaxed);
  k.refs.store(1, std::memory_order_release);
  *h = &k;
}

/* Joins the live, not DONE xfer `x` of generation `gen`. */
bool try_join(uint32_t x, uint32_t gen) {
  std::atomic<uint32_t>& st = g_peer.xfers.items[x].state;
  uint32_t s = st.load(std::memory_order_relaxed);
  for (;;) {
    if ((s >> 16) != gen || (s & kXferDone) || (s & kXferOpenMask) == kXferOpenMask) return false;
    if (st.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return true;
  }
}

/* A new xfer under task t, one ProxyOp open, not yet published. kNone: no entry, or the
 * task is already gone (its last reference dropped: a ProxyOp far later than its task). */
uint32_t make_xfer(uint32_t t, int32_t peer, uint8_t dir, uint32_t* gen) {
  Task& k = g_peer.tasks.items[t];
  uint32_t r = k.refs.load(std::memory_order_relaxed);
  do {
    if (!r) return kNone;
  } while (!k.refs.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel, std::memory_order_relaxed));
  uint32_t x = g_peer.xfers.take();
  if (x == kNone) {
    task_unref(t);
    return kNone;
  }
  Xfer& X = g_peer.xfers.items[x];
  *gen = X.state.load(std::memory_order_relaxed) >> 16;
  X.op = k.op;
  X.p2p = k.p2p;
  X.dir = dir;
  X.peer = peer;
  X.ctx = k.ctx;
  X.task = t;
  X.key = k.key;
  X.steps_total.store(0, std::memory_order_relaxed);
  X.steps_done.store(0, std::memory_order_relaxed);
  X.pstate.store(0, std::memory_order_relaxed);
  X.bytes_done.store(0, std::memory_order_relaxed);
  X.first_ns.store(0, std::memory_order_relaxed);
  X.last_ns.store(0, std::memory_order_relaxed);
  X.wire_ns.store(0, std::memory_order_relaxed);
  X.state.store((*gen << 16) | 1u, std::memory_order_release);
  return x;
}

void publish(uint32_t x) {
  g_peer.xfers.items[x].live.store(1, std::memory_order_release);
  g_peer.tracked.fetch_add(1, std::memory_order_relaxed);
}

/* Never published: nobody else holds it. */
void unmake(uint32_t x, uint32_t gen) {
  Xfer& X = g_peer.xfers.items[x];
  uint32_t task = X.task;
  X.state.store((gen << 16) | kXferDone, std::memory_order_relaxed);
  g_peer.xfers.give(x);
  task_unref(task);
}

/* The xfer of (task, peer, dir) this ProxyOp joins, made if needed. kNone: untracked. */
uint32_t join_or_make(uint32_t t, int32_t peer, uint8_t dir) {
  Task& k = g_peer.tasks.items[t];
  for (int attempt = 0; attempt < 8; ++attempt) {
    int slot = -1;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < kTaskXfers; ++i) {
      uint64_t r = k.xf[i].load(std::memory_order_acquire);
      if (!r) {  // slots fill in order: nothing further
        slot = int(i);
        break;
      }
      if (xref_is(r, peer, dir)) {
        if (try_join(xref_xfer(r), xref_gen(r))) return xref_xfer(r);
        slot = int(i);  // finished or recycled: a new xfer takes its place
        seen = r;
        break;
      }
    }
    uint32_t gen = 0;
    uint32_t x = make_xfer(t, peer, dir, &gen);
    if (x == kNone) return kNone;
    if (slot < 0 || k.xf[slot].compare_exchange_strong(seen, xref_pack(x, gen, peer, dir), std::memory_order_acq_rel)) {
      publish(x);  // slot < 0: the task's list is full; tracked, not merged
      return x;
    }
    unmake(x, gen);  // another ProxyOp of the same transfer won the slot: join it instead
  }
  return kNone;
}

void start_xfer(const ncclProfilerEventDescr_v5_t* d, void** h) {
  if (d->proxyOp.pid != g_pid) return untracked();  // PXN: the parent event lives in another process
  uint32_t t = g_peer.tasks.index_of(d->parentObj);
  if (t == kNone) return untracked();
  uint8_t dir = d->proxyOp.isSend ? 0 : 1;
  uint32_t x = join_or_make(t, d->proxyOp.peer, dir);
  if (x == kNone) return untracked();
  Xfer& X = g_peer.xfers.items[x];
  if (d->proxyOp.nSteps > 0) X.steps_total.fetch_add(uint32_t(d->proxyOp.nSteps), std::memory_order_relaxed);
  *h = &X;
}

void start_step(const ncclProfilerEventDescr_v5_t* d, void** h) {
  uint32_t x = g_peer.xfers.index_of(d->parentObj);
  if (x == kNone) return untracked();
  Xfer& X = g_peer.xfers.items[x];
  uint32_t st = X.state.load(std::memory_order_acquire);
  if (st & kXferDone) return untracked();
  uint32_t i = g_peer.steps.take();
  if (i == kNone) return untracked();
  Step& s = g_peer.steps.items[i];
  s.xfer = x;
  s.gen = st >> 16;
  s.size.store(0, std::memory_order_relaxed);
  s.send_at.store(0, std::memory_order_relaxed);
  s.used.store(1, std::memory_order_release);
  note_time(X, host_now_ns());
  *h = &s;
}

ncclResult_t prof_start(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* d) {
  if (!eHandle) return ncclSuccess;
  *eHandle = nullptr;  // every event we don't track (Group, *Api, KernelCh, CE ...) gets no handle
  if (!d || !g_peer.ready.load(std::memory_order_acquire)) return ncclSuccess;
  switch (d->type) {
    case ncclProfileColl:
    case ncclProfileP2p:
      start_task(ctx_of(context), d, eHandle);
      break;
    case ncclProfileProxyOp:
      start_xfer(d, eHandle);
      break;
    case ncclProfileProxyStep:
      start_step(d, eHandle);
      break;
    default:
      break;
  }
  return ncclSuccess;
}

void stop_step(uint32_t i) {
  Step& s = g_peer.steps.items[i];
  uint8_t one = 1;
  if (!s.used.compare_exchange_strong(one, 0, std::memory_order_acq_rel)) return;  // reclaimed already
  Xfer& X = g_peer.xfers.items[s.xfer];
  if ((X.state.load(std::memory_order_acquire) >> 16) == s.gen) {
    const uint64_t now = host_now_ns();
    X.bytes_done.fetch_add(s.size.load(std::memory_order_relaxed), std::memory_order_relaxed);
    const uint64_t at = s.send_at.load(std::memory_order_relaxed);
    if (at && now > at) X.wire_ns.fetch_add(now - at, std::memory_order_relaxed);
    note_time(X, now);
    X.steps_done.fetch_add(1, std::memory_order_release);
  }
  g_peer.steps.give(i);
}

void stop_xfer(uint32_t x) {
  std::atomic<uint32_t>& st = g_peer.xfers.items[x].state;
  uint32_t s = st.load(std::memory_order_relaxed);
  do {
    if (!(s & kXferOpenMask) || (s & kXferDone)) return;  // a stop we did not count a start for
  } while (!st.compare_exchange_weak(s, s - 1, std::memory_order_acq_rel, std::memory_order_relaxed));
  uint32_t left = s - 1;
  if (left & kXferOpenMask) return;
  // The last open ProxyOp: done, unless another channel joined meanwhile (then its stop does this).
  if (st.compare_exchange_strong(left, left | kXferDone, std::memory_order_acq_rel, std::memory_order_relaxed) &&
      !g_peer.done.push(x))
    untracked();
}

/* Coll/P2p stop = "enqueued": NCCL starts the task's ProxyOps after this, on its proxy
 * thread. The task stays joinable until the agent retires it (task_retire). */
void stop_task(uint32_t t) {
  Task& k = g_peer.tasks.items[t];
  uint8_t zero = 0;
  if (!k.stopped.compare_exchange_strong(zero, 1, std::memory_order_relaxed)) return;  // stopped twice
  k.stop_ns = mono_now_ns();
  if (!g_peer.stopped.push(t)) task_unref(t);  // cannot happen (room for every task): free it now
}

ncclResult_t prof_stop(void* eHandle) {
  if (!eHandle || !g_peer.ready.load(std::memory_order_acquire)) return ncclSuccess;
  uint32_t i;
  if ((i = g_peer.steps.index_of(eHandle)) != kNone)
    stop_step(i);
  else if ((i = g_peer.xfers.index_of(eHandle)) != kNone)
    stop_xfer(i);
  else if ((i = g_peer.tasks.index_of(eHandle)) != kNone)
    stop_task(i);
  return ncclSuccess;
}

ncclResult_t prof_record(void* eHandle, ncclProfilerEventState_v5_t eState, ncclProfilerEventStateArgs_v5_t* args) {
  if (!eHandle || !g_peer.ready.load(std::memory_order_acquire)) return ncclSuccess;
  uint32_t i = g_peer.steps.index_of(eHandle);
  if (i == kNone) return ncclSuccess;  // ProxyOp states are deprecated since v4; nothing else is tracked
  Step& s = g_peer.steps.items[i];
  Xfer& X = g_peer.xfers.items[s.xfer];
  if ((X.state.load(std::memory_order_acquire) >> 16) != s.gen) return ncclSuccess;
  if (args && args->proxyStep.transSize) s.size.store(args->proxyStep.transSize, std::memory_order_relaxed);
  X.pstate.store(uint8_t(eState), std::memory_order_relaxed);
  const uint64_t now = host_now_ns();
  /* NCCL records SendWait when the step's Isend is posted and stops the step when
   * ncclNet->test says it is done (src/transport/net.cc, sendProxyProgress): that span is
   * the link's own transfer time, while the steps' start times follow the ring's pace. */
  if (eState == ncclProfilerProxyStepSendWait && !s.send_at.load(std::memory_order_relaxed))
    s.send_at.store(now, std::memory_order_relaxed);
  note_time(X, now);
  return ncclSuccess;
}

ncclResult_t prof_finalize(void* context) {
  if (ProfCtx* c = ctx_of(context)) c->finalized.store(true, std::memory_order_release);
  return ncclSuccess;
}

}  // namespace

void profiler_reset_after_fork() {
  pthread_mutex_init(&g_prof_mu, nullptr);  // a thread of the parent may have held it
  g_pid = getpid();
  g_peer.n_ctx.store(0, std::memory_order_relaxed);
  if (g_peer.ready.load(std::memory_order_relaxed)) {
    for (uint32_t i = 0; i < g_peer.xfers.n; ++i) {
      g_peer.xfers.items[i].live.store(0, std::memory_order_relaxed);
      g_peer.xfers.items[i].state.store(kXferDone, std::memory_order_relaxed);
    }
    g_peer.tasks.reset();
    g_peer.xfers.reset();
    g_peer.steps.reset();
    g_peer.done.reset();
    g_peer.stopped.reset();
  }
  g_peer.tracked.store(0, std::memory_order_relaxed);
  g_peer.untracked.store(0, std::memory_order_relaxed);
  g_peer.records.store(0, std::memory_order_relaxed);
  peer_reset_after_fork();
}

}  // namespace c4d

/* The plugin symbols: data, looked up by NCCL with dlsym (exports.map lists them). v6
 * first in NCCL >= 2.29, v5 in 2.28. */
extern "C" {
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "c4d", c4d::prof_init, c4d::prof_start, c4d::prof_stop, c4d::prof_record, c4d::prof_finalize};
__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    "c4d", c4d::prof_init, c4d::prof_start, c4d::prof_stop, c4d::prof_record, c4d::prof_finalize};
}
