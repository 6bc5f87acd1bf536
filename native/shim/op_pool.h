/*
 * Op slots: the hand-off between an application thread and the agent. A fixed array of
 * C4D_QUEUE_CAPACITY slots, a lock-free free list and a lock-free FIFO "ready" ring:
 *
 *   app thread:  i = take()  → fill the slot → submit(i) → (later) state = RETURNED
 *   agent:       next_ready(&i) → poll until done → build the record → release(i)
 *
 * Lanes. The free list and the ready ring are lines every calling thread and the agent
 * write with a locked read-modify-write: with threads on several cores each op waited for
 * those lines to cross (8 threads on 8 communicators, bench_shim). So the first kLanes
 * threads that issue ops each get a lane of their own: a ready ring only that thread
 * writes and a ring of free slots only the agent writes (SpscRing: plain stores), and the
 * agent gives a slot back to the lane it came from. A thread without a lane (more threads,
 * or a lane ring full) takes the shared path, which stays as it was. A thread's exit hands
 * its lane back (the agent returns the lane's free slots to the shared list).
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
  uint8_t lane;        // the taker's lane (kNoLane: the shared lists), where the agent frees it
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

constexpr uint32_t kLanes = 16;
constexpr uint8_t kNoLane = 0xff;
/* Cells per lane ring: a quarter of the pool's capacity (16,384 at the default 65,536: a
 * thread's ops of 5 ms between the agent's drains at 3 M calls/s), within these bounds. */
constexpr uint32_t kLaneCellsMin = 1024, kLaneCellsMax = 65536;
constexpr uint32_t kStash = 16;         // slots a lane takes from the shared lists at once

/* One thread's own way to and from the agent. */
struct Lane {
  SpscRing ready;  // owner → agent: submitted slots
  SpscRing free;   // agent → owner: freed slots (a kept pair in kept_a/kept_b, or kNone)
  enum : uint32_t { kFree = 0, kOwned = 1, kLeft = 2 };
  alignas(64) std::atomic<uint32_t> owner;  // kFree → kOwned (a thread's first op) → kLeft (its exit) → kFree (agent)
  /* The owner's alone (the agent's once it left): slots taken from the shared lists in
   * one go, each with a pair in kept_a/kept_b (or kNone) and its device; used in the
   * order taken, [stash_at, stash_end), which is mostly ascending memory: the hardware
   * prefetcher follows (taken last-first, an op cost 30 ns more, bench_shim 1 thread). */
  alignas(64) uint32_t stash[kStash];
  uint32_t stash_at, stash_end;
};

class OpPool {
 public:
  bool init(uint32_t capacity);  // power of two
  void reset();                  // fork child / re-init: every slot free
  /* Any thread. kNone when exhausted. */
  uint32_t take() { return free_.pop(); }
  /* The taker hands a filled slot to the agent: through its lane (kNoLane: none), else the
   * shared ring, which has room for every slot and one consumer, so this does not fail; if
   * it ever did, the caller drops the op (releases the slot) rather than wait. */
  bool submit(uint32_t i, uint8_t lane = kNoLane) {
    return (lane < kLanes && lanes_[lane].ready.push(i)) || ready_.push(i);
  }
  /* Agent only (the ring's single consumer: with several, Vyukov's ring can refuse a
   * push while a slow consumer is mid-pop). The next submitted slot, FIFO. */
  bool next_ready(uint32_t* i) { return ready_.pop(i); }
  /* Agent (or a taker that gave up before submit). */
  void release(uint32_t i) {
    slots_[i].state.store(0, std::memory_order_relaxed);
    free_.push(i);
  }
  OpSlot& at(uint32_t i) { return slots_[i]; }

  /* The calling thread's lane, claimed at its first op (kNoLane when every lane is taken);
   * `claimed` is the thread's own memo in its TLS (ThreadState::lane: 0 not yet, kNoLane
   * none, else lane + 1), which its exit rewrites. */
  uint8_t lane_of(uint8_t* claimed) {
    if (*claimed) return *claimed == kNoLane ? kNoLane : uint8_t(*claimed - 1);
    return claim_lane(claimed);
  }
  Lane& lane(uint8_t l) { return lanes_[l]; }
  /* Taker with a lane: a slot the agent freed into it (kNone when none). */
  uint32_t take_own(uint8_t l) {
    uint32_t i;
    return lanes_[l].free.pop(&i) ? i : kNone;
  }
  /* Up to `max` free slots at once (one operation on the shared list); how many. */
  uint32_t take_many(uint32_t* out, uint32_t max) { return free_.pop_many(out, max); }
  /* Agent: the slot back to its taker's lane while that thread lives, else false. */
  bool give_back(uint32_t i) {
    const uint8_t l = slots_[i].lane;
    return l < kLanes && lanes_[l].owner.load(std::memory_order_relaxed) == Lane::kOwned && lanes_[l].free.push(i);
  }
  /* Agent: lanes ever claimed ([0, n) to drain). */
  uint32_t lanes_used() const { return lanes_used_.load(std::memory_order_acquire); }
  /* Agent: a lane whose thread exited: its free slots to `to_shared`, the lane free again. */
  template <typename Fn>
  void reclaim(uint8_t l, Fn to_shared) {
    Lane& ln = lanes_[l];
    if (ln.owner.load(std::memory_order_acquire) != Lane::kLeft) return;
    uint32_t i;
    while (ln.free.pop(&i)) to_shared(i);
    while (ln.stash_at < ln.stash_end) to_shared(ln.stash[ln.stash_at++]);
    ln.owner.store(Lane::kFree, std::memory_order_release);
  }
  /* The calling thread's exit (pthread key destructor): its lane is the agent's to reclaim. */
  void leave_lane(uint8_t l) { lanes_[l].owner.store(Lane::kLeft, std::memory_order_release); }
  /* Agent only. */
  AgentOp& agent_of(const OpSlot& s) { return agent_[&s - slots_]; }
  uint32_t capacity() const { return cap_; }

 private:
  OpSlot* slots_ = nullptr;
  AgentOp* agent_ = nullptr;
  uint32_t cap_ = 0;
  IndexStack free_;
  IndexRing ready_;
  Lane* lanes_ = nullptr;
  std::atomic<uint32_t> lanes_used_{0};
  uint8_t claim_lane(uint8_t* claimed);
};

extern OpPool g_ops;

}  // namespace c4d

#endif  // C4D_SHIM_OP_POOL_H
