/*
 * Clocks. Every timestamp the shim writes is nanoseconds since the Unix epoch on this
 * host: CLOCK_REALTIME (vDSO, no syscall) plus C4D_CLOCK_OFFSET_NS (simulated skew).
 *
 * CUDA events carry device time, which only relates to other events. To put them on
 * the host clock, each device gets a non-blocking stream of our own on which the agent
 * records an *anchor* event about every second, noting the host time right after
 * cudaEventRecord returned (the stream is idle, so the device stamps the anchor within
 * microseconds of that). Then
 *     host time of event ev = anchor.host_ns + cudaEventElapsedTime(anchor, ev)
 * using the newest anchor recorded before the op was issued (else the oldest kept).
 * A small ring of anchors bounds both clock drift and float-milliseconds rounding.
 */
#ifndef C4D_SHIM_TIMING_H
#define C4D_SHIM_TIMING_H

#include <stdint.h>
#include <time.h>

#include <atomic>

#include "c4d/cuda_abi.h"

namespace c4d {

extern std::atomic<int64_t> g_clock_offset_ns;

/* Host time in ns since the epoch (+ C4D_CLOCK_OFFSET_NS). Any thread; no syscall. */
inline uint64_t host_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec) +
         uint64_t(g_clock_offset_ns.load(std::memory_order_relaxed));
}

/* Monotonic ns, for the agent's own schedule (never written into records). */
inline uint64_t mono_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* Creates `device`'s anchor stream and events and records the first anchor, so that
 * every op on the device is issued after an anchor. Caller holds the init mutex (any
 * app thread); returns false without CUDA or on failure (logged). */
bool timing_device_init(int device);

/* Agent thread: notes which anchors fired and records a new one on every device whose
 * newest is older than a second. */
void timing_tick(uint64_t mono_now);

enum TimeResult { kTimeOk = 1, kTimeNoAnchorYet = 0, kTimeFailed = -1 };

/* Agent thread, with `device` current (cuda_agent_device): host time of the completed
 * event `ev` of `device`; ref_ns = the op's issue time (picks the anchor).
 * kTimeNoAnchorYet: ask again later; kTimeFailed: CUDA refused (no timing for this
 * device, or cudaEventElapsedTime failed). */
TimeResult timing_event_ns(int device, cudaEvent_t ev, uint64_t ref_ns, uint64_t* out);

/* Fork child: forget every anchor. */
void timing_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_TIMING_H
