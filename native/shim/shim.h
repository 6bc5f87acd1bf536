/*
 * Process-wide state of the shim: its mode, its configuration and its counters, and the
 * transitions between modes.
 *
 *   kUninit ──first NCCL call──► kConfigured ──first comm init──► kActive
 *      │                             │                                │ failure inside the shim
 *      └──── C4D_ENABLE=0 ───────────┴────────────► kPassThrough ◄────┘
 *
 * Only kActive records anything. A fork child drops back from kActive to kConfigured
 * and starts afresh at its own next comm init.
 */
#ifndef C4D_SHIM_SHIM_H
#define C4D_SHIM_SHIM_H

#include <stdint.h>

#include <atomic>

#include "config.h"

namespace c4d {

enum Mode : int { kUninit = 0, kConfigured = 1, kActive = 2, kPassThrough = 3 };

extern std::atomic<int> g_mode;
extern Config g_cfg;  // valid once g_mode != kUninit

struct Counters {
  std::atomic<uint64_t> dropped_full;    // records dropped: every op slot queued or in flight
  std::atomic<uint64_t> dropped_send;    // records dropped: ZeroMQ at its high-water mark
  std::atomic<uint64_t> dropped_nolink;  // records dropped: no libzmq or no socket
  std::atomic<uint64_t> sent;            // records handed to ZeroMQ
  std::atomic<uint64_t> no_event;        // ops without events: the device's pool was empty
  std::atomic<uint64_t> simulated;       // grouped ops that ncclGroupSimulateEnd let go (never launched)
  std::atomic<uint64_t> grown;           // ncclCommGrow calls: the grown comm is not tracked
  std::atomic<uint64_t> one_sided;       // ncclPutSignal/ncclSignal/ncclWaitSignal calls: not timed
  std::atomic<uint64_t> untracked;       // ops on a communicator we don't track
  std::atomic<uint64_t> event_errors;    // CUDA event calls that failed
  std::atomic<uint64_t> clamped;         // device times mapped before the issue time (anchor error)
  std::atomic<uint64_t> captured;        // ops issued on a capturing stream (into a CUDA graph): not recorded
};
extern Counters g_counters;

inline uint64_t dropped_total() {
  return g_counters.dropped_full.load(std::memory_order_relaxed) +
         g_counters.dropped_send.load(std::memory_order_relaxed) +
         g_counters.dropped_nolink.load(std::memory_order_relaxed);
}

inline void count(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

/* Parses the configuration once (any thread); returns the mode after that. */
int shim_configure();

/* The current mode; configures on first use. Hot path: one acquire load. */
inline int shim_mode() {
  int m = g_mode.load(std::memory_order_acquire);
  return m != kUninit ? m : shim_configure();
}

/* At a communicator init, before the real call: starts recording (op pool, CUDA
 * runtime, agent thread) if not yet. True when the shim records. Any app thread. */
bool shim_activate();

/* A failure inside the shim: log once and pass everything through from now on. */
void shim_disable(const char* why);

}  // namespace c4d

#endif  // C4D_SHIM_SHIM_H
