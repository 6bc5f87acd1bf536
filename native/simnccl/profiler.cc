/*
 * The NCCL profiler plugin path (profiler.h draws the threads): load a v5 plugin the way
 * NCCL does, init it per communicator, emit Coll/P2p task events on the launching thread
 * and ProxyOp → ProxyStep events on a proxy progress thread as the modeled network
 * transfers progress (profiler_abi.h says exactly what is emitted).
 *
 * Loading (once per process, at the first communicator), NCCL_PROFILER_PLUGIN:
 *   none          → off
 *   unset/empty   → dlopen("libnccl-profiler.so"), silently off if absent
 *   STATIC_PLUGIN → dlopen(NULL): the symbol from the program or an LD_PRELOADed library
 *   X             → dlopen(X); if that fails and X has no '/' and is not lib*.so,
 *                   dlopen("libnccl-profiler-X.so"); failure is one line, then off
 * then dlsym("ncclProfiler_v5"). A plugin's init failing turns it off for that comm only.
 */
#include "profiler.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "c4d/profiler_abi.h"
#include "comm.h"
#include "common.h"
#include "config.h"

namespace sim {
namespace {

std::once_flag g_once;
ncclProfiler_v5_t* g_api = nullptr;
int g_mask = 0; /* process-wide activation mask; every init may write it (NCCL semantics) */

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

void load_plugin() {
  const char* env = getenv("NCCL_PROFILER_PLUGIN");
  std::string name = env ? env : "";
  if (name == "none") return;
  void* h = nullptr;
  if (name.empty()) {
    h = dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return; /* no plugin installed: the normal case */
  } else if (name == "STATIC_PLUGIN") {
    h = dlopen(nullptr, RTLD_NOW);
  } else {
    h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h && name.find('/') == std::string::npos && !(name.rfind("lib", 0) == 0 && ends_with(name, ".so"))) {
      std::string alt = "libnccl-profiler-" + name + ".so";
      h = dlopen(alt.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
      const char* err = dlerror();
      logf("NCCL_PROFILER_PLUGIN=%s: cannot load it (%s); profiling is off", name.c_str(), err ? err : "?");
      return;
    }
  }
  auto* api = static_cast<ncclProfiler_v5_t*>(dlsym(h, C4D_PROFILER_SYMBOL_V5));
  if (!api || !api->init || !api->startEvent || !api->stopEvent || !api->recordEventState || !api->finalize) {
    if (!name.empty())
      logf("NCCL_PROFILER_PLUGIN=%s: no usable %s symbol; profiling is off", name.c_str(), C4D_PROFILER_SYMBOL_V5);
    if (name != "STATIC_PLUGIN") dlclose(h);
    return;
  }
  g_api = api;
}

void plugin_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  static const bool info = [] {
    const char* d = getenv("NCCL_DEBUG");
    return d && (!strcmp(d, "INFO") || !strcmp(d, "TRACE"));
  }();
  if (level > NCCL_LOG_WARN && !info) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  logf("profiler plugin %s:%d: %s", file ? file : "?", line, msg);
}

void* start_event(ncclComm* c, ncclProfilerEventDescr_v5_t* d) {
  void* h = nullptr;
  if (g_api->startEvent(c->prof_ctx, &h, d) != ncclSuccess) return nullptr;
  return h;
}

int mask_now() { return __atomic_load_n(&g_mask, __ATOMIC_RELAXED); }

/* Same node (SIMNCCL_RANKS_PER_NODE; 0: one node): NVLink/P2P/SHM, no proxy. */
bool same_node(const ncclComm* c, int a, int b) {
  int rpn = config().ranks_per_node;
  return rpn <= 0 || c->granks[size_t(a)] / rpn == c->granks[size_t(b)] / rpn;
}

}  // namespace

/* One ProxyOp: one network transfer of one op. Identity is set at post and read-only;
 * timing and `cancelled` are written under g_px.m; the rest is the proxy thread's. */
struct ProxyWork {
  ProxySet* set;
  ncclComm* comm;
  void* parent; /* the op's task handle (stopped before this ProxyOp starts) */
  int rank, peer;
  bool is_send;
  int first_step, nsteps;
  uint64_t step_bytes;
  size_t mine_idx; /* which transfer of the op's Schedule::mine */
  /* g_px.m */
  bool timed = false, cancelled = false;
  uint64_t t0 = 0, step_ns = 0, move_ns = 0;
  int stall_at = 0; /* the first step that never ends (nsteps: none); steps after it never start */
  /* proxy thread */
  bool started = false;
  void* op_h = nullptr;
  std::vector<void*> step_h;
  int next_start = 0, next_stop = 0; /* steps started, steps stopped (in order) */
  std::vector<uint64_t> started_at;   /* when each started step's transfer began */
  uint64_t lag = 0;
  bool caught_up = false; /* a step's start was once still ahead (see advance) */
};

struct ProxySet {
  std::atomic<int> refs{1};              /* the stream worker + one per work */
  std::atomic<uint32_t> remaining{0};    /* works not finished (futex word) */
  std::vector<ProxyWork*> works;
  bool published = false;                /* g_px.m */
  void unref() {
    if (refs.fetch_sub(1) == 1) delete this;
  }
};

namespace {

/* The proxy progress thread and what it owns. Leaked on purpose: it may outlive statics. */
struct ProxyThread {
  std::mutex m;
  std::condition_variable cv;
  std::vector<ProxyWork*> posted; /* not yet picked up */
  std::vector<ProxyWork*> active; /* ProxyOp started */
  bool running = false;
};
ProxyThread* g_px = new ProxyThread;

/* The work is over (finished, cancelled or its comm gone): the worker may stop waiting. */
void retire(ProxyWork* w) {
  ProxySet* s = w->set;
  s->remaining.fetch_sub(1);
  futex_wake_all(&s->remaining, false);
  delete w;
  s->unref();
}

constexpr int kStepsInFlight = 8; /* NCCL_STEPS: a proxy keeps at most this many steps posted */

/* When step s of the work is due to start: its slot in the ring's pace, plus the lag. */
uint64_t start_time(const ProxyWork& w, int s) { return w.t0 + uint64_t(w.first_step + s) * w.step_ns + w.lag; }

void start_step(ProxyWork& w, int s, uint64_t now) {
  w.started_at[size_t(s)] = now;
  if (!(mask_now() & ncclProfileProxyStep) || !w.op_h) return;
  ncclProfilerEventDescr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyStep;
  d.parentObj = w.op_h;
  d.rank = w.rank;
  d.proxyStep.step = s;
  void* h = start_event(w.comm, &d);
  w.step_h[size_t(s)] = h;
  if (h) {
    ncclProfilerEventStateArgs_v5_t a;
    memset(&a, 0, sizeof a);
    a.proxyStep.transSize = w.step_bytes;
    /* A sender that waits for data a stopped link upstream never delivers waits on its GPU. */
    const bool starved = w.is_send && s >= w.stall_at && w.move_ns != kNever;
    g_api->recordEventState(h,
                            !w.is_send ? ncclProfilerProxyStepRecvWait
                            : starved  ? ncclProfilerProxyStepSendGPUWait
                                       : ncclProfilerProxyStepSendWait,
                            &a);
    /* The plugin timed the wait as it recorded it: a thread preempted before that (a busy
     * host) would otherwise stop the step at once, a transfer the plugin sees take no time. */
    w.started_at[size_t(s)] = std::max(now, now_ns());
  }
}

/* Emits the work's events due by now (under g_px.m). Returns the time of its next event;
 * 0 when it is finished. A step starts at its slot in the ring's pace and its transfer takes
 * the link's own move time; up to kStepsInFlight steps are open at once (NCCL_STEPS), they
 * stop in order, and the ProxyOp stops with the last. Behind a hung link the transfer's
 * steps from `stall_at` on never end and no later step starts: its data never comes (a
 * hung link's own transfer stalls at step 0). Times are virtual: ideal time + lag.
 * Whenever a step starts late (the thread woke late on a busy host), the later steps slip by
 * that much, so the plugin measures the modeled step durations. Not before the work first
 * caught up with its schedule: the steps already due when it was published (simnccl's own
 * barriers took that long on a busy host; NCCL's proxy starts as the op is posted) start at
 * once, side by side, each still taking its move time, so the transfer ends about when
 * modeled instead of that much later. */
uint64_t advance(ProxyWork& w) {
  const int last_start = std::min(w.nsteps, w.stall_at + 1); /* the stalled step stays open */
  for (;;) {
    const uint64_t now = now_ns();
    if (w.next_stop == w.nsteps) {
      if (w.op_h) g_api->stopEvent(w.op_h);
      return 0;
    }
    uint64_t t_stop = kNever;
    if (w.next_stop < w.next_start && w.next_stop < w.stall_at)
      t_stop = w.started_at[size_t(w.next_stop)] + w.move_ns;
    uint64_t t_start = kNever;
    if (w.next_start < last_start && w.next_start - w.next_stop < kStepsInFlight)
      t_start = start_time(w, w.next_start);
    if (t_stop != kNever && t_stop <= now + 50000 && t_stop <= t_start) { /* events < 50 us apart coalesce */
      if (void* h = w.step_h[size_t(w.next_stop)]) g_api->stopEvent(h);
      ++w.next_stop;
      continue;
    }
    if (t_start != kNever && t_start <= now + 50000) {
      if (now > t_start + 50000 && w.caught_up) w.lag += now - t_start;
      start_step(w, w.next_start++, std::max(now, t_start));
      continue;
    }
    if (t_start != kNever) w.caught_up = true;
    return std::min(t_start, t_stop); /* kNever: a stalled step never ends */
  }
}

void start_proxy_op(ProxyWork& w) {
  w.started = true;
  w.step_h.assign(size_t(w.nsteps), nullptr);
  w.started_at.assign(size_t(w.nsteps), 0);
  ncclProfilerEventDescr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyOp;
  d.parentObj = w.parent;
  d.rank = w.rank;
  d.proxyOp.pid = getpid();
  d.proxyOp.channelId = 0;
  d.proxyOp.peer = w.peer;
  d.proxyOp.nSteps = w.nsteps;
  d.proxyOp.chunkSize = int(std::min<uint64_t>(w.step_bytes, INT32_MAX));
  d.proxyOp.isSend = w.is_send ? 1 : 0;
  w.op_h = start_event(w.comm, &d);
}

void proxy_main() {
  std::unique_lock<std::mutex> lk(g_px->m);
  for (;;) {
    for (ProxyWork* w : g_px->posted) {
      if (!w->cancelled) start_proxy_op(*w);
      g_px->active.push_back(w);
    }
    g_px->posted.clear();
    uint64_t wake = now_ns() + 100000000ull; /* re-check aborted comms every 100 ms */
    size_t keep = 0;
    for (ProxyWork* w : g_px->active) {
      uint64_t next = kNever;
      if (w->cancelled || w->comm->aborted.load()) {
        next = 0; /* dropped: an aborted op's ProxyOp is never stopped */
      } else if (w->timed) {
        next = advance(*w);
      }
      if (next == 0) {
        retire(w);
        continue;
      }
      g_px->active[keep++] = w;
      wake = std::min(wake, next);
    }
    g_px->active.resize(keep);
    if (!g_px->posted.empty()) continue;
    g_px->cv.wait_until(lk, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(wake)));
  }
}

void post(std::vector<ProxyWork*>& works) {
  if (works.empty()) return;
  std::lock_guard<std::mutex> lk(g_px->m);
  if (!g_px->running) {
    g_px->running = true;
    std::thread(proxy_main).detach();
  }
  g_px->posted.insert(g_px->posted.end(), works.begin(), works.end());
  g_px->cv.notify_one();
}

/* Fork child: the proxy thread is gone, and so are the parent's in-flight ops. */
void proxy_after_fork() {
  g_px = new ProxyThread; /* the parent's may be locked by a thread that does not exist here */
}

}  // namespace

void profiler_comm_init(ncclComm* c) {
  std::call_once(g_once, [] {
    load_plugin();
    pthread_atfork(nullptr, nullptr, proxy_after_fork);
  });
  if (!g_api) return;
  int rpn = config().ranks_per_node;
  std::set<int> nodes;
  for (int g : c->granks) nodes.insert(rpn > 0 ? g / rpn : 0);
  void* ctx = nullptr;
  ncclResult_t r = g_api->init(&ctx, c->id, &g_mask, c->name.c_str() + 1, int(nodes.size()), c->nranks, c->rank,
                               plugin_log);
  if (r != ncclSuccess) return;
  c->prof_ctx = ctx;
  c->prof_on = true;
}

void profiler_comm_finalize(ncclComm* c) {
  if (!c->prof_on) return;
  {
    /* No callback of this comm may run once finalize was called: drop its ProxyOps now
     * (the thread holds the lock while it calls the plugin). */
    std::lock_guard<std::mutex> lk(g_px->m);
    for (ProxyWork* w : g_px->posted)
      if (w->comm == c) w->cancelled = true;
    for (ProxyWork* w : g_px->active)
      if (w->comm == c) w->cancelled = true;
    g_px->cv.notify_one();
  }
  g_api->finalize(c->prof_ctx);
  c->prof_on = false;
}

void profiler_enqueue(std::vector<OpDesc>& ops, bool persistent) {
  const int mask = g_api ? mask_now() : 0;
  const bool want_op = mask & (ncclProfileProxyOp | ncclProfileProxyStep);
  const bool want_coll = want_op || (mask & ncclProfileColl);
  const bool want_p2p = want_op || (mask & ncclProfileP2p);
  std::vector<void*> tasks;
  std::vector<ProxyWork*> works;
  for (OpDesc& op : ops) {
    ncclComm* c = op.comm;
    bool p2p = op.kind == kSend || op.kind == kRecv;
    /* NCCL counts per (comm, function), graph-captured (persistent) plans excluded:
     * src/plugin/profiler.cc ncclProfilerStartTaskEvents, comm->seqNumber[ct->func]. */
    uint64_t seq_number = p2p ? 0 : c->prof_seq[op.kind];
    if (!p2p && !persistent) ++c->prof_seq[op.kind];
    if (!c->prof_on || !(p2p ? want_p2p : want_coll)) continue;
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof d);
    d.rank = c->rank;
    if (p2p) {
      d.type = ncclProfileP2p;
      d.p2p.func = op_func_name(op.kind);
      d.p2p.buff = op.kind == kSend ? const_cast<void*>(op.send) : op.recv;
      d.p2p.datatype = dtype_name(op.dtype);
      d.p2p.count = op.count;
      d.p2p.peer = op.peer;
      d.p2p.nChannels = 1;
    } else {
      d.type = ncclProfileColl;
      d.coll.seqNumber = seq_number;
      d.coll.func = op_func_name(op.kind);
      d.coll.sendBuff = op.send;
      d.coll.recvBuff = op.recv;
      d.coll.count = op.count;
      d.coll.root = op.peer;
      d.coll.datatype = dtype_name(op.dtype);
      d.coll.nChannels = 1;
      d.coll.algo = "RING";
      d.coll.proto = "SIMPLE";
    }
    void* task = start_event(c, &d);
    if (task) tasks.push_back(task);
    if (!want_op) continue;
    /* The transfers' shape (peers, steps, chunk) does not depend on timing. */
    uint64_t bytes = op.count * c4d_dtype_size(op.dtype);
    Schedule shape = p2p ? (op.kind == kSend ? model_p2p(c, c->rank, op.peer, true, bytes, op.step, 0, 0)
                                             : model_p2p(c, op.peer, c->rank, false, bytes, op.step, 0, 0))
                         : model_coll(c, op.kind, bytes, op.peer, op.step, op.seq, 0);
    ProxySet* set = nullptr;
    for (size_t i = 0; i < shape.mine.size(); ++i) {
      const Transfer& tr = shape.mine[i];
      if (same_node(c, c->rank, tr.peer)) continue;
      if (!set) set = new ProxySet;
      ProxyWork* w = new ProxyWork;
      w->set = set;
      w->comm = c;
      w->parent = task;
      w->rank = c->rank;
      w->peer = tr.peer;
      w->is_send = tr.is_send;
      w->first_step = tr.first_step;
      w->nsteps = tr.nsteps;
      w->step_bytes = tr.step_bytes;
      w->mine_idx = i;
      set->works.push_back(w);
      works.push_back(w);
    }
    if (set) {
      set->refs.fetch_add(int(set->works.size()));
      set->remaining.store(uint32_t(set->works.size()));
      op.proxy = set;
    }
  }
  for (void* t : tasks) g_api->stopEvent(t); /* "enqueued"; completion is the last ProxyOp stop */
  post(works); /* the proxy thread starts their ProxyOps after this */
}

void profiler_publish(ProxySet* p, const Schedule& s) {
  std::lock_guard<std::mutex> lk(g_px->m);
  if (p->published) return; /* once: its works may be finished and freed by now */
  p->published = true;
  for (ProxyWork* w : p->works) {
    const Transfer& tr = s.mine[w->mine_idx];
    w->t0 = s.t0;
    w->step_ns = s.step_ns;
    w->move_ns = tr.move_ns;
    w->stall_at = tr.done_steps;
    w->timed = true;
  }
  g_px->cv.notify_one();
}

void profiler_wait(ProxySet* p, ncclComm* c) {
  for (;;) {
    uint32_t left = p->remaining.load();
    if (left == 0 || c->aborted.load()) return;
    futex_wait(&p->remaining, left, 20000000ull, false);
  }
}

void profiler_release(ProxySet* p) {
  {
    std::lock_guard<std::mutex> lk(g_px->m);
    if (!p->published) {
      for (ProxyWork* w : p->works) w->cancelled = true; /* never ran (aborted): drop its ProxyOps */
      g_px->cv.notify_one();
    }
  }
  p->unref();
}

}  // namespace sim
