/*
 * Small helpers shared by every part of simnccl: clocks, futex waits, env parsing,
 * one-line logging, FNV-1a. Nothing here allocates on a hot path.
 */
#ifndef SIMNCCL_COMMON_H
#define SIMNCCL_COMMON_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace sim {

/* CLOCK_MONOTONIC in ns: vDSO, no syscall. One clock for the whole host, so arrival
 * times published by different processes compare directly. */
inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* Sleep (never spin) until CLOCK_MONOTONIC reaches t_ns. */
void sleep_until_ns(uint64_t t_ns);

/* futex(2) on a 32-bit word. `shared` = the word lives in shared memory (no
 * FUTEX_PRIVATE_FLAG). Waits while *addr == expected, at most timeout_ns (0 = forever). */
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, uint64_t timeout_ns, bool shared);
void futex_wake_all(std::atomic<uint32_t>* addr, bool shared);

/* One line on stderr, prefixed "simnccl: " (a trailing newline is added). */
void logf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* A WARN: logf, and the message becomes what ncclGetLastError returns (NCCL 2.30.7
 * src/debug.cc ncclDebugLogV keeps the last WARN in ncclLastError, printed or not). */
void warnf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
const char* last_error();

/* Environment values with range checks. A malformed or out-of-range value prints one
 * line naming the variable and the default, then returns the default. */
double env_double(const char* name, double def, double lo, double hi);
long env_long(const char* name, long def, long lo, long hi);

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;
inline uint64_t fnv1a(const void* p, size_t n, uint64_t h = kFnvOffset) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnvPrime;
  }
  return h;
}

/* splitmix64: a cheap, well-mixed hash for deterministic jitter. */
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace sim

#endif  // SIMNCCL_COMMON_H
