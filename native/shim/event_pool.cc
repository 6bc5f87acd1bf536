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
  if (p->kept_ready() && s.ev_start != kNone && s.ev_end != kNone && s.ev_start != s.ev_end && p->sole(s.ev_start) &&
      p->sole(s.ev_end)) {
    p->keep(slot);
    return true;
  }
  p->release(s.ev_start);
  p->release(s.ev_end);
  return false;
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
