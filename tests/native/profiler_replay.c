/*
 * Drives an NCCL profiler plugin (libc4d.so's ncclProfiler_v6 / _v5) with the event
 * sequence real NCCL produces, so tests/test_conformance_profiler_order.py can check the
 * plugin against NCCL's behaviour rather than against simnccl's. Compiled by that test
 * against upstream's own profiler headers (tests/native/upstream_nccl/, NCCL v2.30.7-1).
 *
 * The order replayed, read from NCCL v2.30.7-1 (one communicator, 2 ranks on 2 nodes, so
 * a network transport with a proxy; we are rank 0):
 *   API thread, per call (src/enqueue.cc collTaskAppend / p2pTaskAppend; src/group.cc):
 *     GroupApi start, state GroupStartApiStop, CollApi|P2pApi start ... stop,
 *     state GroupEndApiStart, KernelLaunch start/stop around the launch,
 *     then hostStreamPlanTask (src/enqueue.cc): Group start, Coll/P2p task starts,
 *     uploadProxyOps + ncclProxyStart (the ops are posted), task stops, Group stop;
 *     GroupApi stop.
 *   Proxy progress thread, later (src/proxy.cc ProxyAppend → ncclProxyOpToArgs starts the
 *   ProxyOp with parentObj = the task's handle, already stopped; src/transport/net.cc
 *   send/recvProxyProgress): state ProxyOpInProgress_v4; per step: ProxyStep start, send:
 *   SendGPUWait, SendPeerWait_v4, SendWait(transSize); recv: RecvWait, RecvFlushWait(transSize),
 *   RecvGPUWait; ProxyStep stop; when every sub is done, ProxyOp stops.
 * Each event is emitted only when the activation mask the plugin returned from init asks
 * for it (the same tests as src/plugin/profiler.cc).
 *
 * ORDER "task-open": the ProxyOps start before the task stops. simnccl emitted this order
 * before issue 8 (native/simnccl/profiler.cc), and real NCCL can too, when its progress thread
 * picks the posted ops up before the host thread reaches ncclProfilerStopTaskEvents: a plugin
 * must handle both. The tests use it as the control.
 *
 * usage: profiler_replay LIB SYMBOL ORDER N_PER_FUNC
 *   LIB     path of the plugin library, or STATIC_PLUGIN (look the symbol up in the process,
 *           as NCCL does with NCCL_PROFILER_PLUGIN=STATIC_PLUGIN, for an LD_PRELOADed shim)
 *   SYMBOL  ncclProfiler_v6 or ncclProfiler_v5
 *   ORDER   nccl or task-open
 *   N_PER_FUNC  AllReduce and AllGather calls each, and Send/Recv pairs (grouped)
 * stdout, last line: "replayed <plans> plans, <transfers> transfers, <events> events, mask 0x<m>"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "common.h"
#include "profiler.h"

enum { kRanks = 2, kPeer = 1, kChannels = 2, kSteps = 4, kStepBytes = 1 << 19 };
enum { kMaxTasks = 2, kMaxOps = kMaxTasks * kChannels * 2 };

typedef ncclProfiler_v6_t Api; /* v5 has the same callbacks; its descriptor is v6's prefix */
typedef ncclProfilerEventDescr_v6_t Descr;

static Api g_api;
static void* g_ctx;
static int g_mask;
static unsigned long g_events;

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("profiler_replay: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void* start(Descr* d) {
  void* h = NULL;
  __atomic_fetch_add(&g_events, 1, __ATOMIC_RELAXED); /* both threads */
  if (g_api.startEvent(g_ctx, &h, d) != ncclSuccess) die("startEvent(type 0x%llx) failed", (unsigned long long)d->type);
  return h;
}

static void stop(void* h) {
  if (h && g_api.stopEvent(h) != ncclSuccess) die("stopEvent failed");
}

static void state(void* h, ncclProfilerEventState_t s, size_t trans) {
  if (!h) return;
  ncclProfilerEventStateArgs_v6_t a;
  memset(&a, 0, sizeof a);
  a.proxyStep.transSize = trans;
  if (g_api.recordEventState(h, s, &a) != ncclSuccess) die("recordEventState(%d) failed", (int)s);
}

static bool want(int bits) { return (g_mask & bits) != 0; }

/* One ProxyOp: a (task, channel, direction) sub of a plan. */
typedef struct {
  void* task;
  int channel, is_send;
  void* h;
} Op;

/* One kernel plan: its tasks (one collective, or a Send and a Recv), and its ProxyOps. */
typedef struct Plan {
  const char* func[kMaxTasks];
  int p2p[kMaxTasks];
  uint64_t seq[kMaxTasks];
  int n_tasks;
  void* task_h[kMaxTasks];
  void* kernel_h[kMaxTasks][kChannels];
  Op ops[kMaxOps];
  int n_ops;
  int phase;        /* progress thread: 1 start the ProxyOps only (task-open), 2 run to the end */
  bool ops_started; /* their ProxyOp events were started */
  struct Plan* next;
} Plan;

/* ------------------------------------------------------------ progress thread */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static Plan *g_head, *g_tail;
static bool g_quit;
static int g_acked; /* plans whose phase 1 the progress thread finished */

static void post(Plan* p) {
  pthread_mutex_lock(&g_mu);
  p->next = NULL;
  if (g_tail)
    g_tail->next = p;
  else
    g_head = p;
  g_tail = p;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

static void proxy_ops_start(Plan* p) {
  p->ops_started = true;
  if (!want(ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin)) return;
  for (int i = 0; i < p->n_ops; ++i) {
    Op* o = &p->ops[i];
    Descr d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileProxyOp;
    d.parentObj = o->task; /* sub->taskEventHandle (src/enqueue.cc uploadProxyOps) */
    d.rank = 0;
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = (uint8_t)o->channel;
    d.proxyOp.peer = kPeer;
    d.proxyOp.nSteps = kSteps;
    d.proxyOp.chunkSize = kStepBytes;
    d.proxyOp.isSend = o->is_send;
    o->h = start(&d);
    state(o->h, ncclProfilerProxyOpInProgress_v4, 0);
  }
}

/* Kernel channel events (only when the plugin asks for KernelCh): NCCL's proxy reads the
 * kernel's per-channel GPU timestamps and reports them with the task as the parent
 * (src/plugin/profiler.cc ncclProfilerStart/StopKernelChEvent). */
static void kernel_channels(Plan* p, bool begin) {
  if (!want(ncclProfileKernelCh)) return;
  for (int t = 0; t < p->n_tasks; ++t)
    for (int c = 0; c < kChannels; ++c) {
      if (begin) {
        Descr d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileKernelCh;
        d.parentObj = p->task_h[t];
        d.rank = 0;
        d.kernelCh.channelId = (uint8_t)c;
        d.kernelCh.pTimer = 1000;
        p->kernel_h[t][c] = start(&d);
      } else if (p->kernel_h[t][c]) {
        ncclProfilerEventStateArgs_v6_t a;
        memset(&a, 0, sizeof a);
        a.kernelCh.pTimer = 2000;
        if (g_api.recordEventState(p->kernel_h[t][c], ncclProfilerKernelChStop, &a) != ncclSuccess)
          die("recordEventState(KernelChStop) failed");
        stop(p->kernel_h[t][c]);
      }
    }
}

/* A send step waits kGpuWaitUs for its data, then its Isend takes kWireUs (test_conformance_
 * profiler_order.py checks that the PEER record's wire_ns counts only the latter). */
enum { kGpuWaitUs = 300, kWireUs = 100 };
static void pause_us(long us) {
  struct timespec t = {0, us * 1000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

static void proxy_progress(Plan* p) {
  kernel_channels(p, true);
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < p->n_ops; ++i) {
      Op* o = &p->ops[i];
      void* h = NULL;
      if (want(ncclProfileProxyStep | ncclProfileNetPlugin)) {
        Descr d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileProxyStep;
        d.parentObj = o->h;
        d.rank = 0;
        d.proxyStep.step = s;
        h = start(&d);
      }
      if (o->is_send) { /* the GPU's data and the peer's buffer take a while, the Isend less */
        state(h, ncclProfilerProxyStepSendGPUWait, 0);
        pause_us(kGpuWaitUs);
        state(h, ncclProfilerProxyStepSendPeerWait_v4, 0);
        state(h, ncclProfilerProxyStepSendWait, kStepBytes);
        pause_us(kWireUs);
      } else {
        state(h, ncclProfilerProxyStepRecvWait, 0);
        state(h, ncclProfilerProxyStepRecvFlushWait, kStepBytes);
        state(h, ncclProfilerProxyStepRecvGPUWait, kStepBytes);
      }
      stop(h);
    }
  }
  for (int i = 0; i < p->n_ops; ++i) stop(p->ops[i].h);
  kernel_channels(p, false);
}

static void* progress_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!g_head && !g_quit) pthread_cond_wait(&g_cv, &g_mu);
    if (!g_head) break;
    Plan* p = g_head;
    g_head = p->next;
    if (!g_head) g_tail = NULL;
    pthread_mutex_unlock(&g_mu);
    if (p->phase == 1) {
      proxy_ops_start(p);
      pthread_mutex_lock(&g_mu);
      ++g_acked;
      pthread_cond_broadcast(&g_cv);
      continue;
    }
    if (!p->ops_started) proxy_ops_start(p); /* nccl order: the ProxyOps start here */
    proxy_progress(p);
    free(p);
    pthread_mutex_lock(&g_mu);
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* --------------------------------------------------------------- API thread */

static void* api_event(uint64_t type, int bits, void* parent, const char* func, int root) {
  if (!want(bits)) return NULL;
  Descr d;
  memset(&d, 0, sizeof d);
  d.type = type;
  d.parentObj = parent;
  if (type == ncclProfileGroupApi) {
    d.groupApi.groupDepth = 1;
  } else if (type == ncclProfileCollApi) {
    d.collApi.func = func;
    d.collApi.count = 1 << 20;
    d.collApi.datatype = "ncclFloat32";
    d.collApi.root = root;
  } else if (type == ncclProfileP2pApi) {
    d.p2pApi.func = func;
    d.p2pApi.count = 1 << 20;
    d.p2pApi.datatype = "ncclFloat32";
  }
  return start(&d);
}

static void issue(Plan* p, bool nccl_order) {
  const int group_api_bits = ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch |
                             ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |
                             ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin | ncclProfileCeColl |
                             ncclProfileCeSync | ncclProfileCeBatch;
  const int task_bits = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
  void* api_parent[kMaxTasks] = {NULL};

  /* The API calls (an implicit group for a collective, ncclGroupStart/End around the p2p). */
  void* group_api = api_event(ncclProfileGroupApi, group_api_bits, NULL, NULL, 0);
  state(group_api, ncclProfilerGroupStartApiStop, 0);
  for (int t = 0; t < p->n_tasks; ++t) {
    uint64_t type = p->p2p[t] ? ncclProfileP2pApi : ncclProfileCollApi;
    int bits = (p->p2p[t] ? ncclProfileP2pApi | ncclProfileP2p : ncclProfileCollApi | ncclProfileColl) | task_bits;
    api_parent[t] = api_event(type, bits, group_api, p->func[t], -1);
    stop(api_parent[t]);
  }
  state(group_api, ncclProfilerGroupEndApiStart, 0);
  if (want(ncclProfileKernelLaunch)) {
    Descr d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileKernelLaunch;
    d.parentObj = group_api;
    stop(start(&d));
  }

  /* hostStreamPlanTask */
  void* group = NULL;
  if (want(ncclProfileGroup | ncclProfileColl | ncclProfileP2p | task_bits)) {
    Descr d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroup;
    group = start(&d);
  }
  for (int t = 0; t < p->n_tasks; ++t) {
    if (!want((p->p2p[t] ? ncclProfileP2p : ncclProfileColl) | task_bits)) continue;
    Descr d;
    memset(&d, 0, sizeof d);
    d.parentObj = api_parent[t];
    d.rank = 0;
    if (p->p2p[t]) {
      d.type = ncclProfileP2p;
      d.p2p.func = p->func[t];
      d.p2p.datatype = "ncclFloat32";
      d.p2p.count = 1 << 20;
      d.p2p.peer = kPeer;
      d.p2p.nChannels = kChannels;
      d.p2p.parentGroup = group;
    } else {
      d.type = ncclProfileColl;
      d.coll.seqNumber = p->seq[t];
      d.coll.func = p->func[t];
      d.coll.count = 1 << 20;
      d.coll.root = 0;
      d.coll.datatype = "ncclFloat32";
      d.coll.nChannels = kChannels;
      d.coll.nWarps = 16;
      d.coll.algo = "RING";
      d.coll.proto = "SIMPLE";
      d.coll.parentGroup = group;
    }
    p->task_h[t] = start(&d);
  }
  /* the ProxyOps of the plan: per task, per channel, the directions it moves */
  p->n_ops = 0;
  for (int t = 0; t < p->n_tasks; ++t)
    for (int c = 0; c < kChannels; ++c)
      for (int send = 1; send >= 0; --send) {
        if (p->p2p[t] && (send != !strcmp(p->func[t], "Send"))) continue;
        p->ops[p->n_ops++] = (Op){p->task_h[t], c, send, NULL};
      }

  if (nccl_order) {
    for (int t = 0; t < p->n_tasks; ++t) stop(p->task_h[t]); /* before any ProxyOp exists */
    stop(group);
    stop(group_api);
    p->phase = 2;
    post(p); /* picked up by the progress thread later */
    return;
  }
  /* task-open: the ProxyOps start while the task is open, then the task stops */
  pthread_mutex_lock(&g_mu);
  int want_ack = g_acked + 1;
  pthread_mutex_unlock(&g_mu);
  p->phase = 1;
  post(p);
  pthread_mutex_lock(&g_mu);
  while (g_acked < want_ack) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  for (int t = 0; t < p->n_tasks; ++t) stop(p->task_h[t]);
  stop(group);
  stop(group_api);
  p->phase = 2;
  post(p);
}

static void log_fn(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level;
  (void)flags;
  (void)file;
  (void)line;
  (void)fmt;
}

int main(int argc, char** argv) {
  if (argc != 5) die("usage: profiler_replay LIB SYMBOL ORDER N_PER_FUNC");
  const char* lib = argv[1];
  const char* sym = argv[2];
  bool nccl_order = !strcmp(argv[3], "nccl");
  if (!nccl_order && strcmp(argv[3], "task-open")) die("ORDER is nccl or task-open, not %s", argv[3]);
  int n = atoi(argv[4]);
  if (n <= 0) die("N_PER_FUNC must be > 0");

  /* As src/plugin/plugin_open.cc: dlopen(path), or dlopen(NULL) for STATIC_PLUGIN. */
  void* h = dlopen(strcmp(lib, "STATIC_PLUGIN") ? lib : NULL, RTLD_NOW | RTLD_LOCAL);
  if (!h) die("dlopen(%s): %s", lib, dlerror());
  const Api* api = (const Api*)dlsym(h, sym);
  if (!api) die("%s not found in %s", sym, lib);
  g_api = *api;
  if (!g_api.name || !g_api.init || !g_api.startEvent || !g_api.stopEvent || !g_api.recordEventState ||
      !g_api.finalize)
    die("%s has a NULL member", sym);

  const uint64_t comm_id = 0xc4dc0ffee0000001ull;
  if (g_api.init(&g_ctx, comm_id, &g_mask, "replay", kRanks, kRanks, 0, log_fn) != ncclSuccess)
    die("init failed: NCCL would unload the plugin");

  pthread_t progress;
  if (pthread_create(&progress, NULL, progress_main, NULL)) die("pthread_create failed");

  static const char* const kColl[] = {"AllReduce", "AllGather"};
  unsigned long plans = 0, transfers = 0;
  for (int i = 0; i < n; ++i) {
    for (int f = 0; f < 2; ++f) {
      Plan* p = calloc(1, sizeof *p);
      if (!p) die("out of memory");
      p->n_tasks = 1;
      p->func[0] = kColl[f];
      p->seq[0] = (uint64_t)i; /* comm->seqNumber[func]: per function, from 0 */
      issue(p, nccl_order);
      ++plans;
      transfers += 2; /* to the peer and from it */
    }
    Plan* p = calloc(1, sizeof *p);
    if (!p) die("out of memory");
    p->n_tasks = 2;
    p->func[0] = "Send";
    p->func[1] = "Recv";
    p->p2p[0] = p->p2p[1] = 1;
    issue(p, nccl_order);
    ++plans;
    transfers += 2;
  }

  pthread_mutex_lock(&g_mu);
  g_quit = true;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(progress, NULL);
  if (g_api.finalize(g_ctx) != ncclSuccess) die("finalize failed");
  printf("replayed %lu plans, %lu transfers, %lu events, mask 0x%x\n", plans, transfers, g_events, g_mask);
  return 0;
}
