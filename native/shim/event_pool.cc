#include "event_pool.h"

#include <stdlib.h>

#include "cuda_rt.h"
#include "log.h"
#include "op_pool.h"

namespace c4d {

namespace {
EventPool g_storage[kMaxDevices];
std::atomic<EventPool*> g_pools[kMaxDevices];
std::atomic<bool> g_failed[kMaxDevices];  // don't retry a device whose creation failed
}  // namespace

bool EventPool::setup(int device, uint32_t n) {
  if (!g_cuda.ok) return false;
  device_ = device;
  if (!events_) {  // after a fork the arrays of the parent's pool are reused
    events_ = static_cast<cudaEvent_t*>(calloc(n, sizeof(cudaEvent_t)));
    refs_ = static_cast<std::atomic<uint32_t>*>(calloc(n, sizeof(std::atomic<uint32_t>)));
    // kept_: room for every op slot (the op pool is sized at start-up, before any pool)
    if (!events_ || !refs_ || !free_.init(n, false) || (g_ops.capacity() && !kept_.init(g_ops.capacity(), false))) {
      C4D_LOG(kWarning, "out of memory for %u events of device %d: no device timing there", n, device);
      free(events_);
      free(refs_);
      events_ = nullptr;
      refs_ = nullptr;
      return false;
    }
    cap_ = n;
  }
  if (n > cap_) n = cap_;
  free_.reset(false);
  kept_.reset(false);  // a fork child's op slots are all free again (OpPool::reset)
  int prev = cuda_current_device();
  if (prev != device && g_cuda.setDevice(device) != C4D_CUDA_SUCCESS) {
    C4D_LOG(kWarning, "cudaSetDevice(%d) failed: no device timing on device %d", device, device);
    return false;
  }
  uint32_t made = 0;
  for (; made < n; ++made)
    if (g_cuda.eventCreateWithFlags(&events_[made], cudaEventDefault) != C4D_CUDA_SUCCESS) break;
  if (prev >= 0 && prev != device) g_cuda.setDevice(prev);
  if (made == 0) {
    C4D_LOG(kWarning, "cudaEventCreateWithFlags failed on device %d: no device timing there", device);
    return false;
  }
  if (made < n) C4D_LOG(kWarning, "only %u of %u events created on device %d", made, n, device);
  n_ = made;
  for (uint32_t i = made; i-- > 0;) {
    refs_[i].store(1, std::memory_order_relaxed);  // a free event holds its taker's reference (take)
    free_.push(i);
  }
  return true;
}

uint32_t EventPool::take_kept(uint32_t* a, uint32_t* b) {
  uint32_t i = kept_.pop();  // acquire: the keeper's writes below are visible
  if (i == kNone) return kNone;
  const OpSlot& s = g_ops.at(i);
  *a = s.kept_a;
  *b = s.kept_b;
  return i;
}

void EventPool::keep(uint32_t slot) {
  OpSlot& s = g_ops.at(slot);
  s.kept_a = s.ev_start;
  s.kept_b = s.ev_end;
  s.state.store(0, std::memory_order_relaxed);
  kept_.push(slot);  // release
}

uint32_t EventPool::take_slot_only() {
  uint32_t a, b, i = take_kept(&a, &b);
  if (i != kNone) {
    release(a);
    release(b);
  }
  return i;
}

bool EventPool::take_pair(uint32_t* a, uint32_t* b) {
  *a = take();
  *b = take();
  if (*a != kNone && *b != kNone) return true;
  release(*a);
  release(*b);
  uint32_t i = take_kept(a, b);
  if (i == kNone) return false;
  g_ops.release(i);
  return true;
}

bool keep_pair(uint32_t slot) {
  const OpSlot& s = g_ops.at(slot);
  EventPool* p = event_pool_for(s.device);
  if (!p) return false;
  if (p->keepable(s.ev_start, s.ev_end)) {
    p->keep(slot);
    return true;
  }
  p->release(s.ev_start);
  p->release(s.ev_end);
  return false;
}

namespace {
/* The lane's stash, empty, refilled: slots from the op pool's free list, each with a pair
 * of `pool`'s events while they last (one operation on each shared list). */
void refill(Lane& ln, EventPool* pool, int device) {
  const uint32_t n = g_ops.take_many(ln.stash, kStash);
  ln.stash_at = 0;
  ln.stash_end = n;
  uint32_t ev[2 * kStash], ne = 0;
  if (pool && n) {
    ne = pool->take_many(ev, 2 * n);
    if (ne & 1) pool->release(ev[--ne]);
  }
  for (uint32_t k = 0; k < n; ++k) {
    OpSlot& s = g_ops.at(ln.stash[k]);
    s.device = device;
    s.kept_a = 2 * k < ne ? ev[2 * k] : kNone;
    s.kept_b = 2 * k < ne ? ev[2 * k + 1] : kNone;
  }
}
}  // namespace

uint32_t take_own_slot(uint8_t l, EventPool* pool, int device, uint32_t* a, uint32_t* b) {
  Lane& ln = g_ops.lane(l);
  uint32_t i = g_ops.take_own(l);
  if (i == kNone) {
    if (ln.stash_at == ln.stash_end) refill(ln, pool, device);
    if (ln.stash_at == ln.stash_end) return kNone;
    i = ln.stash[ln.stash_at++];
  }
  const OpSlot& s = g_ops.at(i);
  *a = s.kept_a;
  *b = s.kept_b;
  if (*a != kNone && (!pool || s.device != device)) {  // not of use here: back to its pool
    EventPool* p = event_pool_for(s.device);
    p->release(*a);
    p->release(*b);
    *a = *b = kNone;
  }
  return i;
}

void free_op_slot(uint32_t slot) {
  OpSlot& s = g_ops.at(slot);
  if (s.lane == kNoLane) {
    if (!keep_pair(slot)) g_ops.release(slot);
    return;
  }
  EventPool* p = event_pool_for(s.device);
  const bool pair = p && p->keepable(s.ev_start, s.ev_end);
  if (p && !pair) {
    p->release(s.ev_start);
    p->release(s.ev_end);
  }
  s.kept_a = pair ? s.ev_start : kNone;
  s.kept_b = pair ? s.ev_end : kNone;
  s.state.store(0, std::memory_order_relaxed);
  if (!g_ops.give_back(slot)) free_to_shared(slot);  // release: the lane's owner sees the fields above
}

void free_to_shared(uint32_t slot) {
  OpSlot& s = g_ops.at(slot);
  EventPool* p = event_pool_for(s.device);
  if (p && s.kept_a != kNone) {
    s.ev_start = s.kept_a;
    s.ev_end = s.kept_b;
    p->keep(slot);
  } else {
    g_ops.release(slot);
  }
}

uint32_t take_any_slot() {
  uint32_t i = g_ops.take();
  for (int d = 0; i == kNone && d < kMaxDevices; ++d)
    if (EventPool* p = event_pool_for(d)) i = p->take_slot_only();
  return i;
}

EventPool* event_pool_for(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return g_pools[device].load(std::memory_order_acquire);
}

EventPool* event_pool_ensure(int device, uint32_t n) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  EventPool* p = g_pools[device].load(std::memory_order_acquire);
  if (p || g_failed[device].load(std::memory_order_relaxed)) return p;
  p = &g_storage[device];
  if (!p->setup(device, n)) {
    g_failed[device].store(true, std::memory_order_relaxed);
    return nullptr;
  }
  C4D_LOG(kDebug, "%u timing events ready on device %d", p->size(), device);
  g_pools[device].store(p, std::memory_order_release);
  return p;
}

void event_pools_reset_after_fork() {
  for (int d = 0; d < kMaxDevices; ++d) {
    g_pools[d].store(nullptr, std::memory_order_relaxed);
    g_failed[d].store(false, std::memory_order_relaxed);
  }
}

}  // namespace c4d
