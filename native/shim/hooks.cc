/*
 * Every NCCL entry point c4d interposes. Each hook does four things, in order:
 *   1. its original, looked up once (C4D_ORIGINAL, real_nccl.h);
 *   2. recording? — the shim is active and this is the application's call, not NCCL
 *      calling its own public symbol (HookScope);
 *   3. constant-time hand-off to the agent (recorder.cc; lifecycle.cc for comms);
 *   4. the original itself, whose result is returned untouched.
 * Exported through exports.map; everything else in libc4d.so is hidden.
 */
#include <atomic>

#include "c4d/nccl_abi.h"
#include "c4d/record.h"
#include "comm_table.h"
#include "lifecycle.h"
#include "real_nccl.h"
#include "recorder.h"
#include "shim.h"

#define C4D_HOOK extern "C" __attribute__((visibility("default")))

namespace {

using c4d::OpDesc;

inline uint8_t inplace(const void* send, const void* recv) { return send == recv ? C4D_OPF_INPLACE : 0; }

/* Steps 2–4 for one operation. */
template <typename Fn, typename... Args>
inline ncclResult_t record_op(Fn real, const OpDesc& d, Args... args) {
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() != c4d::kActive) return real(args...);
  c4d::OpTicket k = c4d::op_begin(g.thread(), d);
  ncclResult_t r = real(args...);
  if (r == ncclInProgress && !k.grouped)
    c4d::op_deferred(g.thread(), k);  // a nonblocking comm: launched later, end event once settled
  else
    c4d::op_end(k, r);
  return r;
}

constexpr uint8_t kNoOp = c4d::kNoRedOp;
constexpr uint8_t kCfg = C4D_OPF_CONFIG_CALL;

}  // namespace

/* ------------------------------------------------------------------ collectives */

C4D_HOOK ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclAllReduce);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_ALLREDUCE, uint8_t(datatype), uint8_t(op), f, -1, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

C4D_HOOK ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclBroadcast);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_BROADCAST, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

C4D_HOOK ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
  C4D_ORIGINAL(ncclBcast);
  const OpDesc d{C4D_OP_BROADCAST, uint8_t(datatype), kNoOp, C4D_OPF_INPLACE, root, count, comm, stream};
  return record_op(real, d, buff, count, datatype, root, comm, stream);
}

C4D_HOOK ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclReduce);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_REDUCE, uint8_t(datatype), uint8_t(op), f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

C4D_HOOK ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclAllGather);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_ALLGATHER, uint8_t(datatype), kNoOp, f, -1, sendcount, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

C4D_HOOK ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclReduceScatter);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_REDUCESCATTER, uint8_t(datatype), uint8_t(op), f, -1, recvcount, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

C4D_HOOK ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclAlltoAll);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_ALLTOALL, uint8_t(datatype), kNoOp, f, -1, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, comm, stream);
}

C4D_HOOK ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclGather);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_GATHER, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

C4D_HOOK ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclScatter);
  const uint8_t f = inplace(sendbuff, recvbuff);
  const OpDesc d{C4D_OP_SCATTER, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

/* ------------------------------------------------------ per-call config variants */

C4D_HOOK ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclAllReduceConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_ALLREDUCE, uint8_t(datatype), uint8_t(op), f, -1, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, op, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclBroadcastConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_BROADCAST, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                                       const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclReduceConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_REDUCE, uint8_t(datatype), uint8_t(op), f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, op, root, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclAllGatherConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_ALLGATHER, uint8_t(datatype), kNoOp, f, -1, sendcount, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream, const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclReduceScatterConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_REDUCESCATTER, uint8_t(datatype), uint8_t(op), f, -1, recvcount, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclAlltoAllConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_ALLTOALL, uint8_t(datatype), kNoOp, f, -1, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclGatherConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_GATHER, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

C4D_HOOK ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  C4D_ORIGINAL(ncclScatterConfig);
  const uint8_t f = uint8_t(kCfg | inplace(sendbuff, recvbuff));
  const OpDesc d{C4D_OP_SCATTER, uint8_t(datatype), kNoOp, f, root, count, comm, stream};
  return record_op(real, d, sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

/* ------------------------------------------------------------ point to point */

C4D_HOOK ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  C4D_ORIGINAL(ncclSend);
  const OpDesc d{C4D_OP_SEND, uint8_t(datatype), kNoOp, C4D_OPF_P2P, peer, count, comm, stream};
  return record_op(real, d, sendbuff, count, datatype, peer, comm, stream);
}

C4D_HOOK ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  C4D_ORIGINAL(ncclRecv);
  const OpDesc d{C4D_OP_RECV, uint8_t(datatype), kNoOp, C4D_OPF_P2P, peer, count, comm, stream};
  return record_op(real, d, recvbuff, count, datatype, peer, comm, stream);
}

/* -------------------------------------------------------------------- groups */

C4D_HOOK ncclResult_t ncclGroupStart(void) {
  C4D_ORIGINAL(ncclGroupStart);
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() == c4d::kPassThrough) return real();
  ncclResult_t r = real();
  if (r == ncclSuccess) c4d::group_started(g.thread());
  return r;
}

C4D_HOOK ncclResult_t ncclGroupEnd(void) {
  C4D_ORIGINAL(ncclGroupEnd);
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() == c4d::kPassThrough) return real();
  return c4d::group_end(g.thread(), real);
}

C4D_HOOK ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  C4D_ORIGINAL(ncclGroupSimulateEnd);
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() == c4d::kPassThrough) return real(simInfo);
  return c4d::group_simulate_end(g.thread(), real, simInfo);
}

/* ------------------------------------------------------------- communicators */

C4D_HOOK ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  C4D_ORIGINAL(ncclCommInitRank);
  c4d::HookScope g;
  // Activate before the real call: a rank stuck in init still registers and heartbeats.
  if (!g.outer() || !c4d::shim_activate()) return real(comm, nranks, commId, rank);
  ncclResult_t r = real(comm, nranks, commId, rank);
  c4d::comm_created(C4D_COMM_INIT_RANK, comm, r, c4d::id_of_unique_id(&commId), 0, -1, -1, rank, nranks, -1);
  return r;
}

C4D_HOOK ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                             ncclConfig_t* config) {
  C4D_ORIGINAL(ncclCommInitRankConfig);
  c4d::HookScope g;
  if (!g.outer() || !c4d::shim_activate()) return real(comm, nranks, commId, rank, config);
  ncclResult_t r = real(comm, nranks, commId, rank, config);
  c4d::comm_created(C4D_COMM_INIT_RANK_CONFIG, comm, r, c4d::id_of_unique_id(&commId), 0, -1, -1, rank, nranks, -1);
  return r;
}

C4D_HOOK ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  C4D_ORIGINAL(ncclCommInitRankScalable);
  c4d::HookScope g;
  if (!g.outer() || !c4d::shim_activate()) return real(newcomm, nranks, myrank, nId, commIds, config);
  ncclResult_t r = real(newcomm, nranks, myrank, nId, commIds, config);
  uint64_t id = (nId > 0 && commIds) ? c4d::id_of_unique_id(&commIds[0]) : 0;
  c4d::comm_created(C4D_COMM_INIT_SCALABLE, newcomm, r, id, 0, -1, -1, myrank, nranks, -1);
  return r;
}

C4D_HOOK ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  C4D_ORIGINAL(ncclCommInitAll);
  c4d::HookScope g;
  if (!g.outer() || !c4d::shim_activate()) return real(comms, ndev, devlist);
  ncclResult_t r = real(comms, ndev, devlist);
  uint64_t id = c4d::id_of_init_all();  // one clique in one process: one id for all its comms
  for (int i = 0; comms && i < ndev; ++i)
    c4d::comm_created(C4D_COMM_INIT_ALL, &comms[i], r, id, 0, -1, -1, i, ndev, devlist ? devlist[i] : i);
  return r;
}

C4D_HOOK ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  C4D_ORIGINAL(ncclCommSplit);
  c4d::HookScope g;
  if (!g.outer() || !c4d::shim_activate()) return real(comm, color, key, newcomm, config);
  c4d::CommSlot* parent = c4d::comm_lookup(comm);
  uint64_t parent_id = parent ? parent->id : 0;
  uint32_t index = parent ? parent->split_count.fetch_add(1, std::memory_order_relaxed) : 0;
  int device = parent ? parent->device.load(std::memory_order_relaxed) : -1;
  ncclResult_t r = real(comm, color, key, newcomm, config);
  c4d::comm_created(C4D_COMM_SPLIT, newcomm, r, c4d::id_of_split(parent_id, index, color), parent_id, color, key, -1,
                    -1, device);
  return r;
}

C4D_HOOK ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  C4D_ORIGINAL(ncclCommShrink);
  c4d::HookScope g;
  if (!g.outer() || !c4d::shim_activate())
    return real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  c4d::CommSlot* parent = c4d::comm_lookup(comm);
  uint64_t parent_id = parent ? parent->id : 0;
  uint32_t index = parent ? parent->shrink_count.fetch_add(1, std::memory_order_relaxed) : 0;
  int device = parent ? parent->device.load(std::memory_order_relaxed) : -1;
  ncclResult_t r = real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  c4d::comm_created(C4D_COMM_SHRINK, newcomm, r,
                    c4d::id_of_shrink(parent_id, index, excludeRanksList, excludeRanksCount), parent_id, -1, -1, -1,
                    -1, device);
  return r;
}

/* Polled by the application (PyTorch after every call on a nonblocking comm, and by its
 * watchdog): passed through; once the comm settled, the calling thread's ops on it that
 * NCCL was still launching get their end events, and a comm made nonblocking its shape. */
C4D_HOOK ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  C4D_ORIGINAL(ncclCommGetAsyncError);
  c4d::HookScope g;
  ncclResult_t r = real(comm, asyncError);
  if (!g.outer() || r != ncclSuccess || !asyncError || *asyncError == ncclInProgress ||
      c4d::shim_mode() != c4d::kActive)
    return r;
  c4d::settle_deferred(g.thread(), comm, asyncError, false);
  c4d::CommSlot* s = c4d::comm_lookup(comm);
  if (s && !s->ready.load(std::memory_order_acquire)) c4d::comm_refresh(s, true);
  return r;
}

namespace {
/* Finalize, destroy, abort: the slot is looked up before the call, because NCCL may
 * reuse the handle's memory for another comm as soon as the call returns. */
template <typename Fn>
inline ncclResult_t end_comm(Fn real, uint8_t event, ncclComm_t comm, bool remove) {
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() != c4d::kActive) return real(comm);
  c4d::settle_deferred(g.thread(), comm, nullptr, true);  // last chance for ops still launching
  c4d::CommSlot* s = c4d::comm_lookup(comm);
  ncclResult_t r = real(comm);
  c4d::comm_ended(event, comm, s, r, remove);
  return r;
}
}  // namespace

C4D_HOOK ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  C4D_ORIGINAL(ncclCommFinalize);
  return end_comm(real, C4D_COMM_FINALIZE, comm, false);
}

C4D_HOOK ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  C4D_ORIGINAL(ncclCommDestroy);
  return end_comm(real, C4D_COMM_DESTROY, comm, true);
}

C4D_HOOK ncclResult_t ncclCommAbort(ncclComm_t comm) {
  C4D_ORIGINAL(ncclCommAbort);
  return end_comm(real, C4D_COMM_ABORT, comm, true);
}

/* -------------------------------------------- recent communicator management */

namespace {
/* Revoke, suspend, resume: the call, then its COMM record; the comm stays tracked. */
template <typename Fn, typename... Args>
inline ncclResult_t comm_event(Fn real, uint8_t event, ncclComm_t comm, Args... args) {
  c4d::HookScope g;
  if (!g.outer() || c4d::shim_mode() != c4d::kActive) return real(comm, args...);
  c4d::CommSlot* s = c4d::comm_lookup(comm);
  ncclResult_t r = real(comm, args...);
  c4d::comm_ended(event, comm, s, r, false);
  return r;
}
}  // namespace

C4D_HOOK ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  C4D_ORIGINAL(ncclCommRevoke);
  return comm_event(real, C4D_COMM_REVOKE, comm, revokeFlags);
}

C4D_HOOK ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  C4D_ORIGINAL(ncclCommSuspend);
  return comm_event(real, C4D_COMM_SUSPEND, comm, flags);
}

C4D_HOOK ncclResult_t ncclCommResume(ncclComm_t comm) {
  C4D_ORIGINAL(ncclCommResume);
  return comm_event(real, C4D_COMM_RESUME, comm);
}

/* Not tracked: the existing ranks (only the root holds the new unique id) and the new ones
 * (no parent) have nothing in common to name the grown comm by without talking. Passed
 * through and counted; the agent says so once. */
C4D_HOOK ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                   ncclComm_t* newcomm, ncclConfig_t* config) {
  C4D_ORIGINAL(ncclCommGrow);
  c4d::HookScope g;
  if (g.outer() && c4d::shim_mode() == c4d::kActive) c4d::count(c4d::g_counters.grown);
  return real(comm, nRanks, uniqueId, rank, newcomm, config);
}

/* ------------------------------------------------------- one-sided (RMA) ops */

/* Passed through and counted, not timed: a put/signal has no peer call to pair it with, and
 * a wait that never ends shows as the rank's next collective not arriving. The agent says
 * so once. */
C4D_HOOK ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                    unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  C4D_ORIGINAL(ncclPutSignal);
  if (c4d::shim_mode() == c4d::kActive) c4d::count(c4d::g_counters.one_sided);
  return real(localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream);
}

C4D_HOOK ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                 cudaStream_t stream) {
  C4D_ORIGINAL(ncclSignal);
  if (c4d::shim_mode() == c4d::kActive) c4d::count(c4d::g_counters.one_sided);
  return real(peer, sigIdx, ctx, flags, comm, stream);
}

C4D_HOOK ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                     cudaStream_t stream) {
  C4D_ORIGINAL(ncclWaitSignal);
  if (c4d::shim_mode() == c4d::kActive) c4d::count(c4d::g_counters.one_sided);
  return real(nDesc, signalDescs, comm, stream);
}
