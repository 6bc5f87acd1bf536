/*
 * The NCCL profiler plugin inside libc4d.so, and the PEER records it feeds.
 *
 *  NCCL's proxy thread (simnccl: a stream worker)         agent thread (agent.cc)
 *  ───────────────────────────────────────────────        ──────────────────────────────────────
 *  init(ctx, commId, mask, ..., nranks, rank)   per comm    every loop  peer_poll: completion ring →
 *    context slot; mask = Coll|P2p|ProxyOp|ProxyStep                     one done=1 PEER record each,
 *  startEvent Coll/P2p      → Task  ┐ pooled, bounded                    transfer slot recycled;
 *  stopEvent  Coll/P2p: task kept   │ (C4D_PEER_TRACK);                  task_retire: stopped tasks
 *    (its ProxyOps start later)     │                                    2 s old (or crowding) freed
 *  startEvent ProxyOp       → Xfer  │                      every heartbeat peer_heartbeat: a done=0
 *     one Xfer per (task, peer, direction): the channels  │ exhausted → handle   record per transfer still
 *     of one transfer join it, nSteps summed              │ NULL, counted        in flight
 *  startEvent ProxyStep     → Step  ┘                      every drained op  peer_note_op: the per-comm
 *  recordEventState(step)  : state, transSize, last_ns                     sequence maps below
 *  stopEvent(step)         : steps_done, bytes_done
 *  stopEvent(ProxyOp)      : last open ProxyOp of the Xfer → DONE → completion ring (lock-free)
 *
 * Callbacks allocate nothing, take no lock and do no I/O: pool entries come from lock-free
 * FIFO free rings (a late event naming a freed entry finds it unrecycled for as long as
 * possible), progress is kept in atomics the agent reads, and every callback returns
 * ncclSuccess. init (per communicator, not on the proxy thread) may allocate.
 *
 * Which communicator a context is. simnccl passes init the very id the shim computes for
 * the comm (c4d/profiler_abi.h), so a context maps to the comm slot with that id. Real
 * NCCL passes its own commHash instead; then the k-th context created in this process with
 * (nranks, rank) maps to the k-th comm slot registered with the same (nranks, rank) whose
 * id no context claimed: NCCL calls init inside the init call the shim hooks, so both see
 * communicators in the same creation order (inits racing on several threads with equal
 * shapes could swap; ncclCommInitAll's comms differ in rank). Resolved by the agent,
 * lazily; unresolved, a record carries the profiler's commId.
 *
 * PEER seq (what c4d_peer_record.seq holds): the shim's own seq of the same op, the one its
 * OP records carry.
 *   collective: the profiler's Coll seqNumber counts from 0 (simnccl: seqNumber = the shim
 *     seq exactly, verified by tests/test_shim_profiler.py) over the calls that enqueued
 *     work, so not over count = 0 calls, which the shim numbers too. NCCL counts per
 *     (comm, function) (comm->seqNumber[func]); simnccl counts per comm. The first Coll
 *     of a second function tells which (seqNumber 0: per function), per context; until
 *     then both agree. Per comm: seq = seqNumber + the count = 0 collectives the shim saw
 *     at or below it. Per function: seq = the shim seq of the seqNumber-th count > 0 call
 *     of that function on the comm (the agent keeps the last 256 per function), or
 *     UINT64_MAX when unknown (older, or OP records were dropped before the agent saw them).
 *   p2p: the ordinal of this P2p event on (comm, direction, peer), from 0 — the shim's p2p
 *     seq of that (comm, direction, peer) when every Send/Recv the application issued
 *     reached the profiler (simnccl: count > 0; an NCCL that implements AlltoAll/Gather/
 *     Scatter with p2p shows those as P2p events the shim numbers as collectives).
 *   a context not resolved to a comm: seqNumber / the ordinal as is, with the profiler's
 *     commId.
 *
 * Completion: a transfer is done when the last ProxyOp that joined it stops. On real NCCL
 * a channel whose ProxyOp starts after the others of the same transfer finished gives a
 * second done record for the same (seq, peer, direction): readers sum them.
 */
#ifndef C4D_SHIM_PROFILER_H
#define C4D_SHIM_PROFILER_H

#include <stdint.h>

namespace c4d {

struct OpSlot;

/* Agent: appends one 128-byte record to the outgoing batch. */
using RecordSink = void (*)(const void* record);

/* Agent: takes the op slots submitted since its last drain (each one through peer_note_op);
 * true when there were any. */
using OpsCatchUp = bool (*)();

/* Agent, for every op slot it drains (submission order): feeds the seq maps. */
void peer_note_op(const OpSlot& s);

/* Agent, every loop: completed transfers → done=1 PEER records. True when any. A record
 * whose op the agent has not taken yet calls take_ops first. */
bool peer_poll(RecordSink emit, OpsCatchUp take_ops);

/* Agent, every heartbeat: one done=0 PEER record per transfer in flight; transfers of
 * finalized contexts are reported one last time and dropped. */
void peer_heartbeat(RecordSink emit, OpsCatchUp take_ops);

/* Agent, every heartbeat: one line the first time the profiler saw collectives that no
 * hook saw (NCCL called through a handle that bypasses the preload). */
void peer_blind_spots();

/* Agent: the summary line's profiler part ("" when the plugin was never initialised). */
void peer_summary(char* out, unsigned cap);

/* Fork child: every context and transfer belongs to the parent's communicators. */
void profiler_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_PROFILER_H
