/*
 * The time model: how long an op takes on the modeled network, and the wait for it.
 *
 * Ring algorithm on the comm's ring (comm rank i -> i+1): allreduce 2(n-1) steps of
 * bytes/n, allgather/reducescatter n-1 steps of one rank's share, broadcast/reduce a
 * pipeline of k chunks along the chain from/to the root (n-1+k-1 steps), alltoall/
 * gather/scatter n-1 steps over direct links, send/recv one step on the direct link.
 * A step takes latency + chunk / bw, and the slowest link the op uses sets the pace
 * of every step (one slow link slows the whole collective, as on hardware); a hung
 * link (comm-hang) makes the op never finish. Every rank derives the same numbers
 * from the same inputs: the members' global ranks, the op, the max step published,
 * and a jitter factor hashed from (comm rank 0's SIMNCCL_SEED, comm id, seq).
 *
 * Per-rank transfers (`mine`) are what the profiler plugin sees: step s of a transfer
 * starts at t0 + s * step_ns and moves its chunk in (lat + chunk / bw(link)) * jitter,
 * so on a slow link those steps are slow and on a hung link they never end. A transfer
 * that forwards data (a ring's, a chain's) stops where its data stops: in a ring, step s
 * of link i -> i+1 forwards what link i-1 -> i moved at step s-1, so a link d hops after
 * a hung one completes d steps and waits for the next (the ring's data dependency: NCCL's
 * src/device/all_reduce.h runRing sends its own chunk, then recvReduceSend / recvCopySend
 * forward what arrived); a chain's links after a hung one move nothing. Transfers that
 * nothing upstream feeds (alltoall, gather, scatter, p2p) finish on time.
 */
#ifndef SIMNCCL_TIMELINE_H
#define SIMNCCL_TIMELINE_H

#include <cstdint>
#include <vector>

#include "ops.h"

namespace sim {

constexpr uint64_t kNever = UINT64_MAX;

struct Transfer {
  int peer;      /* comm rank of the other end */
  bool is_send;  /* this rank sends to peer */
  int first_step;
  int nsteps;
  uint64_t step_bytes;
  uint64_t move_ns; /* duration of each of its steps; kNever on a hung link */
  int done_steps;   /* steps it completes: nsteps, or fewer behind a hung link (see model_coll) */
};

struct Schedule {
  uint64_t t0 = 0;      /* step 0 starts: last arrival (collectives), both ends arrived (p2p) */
  uint64_t step_ns = 0; /* pace of every step */
  int total_steps = 0;
  uint64_t finish = 0; /* t0 + total_steps * step_ns; kNever if a link is hung */
  std::vector<Transfer> mine;
};

/* bytes_unit: count * dtype size, i.e. the per-rank buffer (allreduce, broadcast,
 * reduce) or one rank's share (allgather, reducescatter, alltoall, gather, scatter). */
Schedule model_coll(const ncclComm* c, int kind, uint64_t bytes_unit, int root, int step, uint64_t seq,
                    uint64_t t0);
/* One p2p transfer src -> dst (comm ranks); `me` tells which end is asking. */
Schedule model_p2p(const ncclComm* c, int src, int dst, bool me_is_src, uint64_t bytes, int step, uint32_t idx,
                   uint64_t t0);

struct TimedOp {
  const OpDesc* op;
  Schedule sched;
};

/* Sleeps until every op's finish (forever, while the comm is not aborted, if one is
 * hung); hands each op's schedule to its ProxyOps (profiler.h) and waits for them. */
void wait_timeline(std::vector<TimedOp>& ops);

}  // namespace sim

#endif  // SIMNCCL_TIMELINE_H
