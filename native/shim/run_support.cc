#include "run_support.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include <atomic>

#include "c4d/record.h"
#include "log.h"
#include "shim.h"
#include "timing.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

namespace c4d {

namespace {

/* Written by any application thread (c4d_set_hang_timeout), read by the agent. The
 * generation is bumped last with release order; the agent reads it with acquire, then the
 * value and its time. Two threads setting at the same instant may pair one's value with
 * the other's time (microseconds apart); the generation makes the agent send the last. */
std::atomic<int64_t> g_timeout_us{0};
std::atomic<uint64_t> g_set_ns{0};
std::atomic<uint64_t> g_generation{0};
uint64_t g_sent_generation = 0;  // agent only

void emit_stage(RecordSink emit, uint64_t gen) {
  c4d_stage_record r;
  memset(&r, 0, sizeof r);
  r.h.kind = C4D_REC_STAGE;
  r.h.version = C4D_SCHEMA_VERSION;
  r.h.rank = g_cfg.rank;
  r.h.time_ns = g_set_ns.load(std::memory_order_relaxed);
  r.hang_timeout_us = g_timeout_us.load(std::memory_order_relaxed);
  r.generation = gen;
  emit(&r);
}

}  // namespace

bool stage_poll(RecordSink emit) {
  uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (gen == g_sent_generation) return false;
  emit_stage(emit, gen);
  g_sent_generation = gen;
  return true;
}

void stage_repeat(RecordSink emit) {
  uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (gen) emit_stage(emit, gen);
}

void declare_ptracer() {
  const char* v = getenv("C4D_PTRACER_PID");
  if (!v || !*v) return;
  char* end = nullptr;
  errno = 0;
  long pid = strtol(v, &end, 10);
  if (errno || *end || pid <= 0) {
    char shown[80];
    printable(v, shown, sizeof shown);
    log_write(kWarning, "C4D_PTRACER_PID='%s' is not a process id; using none", shown);
    return;
  }
  // EINVAL without Yama (nothing to declare): not worth a line
  if (prctl(PR_SET_PTRACER, (unsigned long)pid, 0, 0, 0) != 0 && errno != EINVAL)
    C4D_LOG(kDebug, "prctl(PR_SET_PTRACER, %ld): %s", pid, strerror(errno));
}

void stage_reset_after_fork() { g_sent_generation = 0; }

}  // namespace c4d

extern "C" __attribute__((visibility("default"))) void c4d_set_hang_timeout(int64_t timeout_us) {
  using namespace c4d;
  if (timeout_us < -1) timeout_us = -1;
  g_set_ns.store(host_now_ns(), std::memory_order_relaxed);
  g_timeout_us.store(timeout_us, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_release);
}

extern "C" __attribute__((visibility("default"))) int64_t c4d_hang_timeout(void) {
  return c4d::g_timeout_us.load(std::memory_order_relaxed);
}
