/*
 * The agent's side of the profiler plugin: PEER records (c4d_peer_record) from the
 * transfers profiler.cc tracks, which communicator a profiler context is, and which
 * shim seq a profiler event names (the rules are in profiler.h). Agent thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c4d/record.h"
#include "comm_table.h"
#include "log.h"
#include "op_pool.h"
#include "peer_track.h"
#include "profiler.h"
#include "shim.h"
#include "timing.h"

namespace c4d {

namespace {

constexpr uint32_t kRing = 256;     // shim seqs kept per (comm, collective kind) for real NCCL's seqNumber
constexpr uint32_t kZeros = 64;     // count = 0 collectives remembered per comm

/* Per comm slot: what the shim numbered, in the order it issued (drain order). */
struct SeqMap {
  uint64_t next_seq;   // the collective seq expected next; another one means op records were dropped
  bool gap;            // ... which makes per-function ordinals unreliable from then on
  bool zeros_full;
  uint32_t n_zeros;
  uint64_t zeros[kZeros];         // shim seqs of count = 0 collectives, ascending
  uint64_t n_kind[kCollKinds];    // count > 0 collectives per kind so far
  uint64_t ring[kCollKinds][kRing];  // shim seq of the o-th of a kind at [o % kRing]
};

SeqMap* g_maps[kMaxComms];
bool g_claimed[kMaxComms];  // comm slots a context resolved to

/* Stopped tasks in stop order, waiting to be retired (a FIFO of task indices). */
uint32_t* g_retire = nullptr;
uint32_t g_retire_head = 0, g_retire_n = 0;

/* Contexts [0, upto] in creation order: first by id, then by (nranks, rank) and order. */
void resolve_upto(uint32_t upto) {
  uint32_t nc = comm_count();
  for (uint32_t j = 0; j <= upto; ++j) {
    ProfCtx& c = g_peer.ctx[j];
    if (c.how != kCtxUnresolved) continue;
    for (uint32_t i = 0; i < nc; ++i) {
      const CommSlot* s = comm_at(i);
      if (!g_claimed[i] && s->id == c.comm_id && s->rank.load(std::memory_order_relaxed) == c.rank) {
        c.slot = i;
        c.how = kCtxById;
        g_claimed[i] = true;
        break;
      }
    }
  }
  for (uint32_t j = 0; j <= upto; ++j) {
    ProfCtx& c = g_peer.ctx[j];
    if (c.how != kCtxUnresolved) continue;
    for (uint32_t i = 0; i < nc; ++i) {
      const CommSlot* s = comm_at(i);
      if (!g_claimed[i] && s->nranks.load(std::memory_order_relaxed) == c.nranks &&
          s->rank.load(std::memory_order_relaxed) == c.rank) {
        c.slot = i;
        c.how = kCtxByShape;
        g_claimed[i] = true;
        break;
      }
    }
  }
}

/* Lazily, when a record needs it (by then its comm is registered: events follow ops,
 * ops follow init); retried only when new comms appeared. */
void resolve(ProfCtx& c) {
  if (c.how != kCtxUnresolved) return;
  uint32_t nc = comm_count();
  if (c.tries == nc + 1) return;  // nothing new since the last attempt
  resolve_upto(c.index);
  if (c.how == kCtxUnresolved) c.tries = nc + 1;
}

/* The shim seq of X's op. *early: the op is one the agent has not taken from the ready
 * rings yet, so the answer may be wrong (UINT64_MAX, or a count = 0 call not counted). */
uint64_t shim_seq(const ProfCtx& c, const Xfer& X, bool* early) {
  *early = false;
  if (c.how == kCtxUnresolved) return X.key;
  // Graph replays of this kind run on the comm: NCCL emits their events without numbering
  // them (seqNumber not advanced, P2p ordinals shifted), so no event of the kind maps to an op.
  if (X.op < 32 && (comm_at(c.slot)->captured_kinds.load(std::memory_order_relaxed) & (1u << X.op))) return UINT64_MAX;
  if (X.p2p) return X.key;
  const SeqMap* m = g_maps[c.slot];
  if (c.sem.load(std::memory_order_relaxed) != kSemPerFunc) {  // the comm's count > 0 collectives
    uint64_t s = X.key;
    for (uint32_t z = 0; m && z < m->n_zeros && m->zeros[z] <= s; ++z) ++s;
    *early = !m || s >= m->next_seq;  // every collective below next_seq was taken: s is exact
    return s;
  }
  // The X.key-th count > 0 call of this function on the comm.
  if (!m) {
    *early = true;
    return UINT64_MAX;
  }
  if (m->gap || X.op >= kCollKinds) return UINT64_MAX;
  uint64_t n = m->n_kind[X.op], o = X.key;
  *early = o >= n;
  return (o < n && n - o <= kRing) ? m->ring[X.op][o % kRing] : UINT64_MAX;
}

void emit_one(const Xfer& X, bool done, uint64_t now, RecordSink emit, OpsCatchUp take_ops) {
  ProfCtx& c = g_peer.ctx[X.ctx];
  resolve(c);
  // An op's slot is submitted before NCCL is called, so before any event of its transfers:
  // a transfer seen here whose op the agent has not taken yet (it was issued since the last
  // drain) finds it after one more.
  bool early = false;
  uint64_t seq = shim_seq(c, X, &early);
  if (early) {
    take_ops();
    seq = shim_seq(c, X, &early);
  }
  c4d_peer_record r;
  memset(&r, 0, sizeof r);
  r.h.kind = C4D_REC_PEER;
  r.h.version = C4D_SCHEMA_VERSION;
  r.h.rank = g_cfg.rank;
  r.h.time_ns = now;
  r.comm_id = c.how != kCtxUnresolved ? comm_at(c.slot)->id : c.comm_id;
  r.seq = seq;
  r.steps_done = X.steps_done.load(std::memory_order_acquire);  // pairs with the step stop's release
  r.first_ns = X.first_ns.load(std::memory_order_relaxed);
  r.last_ns = X.last_ns.load(std::memory_order_relaxed);
  r.bytes_done = X.bytes_done.load(std::memory_order_relaxed);
  r.wire_ns = X.wire_ns.load(std::memory_order_relaxed);
  r.comm_rank = c.rank;
  r.peer = X.peer;
  r.steps_total = X.steps_total.load(std::memory_order_relaxed);
  r.direction = X.dir;
  r.state = X.pstate.load(std::memory_order_relaxed);
  r.op = X.op;
  r.done = done ? 1 : 0;
  emit(&r);
  g_peer.records.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void peer_note_op(const OpSlot& s) {
  if (s.kind != kSlotOp || (s.flags & C4D_OPF_P2P) || s.op >= kCollKinds || s.comm >= kMaxComms) return;
  if (!g_peer.n_ctx.load(std::memory_order_relaxed)) return;  // no profiler in this process
  SeqMap*& m = g_maps[s.comm];
  if (!m) m = static_cast<SeqMap*>(calloc(1, sizeof(SeqMap)));  // agent thread: may allocate
  if (!m) return;
  if (s.seq != m->next_seq) m->gap = true;
  m->next_seq = s.seq + 1;
  if (s.count == 0) {
    if (m->n_zeros < kZeros)
      m->zeros[m->n_zeros++] = s.seq;
    else
      m->gap = m->zeros_full = true;
    return;
  }
  uint64_t o = m->n_kind[s.op]++;
  m->ring[s.op][o % kRing] = s.seq;
}

void task_retire(uint64_t now) {
  uint32_t cap = g_peer.tasks.n;
  if (!g_retire) g_retire = static_cast<uint32_t*>(calloc(cap, sizeof(uint32_t)));  // agent: may allocate
  uint32_t t;
  while (g_peer.stopped.pop(&t)) {
    if (!g_retire || g_retire_n == cap) {  // no memory for the queue (or a stop we queued twice): now
      task_unref(t);
      continue;
    }
    g_retire[(g_retire_head + g_retire_n++) % cap] = t;
  }
  while (g_retire_n) {
    uint32_t oldest = g_retire[g_retire_head];
    if (g_retire_n <= cap / 2 && now - g_peer.tasks.items[oldest].stop_ns < kTaskKeepNs) break;
    task_unref(oldest);
    g_retire_head = (g_retire_head + 1) % cap;
    --g_retire_n;
  }
}

bool peer_poll(RecordSink emit, OpsCatchUp take_ops) {
  if (!g_peer.ready.load(std::memory_order_acquire)) return false;
  task_retire(mono_now_ns());
  bool any = false;
  uint32_t x;
  uint64_t now = host_now_ns();
  while (g_peer.done.pop(&x)) {
    emit_one(g_peer.xfers.items[x], true, now, emit, take_ops);
    xfer_recycle(x);
    any = true;
  }
  return any;
}

void peer_heartbeat(RecordSink emit, OpsCatchUp take_ops) {
  if (!g_peer.ready.load(std::memory_order_acquire)) return;
  uint64_t now = host_now_ns();
  bool abandoned = false;
  for (uint32_t x = 0; x < g_peer.n_xfers; ++x) {
    Xfer& X = g_peer.xfers.items[x];
    if (!X.live.load(std::memory_order_acquire)) continue;
    if (X.state.load(std::memory_order_acquire) & kXferDone) continue;  // on the completion ring
    emit_one(X, false, now, emit, take_ops);
    // Its communicator is finalized: nothing will finish it (an aborted hang). Last report.
    if (g_peer.ctx[X.ctx].finalized.load(std::memory_order_acquire)) {
      xfer_recycle(x);
      abandoned = true;
    }
  }
  if (!abandoned) return;
  // Their open steps will never be stopped: reclaim steps whose transfer is gone.
  for (uint32_t i = 0; i < g_peer.steps.n; ++i) {
    Step& s = g_peer.steps.items[i];
    if (!s.used.load(std::memory_order_acquire)) continue;
    if ((g_peer.xfers.items[s.xfer].state.load(std::memory_order_acquire) >> 16) == s.gen) continue;
    uint8_t one = 1;
    if (s.used.compare_exchange_strong(one, 0, std::memory_order_acq_rel)) g_peer.steps.give(i);
  }
}

namespace {
uint64_t g_unhooked = 0;  // collectives the profiler saw beyond what the hooks numbered (agent)
bool g_unhooked_said = false;
}  // namespace

void peer_blind_spots() {
  uint32_t n = g_peer.n_ctx.load(std::memory_order_acquire);
  uint64_t unhooked = 0;
  for (uint32_t j = 0; j < n; ++j) {
    ProfCtx& c = g_peer.ctx[j];
    uint64_t seen = c.colls.load(std::memory_order_acquire);  // first: every hooked op is numbered by then
    if (!seen) continue;
    resolve(c);
    if (c.how == kCtxUnresolved) {  // its comm never went through an init hook
      unhooked += seen;
      continue;
    }
    const CommSlot* s = comm_at(c.slot);
    if (s->captured_kinds.load(std::memory_order_relaxed)) continue;  // graph replays: NCCL's own events
    uint64_t hooked = s->coll_seq.load(std::memory_order_relaxed);
    if (seen > hooked) unhooked += seen - hooked;
  }
  g_unhooked = unhooked;
  if (unhooked && !g_unhooked_said) {
    g_unhooked_said = true;
    C4D_LOG(kWarning,
            "the NCCL profiler saw %llu collectives that no hook saw: NCCL is called past the preload (a ctypes or "
            "dlsym handle to libnccl, as vLLM's and SGLang's pynccl do); those ops are not recorded (blind spot)",
            (unsigned long long)unhooked);
  }
}

void peer_summary(char* out, unsigned cap) {
  if (!cap) return;
  out[0] = '\0';
  if (!g_peer.n_ctx.load(std::memory_order_relaxed)) return;
  int k = snprintf(out, cap, "; profiler: %llu transfers, %llu PEER records, %llu events untracked",
                   (unsigned long long)g_peer.tracked.load(std::memory_order_relaxed),
                   (unsigned long long)g_peer.records.load(std::memory_order_relaxed),
                   (unsigned long long)g_peer.untracked.load(std::memory_order_relaxed));
  if (g_unhooked && k > 0 && unsigned(k) < cap)
    snprintf(out + k, cap - unsigned(k), ", %llu collectives past the hooks", (unsigned long long)g_unhooked);
}

void peer_reset_after_fork() {
  g_retire_head = g_retire_n = 0;
  g_unhooked = 0;
  g_unhooked_said = false;
  for (SeqMap*& m : g_maps)
    if (m) memset(m, 0, sizeof *m);
  memset(g_claimed, 0, sizeof g_claimed);
}

}  // namespace c4d
