/*
 * Test-only NCCL profiler plugin (v5): logs every callback as one line, so
 * tests/test_simnccl.py can check what simnccl emits. Built by the test itself.
 *
 * Env: SIMNCCL_TEST_PROFILER_LOG  log path prefix; each process appends to PREFIX.<pid>
 *      SIMNCCL_TEST_PROFILER_MASK activation mask (default 4095: every v5 event)
 *      SIMNCCL_TEST_PROFILER_FAIL_INIT=1  init returns ncclInternalError
 *
 * Lines (t = CLOCK_MONOTONIC ns; tid = the calling thread; h/parent = small event ids,
 * 0 = none):
 *   init t= comm=<hex> name= nnodes= nranks= rank=
 *   coll t= h= comm= rank= seq= func= count= root= dtype= algo= proto=
 *   p2p t= h= comm= rank= func= peer= count= dtype=
 *   proxyop t= h= parent= comm= rank= peer= send= nsteps= chunk= pidok=
 *   proxystep t= h= parent= comm= rank= step=
 *   state t= h= state= size=
 *   stop t= h=
 *   finalize t= comm=
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "c4d/profiler_abi.h"

struct ctx {
  unsigned long long comm;
  int rank;
};

static int g_fd = -1;
static unsigned long g_next = 1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void out(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n < (int)sizeof buf - 24) n += snprintf(buf + n, sizeof buf - (size_t)n, " tid=%ld", (long)syscall(SYS_gettid));
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  if (g_fd >= 0 && write(g_fd, buf, (size_t)n) < 0) { /* best effort */
  }
}

static unsigned long new_id(void) {
  pthread_mutex_lock(&g_mu);
  unsigned long id = g_next++;
  pthread_mutex_unlock(&g_mu);
  return id;
}

/* An event handle is its id itself: nothing to allocate, nothing to free, and a parent
 * stopped before its children (Coll before its ProxyOps) stays printable. */
static unsigned long id_of(void* h) { return (unsigned long)(uintptr_t)h; }

static ncclResult_t p_init(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                           int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  pthread_mutex_lock(&g_mu);
  if (g_fd < 0) {
    const char* p = getenv("SIMNCCL_TEST_PROFILER_LOG");
    char path[1024];
    snprintf(path, sizeof path, "%s.%d", p ? p : "/tmp/simnccl-test-profiler", (int)getpid());
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  pthread_mutex_unlock(&g_mu);
  const char* fail = getenv("SIMNCCL_TEST_PROFILER_FAIL_INIT");
  if (fail && *fail == '1') return ncclInternalError;
  const char* m = getenv("SIMNCCL_TEST_PROFILER_MASK");
  *mask = m ? atoi(m) : 4095;
  struct ctx* c = calloc(1, sizeof *c);
  c->comm = (unsigned long long)commId;
  c->rank = rank;
  *context = c;
  out("init t=%llu comm=%016llx name=%s nnodes=%d nranks=%d rank=%d", now_ns(), c->comm,
      commName ? commName : "(null)", nNodes, nranks, rank);
  return ncclSuccess;
}

static ncclResult_t p_start(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* d) {
  struct ctx* c = context;
  unsigned long id = new_id();
  *eHandle = (void*)(uintptr_t)id;
  unsigned long long t = now_ns();
  switch (d->type) {
    case ncclProfileColl:
      out("coll t=%llu h=%lu comm=%016llx rank=%d seq=%llu func=%s count=%zu root=%d dtype=%s algo=%s proto=%s", t,
          id, c->comm, d->rank, (unsigned long long)d->coll.seqNumber, d->coll.func, d->coll.count, d->coll.root,
          d->coll.datatype, d->coll.algo, d->coll.proto);
      break;
    case ncclProfileP2p:
      out("p2p t=%llu h=%lu comm=%016llx rank=%d func=%s peer=%d count=%zu dtype=%s", t, id, c->comm, d->rank,
          d->p2p.func, d->p2p.peer, d->p2p.count, d->p2p.datatype);
      break;
    case ncclProfileProxyOp:
      out("proxyop t=%llu h=%lu parent=%lu comm=%016llx rank=%d peer=%d send=%d nsteps=%d chunk=%d pidok=%d", t,
          id, id_of(d->parentObj), c->comm, d->rank, d->proxyOp.peer, d->proxyOp.isSend, d->proxyOp.nSteps,
          d->proxyOp.chunkSize, d->proxyOp.pid == getpid());
      break;
    case ncclProfileProxyStep:
      out("proxystep t=%llu h=%lu parent=%lu comm=%016llx rank=%d step=%d", t, id, id_of(d->parentObj), c->comm,
          d->rank, d->proxyStep.step);
      break;
    default:
      out("other t=%llu h=%lu type=%llu", t, id, (unsigned long long)d->type);
  }
  return ncclSuccess;
}

static ncclResult_t p_stop(void* h) {
  out("stop t=%llu h=%lu", now_ns(), id_of(h));
  return ncclSuccess;
}

static ncclResult_t p_state(void* h, ncclProfilerEventState_v5_t s, ncclProfilerEventStateArgs_v5_t* a) {
  out("state t=%llu h=%lu state=%d size=%zu", now_ns(), id_of(h), (int)s, a ? a->proxyStep.transSize : 0);
  return ncclSuccess;
}

static ncclResult_t p_finalize(void* context) {
  struct ctx* c = context;
  out("finalize t=%llu comm=%016llx", now_ns(), c->comm);
  free(c);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "simnccl-test", p_init, p_start, p_stop, p_state, p_finalize};
