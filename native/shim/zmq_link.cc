#include "zmq_link.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "log.h"

namespace c4d {

namespace {

/* The libzmq C API we use, declared here (no zmq.h at build time). Constants from zmq.h,
 * stable since libzmq 3. */
constexpr int ZMQ_PUSH = 8;
constexpr int ZMQ_LINGER = 17;
constexpr int ZMQ_SNDHWM = 23;
constexpr int ZMQ_DONTWAIT = 1;
constexpr int ZMQ_BLOCKY = 70;
constexpr int ZMQ_PAIR = 0;
constexpr int ZMQ_RCVMORE = 13;
constexpr int ZMQ_EVENT_CONNECTED = 0x0001;
constexpr int ZMQ_EVENT_DISCONNECTED = 0x0200;
constexpr int ZMQ_EVENT_HANDSHAKE_SUCCEEDED = 0x1000;  // libzmq >= 4.3
constexpr int ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL = 0x0800;            // libzmq >= 4.3; value: errno
constexpr int ZMQ_EVENT_HANDSHAKE_FAILED = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | 0x2000 | 0x4000;  // + protocol, auth
constexpr int ZMQ_CURVE_PUBLICKEY = 48;
constexpr int ZMQ_CURVE_SECRETKEY = 49;
constexpr int ZMQ_CURVE_SERVERKEY = 50;
constexpr int ZMQ_METADATA = 95;  // libzmq >= 4.3: "X-Name:value", sent in the handshake
constexpr uint32_t ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC = 0x11000001;
constexpr uint32_t ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH = 0x11000002;

struct ZmqApi {
  void* (*ctx_new)();
  int (*ctx_set)(void*, int, int);
  int (*ctx_term)(void*);
  void* (*socket)(void*, int);
  int (*setsockopt)(void*, int, const void*, size_t);
  int (*connect)(void*, const char*);
  int (*send)(void*, const void*, size_t, int);
  int (*close)(void*);
  int (*errno_)();
  const char* (*strerror)(int);
  void (*version)(int*, int*, int*);
  /* optional (delivery monitoring) */
  int (*socket_monitor)(void*, const char*, int);
  int (*recv)(void*, void*, size_t, int);
  int (*getsockopt)(void*, int, void*, size_t*);
  /* optional (CURVE) */
  int (*curve_keypair)(char*, char*);
};

constexpr const char* kDropped = "records are dropped and counted";

ZmqApi g_zmq;
int g_version = 0;  // major * 10000 + minor * 100 + patch
enum LoadState { kNotTried, kLoaded, kFailed };
std::atomic<int> g_state{kNotTried};  // written under g_init_mutex (activation)
char g_path[PATH_MAX];

template <typename T>
bool sym(void* lib, T* out, const char* name) {
  *out = reinterpret_cast<T>(dlsym(lib, name));
  return *out != nullptr;
}

bool try_load(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    C4D_LOG(kDebug, "dlopen(%s): %s", path, dlerror());
    return false;
  }
  ZmqApi z{};
  if (!(sym(lib, &z.ctx_new, "zmq_ctx_new") && sym(lib, &z.ctx_set, "zmq_ctx_set") &&
        sym(lib, &z.ctx_term, "zmq_ctx_term") && sym(lib, &z.socket, "zmq_socket") &&
        sym(lib, &z.setsockopt, "zmq_setsockopt") && sym(lib, &z.connect, "zmq_connect") &&
        sym(lib, &z.send, "zmq_send") && sym(lib, &z.close, "zmq_close") && sym(lib, &z.errno_, "zmq_errno") &&
        sym(lib, &z.strerror, "zmq_strerror") && sym(lib, &z.version, "zmq_version"))) {
    C4D_LOG(kDebug, "%s lacks the libzmq API", path);
    dlclose(lib);
    return false;
  }
  sym(lib, &z.socket_monitor, "zmq_socket_monitor");
  sym(lib, &z.recv, "zmq_recv");
  sym(lib, &z.getsockopt, "zmq_getsockopt");
  sym(lib, &z.curve_keypair, "zmq_curve_keypair");
  g_zmq = z;
  strncpy(g_path, path, sizeof g_path - 1);
  int a = 0, b = 0, c = 0;
  g_zmq.version(&a, &b, &c);
  g_version = a * 10000 + b * 100 + c;
  C4D_LOG(kDebug, "libzmq %d.%d.%d from %s", a, b, c, path);
  return true;
}

/* pyzmq's wheel bundles libzmq in site-packages/pyzmq.libs/ (auditwheel); we live in
 * site-packages/c4d/_native/. Also tried: the same two levels up from the resolved path. */
bool try_beside_pyzmq() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&try_beside_pyzmq), &info) || !info.dli_fname) return false;
  char real[PATH_MAX];
  const char* paths[2] = {info.dli_fname, realpath(info.dli_fname, real)};
  for (const char* self : paths) {
    if (!self) continue;
    char dir[PATH_MAX];
    strncpy(dir, self, sizeof dir - 1);
    dir[sizeof dir - 1] = '\0';
    char* slash = strrchr(dir, '/');
    if (!slash) continue;
    *slash = '\0';
    static const char* const kPatterns[] = {"%s/../../pyzmq.libs/libzmq*.so*", "%s/../../zmq/.libs/libzmq*.so*"};
    for (const char* pat : kPatterns) {
      char pattern[PATH_MAX + 64];
      snprintf(pattern, sizeof pattern, pat, dir);
      glob_t g;
      if (glob(pattern, 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i)
          if (try_load(g.gl_pathv[i])) {
            globfree(&g);
            return true;
          }
      }
      globfree(&g);
    }
  }
  return false;
}

}  // namespace

bool ZmqLink::load(const char* override_path) {
  int st = g_state.load(std::memory_order_acquire);
  if (st != kNotTried) return st == kLoaded;
  bool loaded = (override_path && *override_path && try_load(override_path)) || try_beside_pyzmq() ||
                try_load("libzmq.so.5") || try_load("libzmq.so");
#ifdef C4D_BUILD_LIBZMQ
  loaded = loaded || try_load(C4D_BUILD_LIBZMQ);  // source-tree build: the pyzmq CMake saw
#endif
  g_state.store(loaded ? kLoaded : kFailed, std::memory_order_release);
  if (!loaded) {
    if (override_path && *override_path)
      C4D_LOG(kWarning, "C4D_LIBZMQ='%s' is not a usable libzmq and no other was found; %s", override_path, kDropped);
    else
      C4D_LOG(kWarning, "libzmq not found (no C4D_LIBZMQ, no pyzmq.libs beside c4d, no libzmq.so.5); %s", kDropped);
  }
  return loaded;
}

bool ZmqLink::open(const char* endpoint, int send_hwm, const char* curve_server_key, const char* job) {
  if (sock_) return true;
  if (g_state.load(std::memory_order_acquire) != kLoaded) return false;  // already logged by load()
  ctx_ = g_zmq.ctx_new();
  if (!ctx_) {
    C4D_LOG(kWarning, "zmq_ctx_new failed: %s; records are dropped and counted", g_zmq.strerror(g_zmq.errno_()));
    return false;
  }
  g_zmq.ctx_set(ctx_, ZMQ_BLOCKY, 0);  // a forgotten socket must never block zmq_ctx_term
  sock_ = g_zmq.socket(ctx_, ZMQ_PUSH);
  int linger = 0;
  bool ok = sock_ && g_zmq.setsockopt(sock_, ZMQ_SNDHWM, &send_hwm, sizeof send_hwm) == 0 &&
            g_zmq.setsockopt(sock_, ZMQ_LINGER, &linger, sizeof linger) == 0;
  snprintf(endpoint_, sizeof endpoint_, "%s", endpoint);
  bool secured = ok && secure(curve_server_key, job);
  if (ok) open_monitor();  // before connect: the handshake may complete at once
  if (!ok || !secured || g_zmq.connect(sock_, endpoint) != 0) {
    if (!ok || secured)  // else secure() said why
      C4D_LOG(kWarning, "cannot connect to C4D_MASTER_ADDR=%s: %s; records are dropped and counted", endpoint,
              g_zmq.strerror(g_zmq.errno_()));
    if (mon_) {
      g_zmq.socket_monitor(sock_, nullptr, 0);
      g_zmq.close(mon_);
    }
    if (sock_) g_zmq.close(sock_);
    g_zmq.ctx_term(ctx_);
    ctx_ = sock_ = mon_ = nullptr;
    return false;
  }
  C4D_LOG(kDebug, "pushing records to %s%s", endpoint, curve_ ? " (CURVE)" : "");
  return true;
}

/* CURVE and the job property, before connect. False: nothing may be sent (logged). */
bool ZmqLink::secure(const char* key, const char* job) {
  if (job && *job) {
    char prop[64];
    snprintf(prop, sizeof prop, "X-C4D-Job:%s", job);
    if (g_zmq.setsockopt(sock_, ZMQ_METADATA, prop, strlen(prop)) != 0)
      C4D_LOG(kDebug, "ZMQ_METADATA: %s; the master ties records to this job by REGISTER only",
              g_zmq.strerror(g_zmq.errno_()));
  }
  if (!key || !*key) return true;
  char pub[41], sec[41];
  if (!g_zmq.curve_keypair || g_zmq.curve_keypair(pub, sec) != 0) {
    C4D_LOG(kWarning, "C4D_CURVE_SERVER_KEY is set but %s has no CURVE support: no plain-text fallback, %s", g_path,
            kDropped);
    return false;
  }
  bool ok = g_zmq.setsockopt(sock_, ZMQ_CURVE_SERVERKEY, key, 41) == 0 &&
            g_zmq.setsockopt(sock_, ZMQ_CURVE_PUBLICKEY, pub, sizeof pub) == 0 &&
            g_zmq.setsockopt(sock_, ZMQ_CURVE_SECRETKEY, sec, sizeof sec) == 0;
  memset(sec, 0, sizeof sec);
  if (!ok) {
    C4D_LOG(kWarning, "CURVE keys refused by libzmq: %s; %s", g_zmq.strerror(g_zmq.errno_()), kDropped);
    return false;
  }
  curve_ = true;
  return true;
}

/* Delivery monitor: failures only cost the "delivered" count (logged at debug level). */
void ZmqLink::open_monitor() {
  if (!g_zmq.socket_monitor || !g_zmq.recv || !g_zmq.getsockopt) return;
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://c4d-monitor-%d-%p", int(getpid()), sock_);
  int events = ZMQ_EVENT_DISCONNECTED |
               (g_version >= 40300 ? ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED : ZMQ_EVENT_CONNECTED);
  if (g_zmq.socket_monitor(sock_, ep, events) != 0) {
    C4D_LOG(kDebug, "zmq_socket_monitor: %s; delivery is not known", g_zmq.strerror(g_zmq.errno_()));
    return;
  }
  mon_ = g_zmq.socket(ctx_, ZMQ_PAIR);
  int linger = 0;
  if (!mon_ || g_zmq.setsockopt(mon_, ZMQ_LINGER, &linger, sizeof linger) != 0 || g_zmq.connect(mon_, ep) != 0) {
    C4D_LOG(kDebug, "monitor socket: %s; delivery is not known", g_zmq.strerror(g_zmq.errno_()));
    if (mon_) g_zmq.close(mon_);
    mon_ = nullptr;
    g_zmq.socket_monitor(sock_, nullptr, 0);
    return;
  }
  monitored_ = true;
}

bool ZmqLink::poll_events() {
  if (!mon_) return false;
  bool joined = false;
  for (;;) {
    uint8_t frame[16];  // event id (u16) + value (u32); the second frame is the endpoint
    int n = g_zmq.recv(mon_, frame, sizeof frame, ZMQ_DONTWAIT);
    if (n < 0) break;  // EAGAIN: nothing more now
    int more = 0;
    size_t len = sizeof more;
    while (g_zmq.getsockopt(mon_, ZMQ_RCVMORE, &more, &len) == 0 && more) {
      char skip[8];
      if (g_zmq.recv(mon_, skip, sizeof skip, ZMQ_DONTWAIT) < 0) break;
      len = sizeof more;
    }
    if (n < 2) continue;
    uint16_t ev = uint16_t(frame[0] | (frame[1] << 8));
    if (ev & ZMQ_EVENT_HANDSHAKE_FAILED) {
      uint32_t why = n >= 6 ? uint32_t(frame[2] | (frame[3] << 8) | (frame[4] << 16) | (uint32_t(frame[5]) << 24)) : 0;
      refused(ev, why);
    } else if (ev == ZMQ_EVENT_DISCONNECTED) {
      peer_ = false;
    } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED || ev == ZMQ_EVENT_CONNECTED) {
      joined |= !peer_;
      peer_ = ever_ = true;
    }
  }
  return joined;
}

/* The master refused our handshake: said once per process (ZeroMQ retries on its own). */
void ZmqLink::refused(uint16_t ev, uint32_t why) {
  if (told_refused_) return;
  told_refused_ = true;
  // A master that refuses a handshake mostly just hangs up (no detail, errno EPIPE/ECONNRESET):
  // the sender can't tell a wrong key from a master without CURVE; the master's counters can.
  const char* hint;
  if (why == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
    hint = "C4D_CURVE_SERVER_KEY is not this master's key";
  else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || why == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    hint = curve_ ? "C4D_CURVE_SERVER_KEY is not its key, or it runs without --curve"
                  : "it requires CURVE: set C4D_CURVE_SERVER_KEY to its public key";
  else
    hint = "see the master's log";
  C4D_LOG(kWarning, "the master at %s refused the connection (ZeroMQ event 0x%x, 0x%x): %s; %s", endpoint_, ev, why,
          hint, kDropped);
}

bool ZmqLink::send(const void* data, size_t n) {
  if (!sock_) return false;
  for (;;) {
    if (g_zmq.send(sock_, data, n, ZMQ_DONTWAIT) >= 0) return true;
    if (g_zmq.errno_() != EINTR) return false;
  }
}

void ZmqLink::close(int linger_ms) {
  if (!ctx_) return;
  if (mon_) {
    g_zmq.socket_monitor(sock_, nullptr, 0);
    g_zmq.close(mon_);
    mon_ = nullptr;
  }
  if (sock_) {
    g_zmq.setsockopt(sock_, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    g_zmq.close(sock_);
  }
  g_zmq.ctx_term(ctx_);  // waits for the socket's linger, no longer
  ctx_ = sock_ = nullptr;
}

const char* ZmqLink::library() const { return g_state.load(std::memory_order_acquire) == kLoaded ? g_path : ""; }


}  // namespace c4d
