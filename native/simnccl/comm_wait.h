/* Template bodies of sim::wait_member / wait_all (comm.h). */
#ifndef SIMNCCL_COMM_WAIT_H
#define SIMNCCL_COMM_WAIT_H

#include "common.h"

namespace sim {

template <class Pred>
bool wait_member(ncclComm* c, int m, Pred pred) {
  Member& mb = c->members[m];
  if (pred()) return true;
  mb.waiters.fetch_add(1); /* seq_cst: pairs with ring_bell's bump-then-check */
  bool ok = true;
  for (;;) {
    uint32_t b = mb.bell.load();
    if (pred()) break;
    if (c->aborted.load(std::memory_order_relaxed)) {
      ok = false;
      break;
    }
    futex_wait(&mb.bell, b, 20000000ull, true); /* 20 ms: re-check even if a wake is lost */
  }
  mb.waiters.fetch_sub(1);
  return ok;
}

template <class Pred>
bool wait_all(ncclComm* c, Pred pred) {
  for (int m = 0; m < c->nranks; ++m)
    if (!wait_member(c, m, [&] { return pred(m); })) return false;
  return true;
}

}  // namespace sim

#endif  // SIMNCCL_COMM_WAIT_H
