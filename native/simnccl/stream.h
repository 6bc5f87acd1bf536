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
#include <vector>

#include "c4d/cuda_abi.h"
#include "common.h"

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

constexpr uint32_t kStreamMagic = 0x5354524du;  // "STRM"
constexpr uint32_t kEventMagic = 0x4556544eu;   // "EVTN"
constexpr cudaError_t kErrInvalidValue = 1;
constexpr cudaError_t kErrMemoryAllocation = 2;
constexpr cudaError_t kErrInvalidDevice = 101;
constexpr cudaError_t kErrInvalidHandle = 400;
constexpr cudaError_t kErrNotReady = 600;
constexpr cudaError_t kErrIllegalState = 401;
constexpr cudaError_t kErrCaptureUnsupported = 900; /* cudaErrorStreamCaptureUnsupported */
constexpr cudaError_t kErrCaptureInvalidated = 901; /* cudaErrorStreamCaptureInvalidated */
constexpr cudaError_t kErrCaptureWrongThread = 908; /* cudaErrorStreamCaptureWrongThread */
constexpr cudaError_t kErrCapturedEvent = 907;      /* cudaErrorCapturedEvent */

struct Event {
  uint32_t magic = kEventMagic;
  unsigned flags = 0;
  std::atomic<uint32_t> rec_gen{0};  /* records issued by the host */
  std::atomic<uint32_t> done_gen{0}; /* latest record a stream reached (futex word) */
  std::atomic<uint64_t> ts_ns{0};    /* CLOCK_MONOTONIC when done_gen was reached */
  std::atomic<int> waiters{0};       /* threads blocked in futex_wait on done_gen */
  std::atomic<int> refs{1};          /* host handle + queued markers */
  std::atomic<bool> captured{false}; /* last recorded into a stream capture (capture.cc) */

  bool complete() const { return int32_t(done_gen.load(std::memory_order_acquire) - rec_gen.load()) >= 0; }
  void release() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      magic = 0;
      delete this;
    }
  }
  /* Called by whoever reaches record `gen` (a worker, or the fast path). */
  void reach(uint32_t gen) {
    uint32_t d = done_gen.load();
    if (int32_t(gen - d) <= 0) return; /* a later record on another stream already completed */
    ts_ns.store(now_ns(), std::memory_order_relaxed);
    while (int32_t(gen - d) > 0 && !done_gen.compare_exchange_weak(d, gen)) {
    }
    if (waiters.load() > 0) futex_wake_all(&done_gen, false);
  }
  /* Blocks until record `gen` (or a later one) was reached. */
  void wait_for(uint32_t gen) {
    waiters.fetch_add(1);
    for (;;) {
      uint32_t d = done_gen.load();
      if (int32_t(d - gen) >= 0) break;
      futex_wait(&done_gen, d, 20000000ull, false);
    }
    waiters.fetch_sub(1);
  }
};

struct Stream {
  uint32_t magic = kStreamMagic;
  int device = 0;
  unsigned flags = 0;
  std::mutex m;
  std::condition_variable work_cv; /* the worker sleeps here when the queue is empty */
  std::condition_variable idle_cv; /* host threads in cudaStreamSynchronize sleep here */
  std::vector<Item> ring;          /* circular queue; the running item stays at head */
  size_t head = 0, count = 0;
  bool sleeping = false, destroyed = false;
  int host_waiters = 0;
  /* stream capture (capture.cc): the flag is read lock-free; the rest under its lock */
  std::atomic<bool> capturing{false};
  struct Capture* capture = nullptr;

  void push_locked(const Item& it) {
    if (count == ring.size()) {
      std::vector<Item> bigger(ring.empty() ? 64 : ring.size() * 2);
      for (size_t i = 0; i < count; ++i) bigger[i] = ring[(head + i) % ring.size()];
      ring.swap(bigger);
      head = 0;
    }
    ring[(head + count) % ring.size()] = it;
    ++count;
  }
};

/* NULL, cudaStreamLegacy (1) and cudaStreamPerThread (2) → the per-process default
 * stream; nullptr for a handle that is not a live stream. */
Stream* resolve_stream(cudaStream_t s);
void stream_enqueue(Stream* s, const Item& it);
/* cudaEventRecord's body: the marker completes now on an idle stream, else it is queued. */
void record_event(Event* e, Stream* s);
cudaError_t fail(cudaError_t e); /* sets the thread's last error */

/* ---- stream capture and graphs (capture.cc) ---- */
/* A capturing stream takes `it` into its graph instead of running it (true). */
bool capture_item(Stream* s, const Item& it);
/* An NCCL group launched on a capturing stream: the graph keeps it, to run at each replay
 * (false: the capture ended meanwhile, run it now). Takes ownership of g when true. */
bool capture_group(Stream* s, GroupWork* g);
/* Potentially unsafe calls (cudaEventQuery, cudaStreamSynchronize, cudaMalloc, ...) ask
 * first: 900 and the offending captures invalidated, or 0 (capture.cc tells the rule). */
cudaError_t capture_guard();
/* cudaStreamQuery/Synchronize of a capturing stream: never allowed (900, invalidates it). */
cudaError_t capture_guard_stream(Stream* s);
/* collectives.cc: one replay of a captured group on stream s. */
void launch_captured_group(const GroupWork* tmpl, Stream* s);
int current_device();
/* `device` gets a context (NCCL's init makes one on the device it runs on). */
void context_on_device(int device);

}  // namespace sim

#endif  // SIMNCCL_STREAM_H
