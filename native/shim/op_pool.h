/*
 * Op slots: the hand-off between an application thread and the agent. A fixed array of
 * C4D_QUEUE_CAPACITY slots, a lock-free free list and a lock-free FIFO "ready" ring:
 *
 *   app thread:  i = take()  → fill the slot → submit(i) → (later) state = RETURNED
 *   agent:       next_ready(&i) → poll until done → build the record → release(i)
 *
 * A slot is submitted before the real NCCL call, so an op whose host call blocks (a
 * stuck group launch, a hang inside NCCL) is still visible to the agent; the fields
 * the call's return provides follow with a release store of `state`. Full (every slot
 * queued or in flight) → take() fails: the op is dropped and counted, never waited for.
 */
#ifndef C4D_SHIM_OP_POOL_H
#define C4D_SHIM_OP_POOL_H

#include <stdint.h>

#include <atomic>

#include "queue.h"

namespace c4d {

enum SlotKind : uint8_t { kSlotOp = 1, kSlotComm = 2 };

/* OpSlot.state: what the app thread has published so far. */
enum SlotState : uint32_t {
  kLaunched = 2,  // ev_start/ev_end set and the start event recorded (or no events)
  kReturned = 3,  // the NCCL call (or the group's ncclGroupEnd) returned: return_ns, result, end event
};

/* kSlotComm entries (lifecycle records) reuse the op fields: op = c4d_comm_event,
 * seq = comm id, count = parent id, stream = handle, peer = color, group_id = key,
 * bytes = rank << 32 | nranks, device, result, issue_ns = time of the call's return. */
/* What the application thread writes, in two cache lines (alignas 64, 128 bytes): an
 * op touches only these, and the agent only reads them (AgentOp holds what it writes). */
struct alignas(64) OpSlot {
  std::atomic<uint32_t> state;
  /* set before submit(), then read-only */
  uint8_t kind;   // SlotKind
  uint8_t op;     // c4d_op_kind (kSlotOp) or c4d_comm_event (kSlotComm)
  uint8_t dtype;
  uint8_t redop;
  uint8_t flags;  // c4d_op_flags known at issue
  /* set before state = kReturned */
  uint8_t late_flags;  // NO_EVENT / EVENT_ERROR found after submit
  uint32_t comm;  // comm slot index
  int32_t peer;
  int32_t device;
  uint64_t seq;
  uint64_t issue_ns;  // a stamp (timing.h) until the agent's drain converts it
  uint64_t count;
  uint64_t bytes;
  uint64_t stream;
  uint64_t group_id;
  /* set before state = kLaunched */
  uint32_t ev_start, ev_end;  // EventPool indices, kNone without
  /* set before state = kReturned */
  int32_t result;
  uint64_t return_ns;  // a stamp until the agent's finish_op converts it
  /* the issuing thread only, before submit: its group's chain and event pair */
  uint32_t next;
  uint32_t pair;
  /* While the slot is on an event pool's kept list (event_pool.h): the pair it keeps. */
  uint32_t kept_a, kept_b;
};
static_assert(sizeof(OpSlot) == 128, "an op slot is two cache lines");

/* The agent's own per-slot state, beside the slots (reset by the agent when it takes a
 * slot from the ready ring): the app thread never touches these lines. */
struct AgentOp {
  uint8_t arrived;
  uint8_t agent_flags;
  uint64_t start_ns, end_ns;
};

class OpPool {
 public:
  bool init(uint32_t capacity);  // power of two
  void reset();                  // fork child / re-init: every slot free
  /* Any thread. kNone when exhausted. */
  uint32_t take() { return free_.pop(); }
  /* The taker hands a filled slot to the agent. The ring has room for every slot and
   * has one consumer, so this does not fail; if it ever did, the caller drops the op
   * (releases the slot) rather than wait. */
  bool submit(uint32_t i) { return ready_.push(i); }
  /* Agent only (the ring's single consumer: with several, Vyukov's ring can refuse a
   * push while a slow consumer is mid-pop). The next submitted slot, FIFO. */
  bool next_ready(uint32_t* i) { return ready_.pop(i); }
  /* Agent (or a taker that gave up before submit). */
  void release(uint32_t i) {
    slots_[i].state.store(0, std::memory_order_relaxed);
    free_.push(i);
  }
  OpSlot& at(uint32_t i) { return slots_[i]; }
  /* Agent only. */
  AgentOp& agent_of(const OpSlot& s) { return agent_[&s - slots_]; }
  uint32_t capacity() const { return cap_; }

 private:
  OpSlot* slots_ = nullptr;
  AgentOp* agent_ = nullptr;
  uint32_t cap_ = 0;
  IndexStack free_;
  IndexRing ready_;
};

extern OpPool g_ops;

}  // namespace c4d

#endif  // C4D_SHIM_OP_POOL_H
