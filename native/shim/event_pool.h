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
  /* Kept pairs. The agent frees an op's slot with its two events still attached when no
   * other op shares them (keep_pair), onto this pool's list of such slots, and the next op
   * on this device takes slot and pair at once (take_kept): one operation on a free list
   * per op where a slot and two events took three, on lines every thread and the agent
   * write (8 threads on 8 communicators, bench_shim). Per pool, so a kept pair is never out
   * of reach of its own device's ops. */
  /* Taker: a free op slot with a pair of this pool's events (*a, *b), kNone when none. */
  uint32_t take_kept(uint32_t* a, uint32_t* b);
  /* The slot's own events (ev_start, ev_end, one reference each, none shared): keep them
   * with the slot, which is free from now on (its state reset). */
  void keep(uint32_t slot);
  /* Any thread: a kept slot with its pair back in the pool; kNone when none. For takers
   * that found the op pool's own free list empty. */
  uint32_t take_slot_only();
  /* Any thread: two events, one reference each, from the free list, else a kept slot's
   * pair (the slot back to the op pool). False (nothing held) when the pool is empty. */
  bool take_pair(uint32_t* a, uint32_t* b);
  /* Up to `max` events at once, one reference each; how many. */
  uint32_t take_many(uint32_t* out, uint32_t max) { return free_.pop_many(out, max); }
  bool kept_ready() const { return kept_.ready(); }
  /* The freer of an op slot (the agent): can its pair stay with it? */
  bool keepable(uint32_t a, uint32_t b) const {
    return kept_ready() && a != kNone && b != kNone && a != b && sole(a) && sole(b);
  }
  /* Whoever holds the only reference (an op's own pair, no group shares it). */
  bool sole(uint32_t i) const { return refs_[i].load(std::memory_order_relaxed) == 1; }
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
  IndexStack kept_;  // op slots (indices into g_ops) that keep a pair of this pool's events
};

/* The pool of `device`, nullptr when none (no CUDA, creation failed, device out of
 * range). Lock-free; any thread. */
EventPool* event_pool_for(int device);

/* Creates the pool of `device` if missing. Caller holds the init mutex. */
EventPool* event_pool_ensure(int device, uint32_t n);

/* Freer of an op slot (the agent): its events kept with it (true: the slot is free), or
 * one reference each dropped (false: the caller frees the slot). */
bool keep_pair(uint32_t slot);

/* An op slot for an op of the thread that owns lane `l` (op_pool.h), on `device` (`pool`
 * its events, nullptr: none wanted): one the agent freed into the lane, else from the
 * lane's stash, refilled from the shared lists kStash slots (and pairs) at a time. A pair
 * that came with it in *a, *b (kNone: none). kNone when the shared lists are empty. */
uint32_t take_own_slot(uint8_t l, EventPool* pool, int device, uint32_t* a, uint32_t* b);

/* The agent frees an op slot: back to its taker's lane (op_pool.h) with its own pair when
 * no other op shares it, else as keep_pair / OpPool::release. */
void free_op_slot(uint32_t slot);

/* The agent frees a slot whose pair (or kNone) is in kept_a/kept_b onto the shared lists:
 * one its lane would not take, or a lane's whose thread exited. */
void free_to_shared(uint32_t slot);

/* An op slot for an op that brings no pair: the op pool's free list, else one that kept a
 * pair (the pair back to its pool). kNone when every slot is in use. */
uint32_t take_any_slot();

/* Fork child: forget every pool (the parent's CUDA events mean nothing here). */
void event_pools_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_EVENT_POOL_H
