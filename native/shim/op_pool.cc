#include "op_pool.h"

#include <stdlib.h>

namespace c4d {

OpPool g_ops;

bool OpPool::init(uint32_t capacity) {
  if (slots_) return capacity == cap_;  // already sized (fork child keeps its parent's arrays)
  slots_ = static_cast<OpSlot*>(calloc(capacity, sizeof(OpSlot)));
  if (!slots_ || !free_.init(capacity, true) || !ready_.init(capacity)) return false;
  cap_ = capacity;
  return true;
}

void OpPool::reset() {
  if (!slots_) return;
  free_.reset(true);
  ready_.reset();
}

}  // namespace c4d
