#include "common.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace sim {

void sleep_until_ns(uint64_t t_ns) {
  timespec ts;
  ts.tv_sec = time_t(t_ns / 1000000000ull);
  ts.tv_nsec = long(t_ns % 1000000000ull);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, uint64_t timeout_ns, bool shared) {
  timespec rel;
  timespec* prel = nullptr;
  if (timeout_ns) {
    rel.tv_sec = time_t(timeout_ns / 1000000000ull);
    rel.tv_nsec = long(timeout_ns % 1000000000ull);
    prel = &rel;
  }
  int op = shared ? FUTEX_WAIT : (FUTEX_WAIT | FUTEX_PRIVATE_FLAG);
  // EAGAIN (value changed), ETIMEDOUT, EINTR: all mean "re-check the condition".
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, expected, prel, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* addr, bool shared) {
  int op = shared ? FUTEX_WAKE : (FUTEX_WAKE | FUTEX_PRIVATE_FLAG);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, 0x7fffffff, nullptr, nullptr, 0);
}

namespace {
std::mutex* g_last_mu = new std::mutex; /* leaked: stream workers may warn during exit */
char g_last_error[1024] = "";

void vlog(bool warn, const char* fmt, va_list ap) {
  char buf[768];
  int n = snprintf(buf, sizeof buf, "simnccl: ");
  int m = vsnprintf(buf + n, sizeof buf - size_t(n) - 1, fmt, ap);
  if (warn) {
    std::lock_guard<std::mutex> lk(*g_last_mu);
    snprintf(g_last_error, sizeof g_last_error, "%s", buf + n);
  }
  size_t len = size_t(n) + (m < 0 ? 0 : size_t(m));
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  // One write(2): lines from 32 ranks sharing a terminal do not interleave mid-line.
  ssize_t w = write(2, buf, len);
  (void)w;
}
}  // namespace

void logf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(false, fmt, ap);
  va_end(ap);
}

void warnf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(true, fmt, ap);
  va_end(ap);
}

const char* last_error() { return g_last_error; }

double env_double(const char* name, double def, double lo, double hi) {
  const char* s = getenv(name);
  if (!s || !*s) return def;
  char* end = nullptr;
  errno = 0;
  double v = strtod(s, &end);
  while (end && (*end == ' ' || *end == '\t')) ++end;
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    logf("%s=%s is not a number in [%g, %g]; using the default %g", name, s, lo, hi, def);
    return def;
  }
  return v;
}

long env_long(const char* name, long def, long lo, long hi) {
  const char* s = getenv(name);
  if (!s || !*s) return def;
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 10);
  while (end && (*end == ' ' || *end == '\t')) ++end;
  if (errno || end == s || *end || v < lo || v > hi) {
    logf("%s=%s is not an integer in [%ld, %ld]; using the default %ld", name, s, lo, hi, def);
    return def;
  }
  return v;
}

}  // namespace sim
