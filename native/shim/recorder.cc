#include "recorder.h"

#include "comm_table.h"
#include "cuda_rt.h"
#include "event_pool.h"
#include "lifecycle.h"
#include "op_pool.h"
#include "real_nccl.h"
#include "shim.h"
#include "timing.h"

namespace c4d {

namespace {
// initial-exec: no __tls_get_addr call per op. libc4d.so is preloaded, or dlopened as a
// profiler plugin, where its 48 bytes fit glibc's static TLS surplus (kept for such libraries).
__attribute__((tls_model("initial-exec"))) thread_local ThreadState t_state;
std::atomic<uint64_t> g_group_counter{0};

/* The op is being captured into a CUDA graph: NCCL runs it only when the graph is
 * launched, maybe many times, and numbers none of its replays (persistent plans). */
inline bool capturing(cudaStream_t stream) {
  if (!g_cuda.streamIsCapturing) return false;
  int status = 0;
  return g_cuda.streamIsCapturing(stream, &status) == C4D_CUDA_SUCCESS && status != 0;
}
}  // namespace

ThreadState* thread_state() { return &t_state; }

/* The ready ring refused the slot (see OpPool::submit): give everything back, count. */
static OpTicket drop(OpTicket k) {
  OpSlot& s = g_ops.at(k.slot);
  if (EventPool* p = event_pool_for(s.device)) {
    p->release(s.ev_start);
    p->release(s.ev_end);
  }
  g_ops.release(k.slot);
  count(g_counters.dropped_full);
  return OpTicket{kNone, kNone, nullptr, k.stream, false};
}

/* The op's sequence number on comm c (recorder.h: collectives per comm, p2p per
 * (comm, direction, peer)); UINT64_MAX for a peer out of range or an unknown shape. */
static uint64_t take_seq(CommSlot* c, uint8_t op, uint8_t flags, int32_t peer) {
  if (!(flags & C4D_OPF_P2P)) return c->coll_seq.fetch_add(1, std::memory_order_relaxed);
  std::atomic<uint64_t>* arr = c->p2p_seq.load(std::memory_order_acquire);
  int n = c->nranks.load(std::memory_order_relaxed);
  return (arr && peer >= 0 && peer < n) ? arr[(op == C4D_OP_RECV ? n : 0) + peer].fetch_add(1, std::memory_order_relaxed)
                                        : UINT64_MAX;  // NCCL will refuse that peer, or shape unknown
}

/* Numbers the chained ops that have no seq yet, in issue order. */
static void number_group(ThreadState* t) {
  uint32_t i = t->group_head;
  for (uint32_t j = 0; j < t->group_n; ++j, i = g_ops.at(i).next) {
    if (j < t->group_numbered) continue;
    OpSlot& s = g_ops.at(i);
    s.seq = take_seq(comm_at(s.comm), s.op, s.flags, s.peer);
  }
  t->group_numbered = t->group_n;
}

OpTicket op_begin(ThreadState* t, const OpDesc& d) {
  OpTicket k{kNone, kNone, nullptr, d.stream, false};
  uint64_t issue_ns = host_stamp();  // a stamp until the agent converts it (timing.h)
  CommSlot* c = comm_lookup(d.comm);
  if (!c) {
    count(g_counters.untracked);
    return k;
  }
  if (!c->ready.load(std::memory_order_acquire)) comm_refresh(c, false);  // non-blocking init
  if (t->deferred_n) settle_deferred(t, d.comm, nullptr, false);  // the app did not poll: NCCL is asked
  if (capturing(d.stream)) {  // not numbered, not recorded; the agent says so once
    c->captured_kinds.fetch_or(1u << d.op, std::memory_order_relaxed);
    count(g_counters.captured);
    return k;
  }
  const bool grouped = t->group_depth > 0;
  const int device = c->device.load(std::memory_order_relaxed);
  EventPool* pool = grouped ? nullptr : event_pool_for(device);
  // Grouped ops take and free their slots on the shared lists (their pairs come at the
  // group's end); a thread's other ops use its lane (op_pool.h) when it has one.
  const uint8_t lane = grouped ? kNoLane : g_ops.lane_of(&t->lane);
  // Numbered first: a locked add, cheapest before this op's stores to its slot are pending.
  const uint64_t seq = grouped ? UINT64_MAX : take_seq(c, d.op, d.flags, d.peer);  // grouped: at the group's end
  uint32_t a = kNone, b = kNone;  // a kept pair that came with the slot
  uint32_t i = lane != kNoLane ? take_own_slot(lane, pool, device, &a, &b) : kNone;
  if (i == kNone) {
    i = pool ? pool->take_kept(&a, &b) : kNone;
    if (i == kNone) i = take_any_slot();
  }
  if (i == kNone) {
    // Dropped, but numbered all the same: the other ranks number this op too.
    if (grouped) {
      number_group(t);
      take_seq(c, d.op, d.flags, d.peer);
    }
    count(g_counters.dropped_full);
    return k;
  }
  OpSlot& s = g_ops.at(i);
  s.kind = kSlotOp;
  s.op = d.op;
  s.dtype = d.dtype;
  s.redop = d.redop;
  s.flags = d.flags;
  s.comm = comm_index(c);
  s.peer = d.peer;
  s.device = device;
  s.seq = seq;
  s.issue_ns = issue_ns;
  s.count = d.count;
  s.bytes = d.count * c4d_dtype_size(d.dtype);
  s.stream = reinterpret_cast<uint64_t>(d.stream);
  s.group_id = 0;
  s.ev_start = s.ev_end = kNone;
  s.late_flags = 0;
  s.lane = lane;
  s.result = ncclSuccess;
  s.return_ns = 0;
  k.slot = i;

  if (grouped) {  // chained; numbered, given events and handed over at the outermost ncclGroupEnd
    s.group_id = t->group_id;
    s.flags |= C4D_OPF_IN_GROUP;
    s.next = kNone;
    if (t->group_n++)
      g_ops.at(t->group_tail).next = i;
    else
      t->group_head = i;
    t->group_tail = i;
    k.grouped = true;
    return k;
  }
  if (EventPool* p = pool) {
    if (a == kNone && !p->take_pair(&a, &b)) {
      s.flags |= C4D_OPF_NO_EVENT;
      count(g_counters.no_event);
    } else if (g_cuda.eventRecord(p->event(a), d.stream) != C4D_CUDA_SUCCESS) {
      p->release(a);
      p->release(b);
      s.flags |= C4D_OPF_EVENT_ERROR;
      count(g_counters.event_errors);
    } else {
      s.ev_start = a;
      s.ev_end = b;
      k.ev_end = b;
      k.pool = p;
    }
  }
  s.state.store(kLaunched, std::memory_order_relaxed);
  if (!g_ops.submit(i, lane)) return drop(k);
  return k;
}

void op_end(const OpTicket& k, ncclResult_t r) {
  if (k.slot == kNone) return;
  OpSlot& s = g_ops.at(k.slot);
  if (k.grouped) {
    s.result = r;  // still the issuing thread's: handed over at the group's end
    return;
  }
  if (k.ev_end != kNone) {
    auto* p = static_cast<EventPool*>(k.pool);
    if (g_cuda.eventRecord(p->event(k.ev_end), k.stream) != C4D_CUDA_SUCCESS) {
      s.late_flags |= C4D_OPF_EVENT_ERROR;  // the agent must not query a never-recorded event
      count(g_counters.event_errors);
    }
  }
  s.return_ns = host_stamp();
  s.result = r;
  s.state.store(kReturned, std::memory_order_release);
}

/* Appends a submitted slot to the thread's deferred list (its `next` is the issuing
 * thread's until kReturned: the agent never touches it). */
static void defer(ThreadState* t, uint32_t i) {
  g_ops.at(i).next = kNone;
  if (t->deferred_n++)
    g_ops.at(t->deferred_tail).next = i;
  else
    t->deferred_head = i;
  t->deferred_tail = i;
}

void op_deferred(ThreadState* t, const OpTicket& k) {
  if (k.slot == kNone) return;
  OpSlot& s = g_ops.at(k.slot);
  s.return_ns = host_stamp();
  s.result = ncclInProgress;
  defer(t, k.slot);
}

void settle_deferred(ThreadState* t, ncclComm_t comm, const ncclResult_t* ae_in, bool last) {
  if (!t->deferred_n) return;
  CommSlot* c = comm_lookup(comm);
  if (!c) return;
  const uint32_t ci = comm_index(c);
  // The groups of this comm's deferred ops: NCCL launches a group in one job, so all of its
  // comms settle together (src/group.cc groupLaunch sets every comm's async error at its end).
  constexpr uint32_t kGroups = 16;
  uint64_t groups[kGroups];
  uint32_t ng = 0;
  bool mine = false, many = false;
  for (uint32_t j = 0, i = t->deferred_head; j < t->deferred_n; ++j, i = g_ops.at(i).next) {
    const OpSlot& s = g_ops.at(i);
    if (s.comm != ci) continue;
    mine = true;
    if (!s.group_id) continue;
    uint32_t q = 0;
    while (q < ng && groups[q] != s.group_id) ++q;
    if (q == ng && ng < kGroups) groups[ng++] = s.group_id;
    many = many || q == kGroups;
  }
  if (!mine) return;
  ncclResult_t ae = ncclInProgress;
  if (ae_in) ae = *ae_in;
  else if (real_comm_get_async_error(comm, &ae) != ncclSuccess) ae = ncclInProgress;  // no answer: not yet
  if (ae == ncclInProgress && !last) return;
  const bool launched = ae != ncclInProgress;
  struct Recorded {
    EventPool* pool;
    uint32_t ev;
  } rec[kGroupStreams];
  uint32_t nr = 0;
  uint32_t prev = kNone, n = t->deferred_n;
  for (uint32_t j = 0, i = t->deferred_head; j < n; ++j) {
    OpSlot& s = g_ops.at(i);
    uint32_t next = s.next;  // read before the slot may go back to the pool
    bool hit = s.comm == ci;
    for (uint32_t q = 0; !hit && s.group_id && q < ng; ++q) hit = groups[q] == s.group_id;
    hit = hit || (many && s.group_id);
    if (!hit) {
      prev = i;
      i = next;
      continue;
    }
    if (prev == kNone) t->deferred_head = next;
    else g_ops.at(prev).next = next;
    if (i == t->deferred_tail) t->deferred_tail = prev;
    --t->deferred_n;
    EventPool* p = event_pool_for(s.device);
    if (s.ev_end != kNone && p && launched) {
      uint32_t q = 0;
      while (q < nr && !(rec[q].pool == p && rec[q].ev == s.ev_end)) ++q;
      if (q == nr) {  // an event shared by a group's ops is recorded once
        if (g_cuda.eventRecord(p->event(s.ev_end), reinterpret_cast<cudaStream_t>(s.stream)) != C4D_CUDA_SUCCESS) {
          s.late_flags |= C4D_OPF_EVENT_ERROR;
          count(g_counters.event_errors);
        } else if (nr < kGroupStreams) {
          rec[nr++] = Recorded{p, s.ev_end};
        }
      }
    } else if (s.ev_end != kNone) {  // the comm goes away still launching: host times only
      if (p) p->release(s.ev_end);
      s.ev_end = kNone;
      s.late_flags |= C4D_OPF_NO_EVENT;
    }
    if (s.result == ncclInProgress) s.result = ae;
    s.state.store(kReturned, std::memory_order_release);
    i = next;
  }
}

void group_started(ThreadState* t) {
  if (t->group_depth++ == 0) {
    t->group_id = g_group_counter.fetch_add(1, std::memory_order_relaxed) + 1;
    t->group_n = t->group_numbered = 0;
  }
}

ncclResult_t group_end(ThreadState* t, ncclResult_t (*real)()) {
  if (t->group_depth == 0) return real();  // unbalanced: NCCL reports it
  if (--t->group_depth > 0) return real();
  if (t->group_n == 0) return real();
  number_group(t);
  const uint32_t n = t->group_n, head = t->group_head;
  t->group_n = t->group_numbered = 0;

  // One (start, end) event pair per distinct stream of the group, shared by its ops.
  struct Pair {
    cudaStream_t stream;
    EventPool* pool;
    uint32_t a, b, refs;
    bool error;
  };
  Pair pairs[kGroupStreams];
  uint32_t np = 0;
  for (uint32_t j = 0, i = head; j < n; ++j, i = g_ops.at(i).next) {
    OpSlot& s = g_ops.at(i);
    s.pair = kNone;
    EventPool* p = event_pool_for(s.device);
    if (!p) continue;
    auto stream = reinterpret_cast<cudaStream_t>(s.stream);
    uint32_t q = 0;
    while (q < np && !(pairs[q].stream == stream && pairs[q].pool == p)) ++q;
    if (q == np) {
      if (np == kGroupStreams) {  // more streams in one group than we keep events for
        s.late_flags |= C4D_OPF_NO_EVENT;
        count(g_counters.no_event);
        continue;
      }
      Pair& pr = pairs[np++];
      pr = Pair{stream, p, kNone, kNone, 0, false};
      if (!p->take_pair(&pr.a, &pr.b)) {
        pr.a = pr.b = kNone;
        count(g_counters.no_event);
      } else if (g_cuda.eventRecord(p->event(pr.a), stream) != C4D_CUDA_SUCCESS) {
        p->release(pr.a);
        p->release(pr.b);
        pr.a = pr.b = kNone;
        pr.error = true;
        count(g_counters.event_errors);
      }
    }
    s.pair = q;
    if (pairs[q].a != kNone) ++pairs[q].refs;
  }
  for (uint32_t q = 0; q < np; ++q)
    if (pairs[q].a != kNone) {
      pairs[q].pool->set_refs(pairs[q].a, pairs[q].refs);
      pairs[q].pool->set_refs(pairs[q].b, pairs[q].refs);
    }
  // Hand the group over before NCCL launches it: a launch that blocks is still seen.
  const uint8_t lane = g_ops.lane_of(&t->lane);
  uint32_t first = kNone, last = kNone;  // submitted slots, still chained, for the walk after the call
  for (uint32_t j = 0, i = head; j < n; ++j) {
    OpSlot& s = g_ops.at(i);
    uint32_t next = s.next;
    if (s.pair != kNone) {
      const Pair& pr = pairs[s.pair];
      s.ev_start = pr.a;
      s.ev_end = pr.b;
      if (pr.a == kNone) s.late_flags |= pr.error ? C4D_OPF_EVENT_ERROR : C4D_OPF_NO_EVENT;
    }
    s.state.store(kLaunched, std::memory_order_relaxed);
    if (g_ops.submit(i, lane)) {  // release: the agent sees the fields above
      if (first == kNone) first = i;
      last = i;
    } else {
      drop(OpTicket{i, kNone, nullptr, nullptr, true});  // back in the pool: unlinked from the walk below
      if (last != kNone) g_ops.at(last).next = next;
    }
    i = next;
  }

  ncclResult_t r = real();

  if (r == ncclInProgress) {  // nonblocking: launched later by NCCL; end events once it settles
    uint64_t now = host_stamp();
    for (uint32_t i = first; i != kNone;) {
      OpSlot& s = g_ops.at(i);
      uint32_t next = i == last ? kNone : s.next;
      s.return_ns = now;
      if (s.result == ncclSuccess) s.result = r;
      defer(t, i);
      i = next;
    }
    return r;
  }
  for (uint32_t q = 0; q < np; ++q) {
    Pair& pr = pairs[q];
    if (pr.b != kNone && g_cuda.eventRecord(pr.pool->event(pr.b), pr.stream) != C4D_CUDA_SUCCESS) {
      pr.error = true;
      count(g_counters.event_errors);
    }
  }
  uint64_t now = host_stamp();
  for (uint32_t i = first; i != kNone;) {
    OpSlot& s = g_ops.at(i);
    uint32_t next = i == last ? kNone : s.next;  // read before the slot may go back to the pool
    if (s.pair != kNone && pairs[s.pair].error) s.late_flags |= C4D_OPF_EVENT_ERROR;
    s.return_ns = now;  // grouped ops are launched by the outermost ncclGroupEnd
    if (s.result == ncclSuccess) s.result = r;
    s.state.store(kReturned, std::memory_order_release);
    i = next;
  }
  return r;
}

ncclResult_t group_simulate_end(ThreadState* t, ncclResult_t (*real)(ncclSimInfo_t*), ncclSimInfo_t* info) {
  if (t->group_depth == 0) return real(info);  // unbalanced: NCCL reports it
  if (--t->group_depth > 0) return real(info);
  ncclResult_t r = real(info);
  // NCCL ends the group without launching (or numbering) anything: forget its ops.
  const uint32_t n = t->group_n;
  for (uint32_t j = 0, i = t->group_head; j < n; ++j) {
    uint32_t next = g_ops.at(i).next;
    g_ops.release(i);  // never submitted: the agent never saw it
    i = next;
  }
  t->group_n = t->group_numbered = 0;
  count(g_counters.simulated, n);
  return r;
}

void recorder_reset_after_fork() {
  t_state.group_depth = 0;
  t_state.group_n = t_state.group_numbered = 0;
  t_state.deferred_n = 0;
  t_state.lane = 0;  // OpPool::reset freed every lane
}

}  // namespace c4d
