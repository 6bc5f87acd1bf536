#include "op_pool.h"

#include <pthread.h>
#include <stdlib.h>

#include <new>

namespace c4d {

OpPool g_ops;

namespace {
pthread_key_t g_lane_key;
bool g_lane_key_ok = false;

/* A thread that held a lane exits: the agent takes its free slots back. `v` is the thread's
 * memo (in its TLS, still there while key destructors run): an op the thread issues after
 * this (another key's destructor) takes the shared path, never the lane another thread may
 * own by then. */
void lane_exit(void* v) {
  auto* memo = static_cast<uint8_t*>(v);
  const uint8_t l = uint8_t(*memo - 1);
  *memo = kNoLane;
  if (l < kLanes) g_ops.leave_lane(l);  // (a fork child's thread: its memo was reset, no lane)
}

/* Touches every page now, at start, so that no op's first use of it faults on the
 * application's thread. */
void commit(void* p, size_t bytes) {
  for (size_t off = 0; p && off < bytes; off += 4096) static_cast<volatile char*>(p)[off] = 0;
}
}  // namespace

bool OpPool::init(uint32_t capacity) {
  if (slots_) return capacity == cap_;  // already sized (fork child keeps its parent's arrays)
  // Aligned by hand to a cache line. The memory is committed here, at start: every page of
  // the slots is touched now, so that no op's first use of a slot costs a page fault on the
  // application's thread (C4D_QUEUE_CAPACITY x 128 bytes: 8 MiB by default).
  const size_t bytes = (size_t(capacity) + 1) * sizeof(OpSlot);
  void* raw = calloc(1, bytes);
  commit(raw, bytes);
  uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + alignof(OpSlot) - 1) & ~uintptr_t(alignof(OpSlot) - 1);
  slots_ = raw ? reinterpret_cast<OpSlot*>(at) : nullptr;
  agent_ = static_cast<AgentOp*>(calloc(capacity, sizeof(AgentOp)));
  if (!slots_ || !agent_ || !free_.init(capacity, true) || !ready_.init(capacity)) return false;
  cap_ = capacity;
  // Lanes: two rings each; none (the shared path only) when out of memory.
  uint32_t cells = capacity / 4;
  if (cells < kLaneCellsMin) cells = capacity < kLaneCellsMin ? capacity : kLaneCellsMin;
  if (cells > kLaneCellsMax) cells = kLaneCellsMax;
  void* lanes = calloc(1, sizeof(Lane) * kLanes + 63);
  auto* ring = static_cast<uint32_t*>(calloc(size_t(2) * kLanes * cells, sizeof(uint32_t)));
  if (lanes && ring && !g_lane_key_ok) g_lane_key_ok = pthread_key_create(&g_lane_key, lane_exit) == 0;
  if (!lanes || !ring || !g_lane_key_ok) {
    free(lanes);
    free(ring);
    return true;
  }
  commit(ring, size_t(2) * kLanes * cells * sizeof(uint32_t));
  lanes_ = reinterpret_cast<Lane*>((reinterpret_cast<uintptr_t>(lanes) + 63) & ~uintptr_t(63));
  for (uint32_t l = 0; l < kLanes; ++l) {
    new (&lanes_[l]) Lane();
    lanes_[l].ready.init(ring + size_t(2 * l) * cells, cells);
    lanes_[l].free.init(ring + size_t(2 * l + 1) * cells, cells);
  }
  return true;
}

uint8_t OpPool::claim_lane(uint8_t* claimed) {
  *claimed = kNoLane;  // tried: a thread that finds none takes the shared path from now on
  for (uint32_t l = 0; lanes_ && l < kLanes; ++l) {
    uint32_t want = Lane::kFree;
    if (!lanes_[l].owner.compare_exchange_strong(want, Lane::kOwned, std::memory_order_acquire)) continue;
    if (pthread_setspecific(g_lane_key, claimed) != 0) {
      lanes_[l].owner.store(Lane::kFree, std::memory_order_release);
      return kNoLane;
    }
    uint32_t used = lanes_used_.load(std::memory_order_relaxed);
    while (used < l + 1 && !lanes_used_.compare_exchange_weak(used, l + 1, std::memory_order_release)) {
    }
    *claimed = uint8_t(l + 1);
    return uint8_t(l);
  }
  return kNoLane;
}

void OpPool::reset() {
  if (!slots_) return;
  free_.reset(true);
  ready_.reset();
  for (uint32_t l = 0; lanes_ && l < kLanes; ++l) {  // fork child: the only thread holds none yet
    lanes_[l].ready.reset();
    lanes_[l].free.reset();
    lanes_[l].owner.store(Lane::kFree, std::memory_order_relaxed);
    lanes_[l].stash_at = lanes_[l].stash_end = 0;
  }
  lanes_used_.store(0, std::memory_order_relaxed);
}

}  // namespace c4d
