#include "op_pool.h"

#include <stdlib.h>

namespace c4d {

OpPool g_ops;

bool OpPool::init(uint32_t capacity) {
  if (slots_) return capacity == cap_;  // already sized (fork child keeps its parent's arrays)
  // Aligned by hand to a cache line. The memory is committed here, at start: every page of
  // the slots is touched now, so that no op's first use of a slot costs a page fault on the
  // application's thread (C4D_QUEUE_CAPACITY x 128 bytes: 8 MiB by default).
  const size_t bytes = (size_t(capacity) + 1) * sizeof(OpSlot);
  void* raw = calloc(1, bytes);
  for (size_t off = 0; raw && off < bytes; off += 4096) static_cast<volatile char*>(raw)[off] = 0;
  uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + alignof(OpSlot) - 1) & ~uintptr_t(alignof(OpSlot) - 1);
  slots_ = raw ? reinterpret_cast<OpSlot*>(at) : nullptr;
  agent_ = static_cast<AgentOp*>(calloc(capacity, sizeof(AgentOp)));
  if (!slots_ || !agent_ || !free_.init(capacity, true) || !ready_.init(capacity)) return false;
  cap_ = capacity;
  return true;
}

void OpPool::reset() {
  if (!slots_) return;
  free_.reset(true);
  ready_.reset();
}

}  // namespace c4d
