/*
 * Lock-free containers of 32-bit indices, sized once at start-up, never allocating after.
 *
 *   IndexRing  — Dmitry Vyukov's bounded MPMC ring (FIFO). Each cell carries a sequence
 *                number; a producer claims a position with one CAS, writes, and publishes
 *                with a release store. Used for "op slot ready for the agent".
 *   IndexStack — a Treiber stack (LIFO) with a 32-bit ABA tag packed beside the top
 *                index in one 64-bit word. Used for free lists (op slots, CUDA events):
 *                LIFO keeps recently used, cache-warm entries in circulation.
 *   SpscRing   — a bounded FIFO for one producer and one consumer: plain loads and
 *                stores, no read-modify-write, each side caching the other's index so it
 *                reads the other's line only when the ring looks full or empty. Used for
 *                a thread's own lane to and from the agent (op_pool.h).
 *
 * Both are safe from any number of threads; `init` and `reset` are not (call them before
 * any user exists, or in a fork child where no other thread survives).
 */
#ifndef C4D_SHIM_QUEUE_H
#define C4D_SHIM_QUEUE_H

#include <stdint.h>
#include <stdlib.h>

#include <atomic>

namespace c4d {

constexpr uint32_t kNone = 0xffffffffu;

class IndexRing {
 public:
  /* capacity must be a power of two. False when out of memory. */
  bool init(uint32_t capacity) {
    cells_ = static_cast<Cell*>(calloc(capacity, sizeof(Cell)));
    if (!cells_) return false;
    mask_ = capacity - 1;
    reset();
    return true;
  }
  void reset() {
    for (uint32_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
  }
  /* False when full. */
  bool push(uint32_t v) {
    uint32_t pos = head_.load(std::memory_order_relaxed);
    Cell* c;
    for (;;) {
      c = &cells_[pos & mask_];
      uint32_t seq = c->seq.load(std::memory_order_acquire);
      int32_t dif = int32_t(seq - pos);
      if (dif == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
    c->val = v;
    c->seq.store(pos + 1, std::memory_order_release);
    return true;
  }
  /* False when empty. */
  bool pop(uint32_t* v) {
    uint32_t pos = tail_.load(std::memory_order_relaxed);
    Cell* c;
    for (;;) {
      c = &cells_[pos & mask_];
      uint32_t seq = c->seq.load(std::memory_order_acquire);
      int32_t dif = int32_t(seq - (pos + 1));
      if (dif == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
    *v = c->val;
    c->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

 private:
  struct Cell {
    std::atomic<uint32_t> seq;
    uint32_t val;
  };
  Cell* cells_ = nullptr;
  uint32_t mask_ = 0;
  alignas(64) std::atomic<uint32_t> head_{0};  // next position to write
  alignas(64) std::atomic<uint32_t> tail_{0};  // next position to read
};

class IndexStack {
 public:
  /* Room for indices [0, n). filled: start holding all of them (0 on top). */
  bool init(uint32_t n, bool filled) {
    next_ = static_cast<std::atomic<uint32_t>*>(calloc(n, sizeof(std::atomic<uint32_t>)));
    if (!next_) return false;
    n_ = n;
    reset(filled);
    return true;
  }
  void reset(bool filled) {
    for (uint32_t i = 0; i < n_; ++i) next_[i].store(i + 1 < n_ ? i + 1 : kNone, std::memory_order_relaxed);
    head_.store(filled && n_ ? 0 : kNone, std::memory_order_relaxed);
  }
  bool ready() const { return n_ != 0; }
  /* kNone when empty. Acquire: what the pusher wrote before push() is visible. */
  uint32_t pop() {
    uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      uint32_t top = uint32_t(h);
      if (top == kNone) return kNone;
      uint32_t nxt = next_[top].load(std::memory_order_relaxed);
      uint64_t nh = (((h >> 32) + 1) << 32) | nxt;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_acquire, std::memory_order_acquire)) return top;
    }
  }
  /* Up to `max` indices at once into `out` (one CAS for all); how many. Safe: the tag
   * changes with every push and pop, so an unchanged head means the chain walked was
   * not touched meanwhile (a node's link is only written while it is off the stack). */
  uint32_t pop_many(uint32_t* out, uint32_t max) {
    uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      uint32_t n = 0, cur = uint32_t(h);
      while (n < max && cur != kNone) {
        out[n++] = cur;
        cur = next_[cur].load(std::memory_order_relaxed);
      }
      if (n == 0) return 0;
      uint64_t nh = (((h >> 32) + 1) << 32) | cur;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_acquire, std::memory_order_acquire)) return n;
    }
  }
  void push(uint32_t i) {
    uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      next_[i].store(uint32_t(h), std::memory_order_relaxed);
      uint64_t nh = (((h >> 32) + 1) << 32) | i;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_release, std::memory_order_relaxed)) return;
    }
  }

 private:
  std::atomic<uint32_t>* next_ = nullptr;
  uint32_t n_ = 0;
  alignas(64) std::atomic<uint64_t> head_{uint64_t(kNone)};  // (tag << 32) | top index
};

class SpscRing {
 public:
  /* capacity must be a power of two; `cells` room for it, owned by the caller. */
  void init(uint32_t* cells, uint32_t capacity) {
    cells_ = cells;
    mask_ = capacity - 1;
    reset();
  }
  void reset() {
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
    tail_seen_ = head_seen_ = 0;
  }
  /* Producer only. False when full. */
  bool push(uint32_t v) {
    const uint32_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_seen_ > mask_) {
      tail_seen_ = tail_.load(std::memory_order_acquire);  // the consumer is done with those cells
      if (h - tail_seen_ > mask_) return false;
    }
    cells_[h & mask_] = v;
    head_.store(h + 1, std::memory_order_release);
    return true;
  }
  /* Consumer only. False when empty. */
  bool pop(uint32_t* v) {
    const uint32_t t = tail_.load(std::memory_order_relaxed);
    if (t == head_seen_) {
      head_seen_ = head_.load(std::memory_order_acquire);
      if (t == head_seen_) return false;
    }
    *v = cells_[t & mask_];
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }
  /* Consumer only: how many are in the ring now (at least; more may come). */
  uint32_t ready() {
    head_seen_ = head_.load(std::memory_order_acquire);
    return head_seen_ - tail_.load(std::memory_order_relaxed);
  }

 private:
  uint32_t* cells_ = nullptr;
  uint32_t mask_ = 0;
  alignas(64) std::atomic<uint32_t> head_{0};  // next position to write: the producer's line
  uint32_t tail_seen_ = 0;                     // the producer's last look at tail_
  alignas(64) std::atomic<uint32_t> tail_{0};  // next position to read: the consumer's line
  uint32_t head_seen_ = 0;                     // the consumer's last look at head_
};

}  // namespace c4d

#endif  // C4D_SHIM_QUEUE_H
