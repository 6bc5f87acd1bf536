/*
 * Streams and events on the CPU.
 *
 *   host thread                          stream worker (one thread per stream)
 *   ───────────                          ─────────────────────────────────────
 *   cudaEventRecord ─ idle stream? ─yes─► complete now (clock read, no syscall)
 *        │ no                             ┌─► pop item, run it in queue order:
 *        ▼                                │     EventRecord → timestamp + complete
 *   stream_enqueue(item) ── lock, push ───┘     WaitEvent   → block until event done
 *        (wakes the worker only if it sleeps)   Compute     → sleep for the duration
 *                                               Group       → NCCL ops (collectives.cc)
 *
 * The front item stays queued while it runs, so "queue empty" means "stream idle":
 * that is what cudaStreamQuery, cudaStreamSynchronize and the record fast path test.
 * Workers sleep on a condition variable; nothing spins.
 */
#ifndef SIMNCCL_STREAM_H
#define SIMNCCL_STREAM_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "c4d/cuda_abi.h"

namespace sim {

struct GroupWork; /* collectives.cc */
void run_group(GroupWork* g);   /* called on the worker; frees g */

/* Ties one NCCL group that spans several streams together: the group runs on its
 * first stream once every other stream has reached its Join item, and those streams
 * resume when the group is done (what NCCL does with its internal events). */
struct JoinSync {
  std::mutex m;
  std::condition_variable cv;
  int expected = 0, arrived = 0;
  bool done = false;
  std::atomic<int> refs{1};
  void release() {
    if (refs.fetch_sub(1) == 1) delete this;
  }
};

struct Event;

enum class ItemKind : uint8_t { EventRecord, WaitEvent, Compute, Memcpy, Memset, Group, Join };

struct Item {
  ItemKind kind;
  void* p;       /* Event*, GroupWork*, JoinSync*, or memcpy/memset destination */
  const void* q; /* memcpy source; JoinSync* of a Group item (or null) */
  uint64_t a;    /* event generation, duration_ns, byte count */
  uint64_t b;    /* memset value */
};

struct Stream;

/* NULL, cudaStreamLegacy (1) and cudaStreamPerThread (2) → the per-process default
 * stream; nullptr for a handle that is not a live stream. */
Stream* resolve_stream(cudaStream_t s);
void stream_enqueue(Stream* s, const Item& it);
int current_device();
/* `device` gets a context (NCCL's init makes one on the device it runs on). */
void context_on_device(int device);

}  // namespace sim

#endif  // SIMNCCL_STREAM_H
