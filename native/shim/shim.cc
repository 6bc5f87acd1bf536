#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>

#include "agent.h"
#include "c4d/record.h"
#include "comm_table.h"
#include "cuda_rt.h"
#include "event_pool.h"
#include "log.h"
#include "op_pool.h"
#include "profiler.h"
#include "recorder.h"
#include "timing.h"

namespace c4d {

std::atomic<int> g_mode{kUninit};
Config g_cfg;
Counters g_counters;

namespace {

pthread_once_t g_config_once = PTHREAD_ONCE_INIT;
bool g_atexit_registered = false;  // inherited by a fork child: never registered twice
bool g_atfork_registered = false;

void configure_once() {
  config_load(&g_cfg);
  g_clock_offset_ns.store(g_cfg.clock_offset_ns, std::memory_order_relaxed);
  g_mode.store(g_cfg.enable ? kConfigured : kPassThrough, std::memory_order_release);
  if (!g_cfg.enable) C4D_LOG(kDebug, "C4D_ENABLE=0: pass-through");
}

void at_exit() {
  if (g_mode.load(std::memory_order_acquire) != kActive) return;
  agent_shutdown();
}

/* The child of fork() has only the forking thread: the agent, the ZeroMQ context and
 * the parent's communicators are gone or unusable. Forget them all; the child starts
 * afresh at its own next comm init. */
void at_fork_child() {
  if (g_mode.load(std::memory_order_relaxed) == kActive) g_mode.store(kConfigured, std::memory_order_relaxed);
  agent_reset_after_fork();
  g_ops.reset();
  comm_table_reset_after_fork();
  event_pools_reset_after_fork();
  timing_reset_after_fork();
  recorder_reset_after_fork();
  profiler_reset_after_fork();
  for (std::atomic<uint64_t>* c : {&g_counters.dropped_full, &g_counters.dropped_send, &g_counters.dropped_nolink,
                                   &g_counters.sent, &g_counters.no_event, &g_counters.simulated,
                                   &g_counters.untracked, &g_counters.event_errors, &g_counters.clamped,
                                   &g_counters.captured, &g_counters.grown, &g_counters.one_sided})
    c->store(0, std::memory_order_relaxed);
}

}  // namespace

int shim_configure() {
  pthread_once(&g_config_once, configure_once);
  return g_mode.load(std::memory_order_acquire);
}

bool shim_activate() {
  int m = shim_mode();
  if (m == kActive) return true;
  if (m != kConfigured) return false;
  pthread_mutex_lock(&g_init_mutex);
  if (g_mode.load(std::memory_order_acquire) == kConfigured) {
    if (!g_atfork_registered) {
      pthread_atfork(nullptr, nullptr, at_fork_child);
      g_atfork_registered = true;
    }
    cuda_rt_resolve();
    if (!g_ops.init(g_cfg.queue_capacity)) {
      shim_disable("out of memory for the op queue");
    } else if (!agent_start()) {
      shim_disable("could not start the agent thread");
    } else {
      if (!g_atexit_registered) g_atexit_registered = atexit(at_exit) == 0;
      g_mode.store(kActive, std::memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_init_mutex);
  return g_mode.load(std::memory_order_acquire) == kActive;
}

void shim_disable(const char* why) {
  int prev = g_mode.exchange(kPassThrough, std::memory_order_acq_rel);
  if (prev != kPassThrough) log_write(kError, "%s: disabled, NCCL calls pass straight through", why);
}

}  // namespace c4d

extern "C" __attribute__((visibility("default"))) const char* c4d_version(void) {
#define C4D_STR2(x) #x
#define C4D_STR(x) C4D_STR2(x)
  return "c4d " C4D_SHIM_VERSION " (rev " C4D_STR(C4D_GIT_REV) ", schema " C4D_STR(C4D_SCHEMA_VERSION) ")";
}

extern "C" __attribute__((visibility("default"))) void c4d_stats(uint64_t* sent, uint64_t* dropped) {
  if (sent) *sent = c4d::g_counters.sent.load(std::memory_order_relaxed);
  if (dropped) *dropped = c4d::dropped_total();
}
