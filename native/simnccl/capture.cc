/*
 * Stream capture and CUDA graphs on the CPU, as far as NCCL ops in a captured stream need
 * them: cudaStreamBeginCapture/EndCapture, cudaStreamIsCapturing, cudaStreamGetCaptureInfo,
 * cudaThreadExchangeStreamCaptureMode, cudaGraphInstantiate/Launch/Destroy.
 *
 * A capturing stream runs nothing: what is enqueued on it (kernels, event records, waits,
 * copies, NCCL groups) becomes an item of the graph, and every cudaGraphLaunch enqueues the
 * items again on the launch stream. An NCCL group replayed this way is launched afresh
 * (numbered, its profiler task events emitted on the replaying thread as NCCL's host
 * callback does, its seqNumber not advanced: NCCL 2.30.7 enqueue.cc hostStreamPlanCallback,
 * profiler.cc ncclProfilerStartTaskEvents for persistent plans).
 *
 * The CUDA rule for "potentially unsafe" calls (runtime API, cudaThreadExchangeStreamCaptureMode):
 * a thread's mode is Global (the default), ThreadLocal or Relaxed. A thread in Global mode
 * may not make such a call while it has a capture of its own not begun Relaxed, or while any
 * other thread has a capture begun Global; ThreadLocal only minds its own capture; Relaxed
 * minds nothing. A forbidden call returns cudaErrorStreamCaptureUnsupported and invalidates
 * the offending captures, whose cudaStreamEndCapture then fails with
 * cudaErrorStreamCaptureInvalidated. simnccl's unsafe calls: cudaEventQuery,
 * cudaEventSynchronize, cudaStreamQuery, cudaStreamSynchronize, cudaDeviceSynchronize,
 * cudaMalloc, cudaFree, cudaMemcpy, cudaMemset. Querying or synchronising the capturing
 * stream itself is never allowed. This is what broke PyTorch's CUDA graphs when its
 * watchdog thread queried events (pytorch#104555, fixed by #148594: relaxed mode).
 *
 * Not simulated: captures that fork into other streams (an NCCL group over several
 * streams under capture is refused), graphs launched inside a capture, graph editing.
 */
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "c4d/cuda_abi.h"
#include "ops.h"
#include "stream.h"

namespace sim {

constexpr uint32_t kGraphMagic = 0x47524150u; /* "GRAP" */
constexpr uint32_t kExecMagic = 0x47455845u;  /* "GEXE" */
enum { kModeGlobal = 0, kModeThreadLocal = 1, kModeRelaxed = 2 };
enum { kStatusNone = 0, kStatusActive = 1, kStatusInvalidated = 2 };

struct Capture {
  int mode;
  pid_t tid; /* the thread that began it */
  uint64_t id;
  bool invalidated;
  std::vector<Item> items;
};

struct Graph {
  uint32_t magic;
  std::vector<Item> items;
};

struct GraphExec {
  uint32_t magic;
  std::vector<Item> items;
};

namespace {

std::mutex* g_mu = new std::mutex;                        /* leaked on purpose: workers may */
std::vector<Stream*>* g_capturing = new std::vector<Stream*>; /* outlive static destructors */
std::atomic<int> g_active{0}; /* captures in progress, for the lock-free fast path */
uint64_t g_next_id = 1;
thread_local int t_mode = kModeGlobal;

pid_t my_tid() {
  thread_local pid_t tid = pid_t(syscall(SYS_gettid));
  return tid;
}

Event* as_event(void* p) {
  Event* e = static_cast<Event*>(p);
  return e;
}

void drop_items(std::vector<Item>& items) {
  for (Item& it : items) {
    if (it.kind == ItemKind::EventRecord || it.kind == ItemKind::WaitEvent) as_event(it.p)->release();
    if (it.kind == ItemKind::Group) delete static_cast<GroupWork*>(it.p);
  }
  items.clear();
}

Item copy_item(const Item& it) {
  Item c = it;
  if (it.kind == ItemKind::EventRecord || it.kind == ItemKind::WaitEvent) as_event(it.p)->refs.fetch_add(1);
  if (it.kind == ItemKind::Group) c.p = new GroupWork(*static_cast<const GroupWork*>(it.p));
  return c;
}

/* Under g_mu: the capture of s is over. */
Capture* end_capture_locked(Stream* s) {
  Capture* c = s->capture;
  s->capture = nullptr;
  s->capturing.store(false);
  auto& v = *g_capturing;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  g_active.fetch_sub(1);
  return c;
}

/* One captured item, run again on stream s. */
void launch_item(const Item& it, Stream* s) {
  switch (it.kind) {
    case ItemKind::EventRecord:
      record_event(as_event(it.p), s);
      break;
    case ItemKind::WaitEvent: {
      Event* e = as_event(it.p);
      uint32_t gen = e->rec_gen.load();
      if (gen == 0 || e->complete()) break;
      e->refs.fetch_add(1);
      stream_enqueue(s, Item{ItemKind::WaitEvent, e, nullptr, gen, 0});
      break;
    }
    case ItemKind::Group:
      launch_captured_group(static_cast<const GroupWork*>(it.p), s);
      break;
    default:
      stream_enqueue(s, it);
  }
}

}  // namespace

bool capture_item(Stream* s, const Item& it) {
  std::lock_guard<std::mutex> lk(*g_mu);
  if (!s->capture) return false;
  s->capture->items.push_back(it); /* the caller's reference on an event moves into the graph */
  return true;
}

bool capture_group(Stream* s, GroupWork* g) { return capture_item(s, Item{ItemKind::Group, g, nullptr, 0, 0}); }

cudaError_t capture_guard() {
  if (g_active.load(std::memory_order_relaxed) == 0 || t_mode == kModeRelaxed) return 0;
  std::lock_guard<std::mutex> lk(*g_mu);
  bool refused = false;
  for (Stream* s : *g_capturing) {
    Capture* c = s->capture;
    if (!c || c->invalidated) continue;
    bool mine = c->tid == my_tid();
    if ((mine && c->mode != kModeRelaxed) || (!mine && t_mode == kModeGlobal && c->mode == kModeGlobal)) {
      c->invalidated = true;
      refused = true;
    }
  }
  return refused ? fail(kErrCaptureUnsupported) : 0;
}

cudaError_t capture_guard_stream(Stream* s) {
  if (!s->capturing.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lk(*g_mu);
  if (!s->capture) return 0;
  s->capture->invalidated = true;
  return fail(kErrCaptureUnsupported);
}

}  // namespace sim

using namespace sim;

SIM_API cudaError_t cudaThreadExchangeStreamCaptureMode(int* mode) {
  if (!mode || *mode < kModeGlobal || *mode > kModeRelaxed) return fail(kErrInvalidValue);
  std::swap(*mode, t_mode);
  return 0;
}

SIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode) {
  context_on_device(current_device());
  if (mode < kModeGlobal || mode > kModeRelaxed) return fail(kErrInvalidValue);
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return fail(kErrCaptureUnsupported); /* not the legacy stream */
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  std::lock_guard<std::mutex> lk(*g_mu);
  if (s->capture) return fail(kErrIllegalState);
  s->capture = new Capture{mode, my_tid(), g_next_id++, false, {}};
  s->capturing.store(true);
  g_capturing->push_back(s);
  g_active.fetch_add(1);
  return 0;
}

SIM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  context_on_device(current_device());
  if (!graph) return fail(kErrInvalidValue);
  *graph = nullptr;
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  Capture* c;
  {
    std::lock_guard<std::mutex> lk(*g_mu);
    if (!s->capture) return fail(kErrIllegalState);
    if (s->capture->mode != kModeRelaxed && s->capture->tid != my_tid()) {
      s->capture->invalidated = true;
      return fail(kErrCaptureWrongThread);
    }
    c = end_capture_locked(s);
  }
  if (c->invalidated) {
    drop_items(c->items);
    delete c;
    return fail(kErrCaptureInvalidated);
  }
  Graph* g = new Graph{kGraphMagic, std::move(c->items)};
  delete c;
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return 0;
}

SIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int* status) {
  Stream* s = resolve_stream(stream);
  if (!s || !status) return fail(s ? kErrInvalidValue : kErrInvalidHandle);
  if (!s->capturing.load(std::memory_order_relaxed)) {
    *status = kStatusNone;
    return 0;
  }
  std::lock_guard<std::mutex> lk(*g_mu);
  *status = !s->capture ? kStatusNone : s->capture->invalidated ? kStatusInvalidated : kStatusActive;
  return 0;
}

/* The CUDA 11/12 three-argument form (status, id). */
SIM_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, int* status, unsigned long long* id) {
  Stream* s = resolve_stream(stream);
  if (!s || !status) return fail(s ? kErrInvalidValue : kErrInvalidHandle);
  std::lock_guard<std::mutex> lk(*g_mu);
  *status = !s->capture ? kStatusNone : s->capture->invalidated ? kStatusInvalidated : kStatusActive;
  if (id) *id = s->capture ? s->capture->id : 0;
  return 0;
}

SIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  Graph* g = reinterpret_cast<Graph*>(graph);
  if (!exec || !g || g->magic != kGraphMagic) return fail(kErrInvalidValue);
  GraphExec* x = new GraphExec{kExecMagic, {}};
  for (const Item& it : g->items) x->items.push_back(copy_item(it));
  *exec = reinterpret_cast<cudaGraphExec_t>(x);
  return 0;
}

SIM_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                  unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

SIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  context_on_device(current_device());
  GraphExec* x = reinterpret_cast<GraphExec*>(exec);
  Stream* s = resolve_stream(stream);
  if (!x || x->magic != kExecMagic || !s) return fail(kErrInvalidHandle);
  if (s->capturing.load()) return fail(kErrCaptureUnsupported); /* a graph inside a graph: not simulated */
  for (const Item& it : x->items) launch_item(it, s);
  return 0;
}

SIM_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Graph* g = reinterpret_cast<Graph*>(graph);
  if (!g || g->magic != kGraphMagic) return fail(kErrInvalidValue);
  drop_items(g->items);
  g->magic = 0;
  delete g;
  return 0;
}

SIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  GraphExec* x = reinterpret_cast<GraphExec*>(exec);
  if (!x || x->magic != kExecMagic) return fail(kErrInvalidValue);
  drop_items(x->items);
  x->magic = 0;
  delete x;
  return 0;
}
