/*
 * The PUSH socket to the master, over a libzmq loaded at run time (dlopen, RTLD_LOCAL),
 * so `pip install c4d` is enough: no system libzmq, no symbol clash with an application
 * that brings its own. Search order: $C4D_LIBZMQ; pyzmq's bundled copy found relative
 * to this library (site-packages/c4d/_native/libc4d.so → site-packages/pyzmq.libs/
 * libzmq-*.so*); libzmq.so.5; for a source-tree build, the libzmq of the pyzmq that CMake
 * saw. Not found → logged once; every batch is dropped and counted.
 *
 * Delivery: ZeroMQ takes a message into its queue whether or not a master is there, so
 * "handed to ZeroMQ" is not "delivered". A socket monitor (zmq_socket_monitor over inproc)
 * tells whether a peer completed the ZMTP handshake (CONNECTED on libzmq < 4.3) and is still
 * connected; the agent counts as delivered what it queued while a peer was connected, and
 * what was queued before a peer connected (ZeroMQ sends its queue in order on connect).
 *
 * Security (docs/reliability.md): with the master's CURVE public key (C4D_CURVE_SERVER_KEY)
 * the socket authenticates the master and encrypts, with a client key pair made for this
 * process (zmq_curve_keypair); a libzmq without CURVE sends nothing rather than plain text.
 * The job id travels in the ZMTP handshake as the connection property "X-C4D-Job"
 * (ZMQ_METADATA, libzmq >= 4.3), so the master ties every message to one job.
 *
 * Agent thread only (ZeroMQ sockets are not thread-safe).
 */
#ifndef C4D_SHIM_ZMQ_LINK_H
#define C4D_SHIM_ZMQ_LINK_H

#include <stddef.h>
#include <stdint.h>

namespace c4d {

class ZmqLink {
 public:
  /* Loads libzmq (first call only; logged once when not found). Called on the
   * application thread at activation, never on the agent: a fork() racing a dlopen in
   * another thread leaves the child's loader state inconsistent. */
  static bool load(const char* libzmq_override);
  /* Connects a PUSH socket over the loaded libzmq; CURVE when `curve_server_key` (Z85) is
   * not empty; the job id (may be empty) as the "X-C4D-Job" property. False when it can't
   * (logged): send() then fails. */
  bool open(const char* endpoint, int send_hwm, const char* curve_server_key = "", const char* job = "");
  /* Non-blocking send of one message. True when ZeroMQ took it; false on EAGAIN (high
   * water mark reached: the master is slow or absent) or when no socket exists. */
  bool send(const void* data, size_t n);
  /* Closes the socket, letting queued messages go for at most linger_ms, and
   * terminates the context (blocks at most ~linger_ms). */
  void close(int linger_ms);
  /* Fork child: forget the parent's context without touching it. */
  void forget() {
    ctx_ = sock_ = mon_ = nullptr;
    peer_ = ever_ = monitored_ = curve_ = told_refused_ = false;
  }
  bool connected() const { return sock_ != nullptr; }
  /* Reads the monitor's events (non-blocking). True when a peer connected since the last
   * call. No monitor (an old libzmq): never true, and monitored() is false. */
  bool poll_events();
  bool peer_connected() const { return peer_; }
  bool ever_connected() const { return ever_; }
  bool monitored() const { return monitored_; }  // stays true after close()
  /* Path of the loaded libzmq ("" when none). */
  const char* library() const;

 private:
  void open_monitor();
  bool secure(const char* curve_server_key, const char* job);
  void refused(uint16_t ev, uint32_t why);
  void* ctx_ = nullptr;
  void* sock_ = nullptr;
  void* mon_ = nullptr;  // PAIR socket receiving sock_'s monitor events
  bool peer_ = false, ever_ = false, monitored_ = false;
  bool curve_ = false, told_refused_ = false;
  char endpoint_[256] = "";
};

}  // namespace c4d

#endif  // C4D_SHIM_ZMQ_LINK_H
