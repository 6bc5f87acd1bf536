/*
 * SIMNCCL_FAULTS parser, shared by libnccl.so.2 (comm faults) and c4d-simtrain
 * (compute faults and crashes), so both read the same grammar the same way.
 *
 * Grammar (docs/cli.md, "c4d sim"), specs separated by ';':
 *   KIND@key=value,...   KIND: noncomm-hang | comm-hang | noncomm-slow | comm-slow | crash | mismatch
 *   rank=R       global rank (every kind)
 *   link=R-S     the link between global ranks R and S (comm kinds only)
 *   dir=D        link faults: both (default), fwd (R -> S only) or rev (S -> R only)
 *   step=S       active from training step S on (default 0)
 *   until=U      slow kinds: active before step U only (a transient slowdown that recovers)
 *   secs=X       noncomm-hang: the stall lasts X seconds, then the rank goes on (a transient hang)
 *   factor=F     slow kinds only: compute time x F or link bandwidth / F (default 4, >= 1)
 *   what=W       mismatch only: skip (default) | op | count | dtype | root | count-hang | dtype-hang
 * Exactly one of rank= / link=. node=NAME is resolved to rank= by the Python launcher;
 * seeing it here is an error. A malformed spec yields one error line and is dropped;
 * the well-formed specs beside it still apply.
 *
 * The fault model is hardware: a comm fault at a rank (its NIC, its PCIe link) hits both
 * directions of every link of that rank, in every communicator; a link fault hits that link,
 * both directions unless dir= picks one. mismatch@rank=R,step=S is a program-order bug, not
 * hardware: at step S rank R leaves out one collective (its TP reduce-scatter, or its DP
 * all-reduce when tp = 1) and every rank then joins a world all-reduce (c4d-simtrain);
 * with what=op|count|dtype|root every rank instead joins one more world collective at the end
 * of step S, which rank R calls differently (a broadcast for the others' all-reduce, twice
 * the count, int32 for float32, itself as the broadcast's root). count and dtype move the same
 * bytes rounded to 8 (they complete with wrong data); count-hang (four elements for one) and
 * dtype-hang (two float64 for two float32) move more, and every member hangs.
 */
#ifndef SIMNCCL_FAULT_SPEC_H
#define SIMNCCL_FAULT_SPEC_H

#include <string>
#include <vector>

namespace simfault {

enum class Kind { NonCommHang, CommHang, NonCommSlow, CommSlow, Crash, Mismatch };
enum class Dir { Both, Fwd, Rev };
/* mismatch: what the rank gets wrong (what=); Skip leaves a collective out */
enum class What { Skip, Op, Count, Dtype, Root, CountHang, DtypeHang };

struct Fault {
  Kind kind = Kind::Crash;
  int rank = -1;              /* -1: not a rank fault */
  int link_a = -1, link_b = -1; /* -1: not a link fault */
  Dir dir = Dir::Both;
  int step = 0;
  int until = -1;   /* slow kinds: first step no longer affected; -1 = never recovers */
  double secs = 0;  /* noncomm-hang: stall length in seconds; 0 = forever */
  double factor = 4.0;
  What what = What::Skip; /* mismatch only */

  bool touches_rank(int r) const { return rank == r; }
  /* Is step s inside the fault's active steps? */
  bool active(int s) const { return s >= step && (until < 0 || s < until); }
  /* Does the fault hit the transfer src -> dst (global ranks)? A rank fault hits both
   * directions of every link of the rank; a link fault its link, in the direction(s) named. */
  bool touches_link(int src, int dst) const {
    if (rank >= 0) return rank == src || rank == dst;
    if (link_a == src && link_b == dst) return dir != Dir::Rev;
    if (link_a == dst && link_b == src) return dir != Dir::Fwd;
    return false;
  }
};

struct ParseResult {
  std::vector<Fault> faults;
  std::vector<std::string> errors; /* one human-readable line per rejected spec */
};

ParseResult parse_faults(const char* text);
const char* kind_name(Kind k);
inline bool is_comm_kind(Kind k) { return k == Kind::CommHang || k == Kind::CommSlow; }
inline bool is_slow_kind(Kind k) { return k == Kind::NonCommSlow || k == Kind::CommSlow; }


}  // namespace simfault

#endif  // SIMNCCL_FAULT_SPEC_H
