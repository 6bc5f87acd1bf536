/*
 * The shim's own log: one line per message on stderr, prefixed "c4d: ", written with a
 * single write(2) so lines from many ranks never interleave mid-line. Never called on
 * the hot path except for once-only conditions (a missing symbol).
 */
#ifndef C4D_SHIM_LOG_H
#define C4D_SHIM_LOG_H

#include <atomic>

namespace c4d {

enum LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kFatal = 5 };

/* Messages below this level are dropped (C4D_RUNTIME_LOG_LEVEL; set once by config). */
extern std::atomic<int> g_log_level;

/* Any thread. Formats into a stack buffer (long messages are truncated). */
void log_write(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* Printable copy of an untrusted string for a log line: control bytes become '?',
 * at most `cap - 1` bytes (a trailing "..." marks truncation). */
void printable(const char* s, char* out, unsigned cap);

}  // namespace c4d

#define C4D_LOG(level, ...)                                                        \
  do {                                                                             \
    if ((level) >= ::c4d::g_log_level.load(std::memory_order_relaxed)) ::c4d::log_write((level), __VA_ARGS__); \
  } while (0)

#endif  // C4D_SHIM_LOG_H
