/*
 * Communicators over POSIX shared memory.
 *
 * One communicator = one control segment `/simnccl-<job>-<hex>` (header, one Member
 * per rank, one P2PChan per ordered rank pair) plus one data segment per rank,
 * `<control>-d<rank>`, which only its owner writes: a rank publishes its input there
 * and peers read it (mapped lazily, remapped when the owner grew it). A member bumps
 * its own `bell` after changing its state and futex-wakes it if someone sleeps there;
 * a rank waiting for "every member reached X" sleeps on the bell of the first member
 * that has not (so each change wakes only the ranks waiting for that member). Waiters
 * re-check at least every 20 ms: a dead peer leaves them asleep, never spinning.
 *
 * Names: ncclGetUniqueId writes "/simnccl-<SIMNCCL_JOB>-<16 hex>" into the id, so the
 * launcher can delete /dev/shm/simnccl-<job>-* after a crash. A split child is named
 * from the parent's name prefix and a hash of (parent comm id, split index, color), so
 * every member computes the same name without talking.
 */
#ifndef SIMNCCL_COMM_H
#define SIMNCCL_COMM_H

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "c4d/nccl_abi.h"

namespace sim {

constexpr int kCollRing = 16; /* collectives a member may have published and not finished */
constexpr int kP2PRing = 16;  /* sends in flight per ordered pair */
constexpr uint64_t kCtlMagic = 0x53494d4e43434c31ull; /* "SIMNCCL1" */
constexpr uint32_t kCommMagic = 0x434f4d4du;          /* "COMM": a live ncclComm */

struct alignas(64) CollSlot {
  std::atomic<uint64_t> pub_seq;  /* collective seq published in this slot (0: none) */
  std::atomic<uint64_t> read_seq; /* seq whose peer inputs this member finished reading */
  std::atomic<uint64_t> red_seq;  /* two-stage ops: seq whose chunk this member has reduced */
  uint64_t offset;                /* of the input in the member's data segment */
  uint64_t bytes;                 /* input bytes published */
  uint64_t arrive_ns;             /* CLOCK_MONOTONIC when the member's stream reached the op */
  uint64_t count;
  int32_t step; /* training step the op was issued in (simSetStep) */
  int32_t root;
  uint8_t op, dtype, redop, pad;
};

struct SplitSlot {
  std::atomic<uint32_t> seq; /* 1-based split index this entry belongs to */
  int32_t color, key, pad;
};

struct alignas(64) Member {
  std::atomic<uint32_t> bell;    /* futex word: bumped whenever this member changes its state */
  std::atomic<uint32_t> waiters; /* peers asleep on `bell`: the owner skips the wake if none */
  std::atomic<uint32_t> joined;
  int32_t global_rank, pid, device;
  std::atomic<uint64_t> data_cap; /* current size of this member's data segment */
  uint64_t seed;                  /* SIMNCCL_SEED of the member; comm rank 0's is used */
  SplitSlot split[2];             /* split k uses split[k % 2] (see comm.cc: why 2 suffice) */
  CollSlot coll[kCollRing];       /* collective seq s uses coll[s % kCollRing] */
};

struct P2PDesc {
  uint64_t offset, bytes; /* sender's data segment */
  uint64_t arrive_ns;     /* sender's stream reached the send */
  std::atomic<uint64_t> start_ns, finish_ns; /* set by the receiver: modeled transfer */
  int32_t step, pad;
};

struct alignas(64) P2PChan {
  std::atomic<uint32_t> posted; /* sends published (sender) */
  std::atomic<uint32_t> acked;  /* sends consumed (receiver) */
  P2PDesc ring[kP2PRing];
};

struct alignas(64) CtlHeader {
  std::atomic<uint64_t> magic;
  std::atomic<int32_t> nranks;
  std::atomic<uint32_t> bell; /* futex word: bumped when a rank joins */
  std::atomic<uint32_t> njoined;
  std::atomic<uint32_t> ndetached;
};

}  // namespace sim

/* ncclComm_t points at this; private to simnccl. */
struct ncclComm {
  uint32_t magic = sim::kCommMagic; /* from allocation on: a nonblocking init hands the comm out at once */
  std::string name; /* control segment name, with leading '/' */
  int nranks = 0, rank = 0, global_rank = -1, device = 0;
  uint64_t id = 0; /* comm id shared by all members (profiler_abi.h tells how it is derived) */
  uint64_t seed = 0; /* jitter seed: comm rank 0's SIMNCCL_SEED, so launchers may vary it per rank */

  sim::CtlHeader* ctl = nullptr;
  size_t ctl_len = 0;
  sim::Member* members = nullptr;
  sim::P2PChan* chans = nullptr; /* chans[src * nranks + dst] */
  std::vector<int> granks;       /* global rank of each comm rank */

  int data_fd = -1; /* own data segment */
  char* data = nullptr;
  size_t data_len = 0;
  std::vector<std::pair<char*, size_t>> peer_map; /* peers' data segments (read-only) */

  /* host thread (issue order) */
  uint64_t coll_issued = 0;
  uint32_t ticket_issued = 0;
  uint32_t split_count = 0, shrink_count = 0;
  /* stream worker */
  std::atomic<uint32_t> ticket_done{0}; /* private futex: work items done, in ticket order */
  std::vector<uint32_t> send_idx, recv_idx; /* p2p ops executed per peer */

  std::atomic<bool> aborted{false};
  std::atomic<int> async_error{0}; /* ncclCommGetAsyncError: ncclInProgress while a nonblocking job runs */
  bool blocking = true;            /* ncclConfig_t.blocking (0: calls return ncclInProgress, work goes on) */
  std::atomic<bool> revoked{false};   /* ncclCommRevoke: in-flight ops stopped, new ones refused */
  std::atomic<bool> suspended{false}; /* ncclCommSuspend .. ncclCommResume: no ops */
  std::atomic<uint32_t> jobs{0};   /* nonblocking jobs (init, launches) on helper threads; futex word */
  bool prof_on = false;    /* the profiler plugin accepted this comm (init succeeded) */
  uint64_t prof_seq[10] = {}; /* launching thread: next profiler seqNumber per collective function */
  void* prof_ctx = nullptr; /* its context */
};

namespace sim {

inline ncclComm* as_comm(ncclComm_t c) { return (c && c->magic == kCommMagic) ? c : nullptr; }

/* Blocks until pred() holds, sleeping on member m's bell (pred must depend on m's state
 * only, and stay true once true). false if the comm was aborted. */
template <class Pred>
bool wait_member(ncclComm* c, int m, Pred pred);

/* Blocks until pred(m) holds for every member m. false if the comm was aborted. */
template <class Pred>
bool wait_all(ncclComm* c, Pred pred);

/* This rank changed its state: wake the peers waiting on it. */
void ring_bell(ncclComm* c);

/* Nonblocking communicators (NCCL 2.30.7 src/group.cc ncclGroupEndInternal, src/init.cc):
 * a job (init, a group's launch) runs on a helper thread while ncclCommGetAsyncError says
 * ncclInProgress; finish_job sets its result. ensure_ready is ncclCommEnsureReady: using a
 * comm in progress is a WARN and ncclInvalidArgument. */
void start_job(ncclComm* c);
void finish_job(ncclComm* c, ncclResult_t r);
ncclResult_t ensure_ready(ncclComm* c);

/* Ensures the own data segment holds `bytes`; grows (never shrinks) it. */
bool ensure_data(ncclComm* c, size_t bytes);
/* Peer r's data segment from `off` for `len` bytes (own segment for r == rank). */
const char* peer_data(ncclComm* c, int r, size_t off, size_t len);

}  // namespace sim

#include "comm_wait.h"

#endif  // SIMNCCL_COMM_H
