/*
 * The NCCL profiler plugin path: load a v5 plugin the way NCCL does, init it per
 * communicator, and emit Coll/P2p → ProxyOp → ProxyStep events from the stream worker
 * while the modeled transfers progress (profiler_abi.h says exactly what is emitted).
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
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

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

/* One transfer of one op as the plugin sees it. */
struct Xfer {
  const Transfer* tr;
  const Schedule* sched;
  ncclComm* comm;
  void* op_h = nullptr;
  std::vector<void*> step_h;
};

enum EvKind { kStepEnd = 0, kOpEnd = 1, kStepStart = 2 }; /* ties: ends before starts */

struct Ev {
  uint64_t t;
  int kind;
  size_t x;
  int step;
  bool operator<(const Ev& o) const { return t != o.t ? t < o.t : kind < o.kind; }
};

void* start_event(ncclComm* c, ncclProfilerEventDescr_v5_t* d) {
  void* h = nullptr;
  if (g_api->startEvent(c->prof_ctx, &h, d) != ncclSuccess) return nullptr;
  return h;
}

}  // namespace

void profiler_comm_init(ncclComm* c) {
  std::call_once(g_once, load_plugin);
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
  g_api->finalize(c->prof_ctx);
  c->prof_on = false;
}

bool profiler_active(const std::vector<TimedOp>& ops) {
  if (!g_api) return false;
  int mask = __atomic_load_n(&g_mask, __ATOMIC_RELAXED);
  if (!(mask & (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep))) return false;
  for (const TimedOp& t : ops)
    if (t.op->comm->prof_on) return true;
  return false;
}

void profiler_run_timeline(std::vector<TimedOp>& ops) {
  const int mask = __atomic_load_n(&g_mask, __ATOMIC_RELAXED);
  const bool want_step = mask & ncclProfileProxyStep;
  const bool want_op = want_step || (mask & ncclProfileProxyOp);
  const bool want_coll = want_op || (mask & ncclProfileColl);
  const bool want_p2p = want_op || (mask & ncclProfileP2p);
  const pid_t pid = getpid();

  std::vector<Xfer> xs;
  std::vector<Ev> evs;
  uint64_t end = 0;
  for (TimedOp& t : ops) {
    end = std::max(end, t.sched.finish);
    ncclComm* c = t.op->comm;
    if (!c->prof_on) continue;
    const OpDesc& op = *t.op;
    bool p2p = op.kind == kSend || op.kind == kRecv;
    void* parent = nullptr;
    if (p2p ? want_p2p : want_coll) {
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
        d.coll.seqNumber = op.seq - 1;
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
      parent = start_event(c, &d);
    }
    for (const Transfer& tr : t.sched.mine) {
      Xfer x{&tr, &t.sched, c, nullptr, {}};
      if (want_op) {
        ncclProfilerEventDescr_v5_t d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileProxyOp;
        d.parentObj = parent;
        d.rank = c->rank;
        d.proxyOp.pid = pid;
        d.proxyOp.channelId = 0;
        d.proxyOp.peer = tr.peer;
        d.proxyOp.nSteps = tr.nsteps;
        d.proxyOp.chunkSize = int(std::min<uint64_t>(tr.step_bytes, INT32_MAX));
        d.proxyOp.isSend = tr.is_send ? 1 : 0;
        x.op_h = start_event(c, &d);
      }
      x.step_h.assign(size_t(tr.nsteps), nullptr);
      size_t xi = xs.size();
      xs.push_back(x);
      /* step s starts at t0 + (first + s) * step_ns and takes move_ns; a hung link's
       * first step starts and never ends, and nothing after it starts */
      uint64_t last_end = 0;
      for (int s = 0; s < tr.nsteps; ++s) {
        uint64_t st = t.sched.t0 + uint64_t(tr.first_step + s) * t.sched.step_ns;
        if (want_step) evs.push_back({st, kStepStart, xi, s});
        if (tr.move_ns == kNever) {
          last_end = kNever;
          break;
        }
        last_end = st + tr.move_ns;
        if (want_step) evs.push_back({last_end, kStepEnd, xi, s});
      }
      if (want_op && last_end != kNever) evs.push_back({last_end, kOpEnd, xi, -1});
    }
    if (parent) g_api->stopEvent(parent); /* "enqueued": completion is the last ProxyOp stop */
  }
  std::sort(evs.begin(), evs.end());
  /* Events run on a virtual clock: ideal time + lag. The worker reaches this point after
   * the input exchange, possibly past the first steps' ideal times, and a busy host may
   * wake it late; whenever a step would start late, the rest of the schedule slips by
   * that much, so the plugin always measures the modeled step durations (the op then
   * ends with its last event, a little after `finish`). */
  uint64_t lag = 0;
  for (const Ev& e : evs) {
    uint64_t t = e.t + lag, now = now_ns();
    if (t > now + 50000) {
      sleep_until_ns(t); /* events < 50 us apart are coalesced */
    } else if (e.kind == kStepStart && now > t + 50000) {
      lag += now - t;
    }
    Xfer& x = xs[e.x];
    if (e.kind == kStepStart) {
      ncclProfilerEventDescr_v5_t d;
      memset(&d, 0, sizeof d);
      d.type = ncclProfileProxyStep;
      d.parentObj = x.op_h;
      d.rank = x.comm->rank;
      d.proxyStep.step = e.step;
      void* h = start_event(x.comm, &d);
      x.step_h[size_t(e.step)] = h;
      if (h) {
        ncclProfilerEventStateArgs_v5_t a;
        memset(&a, 0, sizeof a);
        a.proxyStep.transSize = x.tr->step_bytes;
        g_api->recordEventState(h, x.tr->is_send ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvWait,
                                &a);
      }
    } else if (e.kind == kStepEnd) {
      if (void* h = x.step_h[size_t(e.step)]) g_api->stopEvent(h);
    } else if (x.op_h) {
      g_api->stopEvent(x.op_h);
    }
  }
  if (end != kNever) {
    sleep_until_ns(end);
    return;
  }
  for (;;) { /* hung: the stalled steps stay open; sleep until a comm is aborted */
    for (const TimedOp& t : ops)
      if (t.op->comm->aborted.load()) return;
    sleep_until_ns(now_ns() + 100000000ull);
  }
}

}  // namespace sim
