/*
 * SIMNCCL_FAULTS parser, shared by libnccl.so.2 (comm faults) and c4d-simtrain
 * (compute faults and crashes), so both read the same grammar the same way.
 *
 * Grammar (DESIGN.md, "Fault SPEC"), specs separated by ';':
 *   KIND@key=value,...   KIND: noncomm-hang | comm-hang | noncomm-slow | comm-slow | crash
 *   rank=R       global rank (every kind)
 *   link=R-S     the link between global ranks R and S, both directions (comm kinds only)
 *   step=S       active from training step S on (default 0)
 *   factor=F     slow kinds only: compute time x F or link bandwidth / F (default 4, >= 1)
 * Exactly one of rank= / link=. node=NAME is resolved to rank= by the Python launcher;
 * seeing it here is an error. A malformed spec yields one error line and is dropped;
 * the well-formed specs beside it still apply.
 */
#ifndef SIMNCCL_FAULT_SPEC_H
#define SIMNCCL_FAULT_SPEC_H

#include <string>
#include <vector>

namespace simfault {

enum class Kind { NonCommHang, CommHang, NonCommSlow, CommSlow, Crash };

struct Fault {
  Kind kind = Kind::Crash;
  int rank = -1;              /* -1: not a rank fault */
  int link_a = -1, link_b = -1; /* -1: not a link fault */
  int step = 0;
  double factor = 4.0;

  bool touches_rank(int r) const { return rank == r; }
  /* Does the fault name the (undirected) link a<->b, or one of its two ends? */
  bool touches_link(int a, int b) const {
    if (rank >= 0) return rank == a || rank == b;
    return (link_a == a && link_b == b) || (link_a == b && link_b == a);
  }
};

struct ParseResult {
  std::vector<Fault> faults;
  std::vector<std::string> errors; /* one human-readable line per rejected spec */
};

ParseResult parse_faults(const char* text);
const char* kind_name(Kind k);
inline bool is_comm_kind(Kind k) { return k == Kind::CommHang || k == Kind::CommSlow; }

}  // namespace simfault

#endif  // SIMNCCL_FAULT_SPEC_H
