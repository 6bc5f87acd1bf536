/*
 * Communicator lifecycle: registering comms in the comm table, their ids, and the
 * C4D_REC_COMM record of every lifecycle call. Runs on the application thread inside
 * the init/split/destroy hooks, under g_init_mutex (never on the op hot path, except
 * comm_refresh once for a comm created non-blocking).
 *
 * Comm ids are equal on every rank of a communicator (FNV-1a 64, little-endian fields):
 *   InitRank, InitRankConfig : the 128 bytes of the ncclUniqueId
 *   InitRankScalable         : the 128 bytes of the first ncclUniqueId
 *   Split                    : parent id (u64), the parent's split counter before this
 *                              split (u32; NOCOLOR calls count), color (i32)
 *   Shrink                   : parent id (u64), 0x80000000 | the parent's shrink counter
 *                              (u32), the number of excluded ranks (i32), then the excluded
 *                              ranks (i32 each, in the order passed)
 *   InitAll                  : hostname bytes, pid (i32), process InitAll counter (u32)
 * Split and Shrink agree byte for byte with the commId simnccl hands the profiler plugin
 * (native/include/c4d/profiler_abi.h); InitAll's clique lives in one process, so any
 * process-unique id will do.
 */
#ifndef C4D_SHIM_LIFECYCLE_H
#define C4D_SHIM_LIFECYCLE_H

#include <stdint.h>

#include "c4d/nccl_abi.h"
#include "comm_table.h"

namespace c4d {

uint64_t id_of_unique_id(const ncclUniqueId* id);
uint64_t id_of_split(uint64_t parent_id, uint32_t split_index, int color);
uint64_t id_of_shrink(uint64_t parent_id, uint32_t shrink_index, const int* excluded, int n_excluded);
uint64_t id_of_init_all();  // advances the process counter

/* After a creating call returned: registers *out (when the call made a comm) and emits
 * the COMM record (also for failures). Hints are what the call's arguments say; the
 * real NCCL is asked first. device_hint -1: the calling thread's current device. */
void comm_created(uint8_t event, const ncclComm_t* out, ncclResult_t r, uint64_t id, uint64_t parent_id, int color,
                  int key, int rank_hint, int nranks_hint, int device_hint);

/* After finalize/destroy/abort (or revoke/suspend/resume, remove = false) returned. `slot` was looked up before the call (NCCL
 * may reuse the handle's memory as soon as it returns). remove: drop the handle from
 * the table. */
void comm_ended(uint8_t event, ncclComm_t comm, CommSlot* slot, ncclResult_t r, bool remove);

/* For a comm whose shape is not known yet (made nonblocking, or NCCL refused the queries):
 * once it is settled (`is_settled`, else NCCL's async error is asked), retry the rank/size/
 * device queries; try-lock (a busy init mutex means "next time"), at most 64 queries per
 * comm. Hot path (an op on such a comm) or ncclCommGetAsyncError's hook. */
void comm_refresh(CommSlot* c, bool is_settled);

}  // namespace c4d

#endif  // C4D_SHIM_LIFECYCLE_H
