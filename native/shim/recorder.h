/*
 * The hot path: what an interposed NCCL operation does besides calling NCCL.
 *
 *   op_begin  (before the real call): host clock → comm slot → sequence number → op slot
 *             → start event recorded on the op's stream → slot handed to the agent.
 *   op_end    (after it): end event recorded → return time and result → state RETURNED.
 *
 * No allocation, no lock, no syscall (clock_gettime is vDSO), no I/O. Inside
 * ncclGroupStart/End an op is filled into its slot at the call and chained to the
 * thread's group; at the outermost ncclGroupEnd, where NCCL launches them, the group's
 * ops get their sequence numbers (in issue order), one start event per distinct stream
 * and are handed over just before the real ncclGroupEnd, then one end event per stream
 * after it, shared by that stream's ops. ncclGroupSimulateEnd launches nothing: its
 * group's ops are let go unnumbered and unrecorded, as NCCL counts none of them.
 */
#ifndef C4D_SHIM_RECORDER_H
#define C4D_SHIM_RECORDER_H

#include <stdint.h>

#include "c4d/nccl_abi.h"
#include "c4d/record.h"

namespace c4d {

constexpr uint32_t kGroupStreams = 64;  // distinct streams per outermost group that get events
constexpr uint8_t kNoRedOp = 255;

/* Per-thread state (TLS, zero-initialised). */
struct ThreadState {
  int depth;                // hook nesting: only the outermost call is recorded
  int group_depth;          // ncclGroupStart nesting
  uint64_t group_id;        // of the current outermost group
  uint32_t group_n;         // ops chained in the current outermost group (head/tail valid when > 0)
  uint32_t group_numbered;  // how many of them (from the head) have their seq already
  uint32_t group_head, group_tail;  // op slots, issue order, linked by OpSlot::next
  uint32_t deferred_n;      // ops of this thread NCCL is still launching (ncclInProgress)
  uint32_t deferred_head, deferred_tail;  // their slots, issue order, linked by OpSlot::next
  uint8_t lane;             // OpPool::lane_of's memo: 0 not claimed yet
};

ThreadState* thread_state();

/* Re-entry guard: NCCL calls its own public symbols (ncclBcast → ncclBroadcast,
 * ncclCommInitAll → ncclGetUniqueId ...): only the application's call is recorded. */
class HookScope {
 public:
  HookScope() : t_(thread_state()) { outer_ = t_->depth++ == 0; }
  ~HookScope() { --t_->depth; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
  bool outer() const { return outer_; }
  ThreadState* thread() const { return t_; }

 private:
  ThreadState* t_;
  bool outer_;
};

struct OpDesc {
  uint8_t op;     // c4d_op_kind
  uint8_t dtype;  // ncclDataType_t
  uint8_t redop;  // ncclRedOp_t or kNoRedOp
  uint8_t flags;  // C4D_OPF_P2P / INPLACE / CONFIG_CALL
  int32_t peer;   // root, p2p peer or -1
  uint64_t count;
  ncclComm_t comm;
  cudaStream_t stream;
};

struct OpTicket {
  uint32_t slot;      // op slot, kNone when not recorded
  uint32_t ev_end;    // end event to record after the call, kNone without
  void* pool;         // EventPool of ev_end
  cudaStream_t stream;
  bool grouped;       // events come at the outermost ncclGroupEnd
};

OpTicket op_begin(ThreadState* t, const OpDesc& d);
void op_end(const OpTicket& k, ncclResult_t r);

/* Nonblocking communicators. A call that returns ncclInProgress has its work launched later
 * by an NCCL helper thread (NCCL 2.30.7 src/group.cc groupLaunchNonBlocking), so the end
 * event can't be recorded when the call returns: it would land on the stream before the
 * kernel. The op waits on its thread's deferred list until ncclCommGetAsyncError says the
 * comm settled (the launch is over; the application polls it, as PyTorch does), and then
 * its end event is recorded: the op's end is enqueue-bounded from below by that moment.
 * settle_deferred is called with the result the application got (its own poll), or asks
 * NCCL itself (`ae` null) before the thread's next op on that comm or its destroy. `last`:
 * the comm goes away; ops still in progress keep host times only. */
void op_deferred(ThreadState* t, const OpTicket& k);
void settle_deferred(ThreadState* t, ncclComm_t comm, const ncclResult_t* ae, bool last);

/* Group bookkeeping around the real ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd. */
void group_started(ThreadState* t);
ncclResult_t group_end(ThreadState* t, ncclResult_t (*real)());
ncclResult_t group_simulate_end(ThreadState* t, ncclResult_t (*real)(ncclSimInfo_t*), ncclSimInfo_t* info);

/* Fork child: the forking thread's group table is the parent's. */
void recorder_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_RECORDER_H
