/*
 * NCCL profiler plugin support (the v5 interface, c4d/profiler_abi.h), in NCCL's order:
 *
 *   host thread (ncclGroupEnd / a bare op)        proxy progress thread (one per process)
 *   ──────────────────────────────────────        ───────────────────────────────────────
 *   profiler_enqueue: per op of the group          picks posted ProxyOps up later:
 *     startEvent Coll / P2p                          startEvent ProxyOp (parentObj = the
 *     ProxyOps posted (network transfers only)        task handle, already stopped)
 *     stopEvent Coll / P2p   ─── post ───────────►  waits for the op's schedule, then
 *                                                    ProxyStep start/state/stop as modeled
 *   stream worker: profiler_publish(schedule) ───►   time passes; ProxyOp stop after the
 *                  profiler_wait (the kernel ends     last step
 *                  after its network transfers)
 *
 * NCCL 2.30.7: src/enqueue.cc hostStreamPlanTask (ncclProfilerStartTaskEvents →
 * ncclProxyStart → ncclProfilerStopTaskEvents on the launching thread) and src/proxy.cc
 * (ProxyOp events started by ncclProxyOpToArgs when the progress thread appends posted
 * ops, ncclProxyGetPostedOps). Transfers between ranks of one node (SIMNCCL_RANKS_PER_NODE)
 * stand for NVLink/P2P/SHM, which run in the kernel with no proxy: no ProxyOp, no
 * ProxyStep (NVIDIA/nccl plugins/profiler/README.md, "Known Limitations").
 */
#ifndef SIMNCCL_PROFILER_H
#define SIMNCCL_PROFILER_H

#include <vector>

#include "timeline.h"

struct ncclComm;

namespace sim {

struct ProxySet; /* one op's posted ProxyOps, shared by the stream worker and the proxy thread */

void profiler_comm_init(ncclComm* c);     /* host thread, after the comm is complete */
void profiler_comm_finalize(ncclComm* c); /* host thread, at destroy: drops the comm's ProxyOps */

/* Launching thread, for the ops of one group (or one bare op) in order: task events and
 * proxy posts as above; sets op.proxy for ops with network transfers to profile.
 * `persistent`: a CUDA graph replay (the per-function seqNumber is not advanced, as NCCL
 * does for persistent plans). */
void profiler_enqueue(std::vector<OpDesc>& ops, bool persistent);

/* Stream worker: the op's modeled schedule is known (its ProxySteps may start). Once per
 * op: a later call is ignored (a collective publishes as soon as every member arrived). */
void profiler_publish(ProxySet* p, const Schedule& s);
/* Stream worker: until the proxy thread finished the op's ProxyOps or the comm is aborted. */
void profiler_wait(ProxySet* p, ncclComm* c);
/* Stream worker: done with the op (its ProxyOps are dropped if the schedule never came). */
void profiler_release(ProxySet* p);

}  // namespace sim

#endif  // SIMNCCL_PROFILER_H
