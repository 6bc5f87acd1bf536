#include "comm_table.h"

#include <stdlib.h>

#include "log.h"

namespace c4d {

pthread_mutex_t g_init_mutex = PTHREAD_MUTEX_INITIALIZER;

namespace {

constexpr uint32_t kIndexSize = 2 * kMaxComms;  // load factor <= 1/2 (tombstones included)
constexpr uintptr_t kEmpty = 0;
constexpr uintptr_t kTombstone = 1;  // never a valid pointer

struct IndexEntry {
  std::atomic<uintptr_t> key;  // ncclComm_t value, kEmpty or kTombstone
  std::atomic<uint32_t> slot;
};

IndexEntry g_index[kIndexSize];
CommSlot g_slots[kMaxComms];
std::atomic<uint32_t> g_count{0};
bool g_full_logged = false;

inline uint32_t hash_ptr(uintptr_t p) {
  uint64_t x = uint64_t(p) * 0x9e3779b97f4a7c15ull;
  return uint32_t(x >> 32) & (kIndexSize - 1);
}

}  // namespace

CommSlot* comm_lookup(ncclComm_t handle) {
  uintptr_t k = reinterpret_cast<uintptr_t>(handle);
  if (k <= kTombstone) return nullptr;
  for (uint32_t i = hash_ptr(k), n = 0; n < kIndexSize; i = (i + 1) & (kIndexSize - 1), ++n) {
    uintptr_t cur = g_index[i].key.load(std::memory_order_acquire);
    if (cur == k) return &g_slots[g_index[i].slot.load(std::memory_order_relaxed)];
    if (cur == kEmpty) return nullptr;
  }
  return nullptr;
}

CommSlot* comm_register(ncclComm_t handle, uint64_t id, uint64_t parent_id, uint8_t init_event, int color,
                        int key) {
  uintptr_t k = reinterpret_cast<uintptr_t>(handle);
  if (k <= kTombstone) return nullptr;
  comm_unregister(handle);  // a stale entry (destroy we did not see) must not shadow the new comm
  uint32_t n = g_count.load(std::memory_order_relaxed);
  if (n >= kMaxComms) {
    if (!g_full_logged) C4D_LOG(kWarning, "more than %u communicators: later ones are not tracked", kMaxComms);
    g_full_logged = true;
    return nullptr;
  }
  CommSlot* s = &g_slots[n];
  s->handle = handle;
  s->id = id;
  s->parent_id = parent_id;
  s->init_event = init_event;
  s->color = color;
  s->key = key;
  s->rank.store(-1, std::memory_order_relaxed);
  s->nranks.store(-1, std::memory_order_relaxed);
  s->device.store(-1, std::memory_order_relaxed);
  s->ready.store(false, std::memory_order_relaxed);
  s->refresh_tries.store(0, std::memory_order_relaxed);
  s->live.store(false, std::memory_order_relaxed);  // comm_created makes it live once its shape is set
  s->nonblocking.store(false, std::memory_order_relaxed);
  s->coll_seq.store(0, std::memory_order_relaxed);
  s->p2p_seq.store(nullptr, std::memory_order_relaxed);
  s->split_count.store(0, std::memory_order_relaxed);
  s->shrink_count.store(0, std::memory_order_relaxed);
  s->captured_kinds.store(0, std::memory_order_relaxed);
  g_count.store(n + 1, std::memory_order_release);
  for (uint32_t i = hash_ptr(k);; i = (i + 1) & (kIndexSize - 1)) {
    uintptr_t cur = g_index[i].key.load(std::memory_order_relaxed);
    if (cur == kEmpty || cur == kTombstone) {
      g_index[i].slot.store(n, std::memory_order_relaxed);
      g_index[i].key.store(k, std::memory_order_release);
      return s;
    }
  }
}

bool comm_set_shape(CommSlot* s, int rank, int nranks, int device) {
  s->rank.store(rank, std::memory_order_relaxed);
  s->nranks.store(nranks, std::memory_order_relaxed);
  s->device.store(device, std::memory_order_relaxed);
  if (nranks <= 0 || rank < 0) return false;
  if (!s->p2p_seq.load(std::memory_order_relaxed)) {
    auto* seq = static_cast<std::atomic<uint64_t>*>(calloc(2 * size_t(nranks), sizeof(std::atomic<uint64_t>)));
    if (!seq) return false;
    s->p2p_seq.store(seq, std::memory_order_release);
  }
  s->ready.store(true, std::memory_order_release);
  return true;
}

void comm_unregister(ncclComm_t handle) {
  uintptr_t k = reinterpret_cast<uintptr_t>(handle);
  for (uint32_t i = hash_ptr(k), n = 0; n < kIndexSize; i = (i + 1) & (kIndexSize - 1), ++n) {
    uintptr_t cur = g_index[i].key.load(std::memory_order_relaxed);
    if (cur == kEmpty) return;
    if (cur == k) {
      g_slots[g_index[i].slot.load(std::memory_order_relaxed)].live.store(false, std::memory_order_release);
      g_index[i].key.store(kTombstone, std::memory_order_release);
      return;
    }
  }
}

void comm_unregister_slot(CommSlot* s) {
  uintptr_t k = reinterpret_cast<uintptr_t>(s->handle);
  uint32_t want = comm_index(s);
  s->live.store(false, std::memory_order_release);
  for (uint32_t i = hash_ptr(k), n = 0; n < kIndexSize; i = (i + 1) & (kIndexSize - 1), ++n) {
    uintptr_t cur = g_index[i].key.load(std::memory_order_relaxed);
    if (cur == kEmpty) return;
    if (cur == k && g_index[i].slot.load(std::memory_order_relaxed) == want) {
      g_index[i].key.store(kTombstone, std::memory_order_release);
      return;
    }
  }
}

uint32_t comm_count() { return g_count.load(std::memory_order_acquire); }
CommSlot* comm_at(uint32_t i) { return &g_slots[i]; }
uint32_t comm_index(const CommSlot* s) { return uint32_t(s - g_slots); }

void comm_table_reset_after_fork() {
  for (IndexEntry& e : g_index) e.key.store(kEmpty, std::memory_order_relaxed);
  g_count.store(0, std::memory_order_relaxed);
  g_full_logged = false;
  pthread_mutex_init(&g_init_mutex, nullptr);  // a thread of the parent may have held it
}

}  // namespace c4d
