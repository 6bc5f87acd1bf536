/*
 * ncclComm_t → comm slot. Slots hold what the hot path and the agent need about a
 * communicator: its c4d id (equal on every rank), rank, size, device and sequence
 * counters. Written at init under g_init_mutex; read lock-free: an open-addressing
 * index maps the handle to the slot, and a slot's identity fields are published before
 * its index entry (release/acquire).
 *
 * Slots are never reused (a destroyed comm's slot stays readable for the ops still in
 * flight on it), so a process tracks at most kMaxComms communicators over its life;
 * further ones pass through untracked (logged once). Handles are reused by NCCL's
 * allocator: destroy removes the index entry, so a new comm at the same address
 * gets a fresh slot.
 */
#ifndef C4D_SHIM_COMM_TABLE_H
#define C4D_SHIM_COMM_TABLE_H

#include <pthread.h>
#include <stdint.h>

#include <atomic>

#include "c4d/nccl_abi.h"

namespace c4d {

constexpr uint32_t kMaxComms = 4096;

/* Aligned to cache lines, the sequence counters on a line of their own: each thread's op
 * bumps its comm's counter, and with 96-byte slots that line also held the next comm's
 * identity, which its own thread reads on every op (8 threads on 8 comms, bench_shim). */
struct alignas(64) CommSlot {
  /* identity: set once at registration (rank/nranks/device again by comm_refresh) */
  ncclComm_t handle;
  uint64_t id;
  uint64_t parent_id;
  uint8_t init_event;  // enum c4d_comm_event that created it
  int32_t color, key;  // split arguments (-1 otherwise)
  std::atomic<int32_t> rank, nranks, device;
  std::atomic<bool> ready;  // rank/nranks/device known and p2p counters allocated
  std::atomic<uint32_t> refresh_tries;  // comm_refresh attempts while not ready (capped)
  std::atomic<bool> live;   // registered and complete (set by comm_created); false after destroy/abort
  std::atomic<bool> nonblocking;  // made by a call that returned ncclInProgress: ask NCCL only once settled
  /* hot path */
  alignas(64) std::atomic<uint64_t> coll_seq;      // next collective sequence = collectives issued
  std::atomic<std::atomic<uint64_t>*> p2p_seq;     // [2 * nranks]: send to peer p at [p], recv at [nranks + p]
  std::atomic<uint32_t> split_count, shrink_count; // children made from this comm, in call order
  std::atomic<uint32_t> captured_kinds;            // bit c4d_op_kind: issued into a CUDA graph capture
};

/* Serialises every communicator lifecycle call in the shim (never the hot path). */
extern pthread_mutex_t g_init_mutex;

/* Lock-free; any thread. nullptr when the handle is not tracked. */
CommSlot* comm_lookup(ncclComm_t handle);

/* Under g_init_mutex: a new slot for `handle`, indexed. nullptr when full. */
CommSlot* comm_register(ncclComm_t handle, uint64_t id, uint64_t parent_id, uint8_t init_event, int color,
                        int key);

/* Under g_init_mutex: allocate the p2p counters once rank/nranks/device are known. */
bool comm_set_shape(CommSlot* s, int rank, int nranks, int device);

/* Under g_init_mutex: remove the handle from the index (its slot stays readable). */
void comm_unregister(ncclComm_t handle);

/* Under g_init_mutex: remove `s` from the index if its handle still maps to it (NCCL may
 * already have handed the same address to a new comm). */
void comm_unregister_slot(CommSlot* s);

/* Slots in use so far (registration order); the agent walks [0, comm_count()). */
uint32_t comm_count();
CommSlot* comm_at(uint32_t i);
uint32_t comm_index(const CommSlot* s);

/* Fork child: forget every comm (the parent's communicators are unusable there). */
void comm_table_reset_after_fork();

/* FNV-1a 64, the hash behind every comm id. */
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline uint64_t fnv1a(const void* p, unsigned long n, uint64_t h = kFnvOffset) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (unsigned long i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace c4d

#endif  // C4D_SHIM_COMM_TABLE_H
