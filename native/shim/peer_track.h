/*
 * State shared by the profiler callbacks (profiler.cc, NCCL's threads) and the agent
 * (peer.cc): contexts, and three fixed pools of event entries whose indices circulate
 * through lock-free rings (queue.h). See profiler.h for the picture.
 *
 * Ownership, per entry kind:
 *   ProfCtx  one per init, never reused (at most kMaxProfCtx per process). Identity is
 *            written before the context pointer is handed to NCCL; `slot`/`how` are the
 *            agent's alone.
 *   Task     a Coll or P2p event. refs: 1 for the event until the agent retires it, +1 per
 *            Xfer made under it until the agent recycles that Xfer; the last unref frees
 *            it. NCCL stops a task on the launching thread before the proxy thread starts
 *            its ProxyOps (enqueue.cc hostStreamPlanTask, proxy.cc), so the stopEvent only
 *            queues the task on `stopped`; the agent retires it kTaskKeepNs later, or
 *            sooner, oldest first, when more than half the pool waits there.
 *   Xfer     one (task, peer, direction). `state` packs gen (16 bits) | DONE | open
 *            ProxyOps (15 bits): a ProxyOp joins with a CAS that fails on another gen or
 *            on DONE, so a stale reference can never join a recycled entry. The last
 *            ProxyOp stop sets DONE and pushes it on the completion ring; only the agent
 *            recycles it (gen + 1). Identity is written before `live` (release).
 *   Step     a ProxyStep; names its Xfer by (index, gen). Freed at its stopEvent, or by the
 *            agent once its Xfer was abandoned (an aborted comm never stops its steps);
 *            `used` (CAS 1 -> 0) makes sure only one of the two frees it.
 */
#ifndef C4D_SHIM_PEER_TRACK_H
#define C4D_SHIM_PEER_TRACK_H

#include <stdint.h>

#include <atomic>

#include "comm_table.h"
#include "queue.h"

namespace c4d {

constexpr uint32_t kMaxProfCtx = kMaxComms;
constexpr uint32_t kTaskXfers = 8;  // (peer, direction) pairs merged per task; more stay unmerged
constexpr uint32_t kStepsPerXfer = 8;  // step entries per tracked transfer (NCCL keeps <= 8 in flight per channel)

constexpr uint8_t kCollKinds = 8;   // enum c4d_op_kind values below C4D_OP_SEND are collectives
constexpr uint64_t kTaskKeepNs = 2000000000ull;  // a stopped task stays joinable this long

/* ProfCtx.how */
enum CtxMatch : uint8_t { kCtxUnresolved = 0, kCtxById = 1, kCtxByShape = 2 };

/* ProfCtx.sem: what the Coll seqNumber counts (profiler.h). */
enum SeqSem : uint8_t { kSemUnknown = 0, kSemPerComm = 1, kSemPerFunc = 2 };

struct ProfCtx {
  uint32_t index;
  int32_t nranks, rank, nnodes;
  uint64_t comm_id;                // as init got it
  std::atomic<uint32_t>* p2p_ord;  // [2 * nranks]: next P2p ordinal, send to p at [p], recv at [nranks + p]
  std::atomic<bool> finalized;
  std::atomic<uint8_t> first_kind;  // kind of the first Coll event (255 none yet)
  std::atomic<uint8_t> sem;         // SeqSem, decided by the first Coll of another kind
  std::atomic<uint64_t> colls;      // Coll events seen (release: after the hook numbered the op)
  /* agent only */
  uint32_t slot;     // comm slot index, valid when how != kCtxUnresolved
  uint8_t how;       // CtxMatch
  uint32_t tries;    // 1 + comm_count() at the last failed resolution (retried when comms appear)
};

struct Task {
  std::atomic<uint32_t> refs;
  std::atomic<uint8_t> stopped;  // its stopEvent came (queued once on PeerTrack::stopped)
  uint64_t stop_ns;              // monotonic time of that stopEvent (published by the ring push)
  uint32_t ctx;
  uint64_t key;  // collective: seqNumber; p2p: ordinal on (comm, direction, peer)
  uint8_t op;    // enum c4d_op_kind, 255 unknown
  uint8_t p2p;
  std::atomic<uint64_t> xf[kTaskXfers];  // XferRef packed, 0 empty
};

constexpr uint32_t kXferDone = 1u << 15;
constexpr uint32_t kXferOpenMask = kXferDone - 1;

struct Xfer {
  std::atomic<uint32_t> state;  // gen << 16 | DONE | open
  std::atomic<uint8_t> live;    // identity valid, tracked (agent scans these)
  /* identity: written by the creator before `live`, read-only until recycled */
  uint8_t op, p2p, dir;  // dir 0 send, 1 recv
  int32_t peer;
  uint32_t ctx;
  uint32_t task;
  uint64_t key;
  /* progress: any callback thread writes, the agent reads */
  std::atomic<uint32_t> steps_total, steps_done;
  std::atomic<uint8_t> pstate;  // last ProxyStep state
  std::atomic<uint64_t> bytes_done, first_ns, last_ns;
  std::atomic<uint64_t> wire_ns;  // sum over its send steps of SendWait -> step stop (profiler.cc)
};

struct Step {
  std::atomic<uint8_t> used;   // taken and not yet stopped (or reclaimed: see peer_heartbeat)
  uint32_t xfer, gen;
  std::atomic<uint64_t> size;     // transSize of the latest state record
  std::atomic<uint64_t> send_at;  // when it entered SendWait (0: not yet, or a receive)
};

/* A lock-free pool of T: entries [0, n), free indices in a FIFO ring. */
template <typename T>
struct Pool {
  T* items = nullptr;
  uint32_t n = 0;
  IndexRing free;

  bool init(uint32_t count);
  void reset();
  uint32_t take() {
    uint32_t i;
    return free.pop(&i) ? i : kNone;
  }
  void give(uint32_t i);
  /* Index of a handle NCCL gave back, or kNone when it is not one of ours. */
  uint32_t index_of(const void* p) const {
    const char* b = reinterpret_cast<const char*>(items);
    const char* q = static_cast<const char*>(p);
    if (!items || q < b || q >= b + sizeof(T) * n) return kNone;
    size_t off = size_t(q - b);
    return off % sizeof(T) ? kNone : uint32_t(off / sizeof(T));
  }
};

struct PeerTrack {
  std::atomic<bool> ready;         // pools allocated (release after init)
  std::atomic<uint32_t> n_ctx;     // contexts handed out
  ProfCtx ctx[kMaxProfCtx];
  Pool<Task> tasks;
  Pool<Xfer> xfers;
  Pool<Step> steps;
  IndexRing done;                  // DONE xfers for the agent (single consumer)
  IndexRing stopped;               // stopped tasks for the agent to retire (single consumer)
  uint32_t n_xfers;                // pool size (C4D_PEER_TRACK)
  /* counters (relaxed) */
  std::atomic<uint64_t> tracked;   // transfers tracked
  std::atomic<uint64_t> untracked; // events not tracked: a pool empty, no parent, other process (PXN)
  std::atomic<uint64_t> records;   // PEER records emitted (agent)
};

extern PeerTrack g_peer;

/* XferRef: which Xfer a task merged (peer, direction) into. 0 = empty. */
inline uint64_t xref_pack(uint32_t xfer, uint32_t gen, int32_t peer, uint8_t dir) {
  return (uint64_t(xfer) & 0xffffff) | (uint64_t(gen & 0xffff) << 24) | ((uint64_t(uint32_t(peer)) & 0x3fffff) << 40) |
         (uint64_t(dir & 1) << 62) | (1ull << 63);
}
inline uint32_t xref_xfer(uint64_t r) { return uint32_t(r & 0xffffff); }
inline uint32_t xref_gen(uint64_t r) { return uint32_t((r >> 24) & 0xffff); }
inline bool xref_is(uint64_t r, int32_t peer, uint8_t dir) {
  return (r >> 63) && ((r >> 40) & 0x3fffff) == (uint64_t(uint32_t(peer)) & 0x3fffff) && ((r >> 62) & 1) == dir;
}

/* Any thread: drops one task reference; the last frees it. */
void task_unref(uint32_t t);

/* Agent: returns a DONE (or abandoned) xfer to the pool and unrefs its task. */
void xfer_recycle(uint32_t x);

/* Agent, every loop: drops the event reference of stopped tasks that are old enough. */
void task_retire(uint64_t now_ns);

/* Agent, every heartbeat: collectives the profiler saw and no hook did (NCCL called past
 * the preload), said once. */
void peer_blind_spots();

/* Fork child: the agent's side forgets its maps (peer.cc). */
void peer_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_PEER_TRACK_H
