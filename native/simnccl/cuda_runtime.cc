/*
 * The CUDA runtime subset on the CPU: devices are numbers, device memory is host
 * memory, streams are worker threads (stream.h draws the flow), events are markers
 * timestamped with CLOCK_MONOTONIC when a worker reaches them.
 *
 * Contracts the shim relies on:
 *  - cudaEventRecord is cheap: on an idle stream it completes the event on the spot
 *    (one uncontended lock, one vDSO clock read); on a busy stream it pushes an item
 *    and wakes the worker only if that worker sleeps.
 *  - cudaEventQuery never blocks: 0 or 600 (cudaErrorNotReady).
 *  - cudaEventElapsedTime: signed milliseconds end - start; 600 while either event is
 *    incomplete, 400 for an event never recorded or created with DisableTiming.
 *
 * Contexts: the CUDA runtime creates a device's primary context (~500 MiB of GPU memory
 * on real hardware) at the first call that needs one, on the calling thread's current
 * device, which is device 0 until the thread calls cudaSetDevice (and cudaSetDevice itself
 * initialises the context since CUDA 12.0). simnccl notes which devices got a context in
 * this process; SIMNCCL_CONTEXT_DUMP=PATH writes them to PATH at exit ("contexts 3\n"), so
 * a test can tell that a thread touched device 0 by accident.
 */
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "include/simnccl/sim_ext.h"
#include "stream.h"

namespace sim {

namespace {

std::mutex* g_reg_mu = new std::mutex;                   /* leaked on purpose: workers may */
std::vector<Stream*>* g_streams = new std::vector<Stream*>; /* outlive static destructors */
Stream* g_default = nullptr;
std::once_flag g_default_once;
thread_local int t_device = 0;
thread_local cudaError_t t_last_error = 0;
constexpr int kCtxWords = 16;
std::atomic<uint64_t> g_contexts[kCtxWords]; /* bit d: device d has a context in this process */

void touch_device(int d) {
  if (d >= 0 && d < 64 * kCtxWords) g_contexts[d / 64].fetch_or(1ull << (d % 64), std::memory_order_relaxed);
}

/* Every runtime call that needs a context makes one on the caller's current device. */
void touch_context() { touch_device(t_device); }

void dump_contexts() {
  const char* path = getenv("SIMNCCL_CONTEXT_DUMP");
  if (!path || !*path) return;
  std::string line = "contexts";
  for (int d = 0; d < 64 * kCtxWords; ++d)
    if (g_contexts[d / 64].load() & (1ull << (d % 64))) line += " " + std::to_string(d);
  line += "\n";
  if (FILE* f = fopen(path, "w")) {
    fputs(line.c_str(), f);
    fclose(f);
  }
}

/* At load, so that it runs after every atexit handler registered later (the shim's agent
 * flushes in one of those, and may still call CUDA there). */
__attribute__((constructor)) void register_context_dump() {
  const char* path = getenv("SIMNCCL_CONTEXT_DUMP");
  if (path && *path) atexit(dump_contexts);
}

int device_count() {
  static const int n = int(env_long("SIMNCCL_NUM_DEVICES", 8, 1, 1024));
  return n;
}

/* A kernel that never ends (SIM_COMPUTE_FOREVER: the noncomm-hang fault). Its own
 * never-inlined function, so that a debugger attached to a hung rank names it. */
[[noreturn]] __attribute__((noinline)) void simnccl_hung_kernel() {
  for (;;) sleep_until_ns(now_ns() + 3600ull * 1000000000ull);
}

void run_item(const Item& it) {
  switch (it.kind) {
    case ItemKind::EventRecord: {
      Event* e = static_cast<Event*>(it.p);
      e->reach(uint32_t(it.a));
      e->release();
      break;
    }
    case ItemKind::WaitEvent: {
      Event* e = static_cast<Event*>(it.p);
      e->wait_for(uint32_t(it.a));
      e->release();
      break;
    }
    case ItemKind::Compute:
      if (it.a == SIM_COMPUTE_FOREVER) simnccl_hung_kernel();
      sleep_until_ns(now_ns() + it.a);
      break;
    case ItemKind::Memcpy:
      if (it.a) memmove(it.p, it.q, it.a);
      break;
    case ItemKind::Memset:
      if (it.a) memset(it.p, int(it.b), it.a);
      break;
    case ItemKind::Group: {
      JoinSync* js = static_cast<JoinSync*>(const_cast<void*>(it.q));
      if (js) {
        std::unique_lock<std::mutex> lk(js->m);
        js->cv.wait(lk, [&] { return js->arrived == js->expected; });
      }
      run_group(static_cast<GroupWork*>(it.p));
      if (js) {
        {
          std::lock_guard<std::mutex> lk(js->m);
          js->done = true;
        }
        js->cv.notify_all();
        js->release();
      }
      break;
    }
    case ItemKind::Join: {
      JoinSync* js = static_cast<JoinSync*>(it.p);
      {
        std::unique_lock<std::mutex> lk(js->m);
        ++js->arrived;
        js->cv.notify_all();
        js->cv.wait(lk, [&] { return js->done; });
      }
      js->release();
      break;
    }
  }
}

void worker_main(Stream* s) {
  std::unique_lock<std::mutex> lk(s->m);
  for (;;) {
    while (s->count == 0) {
      if (s->destroyed) {
        lk.unlock();
        {
          std::lock_guard<std::mutex> rg(*g_reg_mu);
          auto& v = *g_streams;
          for (size_t i = 0; i < v.size(); ++i)
            if (v[i] == s) {
              v[i] = v.back();
              v.pop_back();
              break;
            }
        }
        s->magic = 0;
        delete s;
        return;
      }
      s->sleeping = true;
      s->work_cv.wait(lk);
      s->sleeping = false;
    }
    Item it = s->ring[s->head];
    lk.unlock();
    run_item(it);
    lk.lock();
    s->head = (s->head + 1) % s->ring.size();
    --s->count;
    if (s->count == 0 && s->host_waiters) s->idle_cv.notify_all();
  }
}

Stream* new_stream(unsigned flags) {
  Stream* s = new Stream;
  s->device = t_device;
  s->flags = flags;
  s->ring.resize(64);
  {
    std::lock_guard<std::mutex> rg(*g_reg_mu);
    g_streams->push_back(s);
  }
  std::thread(worker_main, s).detach();
  return s;
}

Stream* default_stream() {
  std::call_once(g_default_once, [] { g_default = new_stream(0); });
  return g_default;
}

Event* as_event(cudaEvent_t e) {
  Event* ev = reinterpret_cast<Event*>(e);
  return (ev && ev->magic == kEventMagic) ? ev : nullptr;
}

void sync_stream(Stream* s) {
  std::unique_lock<std::mutex> lk(s->m);
  ++s->host_waiters;
  s->idle_cv.wait(lk, [&] { return s->count == 0; });
  --s->host_waiters;
}

}  // namespace

cudaError_t fail(cudaError_t e) {
  if (e) t_last_error = e;
  return e;
}

Stream* resolve_stream(cudaStream_t h) {
  uintptr_t v = reinterpret_cast<uintptr_t>(h);
  if (v <= 2) return default_stream();
  Stream* s = reinterpret_cast<Stream*>(h);
  return s->magic == kStreamMagic ? s : nullptr;
}

void stream_enqueue(Stream* s, const Item& it) {
  if (s->capturing.load(std::memory_order_relaxed) && capture_item(s, it)) return;
  std::lock_guard<std::mutex> lk(s->m);
  s->push_locked(it);
  if (s->sleeping) s->work_cv.notify_one(); /* a running worker finds the item itself */
}

int current_device() { return t_device; }

void record_event(Event* e, Stream* s) {
  e->captured.store(false, std::memory_order_relaxed);
  uint32_t gen = e->rec_gen.fetch_add(1) + 1;
  std::lock_guard<std::mutex> lk(s->m);
  if (s->count == 0) {
    e->reach(gen); /* idle stream: the "GPU" reaches the marker at once */
    return;
  }
  e->refs.fetch_add(1, std::memory_order_relaxed);
  s->push_locked(Item{ItemKind::EventRecord, e, nullptr, gen, 0});
  if (s->sleeping) s->work_cv.notify_one();
}

void context_on_device(int device) { touch_device(device); }

}  // namespace sim

using namespace sim;

SIM_API cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(kErrInvalidValue);
  *count = device_count();
  return 0;
}

SIM_API cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(kErrInvalidValue);
  *device = t_device;
  return 0;
}

SIM_API cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(kErrInvalidDevice);
  t_device = device;
  touch_context(); /* CUDA 12.0+: cudaSetDevice initialises the device's primary context */
  return 0;
}

SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  touch_context();
  if (!stream) return fail(kErrInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new_stream(flags));
  return 0;
}

SIM_API cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

SIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  touch_context();
  Stream* s = resolve_stream(stream);
  if (!s || s == default_stream()) return fail(kErrInvalidHandle);
  std::lock_guard<std::mutex> lk(s->m);
  s->destroyed = true; /* like CUDA: returns now, the worker drains the queue, then exits */
  if (s->sleeping) s->work_cv.notify_one();
  return 0;
}

SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  if (cudaError_t g = capture_guard_stream(s)) return g;
  sync_stream(s);
  return 0;
}

SIM_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  if (cudaError_t g = capture_guard_stream(s)) return g;
  std::lock_guard<std::mutex> lk(s->m);
  return s->count == 0 ? 0 : kErrNotReady;
}

SIM_API cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  touch_context();
  Stream* s = resolve_stream(stream);
  if (!s || !device) return fail(s ? kErrInvalidValue : kErrInvalidHandle);
  *device = s->device;
  return 0;
}

SIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  touch_context();
  (void)flags;
  Stream* s = resolve_stream(stream);
  Event* e = as_event(event);
  if (!s || !e) return fail(kErrInvalidHandle);
  uint32_t gen = e->rec_gen.load();
  if (gen == 0 || e->complete()) return 0; /* nothing to wait for */
  e->refs.fetch_add(1);
  stream_enqueue(s, Item{ItemKind::WaitEvent, e, nullptr, gen, 0});
  return 0;
}

SIM_API cudaError_t cudaDeviceSynchronize(void) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  default_stream();
  std::lock_guard<std::mutex> rg(*g_reg_mu);
  for (Stream* s : *g_streams) sync_stream(s);
  return 0;
}

SIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  touch_context();
  if (!event) return fail(kErrInvalidValue);
  Event* e = new Event;
  e->flags = flags;
  *event = reinterpret_cast<cudaEvent_t>(e);
  return 0;
}

SIM_API cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

SIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  touch_context();
  Event* e = as_event(event);
  Stream* s = resolve_stream(stream);
  if (!e || !s) return fail(kErrInvalidHandle);
  if (s->capturing.load(std::memory_order_relaxed)) {
    e->refs.fetch_add(1);
    if (capture_item(s, Item{ItemKind::EventRecord, e, nullptr, 0, 0})) {
      e->captured.store(true); /* queried now, it says cudaErrorCapturedEvent */
      return 0;
    }
    e->release();
  }
  record_event(e, s);
  return 0;
}

SIM_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  Event* e = as_event(event);
  if (!e) return fail(kErrInvalidHandle);
  if (e->captured.load(std::memory_order_relaxed)) return fail(kErrCapturedEvent);
  return e->complete() ? 0 : kErrNotReady;
}

SIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  Event* e = as_event(event);
  if (!e) return fail(kErrInvalidHandle);
  if (e->captured.load(std::memory_order_relaxed)) return fail(kErrCapturedEvent);
  e->wait_for(e->rec_gen.load());
  return 0;
}

SIM_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  touch_context();
  Event* a = as_event(start);
  Event* b = as_event(end);
  if (!ms) return fail(kErrInvalidValue);
  if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
    return fail(kErrInvalidHandle);
  if (a->rec_gen.load() == 0 || b->rec_gen.load() == 0) return fail(kErrInvalidHandle);
  if (!a->complete() || !b->complete()) return fail(kErrNotReady);
  int64_t d = int64_t(b->ts_ns.load(std::memory_order_relaxed) - a->ts_ns.load(std::memory_order_relaxed));
  *ms = float(double(d) / 1e6);
  return 0;
}

SIM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  touch_context();
  Event* e = as_event(event);
  if (!e) return fail(kErrInvalidHandle);
  e->release(); /* queued markers hold their own reference */
  return 0;
}

SIM_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  if (!ptr) return fail(kErrInvalidValue);
  *ptr = nullptr;
  if (size == 0) return 0;
  void* p = aligned_alloc(256, (size + 255) & ~size_t(255));
  if (!p) return fail(kErrMemoryAllocation);
  *ptr = p;
  return 0;
}

SIM_API cudaError_t cudaFree(void* ptr) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  free(ptr);
  return 0;
}

SIM_API cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaMalloc(ptr, size); }

SIM_API cudaError_t cudaFreeHost(void* ptr) { return cudaFree(ptr); }

SIM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t stream) {
  touch_context();
  (void)kind;
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  if (count && (!dst || !src)) return fail(kErrInvalidValue);
  stream_enqueue(s, Item{ItemKind::Memcpy, dst, src, count, 0});
  return 0;
}

SIM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  (void)kind;
  if (count && (!dst || !src)) return fail(kErrInvalidValue);
  sync_stream(default_stream()); /* synchronous copy on the legacy default stream */
  if (count) memmove(dst, src, count);
  return 0;
}

SIM_API cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  touch_context();
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  if (count && !dst) return fail(kErrInvalidValue);
  stream_enqueue(s, Item{ItemKind::Memset, dst, nullptr, count, uint64_t(value)});
  return 0;
}

SIM_API cudaError_t cudaMemset(void* dst, int value, size_t count) {
  touch_context();
  if (cudaError_t g = capture_guard()) return g;
  if (count && !dst) return fail(kErrInvalidValue);
  sync_stream(default_stream());
  if (count) memset(dst, value, count);
  return 0;
}

SIM_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = 0;
  return e;
}

SIM_API const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case 0: return "no error";
    case kErrInvalidValue: return "invalid argument";
    case kErrMemoryAllocation: return "out of memory";
    case kErrInvalidDevice: return "invalid device ordinal";
    case kErrInvalidHandle: return "invalid resource handle";
    case kErrNotReady: return "device not ready";
    case kErrIllegalState: return "the operation cannot be performed in the present state";
    case kErrCaptureUnsupported: return "operation not permitted when stream is capturing";
    case kErrCaptureInvalidated: return "operation failed due to a previous error during capture";
    case kErrCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case kErrCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "unrecognized error code";
  }
}

SIM_API cudaError_t simLaunchCompute(cudaStream_t stream, uint64_t duration_ns) {
  touch_context();
  Stream* s = resolve_stream(stream);
  if (!s) return fail(kErrInvalidHandle);
  stream_enqueue(s, Item{ItemKind::Compute, nullptr, nullptr, duration_ns, 0});
  return 0;
}
