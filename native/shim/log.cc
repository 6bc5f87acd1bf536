#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

namespace c4d {

std::atomic<int> g_log_level{kInfo};

void log_write(int level, const char* fmt, ...) {
  if (level < g_log_level.load(std::memory_order_relaxed)) return;
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "c4d: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  n += m;
  if (n > int(sizeof buf) - 2) n = int(sizeof buf) - 2;
  buf[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, size_t(n));
  (void)w;  // nothing sensible to do when stderr is gone
}

void printable(const char* s, char* out, unsigned cap) {
  unsigned n = 0;
  size_t len = strlen(s);
  bool cut = len > cap - 1;
  unsigned keep = cut ? cap - 4 : unsigned(len);
  for (; n < keep; ++n) {
    unsigned char c = static_cast<unsigned char>(s[n]);
    out[n] = (c < 0x20 || c == 0x7f) ? '?' : char(c);
  }
  if (cut) {
    memcpy(out + n, "...", 3);
    n += 3;
  }
  out[n] = '\0';
}

}  // namespace c4d
