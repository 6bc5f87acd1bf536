#include "op_pool.h"

#include <stdlib.h>

namespace c4d {

OpPool g_ops;

bool OpPool::init(uint32_t capacity) {
  if (slots_) return capacity == cap_;  // already sized (fork child keeps its parent's arrays)
  // calloc, not aligned_alloc + memset: large zeroed blocks come straight from mmap and
  // cost no memory until a slot is first used. Aligned by hand to a cache line.
  void* raw = calloc(size_t(capacity) + 1, sizeof(OpSlot));
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
