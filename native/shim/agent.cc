/*
 * The agent thread, and how it meets the hot path.
 *
 *  application thread (any thread calling NCCL)          agent thread "c4d-agent" (one per process)
 *  ────────────────────────────────────────────          ─────────────────────────────────────────────
 *  ncclAllReduce(...)                    hooks.cc         started at the first communicator init
 *   1 original looked up once (dlsym RTLD_NEXT)           ZeroMQ PUSH → C4D_MASTER_ADDR; REGISTER first
 *   2 recording? mode == kActive, outermost (TLS guard)   loop (every 5 ms while ops are in flight, 50 ms idle):
 *   3 op_begin                        recorder.cc          a drain the ready rings → pending list (FIFO);
 *       clock_gettime(REALTIME)          (vDSO)               COMM entries become COMM records at once
 *       comm slot, seq      comm_table.cc (lock-free)      b timing_tick: an anchor event per device ~1/s
 *       op slot + 2 events ← the thread's lane (op_pool.h: c poll pending ops with cudaEventQuery:
 *         freed by the agent, else a stash; plain stores)     start fired → arrived; RETURNED and end
 *       cudaEventRecord(start); lane's ready ring ← slot        fired → done → c4d_op_record into the batch;
 *         (no lane: shared free lists, Vyukov MPMC ring)        the slot back to its thread's lane
 *   4 real ncclAllReduce                                   c' profiler transfers done → PEER records (profiler.h)
 *                                                          c" hang timeout set by the code → STAGE (run_support.h)
 *   5 op_end: cudaEventRecord(end); return time,           d every C4D_HEARTBEAT_MS: a process heartbeat and
 *     result; state = RETURNED (release)                      one per live comm (REGISTER, COMM, STAGE every 10th),
 *                                                            one PEER record per profiler transfer in flight
 *                                                          e batch of ≤ 512 records or ≤ 50 ms old →
 *                                                            zmq_send(DONTWAIT); EAGAIN → dropped, counted
 *   grouped ops: slot handed over at the call; events     at exit (atexit): drain, FINAL heartbeat, flush for
 *   at the outermost ncclGroupEnd (recorder.cc)            ≤ C4D_EXIT_FLUSH_MS, stop; never hangs the exit
 *
 * Shared between the two sides: op slots (released to the agent by the ring, fields
 * after submit published by `state`), event reference counts, comm slot counters. The
 * agent holds no lock the hot path takes. Memory is fixed at start: op slots
 * (C4D_QUEUE_CAPACITY) and kLanes thread lanes (2 MiB at the default capacity), events
 * (C4D_EVENT_POOL per device), one batch buffer; the profiler plugin's pools
 * (C4D_PEER_TRACK) at its first init.
 */
#include "agent.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c4d/record.h"
#include "comm_table.h"
#include "cuda_rt.h"
#include "event_pool.h"
#include "log.h"
#include "op_pool.h"
#include "profiler.h"
#include "real_nccl.h"
#include "run_support.h"
#include "shim.h"
#include "timing.h"
#include "zmq_link.h"

#ifndef C4D_GIT_REV
#define C4D_GIT_REV 0
#endif

namespace c4d {

namespace {

constexpr uint32_t kBatchMax = 255;                 // records per ZeroMQ message (the master takes 32 KiB)
constexpr uint64_t kBatchMaxAgeNs = 50000000ull;    // or when the oldest waits 50 ms
static_assert(sizeof(c4d_batch_header) + kBatchMax * C4D_RECORD_SIZE <= (32u << 10),
              "a batch is at most what the master takes (c4d/master/collector.py MAX_MESSAGE_BYTES)");
constexpr uint64_t kPollBusyNs = 5000000ull;        // ops in flight: poll events every 5 ms (event
                                                    // times do not depend on it; CPU does)
constexpr uint64_t kPollIdleNs = 50000000ull;       // nothing in flight (= the batch age limit)
constexpr uint32_t kRegisterEvery = 10;             // heartbeats between REGISTER repeats
constexpr uint32_t kReservoir = 256;                // duration samples kept per (comm, op) for stats
constexpr uint64_t kConnectGraceNs = 3000000000ull;  // no master connected by then: say so once

struct OpStats {
  uint64_t n, sum_ns, bytes;
  float sample_us[kReservoir];  // reservoir sample for the median
};

/* Agent-only view of one communicator. */
struct CommProgress {
  uint64_t arrived_mark;    // 1 + highest collective seq whose start fired
  uint64_t done_mark;       // 1 + highest collective seq done
  uint64_t last_arrive_ns;  // device start (else issue time) of the latest arrived collective
  uint64_t last_done_ns;    // device end (else return time) of the latest done collective
  uint32_t pend;            // heartbeat scratch: oldest pending op slot (kNone)
  uint32_t p2p_in_flight;   // heartbeat scratch
  OpStats* stats;           // [C4D_OP_COUNT], C4D_ENABLE_STATS_OUTPUT only
};

struct Agent {
  bool running;           // app side: started and not shut down
  pthread_t thread;
  pthread_mutex_t mu;     // stop/finished hand-shake with the exiting thread only
  pthread_cond_t cv;
  bool stop, finished;
  ZmqLink link;
  uint32_t* pending;      // op slots in flight, submission order
  uint32_t n_pending;
  uint32_t n_batch;
  uint64_t batch_first_mono;
  uint32_t hb_count;
  uint64_t ops_seen, ops_arrived, ops_done;
  uint64_t rng;
  uint64_t delivered;     // records queued while a master was connected, or before one connected
  uint64_t unconfirmed;   // records queued since no master is connected
  uint64_t started_mono;
  bool told_no_master;
  c4d_register_record reg;
  alignas(16) uint8_t batch[sizeof(c4d_batch_header) + kBatchMax * C4D_RECORD_SIZE];
  CommProgress progress[kMaxComms];
};

Agent g_agent;  // trivially destructible: nothing runs at exit behind our back

/* ---------------------------------------------------------------- sending */

/* Delivery bookkeeping (zmq_link.h): `queued` records were just handed to ZeroMQ. */
void note_link(uint32_t queued) {
  Agent& a = g_agent;
  if (a.link.poll_events()) {  // a master connected: ZeroMQ sends it what waited in the queue
    a.delivered += a.unconfirmed;
    a.unconfirmed = 0;
  }
  if (a.link.peer_connected())
    a.delivered += queued;
  else
    a.unconfirmed += queued;
}

void flush() {
  Agent& a = g_agent;
  if (!a.n_batch) return;
  c4d_batch_header h{C4D_BATCH_MAGIC, C4D_SCHEMA_VERSION, C4D_RECORD_SIZE, a.n_batch, g_cfg.rank};
  memcpy(a.batch, &h, sizeof h);
  size_t n = sizeof h + size_t(a.n_batch) * C4D_RECORD_SIZE;
  if (!a.link.connected())
    count(g_counters.dropped_nolink, a.n_batch);
  else if (a.link.send(a.batch, n)) {
    count(g_counters.sent, a.n_batch);
    note_link(a.n_batch);
  } else
    count(g_counters.dropped_send, a.n_batch);
  a.n_batch = 0;
}

void append(const void* rec) {
  Agent& a = g_agent;
  if (a.n_batch == 0) a.batch_first_mono = mono_now_ns();
  memcpy(a.batch + sizeof(c4d_batch_header) + size_t(a.n_batch) * C4D_RECORD_SIZE, rec, C4D_RECORD_SIZE);
  if (++a.n_batch >= kBatchMax) flush();
}

void header(c4d_record_header* h, uint16_t kind, uint64_t time_ns) {
  h->kind = kind;
  h->version = C4D_SCHEMA_VERSION;
  h->rank = g_cfg.rank;
  h->time_ns = time_ns;
}

/* ---------------------------------------------------------------- records */

void build_register(int device) {
  c4d_register_record& r = g_agent.reg;
  memset(&r, 0, sizeof r);
  r.hang_timeout_us = g_cfg.hang_timeout_us;
  r.pid = getpid();
  r.world_size = g_cfg.world_size;
  r.local_rank = g_cfg.local_rank;
  r.cuda_device = device;
  r.nccl_version = real_nccl_version();
  r.hang_times = g_cfg.hang_times;
  r.bw_check_period_s = g_cfg.bw_check_period_s;
  r.heartbeat_ms = g_cfg.heartbeat_ms;
  r.build_rev = uint32_t(C4D_GIT_REV);
  r.log_level = uint8_t(g_cfg.log_level);
  r.stats_output = g_cfg.stats_output;
  r.device_timing = g_cuda.ok;
  memcpy(r.node, g_cfg.node, sizeof r.node);
  memcpy(r.job, g_cfg.job, sizeof r.job);
}

void send_register() {
  header(&g_agent.reg.h, C4D_REC_REGISTER, host_now_ns());
  append(&g_agent.reg);
}

void comm_record(uint8_t event, int32_t result, uint64_t id, uint64_t parent, uint64_t handle, int32_t rank,
                 int32_t nranks, int32_t color, int32_t key, int32_t device, uint64_t time_ns) {
  c4d_comm_record r;
  memset(&r, 0, sizeof r);
  header(&r.h, C4D_REC_COMM, time_ns);
  r.comm_id = id;
  r.parent_id = parent;
  r.handle = handle;
  r.comm_rank = rank;
  r.comm_nranks = nranks;
  r.color = color;
  r.key = key;
  r.device = device;
  r.result = result;
  r.event = event;
  append(&r);
}

/* A lifecycle entry from lifecycle.cc (field reuse documented in op_pool.h). */
void comm_entry(const OpSlot& o) {
  comm_record(o.op, o.result, o.seq, o.count, o.stream, int32_t(o.bytes >> 32), int32_t(uint32_t(o.bytes)),
              o.peer, int32_t(int64_t(o.group_id)), o.device, o.issue_ns);
}

/* Every live comm again, as its creation event (a master that (re)started late learns them). */
void comm_snapshots() {
  uint64_t now = host_now_ns();
  for (uint32_t c = 0, n = comm_count(); c < n; ++c) {
    const CommSlot* s = comm_at(c);
    if (!s->live.load(std::memory_order_acquire)) continue;
    comm_record(s->init_event, ncclSuccess, s->id, s->parent_id, reinterpret_cast<uint64_t>(s->handle),
                s->rank.load(std::memory_order_relaxed), s->nranks.load(std::memory_order_relaxed), s->color,
                s->key, s->device.load(std::memory_order_relaxed), now);
  }
}

void fill_pending(c4d_heartbeat_record& h, uint32_t i) {
  if (i == kNone) {
    h.pend_seq = UINT64_MAX;
    h.pend_peer = -1;
    h.pend_op = 255;
    h.pend_dtype = 255;
    h.pend_redop = 255;
    return;
  }
  const OpSlot& s = g_ops.at(i);
  h.pend_seq = s.seq;
  h.pend_issue_ns = s.issue_ns;
  const AgentOp& x = g_ops.agent_of(s);
  h.pend_start_ns = x.arrived ? (x.start_ns ? x.start_ns : s.issue_ns) : 0;
  h.pend_peer = s.peer;
  h.pend_op = s.op;
  h.pend_flags = s.flags;
  h.pend_count = s.count;  // what the members of one op must agree on (c4d/engine/consistency.py)
  h.pend_dtype = s.dtype;
  h.pend_redop = s.redop;
}

uint8_t saturate8(uint32_t v) { return v > 255u ? uint8_t(255) : uint8_t(v); }
uint32_t saturate32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : uint32_t(v); }

/* What the shim cannot see, said once per process when it first happens (never on the
 * application's threads). */
void blind_spots() {
  struct Spot {
    std::atomic<uint64_t>* counter;
    bool said;
    const char* what;
  };
  static Spot spots[] = {
      {&g_counters.captured, false,
       "NCCL ops issued on a capturing stream go into a CUDA graph: neither they nor the graph's replays are "
       "timed or checked for hangs (blind spot; counted in the exit summary)"},
      {&g_counters.grown, false,
       "ncclCommGrow: communicators made by growing are not tracked (their ranks share no id to name them by); "
       "their ops pass through unrecorded (blind spot)"},
      {&g_counters.one_sided, false,
       "ncclPutSignal/ncclSignal/ncclWaitSignal (one-sided RMA) are passed through untimed: a wait that never ends "
       "shows as this rank's next collective not arriving (blind spot)"},
  };
  for (Spot& s : spots)
    if (!s.said && s.counter->load(std::memory_order_relaxed)) {
      s.said = true;
      C4D_LOG(kWarning, "%s", s.what);
    }
  peer_blind_spots();
}

bool drain();  // (below) profiler.h's OpsCatchUp

void heartbeats(uint16_t hb_flags) {
  Agent& a = g_agent;
  blind_spots();
  if (a.hb_count > 0 && a.hb_count % kRegisterEvery == 0) {
    send_register();
    comm_snapshots();
    stage_repeat(append);
  }
  ++a.hb_count;
  uint32_t nc = comm_count();
  for (uint32_t c = 0; c < nc; ++c) {
    a.progress[c].pend = kNone;
    a.progress[c].p2p_in_flight = 0;
  }
  uint32_t oldest = a.n_pending ? a.pending[0] : kNone;
  for (uint32_t r = 0; r < a.n_pending; ++r) {
    const OpSlot& s = g_ops.at(a.pending[r]);
    CommProgress& p = a.progress[s.comm];
    if (p.pend == kNone) p.pend = a.pending[r];
    if (s.flags & C4D_OPF_P2P) ++p.p2p_in_flight;
  }
  uint64_t now = host_now_ns();
  uint64_t dropped = dropped_total(), sent = g_counters.sent.load(std::memory_order_relaxed);

  c4d_heartbeat_record h;
  memset(&h, 0, sizeof h);
  header(&h.h, C4D_REC_HEARTBEAT, now);
  h.comm_id = 0;  // the process: counts are ops (collective and p2p) seen by the agent
  h.n_issued = a.ops_seen;
  h.n_arrived = a.ops_arrived;
  h.n_done = a.ops_done;
  h.dropped = saturate32(dropped);
  h.sent = sent;
  h.comm_rank = g_cfg.rank;
  h.comm_nranks = g_cfg.world_size;
  h.device = int16_t(a.reg.cuda_device);
  h.hb_flags = uint8_t(hb_flags);
  fill_pending(h, oldest);
  uint32_t p2p = 0;
  for (uint32_t c = 0; c < nc; ++c) p2p += a.progress[c].p2p_in_flight;
  h.p2p_in_flight = saturate8(p2p);
  append(&h);

  for (uint32_t c = 0; c < nc; ++c) {
    const CommSlot* s = comm_at(c);
    if (!s->live.load(std::memory_order_acquire)) continue;
    const CommProgress& p = a.progress[c];
    memset(&h, 0, sizeof h);
    header(&h.h, C4D_REC_HEARTBEAT, now);
    h.comm_id = s->id;
    h.n_issued = s->coll_seq.load(std::memory_order_relaxed);
    h.n_arrived = p.arrived_mark;
    h.n_done = p.done_mark;
    h.last_arrive_ns = p.last_arrive_ns;
    h.last_done_ns = p.last_done_ns;
    h.dropped = saturate32(dropped);
    h.sent = sent;
    h.comm_rank = s->rank.load(std::memory_order_relaxed);
    h.comm_nranks = s->nranks.load(std::memory_order_relaxed);
    h.device = int16_t(s->device.load(std::memory_order_relaxed));
    h.hb_flags = uint8_t(hb_flags);
    h.p2p_in_flight = saturate8(p.p2p_in_flight);
    fill_pending(h, p.pend);
    append(&h);
  }
  peer_heartbeat(append, drain);  // transfers still in flight: where a hang stopped
}

/* ---------------------------------------------------------------- op progress */

void note_stats(CommProgress& p, const OpSlot& s) {
  if (!p.stats) p.stats = static_cast<OpStats*>(calloc(C4D_OP_COUNT, sizeof(OpStats)));
  if (!p.stats || s.op >= C4D_OP_COUNT) return;
  OpStats& st = p.stats[s.op];
  const AgentOp& x = g_ops.agent_of(s);
  uint64_t ns = (x.start_ns && x.end_ns) ? x.end_ns - x.start_ns : s.return_ns - s.issue_ns;
  float us = float(double(ns) / 1e3);
  if (st.n < kReservoir) {
    st.sample_us[st.n] = us;
  } else {
    uint64_t& x = g_agent.rng;  // xorshift64: reservoir sampling (Algorithm R)
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint64_t j = x % (st.n + 1);
    if (j < kReservoir) st.sample_us[j] = us;
  }
  ++st.n;
  st.sum_ns += ns;
  st.bytes += s.bytes;
}

void on_arrived(OpSlot& s) {
  Agent& a = g_agent;
  AgentOp& x = g_ops.agent_of(s);
  x.arrived = 1;
  ++a.ops_arrived;
  if (s.flags & C4D_OPF_P2P) return;
  CommProgress& p = a.progress[s.comm];
  if (s.seq + 1 > p.arrived_mark) p.arrived_mark = s.seq + 1;
  uint64_t t = x.start_ns ? x.start_ns : s.issue_ns;
  if (t > p.last_arrive_ns) p.last_arrive_ns = t;
}

void finish_op(uint32_t i) {
  Agent& a = g_agent;
  OpSlot& s = g_ops.at(i);
  const AgentOp& x = g_ops.agent_of(s);
  const CommSlot* c = comm_at(s.comm);
  CommProgress& p = a.progress[s.comm];
  ++a.ops_done;
  s.return_ns = stamp_to_ns(s.return_ns);
  if (s.return_ns < s.issue_ns) s.return_ns = s.issue_ns;  // two conversions, a rate refined between
  if (!(s.flags & C4D_OPF_P2P)) {
    if (s.seq + 1 > p.done_mark) p.done_mark = s.seq + 1;
    uint64_t t = x.end_ns ? x.end_ns : s.return_ns;
    if (t > p.last_done_ns) p.last_done_ns = t;
  }
  c4d_op_record r;
  memset(&r, 0, sizeof r);
  header(&r.h, C4D_REC_OP, host_now_ns());
  r.comm_id = c->id;
  r.seq = s.seq;
  r.issue_ns = s.issue_ns;
  r.start_ns = x.start_ns;
  r.end_ns = x.end_ns;
  r.count = s.count;
  r.bytes = s.bytes;
  r.stream = s.stream;
  r.group_id = s.group_id;
  r.return_ns = s.return_ns;
  r.comm_rank = c->rank.load(std::memory_order_relaxed);
  r.comm_nranks = c->nranks.load(std::memory_order_relaxed);
  r.peer = s.peer;
  r.device = s.device;
  r.result = s.result;
  r.op = s.op;
  r.dtype = s.dtype;
  r.redop = s.redop;
  r.flags = uint8_t(s.flags | s.late_flags | x.agent_flags | ((x.start_ns && x.end_ns) ? C4D_OPF_DEVICE_TIMING : 0));
  append(&r);
  if (g_cfg.stats_output) note_stats(p, s);
  free_op_slot(i);
}

enum Probe { kWait, kFired, kFailed };

/* Host time of `ev` when it fired. kWait: not yet (or no anchor yet). */
Probe probe(const OpSlot& s, uint32_t ev, uint64_t floor_ns, uint64_t* out) {
  EventPool* pool = event_pool_for(s.device);
  if (!pool || !cuda_agent_device(s.device)) return kFailed;
  cudaEvent_t e = pool->event(ev);
  cudaError_t q = g_cuda.eventQuery(e);
  if (q == C4D_CUDA_ERROR_NOT_READY) return kWait;
  if (q != C4D_CUDA_SUCCESS) return kFailed;
  uint64_t t = 0;
  switch (timing_event_ns(s.device, e, s.issue_ns, &t)) {
    case kTimeNoAnchorYet:
      return kWait;
    case kTimeFailed:
      return kFailed;
    case kTimeOk:
      break;
  }
  if (t < floor_ns) {  // anchor error of a few µs: keep issue <= start <= end
    t = floor_ns;
    count(g_counters.clamped);
  }
  *out = t;
  return kFired;
}

/* Advances one pending op; true when it is done. `blocked` streams have an unfired
 * event this pass: their later ops can't have fired either. */
bool advance(OpSlot& s, uint64_t* blocked, uint32_t* n_blocked) {
  auto is_blocked = [&](uint64_t st) {
    for (uint32_t b = 0; b < *n_blocked; ++b)
      if (blocked[b] == st) return true;
    return false;
  };
  auto block = [&](uint64_t st) {
    if (*n_blocked < 64) blocked[(*n_blocked)++] = st;
  };
  AgentOp& x = g_ops.agent_of(s);
  uint32_t state = s.state.load(std::memory_order_acquire);
  if (!x.arrived) {
    if (state < kLaunched) return false;
    if (s.ev_start == kNone) {
      on_arrived(s);  // no device timing: arrival = issue
    } else {
      if (is_blocked(s.stream)) return false;
      switch (probe(s, s.ev_start, s.issue_ns, &x.start_ns)) {
        case kWait:
          block(s.stream);
          return false;
        case kFailed:
          x.agent_flags |= C4D_OPF_EVENT_ERROR;
          count(g_counters.event_errors);
          x.start_ns = 0;
          break;
        case kFired:
          break;
      }
      on_arrived(s);
    }
  }
  if (state != kReturned) return false;
  if (s.ev_end == kNone || ((s.late_flags | x.agent_flags) & C4D_OPF_EVENT_ERROR)) {
    x.end_ns = 0;
    if (x.agent_flags & C4D_OPF_EVENT_ERROR) x.start_ns = 0;
    return true;
  }
  if (is_blocked(s.stream)) return false;
  switch (probe(s, s.ev_end, x.start_ns ? x.start_ns : s.issue_ns, &x.end_ns)) {
    case kWait:
      block(s.stream);
      return false;
    case kFailed:
      x.agent_flags |= C4D_OPF_EVENT_ERROR;
      count(g_counters.event_errors);
      x.start_ns = x.end_ns = 0;
      return true;
    case kFired:
      return true;
  }
  return true;
}

/* One submitted slot → pending list; a lifecycle entry is written out at once. */
void take_ready(uint32_t i) {
  Agent& a = g_agent;
  OpSlot& s = g_ops.at(i);
  if (s.kind == kSlotComm) {
    comm_entry(s);
    g_ops.release(i);
    return;
  }
  ++a.ops_seen;
  s.issue_ns = stamp_to_ns(s.issue_ns);  // the app wrote it before submit and never again
  g_ops.agent_of(s) = AgentOp{};
  peer_note_op(s);
  a.pending[a.n_pending++] = i;  // never overflows: pending holds at most every slot
}

/* Ready rings → pending list. The lanes' counts are read before the shared ring, which a
 * thread's lifecycle entries take: a comm's creation, submitted before its first op, comes
 * out first. Lanes of exited threads give their free slots back to the shared lists. */
bool drain() {
  uint32_t ready[kLanes];
  const uint32_t lanes = g_ops.lanes_used();
  for (uint32_t l = 0; l < lanes; ++l) ready[l] = g_ops.lane(uint8_t(l)).ready.ready();
  bool any = false;
  uint32_t i;
  while (g_ops.next_ready(&i)) {
    any = true;
    take_ready(i);
  }
  for (uint32_t l = 0; l < lanes; ++l) {
    Lane& ln = g_ops.lane(uint8_t(l));
    for (uint32_t n = ready[l]; n > 0 && ln.ready.pop(&i); --n) {
      any = true;
      take_ready(i);
    }
    g_ops.reclaim(uint8_t(l), free_to_shared);
  }
  return any;
}

bool poll() {
  Agent& a = g_agent;
  uint64_t blocked[64];
  uint32_t n_blocked = 0, w = 0;
  bool any = false;
  for (uint32_t r = 0; r < a.n_pending; ++r) {
    uint32_t i = a.pending[r];
    if (advance(g_ops.at(i), blocked, &n_blocked)) {
      finish_op(i);
      any = true;
    } else {
      a.pending[w++] = i;
    }
  }
  a.n_pending = w;
  return any;
}

/* ---------------------------------------------------------------- the thread */

bool stop_requested() {
  Agent& a = g_agent;
  pthread_mutex_lock(&a.mu);
  bool s = a.stop;
  pthread_mutex_unlock(&a.mu);
  return s;
}

void sleep_until(uint64_t mono_ns) {
  Agent& a = g_agent;
  timespec ts{time_t(mono_ns / 1000000000ull), long(mono_ns % 1000000000ull)};
  pthread_mutex_lock(&a.mu);
  while (!a.stop)
    if (pthread_cond_timedwait(&a.cv, &a.mu, &ts) == ETIMEDOUT) break;
  pthread_mutex_unlock(&a.mu);
}

/* Exit: last records out, FINAL heartbeat, bounded flush. */
void finish_up() {
  Agent& a = g_agent;
  uint64_t t0 = mono_now_ns();
  uint64_t budget = uint64_t(g_cfg.exit_flush_ms) * 1000000ull;
  uint64_t wait_ops_until = t0 + budget / 4;  // ops still on the device get a little time
  for (;;) {
    drain();
    uint64_t now = mono_now_ns();
    timing_tick(now);
    poll();
    peer_poll(append, drain);
    if (!a.n_pending || now >= wait_ops_until) break;
    timespec ms{0, 1000000};
    nanosleep(&ms, nullptr);
  }
  heartbeats(C4D_HBF_FINAL);
  flush();
  note_link(0);
  // A short-lived process may queue everything before ZeroMQ's handshake with the master
  // completes; the queue then goes out during the close's linger. Watch the monitor while
  // the budget lasts, so that the exit summary says what was really delivered. A process
  // that has run past the connect grace without ever meeting a master waits for none.
  uint64_t connect_until = t0 + budget / 2;
  bool young = !a.link.ever_connected() && t0 - a.started_mono < kConnectGraceNs;
  while (young && a.unconfirmed && a.link.monitored() && !a.link.peer_connected() && mono_now_ns() < connect_until) {
    timespec ms{0, 1000000};
    nanosleep(&ms, nullptr);
    note_link(0);
  }
  uint64_t now = mono_now_ns();
  uint64_t left = t0 + budget > now ? t0 + budget - now : 0;
  if (a.link.monitored() && !a.link.peer_connected()) left = 0;  // no master there to flush to
  a.link.close(int(left / 1000000ull));
}

void* agent_main(void*) {
  pthread_setname_np(pthread_self(), "c4d-agent");
  cuda_agent_reset();
  declare_ptracer();
  Agent& a = g_agent;
  if (g_cfg.master_addr[0]) a.link.open(g_cfg.master_addr, g_cfg.send_hwm, g_cfg.curve_server_key, g_cfg.job);
  a.started_mono = mono_now_ns();
  C4D_LOG(kDebug, "agent up: rank %d pid %d → %s", g_cfg.rank, int(getpid()), g_cfg.master_addr);
  send_register();
  const uint64_t hb_period = uint64_t(g_cfg.heartbeat_ms) * 1000000ull;
  uint64_t next_hb = mono_now_ns();
  for (;;) {
    bool stop = stop_requested();
    uint64_t now = mono_now_ns();
    bool busy = drain();
    timing_tick(now);
    busy |= poll();
    busy |= peer_poll(append, drain);
    stage_poll(append);
    if (now >= next_hb) {
      heartbeats(0);
      flush();
      next_hb += hb_period;
      if (next_hb <= now) next_hb = now + hb_period;  // we were late: don't burst
    }
    if (a.n_batch && mono_now_ns() - a.batch_first_mono >= kBatchMaxAgeNs) flush();
    note_link(0);
    if (!a.told_no_master && a.link.monitored() && !a.link.ever_connected() &&
        mono_now_ns() - a.started_mono >= kConnectGraceNs) {
      a.told_no_master = true;
      C4D_LOG(kWarning,
              "rank %d: no master has connected at %s after %llu s; records wait in ZeroMQ's queue (then are "
              "dropped and counted) until one listens there",
              g_cfg.rank, g_cfg.master_addr, (unsigned long long)(kConnectGraceNs / 1000000000ull));
    }
    if (stop) break;
    uint64_t wake = now + ((busy || a.n_pending) ? kPollBusyNs : kPollIdleNs);
    if (next_hb < wake) wake = next_hb;
    if (a.n_batch && a.batch_first_mono + kBatchMaxAgeNs < wake) wake = a.batch_first_mono + kBatchMaxAgeNs;
    sleep_until(wake);
  }
  finish_up();
  pthread_mutex_lock(&a.mu);
  a.finished = true;
  pthread_cond_broadcast(&a.cv);
  pthread_mutex_unlock(&a.mu);
  return nullptr;
}

void init_sync() {
  Agent& a = g_agent;
  pthread_mutex_init(&a.mu, nullptr);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&a.cv, &attr);
  pthread_condattr_destroy(&attr);
}

const char* const kOpNames[C4D_OP_COUNT] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                            "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};

void print_stats() {
  Agent& a = g_agent;
  for (uint32_t c = 0, n = comm_count(); c < n; ++c) {
    OpStats* st = a.progress[c].stats;
    if (!st) continue;
    const CommSlot* s = comm_at(c);
    for (int op = 0; op < C4D_OP_COUNT; ++op) {
      if (!st[op].n) continue;
      uint32_t k = st[op].n < kReservoir ? uint32_t(st[op].n) : kReservoir;
      qsort(st[op].sample_us, k, sizeof(float), [](const void* x, const void* y) {
        float a1 = *static_cast<const float*>(x), b1 = *static_cast<const float*>(y);
        return (a1 > b1) - (a1 < b1);
      });
      float median = (k % 2) ? st[op].sample_us[k / 2] : (st[op].sample_us[k / 2 - 1] + st[op].sample_us[k / 2]) / 2;
      log_write(kInfo, "stats rank %d comm %016llx (%d/%d) %-13s count=%llu median_us=%.1f mean_us=%.1f bytes=%llu",
                g_cfg.rank, (unsigned long long)s->id, s->rank.load(std::memory_order_relaxed),
                s->nranks.load(std::memory_order_relaxed), kOpNames[op], (unsigned long long)st[op].n, median,
                double(st[op].sum_ns) / 1e3 / double(st[op].n), (unsigned long long)st[op].bytes);
    }
  }
}

}  // namespace

bool agent_start() {
  Agent& a = g_agent;
  if (a.running) return true;
  if (!a.pending) a.pending = static_cast<uint32_t*>(calloc(g_ops.capacity(), sizeof(uint32_t)));
  if (!a.pending) return false;
  init_sync();
  a.stop = a.finished = false;
  a.n_pending = a.n_batch = a.hb_count = 0;
  a.ops_seen = a.ops_arrived = a.ops_done = 0;
  a.rng = 0x9e3779b97f4a7c15ull ^ uint64_t(getpid());
  a.delivered = a.unconfirmed = 0;
  a.told_no_master = false;
  build_register(cuda_current_device());
  ZmqLink::load(g_cfg.libzmq);  // here, not on the agent: see ZmqLink::load

  // The agent (and the ZeroMQ threads it creates) must never take the application's signals.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&a.thread, &attr, agent_main, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    C4D_LOG(kError, "pthread_create: %s", strerror(rc));
    return false;
  }
  a.running = true;
  return true;
}

void agent_shutdown() {
  Agent& a = g_agent;
  if (!a.running) return;
  g_mode.store(kPassThrough, std::memory_order_release);  // calls racing with exit pass through
  uint64_t t0 = mono_now_ns();
  uint64_t limit = t0 + uint64_t(g_cfg.exit_flush_ms + kExitMarginMs) * 1000000ull;
  timespec ts{time_t(limit / 1000000000ull), long(limit % 1000000000ull)};
  pthread_mutex_lock(&a.mu);
  a.stop = true;
  pthread_cond_broadcast(&a.cv);
  while (!a.finished)
    if (pthread_cond_timedwait(&a.cv, &a.mu, &ts) == ETIMEDOUT) break;
  bool finished = a.finished;
  pthread_mutex_unlock(&a.mu);
  a.running = false;
  C4D_LOG(kDebug, "exit: the agent %s after %.1f ms (bound %d ms)", finished ? "finished" : "was left",
          double(mono_now_ns() - t0) / 1e6, g_cfg.exit_flush_ms + kExitMarginMs);
  if (!finished) C4D_LOG(kWarning, "agent still busy after %d ms at exit; exiting anyway", g_cfg.exit_flush_ms);
  if (finished && g_cfg.stats_output) print_stats();
  uint64_t full = g_counters.dropped_full.load(std::memory_order_relaxed);
  uint64_t send = g_counters.dropped_send.load(std::memory_order_relaxed);
  uint64_t nolink = g_counters.dropped_nolink.load(std::memory_order_relaxed);
  char prof[192], captured[64] = "";
  peer_summary(prof, sizeof prof);
  if (uint64_t n = g_counters.captured.load(std::memory_order_relaxed))
    snprintf(captured, sizeof captured, "; %llu ops captured into CUDA graphs", (unsigned long long)n);
  uint64_t sent = g_counters.sent.load(std::memory_order_relaxed);
  char delivered[96];
  if (finished && a.link.monitored())
    snprintf(delivered, sizeof delivered, ", %llu delivered", (unsigned long long)a.delivered);
  else
    snprintf(delivered, sizeof delivered, ", delivery not known");
  C4D_LOG(kInfo,
          "rank %d pid %d: %llu records sent, %llu dropped (queue full %llu, master busy %llu, no link %llu)%s%s%s",
          g_cfg.rank, int(getpid()), (unsigned long long)sent, (unsigned long long)(full + send + nolink),
          (unsigned long long)full, (unsigned long long)send, (unsigned long long)nolink, delivered, prof, captured);
  if (!g_cfg.master_addr[0])
    C4D_LOG(kWarning, "rank %d pid %d: nothing was delivered: %s is not a usable %s", g_cfg.rank, int(getpid()),
            g_cfg.curve_bad ? "C4D_CURVE_SERVER_KEY" : "C4D_MASTER_ADDR", g_cfg.curve_bad ? "key" : "endpoint");
  else if (finished && a.link.monitored() && !a.link.ever_connected())
    C4D_LOG(kWarning,
            "rank %d pid %d: nothing was delivered: no master ever connected at %s (%llu records queued and lost)",
            g_cfg.rank, int(getpid()), g_cfg.master_addr, (unsigned long long)sent);
}

void agent_reset_after_fork() {
  Agent& a = g_agent;
  a.running = false;
  a.link.forget();
  stage_reset_after_fork();
  a.n_pending = a.n_batch = a.hb_count = 0;
  a.delivered = a.unconfirmed = 0;
  a.told_no_master = false;
  for (CommProgress& p : a.progress) p = CommProgress{0, 0, 0, 0, kNone, 0, nullptr};
  init_sync();
}

}  // namespace c4d
