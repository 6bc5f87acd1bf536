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
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

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

/* Hot-path timestamps ("stamps"). An NCCL call takes two host times (issue, return), and
 * clock_gettime costs 20 ns on bare metal but ~55 ns in a VM (measured on the CI box;
 * analysis/bench_shim.py): most of what the shim adds. Where the kernel itself keeps time
 * with the TSC (clocksource "tsc": invariant and synchronised across cores, else the
 * kernel would not use it), a stamp is the raw TSC, which costs half of that, and the agent
 * turns it into host ns (stamp_to_ns) against (TSC, clock) pairs it takes every second.
 * Elsewhere (another clocksource, not x86-64, C4D_TSC=0) a stamp is host_now_ns() and the
 * conversion is the identity. Only op slots' issue_ns/return_ns hold stamps, from the
 * application's write until the agent converts them (drain / finish_op). */
extern bool g_stamp_tsc;  // set at activation, before kActive is published; read-only after

inline uint64_t host_stamp() {
#if defined(__x86_64__)
  if (g_stamp_tsc) return __rdtsc();
#endif
  return host_now_ns();
}

/* At activation (init mutex held): decides whether stamps are TSC ticks and takes the
 * first (TSC, clock) pair. Reads a sysfs file: never on the hot path. */
void stamp_clock_init(bool allow_tsc);

/* Agent thread only: host ns of a stamp. The first call after init waits until the first
 * pair is 10 ms old, to measure the TSC rate (once per process). */
uint64_t stamp_to_ns(uint64_t stamp);

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
