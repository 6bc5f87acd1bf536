/*
 * Per-device pools of timing-enabled CUDA events, created at communicator init (never
 * on the hot path). take/release are lock-free (a Treiber stack of indices). An event
 * can be shared by several ops (the ops of one stream in one NCCL group): the taker
 * sets its reference count, and whoever drops the last reference returns it.
 * Empty pool → the op is recorded without events (C4D_OPF_NO_EVENT) and counted.
 */
#ifndef C4D_SHIM_EVENT_POOL_H
#define C4D_SHIM_EVENT_POOL_H

#include <stdint.h>

#include <atomic>

#include "c4d/cuda_abi.h"
#include "queue.h"

namespace c4d {

constexpr int kMaxDevices = 64;

class EventPool {
 public:
  /* Any thread. kNone when empty; the event starts with one reference, set by whoever
   * returned it (release): the taker does not write the line the agent last wrote. */
  uint32_t take() { return free_.pop(); }
  /* Taker only, before the index is published to another thread. */
  void set_refs(uint32_t i, uint32_t n) { refs_[i].store(n, std::memory_order_relaxed); }
  /* Any thread: drops one reference; the last one returns the event to the pool. */
  void release(uint32_t i) {
    if (i == kNone) return;
    if (refs_[i].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      refs_[i].store(1, std::memory_order_relaxed);  // the next taker's (push publishes it)
      free_.push(i);
    }
  }
  cudaEvent_t event(uint32_t i) const { return events_[i]; }
  int device() const { return device_; }
  uint32_t size() const { return n_; }

  /* Creates `n` events on `device` (switching the calling thread's device and back).
   * False on failure (logged). Caller holds the init mutex; the pool is not yet shared. */
  bool setup(int device, uint32_t n);

 private:
  int device_ = -1;
  uint32_t n_ = 0;    // events created
  uint32_t cap_ = 0;  // room in the arrays
  cudaEvent_t* events_ = nullptr;
  std::atomic<uint32_t>* refs_ = nullptr;
  IndexStack free_;
};

/* The pool of `device`, nullptr when none (no CUDA, creation failed, device out of
 * range). Lock-free; any thread. */
EventPool* event_pool_for(int device);

/* Creates the pool of `device` if missing. Caller holds the init mutex. */
EventPool* event_pool_ensure(int device, uint32_t n);

/* Fork child: forget every pool (the parent's CUDA events mean nothing here). */
void event_pools_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_EVENT_POOL_H
