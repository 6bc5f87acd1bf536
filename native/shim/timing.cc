#include "timing.h"

#include <stdio.h>
#include <string.h>

#include "cuda_rt.h"
#include "event_pool.h"
#include "log.h"

namespace c4d {

std::atomic<int64_t> g_clock_offset_ns{0};
bool g_stamp_tsc = false;

namespace {

constexpr int kAnchors = 8;
constexpr uint64_t kAnchorPeriodNs = 1000000000ull;

enum AnchorState : uint8_t { kUnused = 0, kRecorded = 1, kFired = 2 };

struct Anchor {
  cudaEvent_t ev;
  uint64_t host_ns;  // host time right after cudaEventRecord returned
  uint8_t state;
};

/* Written by timing_device_init (app thread, before `ready`), then only by the agent. */
struct DeviceClock {
  std::atomic<bool> ready;
  cudaStream_t stream;
  Anchor ring[kAnchors];
  int next;                   // ring slot the next anchor goes to
  uint64_t last_record_mono;  // when the newest anchor was recorded
};

DeviceClock g_clocks[kMaxDevices];

/* ---- stamps: TSC → host ns (agent thread, after stamp_clock_init) ---- */

struct TscPair {
  uint64_t tsc, mono, real;  // taken together: real includes C4D_CLOCK_OFFSET_NS
};

constexpr uint64_t kTscCalibrateNs = 10000000ull;  // first rate measured over 10 ms
constexpr uint64_t kTscPairPeriodNs = 1000000000ull;

struct StampClock {
  TscPair first, last;  // ticks per ns measured from `first` (monotonic: never steps) ...
  double ns_per_tick;   // ... to the newest pair; 0 until measured
};
StampClock g_stamp;

uint64_t read_tsc() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

TscPair take_pair() {
  uint64_t a = read_tsc();
  TscPair p{0, mono_now_ns(), host_now_ns()};
  uint64_t b = read_tsc();
  p.tsc = a + (b - a) / 2;
  return p;
}

void measure_rate() {
  TscPair p = take_pair();
  if (p.tsc <= g_stamp.first.tsc || p.mono <= g_stamp.first.mono) return;
  g_stamp.last = p;
  g_stamp.ns_per_tick = double(p.mono - g_stamp.first.mono) / double(p.tsc - g_stamp.first.tsc);
}

/* The kernel keeps time with the TSC: it found it invariant and in sync across CPUs. */
bool kernel_clock_is_tsc() {
#if defined(__x86_64__)
  FILE* f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return false;
  char buf[32] = {0};
  bool tsc = fgets(buf, sizeof buf, f) && !strcmp(buf, "tsc\n");
  fclose(f);
  return tsc;
#else
  return false;
#endif
}

bool record_anchor(DeviceClock& c, uint64_t mono_now) {
  Anchor& a = c.ring[c.next];
  if (a.state == kRecorded) return false;  // still in flight: never re-record it
  if (g_cuda.eventRecord(a.ev, c.stream) != C4D_CUDA_SUCCESS) return false;
  a.host_ns = host_now_ns();
  a.state = kRecorded;
  c.next = (c.next + 1) % kAnchors;
  c.last_record_mono = mono_now;
  return true;
}

}  // namespace

bool timing_device_init(int device) {
  if (!g_cuda.ok || device < 0 || device >= kMaxDevices) return false;
  DeviceClock& c = g_clocks[device];
  if (c.ready.load(std::memory_order_acquire)) return true;
  int prev = cuda_current_device();
  if (prev != device && g_cuda.setDevice(device) != C4D_CUDA_SUCCESS) return false;
  bool ok = g_cuda.streamCreateWithFlags(&c.stream, cudaStreamNonBlocking) == C4D_CUDA_SUCCESS;
  for (int i = 0; ok && i < kAnchors; ++i) {
    ok = g_cuda.eventCreateWithFlags(&c.ring[i].ev, cudaEventDefault) == C4D_CUDA_SUCCESS;
    c.ring[i].state = kUnused;
  }
  c.next = 0;
  ok = ok && record_anchor(c, mono_now_ns());
  if (prev >= 0 && prev != device) g_cuda.setDevice(prev);
  if (!ok) {
    C4D_LOG(kWarning, "could not set up the anchor stream of device %d: host times only there", device);
    return false;
  }
  c.ready.store(true, std::memory_order_release);
  return true;
}

void stamp_clock_init(bool allow_tsc) {
  if (g_stamp_tsc || !allow_tsc || !kernel_clock_is_tsc()) return;  // a fork child keeps its parent's pairs
  g_stamp.first = g_stamp.last = take_pair();
  g_stamp.ns_per_tick = 0;
  g_stamp_tsc = true;
  C4D_LOG(kDebug, "host times on the hot path from the TSC");
}

uint64_t stamp_to_ns(uint64_t stamp) {
  if (!g_stamp_tsc) return stamp;
  while (g_stamp.ns_per_tick == 0) {  // once: the rate over the first 10 ms
    uint64_t age = mono_now_ns() - g_stamp.first.mono;
    if (age >= kTscCalibrateNs) {
      measure_rate();
    } else {
      timespec ts{0, long(kTscCalibrateNs - age)};
      nanosleep(&ts, nullptr);
    }
  }
  const TscPair& p = g_stamp.last;
  return uint64_t(int64_t(p.real) + int64_t(double(int64_t(stamp - p.tsc)) * g_stamp.ns_per_tick));
}

void timing_tick(uint64_t mono_now) {
  if (g_stamp_tsc && g_stamp.ns_per_tick != 0 && mono_now - g_stamp.last.mono >= kTscPairPeriodNs) measure_rate();
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceClock& c = g_clocks[d];
    if (!c.ready.load(std::memory_order_acquire) || !cuda_agent_device(d)) continue;
    for (Anchor& a : c.ring)
      if (a.state == kRecorded) {
        cudaError_t q = g_cuda.eventQuery(a.ev);
        if (q == C4D_CUDA_SUCCESS) a.state = kFired;
        else if (q != C4D_CUDA_ERROR_NOT_READY) a.state = kUnused;  // broken: don't use it
      }
    if (mono_now - c.last_record_mono >= kAnchorPeriodNs) record_anchor(c, mono_now);
  }
}

TimeResult timing_event_ns(int device, cudaEvent_t ev, uint64_t ref_ns, uint64_t* out) {
  if (device < 0 || device >= kMaxDevices) return kTimeFailed;
  DeviceClock& c = g_clocks[device];
  if (!c.ready.load(std::memory_order_acquire)) return kTimeFailed;
  const Anchor* best = nullptr;   // newest fired anchor recorded at or before ref_ns
  const Anchor* oldest = nullptr; // fallback: the oldest fired anchor
  for (const Anchor& a : c.ring) {
    if (a.state != kFired) continue;
    if (a.host_ns <= ref_ns && (!best || a.host_ns > best->host_ns)) best = &a;
    if (!oldest || a.host_ns < oldest->host_ns) oldest = &a;
  }
  if (!best) best = oldest;
  if (!best) return kTimeNoAnchorYet;  // the first anchor is in flight (fires within µs)
  float ms = 0;
  if (g_cuda.eventElapsedTime(&ms, best->ev, ev) != C4D_CUDA_SUCCESS) return kTimeFailed;
  int64_t delta = int64_t(double(ms) * 1e6);
  *out = uint64_t(int64_t(best->host_ns) + delta);
  return kTimeOk;
}

void timing_reset_after_fork() {
  for (DeviceClock& c : g_clocks) c.ready.store(false, std::memory_order_relaxed);
}

}  // namespace c4d
