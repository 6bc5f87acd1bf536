/*
 * NCCL operations: the host API (validate, assign the per-comm sequence, queue on the
 * stream, return at once) and their execution on the stream worker.
 *
 * Execution of one group (GroupWork) on the worker, in chunks (each chunk holds at
 * most kCollRing collectives per comm and kP2PRing sends per peer):
 *   1. wait for our turn on every comm it touches (tickets: issue order per comm)
 *   2. publish: copy every input into our data segment, fill our CollSlot / post
 *      our sends (P2PChan), ring the bell
 *   3. read: for each collective wait until all members published, compute our
 *      output from their inputs, mark read (allreduce/reduce on 3+ ranks: reduce our
 *      chunk, mark reduced; then gather every rank's reduced chunk, mark read); for
 *      each recv wait for the post, copy, model the transfer, ack with its times
 *   4. barrier: wait until every member has read (buffers reusable), every send acked
 *   5. wait until the modeled finish: last arrival + modeled duration (timeline.h)
 * Publishing everything before waiting on anything is what lets a rank post sends
 * and receives to several peers in one group without deadlock.
 */
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "comm.h"
#include "common.h"
#include "config.h"
#include "ops.h"
#include "profiler.h"
#include "reduce.h"
#include "stream.h"
#include "timeline.h"

namespace sim {
namespace {

struct PendingOp {
  OpDesc op;
  Stream* stream;
};

thread_local int t_group_depth = 0;
thread_local std::vector<PendingOp>* t_pending = nullptr;

size_t align64(size_t v) { return (v + 63) & ~size_t(63); }

bool is_coll(int kind) { return kind <= kScatter; }
bool is_reducing(int kind) { return kind == kAllReduce || kind == kReduce || kind == kReduceScatter; }

/* AllReduce and Reduce on 3+ ranks run in two stages, reduce-scatter then gather, so a
 * rank reads about twice the buffer instead of n times: with 32 ranks on 2 cores the
 * memory traffic, not the model, would otherwise set the step time. */
bool two_stage(const OpDesc& op) { return (op.kind == kAllReduce || op.kind == kReduce) && op.comm->nranks >= 3; }

/* Elements [lo, hi) of chunk r when `count` is split over n ranks. */
void chunk_of(size_t count, int n, int r, size_t* lo, size_t* hi) {
  size_t q = count / size_t(n), rem = count % size_t(n), ur = size_t(r);
  *lo = ur * q + std::min(ur, rem);
  *hi = *lo + q + (ur < rem ? 1 : 0);
}

/* Scratch after the input for a two-stage op's reduced chunk. */
size_t scratch_bytes(const OpDesc& op) {
  if (!two_stage(op)) return 0;
  size_t n = size_t(op.comm->nranks);
  return align64((op.count + n - 1) / n * c4d_dtype_size(op.dtype));
}

/* Bytes this rank publishes into its data segment for op. */
size_t publish_bytes(const OpDesc& op) {
  size_t b = op.count * c4d_dtype_size(op.dtype), n = size_t(op.comm->nranks);
  switch (op.kind) {
    case kBroadcast: return op.comm->rank == op.peer ? b : 0;
    case kScatter: return op.comm->rank == op.peer ? n * b : 0;
    case kReduceScatter:
    case kAlltoAll: return n * b;
    case kRecv: return 0;
    default: return b;
  }
}

void set_error(ncclComm* c, ncclResult_t r, const char* what) {
  int zero = 0;
  if (c->async_error.compare_exchange_strong(zero, int(r)))
    warnf("comm rank %d (global %d): %s", c->rank, c->global_rank, what); /* first error per comm */
}

/* Launch: number the group's collectives, take its turn on each comm, emit its profiler
 * task events and queue it on its stream(s). */
void launch(GroupWork* g, const std::vector<Stream*>& streams, bool persistent) {
  for (OpDesc& op : g->ops) {
    ncclComm* c = op.comm;
    if (is_coll(op.kind)) op.seq = ++c->coll_issued;
    bool seen = false;
    for (auto& t : g->tickets) seen = seen || t.first == c;
    if (!seen) g->tickets.push_back({c, ++c->ticket_issued});
  }
  profiler_enqueue(g->ops, persistent); /* NCCL's hostStreamPlanTask, right after the launch */
  JoinSync* js = nullptr;
  if (streams.size() > 1) {
    js = new JoinSync;
    js->expected = int(streams.size()) - 1;
    js->refs.store(int(streams.size()));
    for (size_t i = 1; i < streams.size(); ++i) stream_enqueue(streams[i], Item{ItemKind::Join, js, nullptr, 0, 0});
  }
  stream_enqueue(streams[0], Item{ItemKind::Group, g, js, 0, 0});
}

/* How long the helper thread of a nonblocking group takes to launch it (NCCL: thread
 * start, ncclPrepareTasks, the kernel launches); SIMNCCL_NB_LAUNCH_US, default 500. */
uint64_t nb_launch_ns() {
  static const uint64_t ns = uint64_t(env_long("SIMNCCL_NB_LAUNCH_US", 500, 0, 10000000)) * 1000ull;
  return ns;
}

/* One group (or one bare op), at its ncclGroupEnd: launched, or kept by the capturing
 * stream's graph to be launched at each replay. A group of nonblocking communicators is
 * launched later by a helper thread while their async error says ncclInProgress (NCCL
 * 2.30.7 src/group.cc ncclGroupEndInternal: groupLaunchNonBlocking on a job thread). */
ncclResult_t enqueue_group(std::vector<PendingOp>& ops) {
  GroupWork* g = new GroupWork;
  std::vector<Stream*> streams;
  std::vector<ncclComm*> comms;
  bool captured = false;
  for (PendingOp& p : ops) {
    g->ops.push_back(p.op);
    if (std::find(streams.begin(), streams.end(), p.stream) == streams.end()) streams.push_back(p.stream);
    if (std::find(comms.begin(), comms.end(), p.op.comm) == comms.end()) comms.push_back(p.op.comm);
    captured = captured || p.stream->capturing.load();
  }
  const bool blocking = comms[0]->blocking;
  for (ncclComm* c : comms)
    if (c->blocking != blocking) {
      delete g;
      warnf("Blocking and nonblocking communicators are not allowed in the same group.");
      return ncclInvalidArgument;
    }
  if (captured) {
    if (streams.size() == 1 && capture_group(streams[0], g)) return ncclSuccess;
    if (streams.size() > 1) {
      delete g;
      warnf("simnccl: an NCCL group over several streams under CUDA graph capture is not simulated");
      return ncclInvalidUsage;
    }
  }
  if (!blocking) {
    for (ncclComm* c : comms) start_job(c);
    std::thread([g, streams, comms] {
      sleep_until_ns(now_ns() + nb_launch_ns());
      launch(g, streams, false);
      for (ncclComm* c : comms) finish_job(c, ncclSuccess);
    }).detach();
    return ncclInProgress;
  }
  launch(g, streams, false);
  return ncclSuccess;
}

ncclResult_t submit(const OpDesc& op, cudaStream_t stream) {
  Stream* s = resolve_stream(stream);
  if (!s) {
    warnf("%s: invalid cudaStream_t %p", op_func_name(op.kind), (void*)stream);
    return ncclInvalidArgument;
  }
  if (t_group_depth > 0) {
    t_pending->push_back({op, s});
    return ncclSuccess;
  }
  std::vector<PendingOp> one{{op, s}};
  ncclResult_t r = enqueue_group(one);
  /* src/enqueue.cc ncclEnqueueCheck: a nonblocking comm's state decides, asked through the
   * PLT (an interposer sees this call inside the op's). */
  if (r == ncclInProgress && ncclCommGetAsyncError(op.comm, &r) != ncclSuccess) r = ncclInternalError;
  return r;
}

/* Common argument checks of every op; `kind` decides which buffers matter. */
ncclResult_t issue(uint8_t kind, const void* send, void* recv, size_t count, ncclDataType_t dtype, int redop,
                   int peer, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = op_func_name(kind);
  ncclComm* c = as_comm(comm);
  if (!c) {
    warnf("%s: invalid communicator %p", fn, (void*)comm);
    return ncclInvalidArgument;
  }
  if (c->aborted.load()) {
    warnf("%s: communicator was aborted", fn);
    return ncclInvalidUsage;
  }
  if (c->revoked.load()) {
    warnf("%s: communicator was revoked", fn);
    return ncclInvalidUsage;
  }
  if (c->suspended.load()) {
    warnf("%s: communicator is suspended", fn);
    return ncclInvalidUsage;
  }
  if (ncclResult_t r = ensure_ready(c)) return r;
  if (c4d_dtype_size(dtype) == 0 || int(dtype) < 0 || dtype >= ncclNumTypes) {
    warnf("%s: invalid datatype %d", fn, int(dtype));
    return ncclInvalidArgument;
  }
  if (is_reducing(kind) && !reducible(dtype, redop)) {
    warnf("%s: reduction op %d on datatype %d is not supported", fn, redop, int(dtype));
    return ncclInvalidArgument;
  }
  bool rooted = kind == kBroadcast || kind == kReduce || kind == kGather || kind == kScatter;
  if ((rooted || kind == kSend || kind == kRecv) && (peer < 0 || peer >= c->nranks)) {
    warnf("%s: %s %d is not in [0, %d)", fn, rooted ? "root" : "peer", peer, c->nranks);
    return ncclInvalidArgument;
  }
  if (count == 0) return ncclSuccess; /* like NCCL: nothing is queued for an empty op */
  bool is_root = c->rank == peer;
  bool needs_send = kind != kRecv && !(kind == kScatter && !is_root) && !(kind == kBroadcast && !is_root);
  bool needs_recv = kind != kSend && !((kind == kReduce || kind == kGather) && !is_root);
  if ((needs_send && !send) || (needs_recv && !recv)) {
    warnf("%s: NULL %s buffer", fn, (needs_send && !send) ? "send" : "receive");
    return ncclInvalidArgument;
  }
  OpDesc op{};
  op.kind = kind;
  op.dtype = dtype;
  op.redop = is_reducing(kind) ? redop : -1;
  op.peer = (rooted || kind == kSend || kind == kRecv) ? peer : -1;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.comm = c;
  op.seq = 0; /* collectives are numbered when launched (enqueue_group) */
  op.step = current_step();
  return submit(op, stream);
}

/* ---- execution on the stream worker ---- */

struct Run {
  OpDesc* op;
  size_t off = 0, bytes = 0; /* our published input */
  uint32_t idx = 0;          /* p2p index on (comm, peer, direction) */
  bool ok = true;
  Schedule sched;
};

bool same_op(const CollSlot& a, const CollSlot& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root && a.redop == b.redop;
}

/* Members that disagree (same_op false): does NCCL still get through the op? Modeled: when
 * they agree on the op and its root and move the same number of 8-byte units (a low-latency
 * protocol line holds 8 data bytes; each receiver waits for the lines it expects), every member
 * completes with wrong data: a dtype of the same size, another reduction op, counts a few bytes
 * apart. Anything else (another op, another root, sizes further apart) leaves some member
 * waiting for steps nobody sends: every member hangs. The same answer on every member. */
bool completes_anyway(ncclComm* c, uint64_t seq) {
  const CollSlot& a = c->members[0].coll[seq % kCollRing];
  const uint64_t units = (a.count * c4d_dtype_size(ncclDataType_t(a.dtype)) + 7) / 8;
  for (int r = 1; r < c->nranks; ++r) {
    const CollSlot& b = c->members[r].coll[seq % kCollRing];
    if (b.op != a.op || b.root != a.root) return false;
    if ((b.count * c4d_dtype_size(ncclDataType_t(b.dtype)) + 7) / 8 != units) return false;
  }
  return true;
}

/* Our output of a collective from every member's published input. */
void compute(ncclComm* c, Run& run) {
  const OpDesc& op = *run.op;
  const int n = c->nranks, me = c->rank;
  const size_t es = c4d_dtype_size(op.dtype), b = op.count * es;
  const uint64_t seq = op.seq;
  const CollSlot& mine = c->members[me].coll[seq % kCollRing];
  for (int r = 0; r < n; ++r) {
    const CollSlot& theirs = c->members[r].coll[seq % kCollRing];
    if (!same_op(theirs, mine)) {
      char msg[200];
      if (theirs.op == 255 || mine.op == 255)
        snprintf(msg, sizeof msg, "%s seq %llu: rank %d could not stage its input (shared memory full?)",
                 op_func_name(op.kind), (unsigned long long)seq, theirs.op == 255 ? r : me);
      else {
        /* NCCL checks none of this (docs/real-nccl.md, section 8): the op hangs, or completes
         * with wrong data, and so does it here (completes_anyway). No error either way. */
        run.ok = false; /* no output computed: wrong data */
        if (!completes_anyway(c, seq)) run.sched.finish = kNever;
        return;
      }
      set_error(c, ncclInvalidUsage, msg);
      run.ok = false;
      return;
    }
  }
  auto in = [&](int r, size_t extra, size_t len) -> const char* {
    const CollSlot& s = c->members[r].coll[seq % kCollRing];
    const char* p = peer_data(c, r, s.offset + extra, len);
    if (!p) {
      set_error(c, ncclSystemError, "cannot map a peer's data segment");
      run.ok = false;
    }
    return p;
  };
  std::vector<const void*> ins(size_t(n), nullptr);
  char* out = static_cast<char*>(op.recv);
  switch (op.kind) {
    case kAllReduce:
    case kReduce:
      if (two_stage(op)) { /* stage 1: reduce our chunk of everyone's input into scratch */
        size_t lo, hi;
        chunk_of(op.count, n, me, &lo, &hi);
        if (hi == lo) break;
        for (int r = 0; r < n; ++r)
          if (!(ins[size_t(r)] = in(r, lo * es, (hi - lo) * es))) return;
        reduce_n(c->data + run.off + align64(run.bytes), ins.data(), n, hi - lo, op.dtype, op.redop);
        break;
      }
      if (op.kind == kReduce && me != op.peer) break;
      for (int r = 0; r < n; ++r)
        if (!(ins[size_t(r)] = in(r, 0, b))) return;
      reduce_n(out, ins.data(), n, op.count, op.dtype, op.redop);
      break;
    case kReduceScatter:
      for (int r = 0; r < n; ++r)
        if (!(ins[size_t(r)] = in(r, size_t(me) * b, b))) return;
      reduce_n(out, ins.data(), n, op.count, op.dtype, op.redop);
      break;
    case kBroadcast:
      if (const char* p = in(op.peer, 0, b)) memcpy(out, p, b);
      break;
    case kScatter:
      if (const char* p = in(op.peer, size_t(me) * b, b)) memcpy(out, p, b);
      break;
    case kAllGather:
    case kGather:
      if (op.kind == kGather && me != op.peer) break;
      for (int r = 0; r < n; ++r)
        if (const char* p = in(r, 0, b)) memcpy(out + size_t(r) * b, p, b);
      break;
    case kAlltoAll:
      for (int r = 0; r < n; ++r)
        if (const char* p = in(r, size_t(me) * b, b)) memcpy(out + size_t(r) * b, p, b);
      break;
  }
}

/* Stage 2 of a two-stage op: gather every rank's reduced chunk into our output. */
void gather_reduced(ncclComm* c, Run& run) {
  const OpDesc& op = *run.op;
  if (!run.ok || (op.kind == kReduce && c->rank != op.peer)) return;
  const size_t es = c4d_dtype_size(op.dtype);
  for (int r = 0; r < c->nranks; ++r) {
    size_t lo, hi;
    chunk_of(op.count, c->nranks, r, &lo, &hi);
    if (hi == lo) continue;
    const CollSlot& s = c->members[r].coll[op.seq % kCollRing];
    const char* p = peer_data(c, r, s.offset + align64(s.bytes), (hi - lo) * es);
    if (!p) {
      set_error(c, ncclSystemError, "cannot map a peer's data segment");
      return;
    }
    memcpy(static_cast<char*>(op.recv) + lo * es, p, (hi - lo) * es);
  }
}

void run_chunk(std::vector<Run>& runs) {
  const uint64_t arrive = now_ns();
  std::vector<ncclComm*> comms;
  std::map<ncclComm*, size_t> cursor;
  for (Run& r : runs) {
    ncclComm* c = r.op->comm;
    if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
    r.bytes = publish_bytes(*r.op);
    r.off = cursor[c];
    cursor[c] += align64(r.bytes) + scratch_bytes(*r.op);
  }
  for (ncclComm* c : comms)
    if (!ensure_data(c, cursor[c])) set_error(c, ncclSystemError, "cannot grow the data segment");

  /* 2. publish */
  for (Run& r : runs) {
    OpDesc& op = *r.op;
    ncclComm* c = op.comm;
    bool have_data = c->data_len >= r.off + r.bytes;
    if (is_coll(op.kind)) {
      if (r.bytes && have_data) memcpy(c->data + r.off, op.send, r.bytes);
      CollSlot& s = c->members[c->rank].coll[op.seq % kCollRing];
      s.offset = r.off;
      s.bytes = r.bytes;
      s.arrive_ns = arrive;
      s.count = op.count;
      s.step = op.step;
      s.root = op.peer;
      s.op = have_data ? op.kind : 255; /* 255: "I failed": peers skip the data, keep the protocol */
      s.dtype = uint8_t(op.dtype);
      s.redop = uint8_t(op.redop);
      s.pub_seq.store(op.seq, std::memory_order_release);
    } else if (op.kind == kSend) {
      r.idx = c->send_idx[size_t(op.peer)]++;
      P2PChan& ch = c->chans[c->rank * c->nranks + op.peer];
      wait_member(c, op.peer, [&] { return ch.posted.load() - ch.acked.load() < uint32_t(kP2PRing); });
      if (r.bytes && have_data) memcpy(c->data + r.off, op.send, r.bytes);
      P2PDesc& d = ch.ring[r.idx % kP2PRing];
      d.offset = r.off;
      d.bytes = have_data ? r.bytes : UINT64_MAX;
      d.arrive_ns = arrive;
      d.step = op.step;
      d.start_ns.store(0);
      d.finish_ns.store(0);
      ch.posted.store(r.idx + 1, std::memory_order_release);
    } else {
      r.idx = c->recv_idx[size_t(op.peer)]++;
    }
  }
  for (ncclComm* c : comms) ring_bell(c);

  /* 3. read */
  for (Run& r : runs) {
    OpDesc& op = *r.op;
    ncclComm* c = op.comm;
    if (is_coll(op.kind)) {
      uint64_t seq = op.seq;
      if (!wait_all(c, [&](int m) {
            return c->members[m].coll[seq % kCollRing].pub_seq.load(std::memory_order_acquire) >= seq;
          }))
        return;
      /* Every member arrived: the transfer's schedule is known, and the proxy starts its steps
       * now, as NCCL's does once the op is posted, not after simnccl's own bookkeeping below
       * (the data copies and two more barriers), which on a busy host would delay every step. */
      uint64_t t0 = 0;
      int step = 0;
      for (int m = 0; m < c->nranks; ++m) {
        const CollSlot& s = c->members[m].coll[seq % kCollRing];
        t0 = std::max(t0, s.arrive_ns);
        step = std::max(step, int(s.step));
      }
      r.sched = model_coll(c, op.kind, op.count * c4d_dtype_size(op.dtype), op.peer, step, seq, t0);
      if (op.proxy) profiler_publish(op.proxy, r.sched);
      compute(c, r);
      CollSlot& s = c->members[c->rank].coll[seq % kCollRing];
      (two_stage(op) ? s.red_seq : s.read_seq).store(seq, std::memory_order_release);
      ring_bell(c);
    } else if (op.kind == kRecv) {
      P2PChan& ch = c->chans[op.peer * c->nranks + c->rank];
      if (!wait_member(c, op.peer, [&] { return ch.posted.load(std::memory_order_acquire) > r.idx; })) return;
      P2PDesc& d = ch.ring[r.idx % kP2PRing];
      size_t want = op.count * c4d_dtype_size(op.dtype);
      if (d.bytes != want) {
        char msg[160];
        snprintf(msg, sizeof msg, "Recv from rank %d: it sent %llu bytes, this rank expects %zu", op.peer,
                 (unsigned long long)d.bytes, want);
        set_error(c, ncclInvalidUsage, msg);
      } else if (const char* p = peer_data(c, op.peer, d.offset, want)) {
        memcpy(op.recv, p, want);
      } else {
        set_error(c, ncclSystemError, "cannot map a peer's data segment");
      }
      int step = std::max(op.step, int(d.step));
      r.sched = model_p2p(c, op.peer, c->rank, false, want, step, r.idx, std::max(arrive, d.arrive_ns));
      d.step = step; /* the sender models its end of the transfer with the same step */
      d.start_ns.store(r.sched.t0);
      d.finish_ns.store(r.sched.finish);
      ch.acked.store(r.idx + 1, std::memory_order_release);
      ring_bell(c);
    }
  }

  for (Run& r : runs) { /* stage 2 of the two-stage ops, once every chunk is reduced */
    OpDesc& op = *r.op;
    ncclComm* c = op.comm;
    if (!is_coll(op.kind) || !two_stage(op)) continue;
    uint64_t seq = op.seq;
    if (!wait_all(c, [&](int m) {
          return c->members[m].coll[seq % kCollRing].red_seq.load(std::memory_order_acquire) >= seq;
        }))
      return;
    gather_reduced(c, r);
    c->members[c->rank].coll[seq % kCollRing].read_seq.store(seq, std::memory_order_release);
    ring_bell(c);
  }

  /* 4. barrier: every member has read our input; every send acked */
  for (Run& r : runs) {
    OpDesc& op = *r.op;
    ncclComm* c = op.comm;
    if (is_coll(op.kind)) {
      uint64_t seq = op.seq;
      if (!wait_all(c, [&](int m) {
            return c->members[m].coll[seq % kCollRing].read_seq.load(std::memory_order_acquire) >= seq;
          }))
        return;
    } else if (op.kind == kSend) {
      P2PChan& ch = c->chans[c->rank * c->nranks + op.peer];
      if (!wait_member(c, op.peer, [&] { return ch.acked.load(std::memory_order_acquire) > r.idx; })) return;
      const P2PDesc& d = ch.ring[r.idx % kP2PRing];
      uint64_t bytes = op.count * c4d_dtype_size(op.dtype);
      /* the receiver modeled the transfer; we take its times, recomputing only our view */
      r.sched = model_p2p(c, c->rank, op.peer, true, bytes, d.step, r.idx, d.start_ns.load());
      r.sched.finish = d.finish_ns.load();
    }
  }

  /* 5. modeled time */
  std::vector<TimedOp> timed;
  for (Run& r : runs) timed.push_back({r.op, r.sched});
  wait_timeline(timed);
}

}  // namespace

void launch_captured_group(const GroupWork* tmpl, Stream* s) {
  GroupWork* g = new GroupWork(*tmpl);
  launch(g, {s}, true);
}

const char* op_func_name(int kind) {
  static const char* names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};
  return kind >= 0 && kind <= kRecv ? names[kind] : "Unknown";
}

const char* dtype_name(int dtype) {
  static const char* names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32",
                                "ncclInt64",   "ncclUint64",  "ncclFloat16", "ncclFloat32",
                                "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return dtype >= 0 && dtype < ncclNumTypes ? names[dtype] : "Unknown";
}

void run_group(GroupWork* g) {
  for (auto& t : g->tickets) {
    ncclComm* c = t.first;
    for (;;) { /* our turn on c: every earlier op on c has finished on this process */
      uint32_t d = c->ticket_done.load();
      if (d == t.second - 1) break;
      futex_wait(&c->ticket_done, d, 20000000ull, false);
    }
  }
  std::vector<Run> chunk;
  std::map<std::pair<ncclComm*, int>, int> load; /* collectives per comm (-1), sends per (comm, peer) */
  auto flush = [&] {
    if (!chunk.empty()) run_chunk(chunk);
    chunk.clear();
    load.clear();
  };
  for (OpDesc& op : g->ops) {
    bool aborted = op.comm->aborted.load();
    if (aborted) continue;
    std::pair<ncclComm*, int> key{op.comm, is_coll(op.kind) ? -1 : op.peer};
    int limit = is_coll(op.kind) ? kCollRing : kP2PRing;
    if (op.kind != kRecv && load[key] >= limit) flush();
    if (op.kind != kRecv) ++load[key];
    Run r;
    r.op = &op;
    chunk.push_back(r);
  }
  flush();
  for (OpDesc& op : g->ops)
    if (op.proxy) profiler_release(op.proxy);
  for (auto& t : g->tickets) {
    t.first->ticket_done.store(t.second);
    futex_wake_all(&t.first->ticket_done, false);
  }
  delete g;
}

}  // namespace sim

using namespace sim;

#define SIM_ALIAS(name) \
  extern "C" __attribute__((alias(#name), visibility("default"))) decltype(name) p##name;

SIM_API ncclResult_t ncclGroupStart(void) {
  if (t_group_depth++ == 0) {
    if (!t_pending) t_pending = new std::vector<PendingOp>;
    t_pending->clear();
  }
  return ncclSuccess;
}
SIM_ALIAS(ncclGroupStart)

SIM_API ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth == 0) {
    warnf("ncclGroupEnd without a matching ncclGroupStart");
    return ncclInvalidUsage;
  }
  ncclResult_t r = ncclSuccess;
  if (--t_group_depth == 0 && !t_pending->empty()) {
    r = enqueue_group(*t_pending);
    t_pending->clear();
  }
  return r;
}
SIM_ALIAS(ncclGroupEnd)

/* Ends the group without launching it (NCCL 2.22+, src/group.cc ncclGroupSimulateEnd →
 * ncclGroupEndInternal(simInfo)): the tasks are planned, timed and dropped, nothing is
 * numbered; estimatedTime (µs) is the sum of the ops' modeled times. */
SIM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (t_group_depth == 0) {
    warnf("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<PendingOp> ops;
  ops.swap(*t_pending);
  if (simInfo && simInfo->magic != NCCL_SIM_INFO_MAGIC) {
    warnf("ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  double us = 0;
  for (const PendingOp& p : ops) {
    const OpDesc& op = p.op;
    uint64_t bytes = op.count * c4d_dtype_size(op.dtype);
    Schedule s = is_coll(op.kind) ? model_coll(op.comm, op.kind, bytes, op.peer, op.step, 0, 0)
                                  : op.kind == kSend ? model_p2p(op.comm, op.comm->rank, op.peer, true, bytes, op.step, 0, 0)
                                                    : model_p2p(op.comm, op.peer, op.comm->rank, false, bytes, op.step, 0, 0);
    if (s.finish != kNever) us += double(s.finish) / 1e3;
  }
  if (simInfo) simInfo->estimatedTime = float(us);
  return ncclSuccess;
}
SIM_ALIAS(ncclGroupSimulateEnd)

SIM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}
SIM_ALIAS(ncclAllReduce)

SIM_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(kBroadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclBroadcast)

SIM_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream) {
  /* Through the PLT, like NCCL: an interposer sees this inner call too. */
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
SIM_ALIAS(ncclBcast)

SIM_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
SIM_ALIAS(ncclReduce)

SIM_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                   ncclComm_t comm, cudaStream_t stream) {
  return issue(kAllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
}
SIM_ALIAS(ncclAllGather)

SIM_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  return issue(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}
SIM_ALIAS(ncclReduceScatter)

SIM_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
  return issue(kAlltoAll, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
}
SIM_ALIAS(ncclAlltoAll)

SIM_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(kGather, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclGather)

SIM_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(kScatter, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclScatter)

SIM_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream) {
  return issue(kSend, sendbuff, nullptr, count, datatype, -1, peer, comm, stream);
}
SIM_ALIAS(ncclSend)

SIM_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                              cudaStream_t stream) {
  return issue(kRecv, nullptr, recvbuff, count, datatype, -1, peer, comm, stream);
}
SIM_ALIAS(ncclRecv)

/* One-sided RMA over registered windows (NCCL 2.29+) is not simulated: refused, with a WARN. */
SIM_API ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                                   ncclComm_t comm, cudaStream_t stream) {
  (void)localbuff, (void)count, (void)datatype, (void)peer, (void)peerWin, (void)peerWinOffset, (void)sigIdx,
      (void)ctx, (void)flags, (void)comm, (void)stream;
  warnf("ncclPutSignal: one-sided operations are not simulated by simnccl");
  return ncclInvalidUsage;
}
SIM_ALIAS(ncclPutSignal)

SIM_API ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                cudaStream_t stream) {
  (void)peer, (void)sigIdx, (void)ctx, (void)flags, (void)comm, (void)stream;
  warnf("ncclSignal: one-sided operations are not simulated by simnccl");
  return ncclInvalidUsage;
}
SIM_ALIAS(ncclSignal)

SIM_API ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                    cudaStream_t stream) {
  (void)nDesc, (void)signalDescs, (void)comm, (void)stream;
  warnf("ncclWaitSignal: one-sided operations are not simulated by simnccl");
  return ncclInvalidUsage;
}
SIM_ALIAS(ncclWaitSignal)

/* The ...Config variants run the same code; the per-call config is opaque here. They
 * do not call the plain entry points (an interposer hooks both and counts each once). */
SIM_API ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream, const ncclCollConfig_t* config) {
  (void)config;
  return issue(kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}
SIM_ALIAS(ncclAllReduceConfig)

SIM_API ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                                         const ncclCollConfig_t* config) {
  (void)config;
  return issue(kBroadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclBroadcastConfig)

SIM_API ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t* config) {
  (void)config;
  return issue(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
SIM_ALIAS(ncclReduceConfig)

SIM_API ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                         const ncclCollConfig_t* config) {
  (void)config;
  return issue(kAllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
}
SIM_ALIAS(ncclAllGatherConfig)

SIM_API ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream, const ncclCollConfig_t* config) {
  (void)config;
  return issue(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}
SIM_ALIAS(ncclReduceScatterConfig)

SIM_API ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                        const ncclCollConfig_t* config) {
  (void)config;
  return issue(kAlltoAll, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
}
SIM_ALIAS(ncclAlltoAllConfig)

SIM_API ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t* config) {
  (void)config;
  return issue(kGather, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclGatherConfig)

SIM_API ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                                       const ncclCollConfig_t* config) {
  (void)config;
  return issue(kScatter, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_ALIAS(ncclScatterConfig)
