#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>
#include <strings.h>
#include <unistd.h>

#include "log.h"

namespace c4d {

const char* const kDefaultMasterAddr = "tcp://127.0.0.1:5555";

namespace {

/* The environment value, or nullptr when unset or empty (empty = "use the default"). */
const char* env(const char* name) {
  const char* v = getenv(name);
  return (v && *v) ? v : nullptr;
}

void bad(const char* name, const char* value, const char* what, const char* using_) {
  char shown[80];
  printable(value, shown, sizeof shown);
  log_write(kWarning, "%s='%s' %s; using %s", name, shown, what, using_);
}

bool parse_i64(const char* s, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s) return false;
  while (*end == ' ' || *end == '\t') ++end;
  if (*end) return false;
  *out = v;
  return true;
}

/* Integer in [lo, hi]; one line and `def` otherwise. */
int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const char* s = env(name);
  if (!s) return def;
  int64_t v = 0;
  bool ok = parse_i64(s, &v);
  if (ok && v >= lo && v <= hi) return v;
  char what[96], d[32];
  if (ok && v > hi)
    snprintf(what, sizeof what, "is larger than %lld", (long long)hi);
  else if (lo == 1)
    snprintf(what, sizeof what, "is not a positive integer");
  else if (lo == 0)
    snprintf(what, sizeof what, "is not a non-negative integer");
  else if (lo < 0)
    snprintf(what, sizeof what, "is not an integer in [%lld, %lld]", (long long)lo, (long long)hi);
  else
    snprintf(what, sizeof what, "is not an integer >= %lld", (long long)lo);
  snprintf(d, sizeof d, "%lld", (long long)def);
  bad(name, s, what, d);
  return def;
}

/* TRUE/FALSE/1/0 (case-insensitive). */
bool env_bool(const char* name, bool def) {
  const char* s = env(name);
  if (!s) return def;
  if (!strcasecmp(s, "true") || !strcmp(s, "1")) return true;
  if (!strcasecmp(s, "false") || !strcmp(s, "0")) return false;
  bad(name, s, "is not TRUE, FALSE, 1 or 0", def ? "TRUE" : "FALSE");
  return def;
}

const char* const kLevels[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};

int env_level(const char* name, int def) {
  const char* s = env(name);
  if (!s) return def;
  for (int i = 0; i < 6; ++i)
    if (!strcasecmp(s, kLevels[i])) return i;
  if (!strcasecmp(s, "WARN")) return kWarning;
  bad(name, s, "is not one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL", kLevels[def]);
  return def;
}

bool printable_name(const char* s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return false;
  for (size_t i = 0; i < n; ++i)
    if (s[i] <= 0x20 || s[i] >= 0x7f) return false;
  return true;
}

/* ZeroMQ endpoints c4d can PUSH to; the address itself is checked by zmq_connect. */
bool looks_like_endpoint(const char* s) {
  static const char* const kTransports[] = {"tcp://", "ipc://", "inproc://", "ws://", "wss://", "tipc://", "vmci://"};
  if (!printable_name(s, 255)) return false;
  for (const char* t : kTransports) {
    size_t n = strlen(t);
    if (!strncmp(s, t, n) && s[n]) return true;
  }
  return false;
}

int first_int(const char* const* names, int n) {
  for (int i = 0; i < n; ++i) {
    const char* s = env(names[i]);
    int64_t v = 0;
    if (s && parse_i64(s, &v) && v >= 0 && v < (int64_t(1) << 31)) return int(v);
  }
  return -1;
}

void copy_trunc(char* dst, size_t cap, const char* src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

constexpr size_t kZ85Key = 40;  // a CURVE key in Z85 text (32 bytes)

bool is_z85_key(const char* s, size_t n) {
  static const char kZ85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (n != kZ85Key) return false;
  for (size_t i = 0; i < n; ++i)
    if (!s[i] || !strchr(kZ85, s[i])) return false;
  return true;
}

/* The master's public key from a file: a ZeroMQ certificate (`public-key = "..."`, what
 * `c4d keygen` and pyzmq write) or the bare Z85 text. False when neither. */
bool key_from_file(const char* path, char* out) {
  FILE* f = fopen(path, "re");
  if (!f) return false;
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  if (const char* p = strstr(buf, "public-key")) {
    const char* q = strchr(p, '"');
    if (!q) return false;
    const char* k = q + 1;  // 40 key characters, then the closing quote
    if (strnlen(k, kZ85Key + 1) <= kZ85Key || k[kZ85Key] != '"' || !is_z85_key(k, kZ85Key)) return false;
    memcpy(out, k, kZ85Key);
    out[kZ85Key] = '\0';
    return true;
  }
  size_t b = 0, e = n;
  while (b < e && (buf[b] == ' ' || buf[b] == '\t' || buf[b] == '\n' || buf[b] == '\r')) ++b;
  while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\t' || buf[e - 1] == '\n' || buf[e - 1] == '\r')) --e;
  if (!is_z85_key(buf + b, e - b)) return false;
  memcpy(out, buf + b, kZ85Key);
  out[kZ85Key] = '\0';
  return true;
}

uint32_t round_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

void config_load(Config* c) {
  memset(c, 0, sizeof *c);
  // The log level first, so that it governs the lines below.
  c->log_level = env_level("C4D_RUNTIME_LOG_LEVEL", kInfo);
  g_log_level.store(c->log_level, std::memory_order_relaxed);

  c->enable = true;
  if (const char* s = env("C4D_ENABLE")) {
    if (!strcmp(s, "0") || !strcasecmp(s, "false"))
      c->enable = false;
    else if (strcmp(s, "1") && strcasecmp(s, "true"))
      bad("C4D_ENABLE", s, "is not 0 or 1", "1");
  }
  c->hang_timeout_us = uint64_t(env_int("C4D_HANG_TIMEOUT", 10000000, 1, int64_t(1) << 50));
  c->hang_times = int(env_int("C4D_HANG_TIMES", 18, 1, 1000000));
  c->bw_check_period_s = int(env_int("C4D_CONN_BW_CHECK_PERIOD", 10, 1, 86400));
  c->stats_output = env_bool("C4D_ENABLE_STATS_OUTPUT", false);

  copy_trunc(c->master_addr, sizeof c->master_addr, kDefaultMasterAddr);
  if (const char* s = env("C4D_MASTER_ADDR")) {
    if (looks_like_endpoint(s))
      copy_trunc(c->master_addr, sizeof c->master_addr, s);
    else {  // never silently another address: the records would go to whoever listens there
      char shown[80];
      printable(s, shown, sizeof shown);
      log_write(kWarning,
                "C4D_MASTER_ADDR='%s' is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH); using none: records "
                "are counted, not sent",
                shown);
      c->master_addr[0] = '\0';
    }
  }

  // CURVE (docs/reliability.md): the master's public key, as text or in a file. A value that is
  // neither sends nothing: never a plain-text fallback the operator did not ask for.
  if (const char* s = env("C4D_CURVE_SERVER_KEY")) {
    bool file = access(s, F_OK) == 0;
    bool ok = file ? key_from_file(s, c->curve_server_key) : is_z85_key(s, strlen(s));
    if (ok && !file) copy_trunc(c->curve_server_key, sizeof c->curve_server_key, s);
    if (!ok) {
      char shown[80];
      printable(s, shown, sizeof shown);
      log_write(kWarning,
                "C4D_CURVE_SERVER_KEY='%s' is %s; using none: records are counted, not sent", shown,
                file ? "a file without a Z85 public key (public-key = \"...\", 40 characters) or unreadable"
                     : "neither a Z85 public key (40 characters) nor an existing key file");
      c->curve_server_key[0] = '\0';
      c->curve_bad = true;
      c->master_addr[0] = '\0';
    }
  }

  char host[256] = "unknown";
  if (gethostname(host, sizeof host) != 0) copy_trunc(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  copy_trunc(c->node, sizeof c->node, host);
  if (const char* s = env("C4D_NODE_NAME")) {
    if (printable_name(s, sizeof c->node - 1)) {
      copy_trunc(c->node, sizeof c->node, s);
    } else {
      char what[96];
      snprintf(what, sizeof what, "is not a name of 1 to %zu printable characters without spaces", sizeof c->node - 1);
      bad("C4D_NODE_NAME", s, what, c->node);
    }
  }

  c->heartbeat_ms = int(env_int("C4D_HEARTBEAT_MS", 1000, 10, 3600000));
  c->queue_capacity = round_pow2(uint32_t(env_int("C4D_QUEUE_CAPACITY", 65536, 1, 1 << 24)));
  c->event_pool = uint32_t(env_int("C4D_EVENT_POOL", 4096, 2, 1 << 20));
  c->send_hwm = int(env_int("C4D_SEND_HWM", 512, 1, 1 << 20));
  c->exit_flush_ms = int(env_int("C4D_EXIT_FLUSH_MS", 200, 0, 60000));
  c->clock_offset_ns = env_int("C4D_CLOCK_OFFSET_NS", 0, -(int64_t(1) << 62), int64_t(1) << 62);
  c->peer_track = uint32_t(env_int("C4D_PEER_TRACK", 4096, 16, 1 << 20));
  c->tsc = env_bool("C4D_TSC", true);

  if (const char* s = env("C4D_LIBZMQ")) {
    if (access(s, R_OK) == 0 && strlen(s) < sizeof c->libzmq)
      copy_trunc(c->libzmq, sizeof c->libzmq, s);
    else
      bad("C4D_LIBZMQ", s, "is not a readable file", "pyzmq's bundled libzmq or libzmq.so.5");
  }

  if (const char* s = env("C4D_JOB_ID")) {
    if (printable_name(s, sizeof c->job - 1)) {
      copy_trunc(c->job, sizeof c->job, s);
    } else {
      char what[96];
      snprintf(what, sizeof what, "is not an id of 1 to %zu printable characters without spaces", sizeof c->job - 1);
      bad("C4D_JOB_ID", s, what, "the launcher's job id");
    }
  }
  if (!c->job[0]) {
    for (const char* name : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
      if (const char* s = env(name)) {
        copy_trunc(c->job, sizeof c->job, s);  // not ours to validate: truncate silently
        break;
      }
    }
  }

  static const char* const kRank[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  static const char* const kWorld[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  static const char* const kLocal[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
  c->rank = first_int(kRank, 4);
  c->world_size = first_int(kWorld, 4);
  c->local_rank = first_int(kLocal, 4);
}

}  // namespace c4d
