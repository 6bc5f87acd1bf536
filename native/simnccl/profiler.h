/*
 * NCCL profiler plugin support (the v5 interface, c4d/profiler_abi.h): loaded once per
 * process the way NCCL loads it, init per communicator, events emitted by the stream
 * worker as modeled time passes (timeline.h).
 */
#ifndef SIMNCCL_PROFILER_H
#define SIMNCCL_PROFILER_H

#include <vector>

#include "timeline.h"

struct ncclComm;

namespace sim {

void profiler_comm_init(ncclComm* c);     /* host thread, after the comm is complete */
void profiler_comm_finalize(ncclComm* c); /* host thread, at destroy */
/* Does any op of the group belong to a comm with a live plugin context? */
bool profiler_active(const std::vector<TimedOp>& ops);
/* wait_timeline's body when a plugin listens (stream worker). */
void profiler_run_timeline(std::vector<TimedOp>& ops);

}  // namespace sim

#endif  // SIMNCCL_PROFILER_H
