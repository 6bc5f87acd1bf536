/*
 * Thread lanes (op_pool.h) under stress, built and run by tests/test_shim.py (under
 * ThreadSanitizer when the compiler has it) with the shim's own event_pool.cc, op_pool.cc
 * and log.cc, and a CUDA runtime of counters (no GPU: the events are only names here).
 *
 * Producers play application threads, in waves: more threads in all than there are lanes
 * (a lane comes back when its thread exits), and one wave with more threads at once than
 * lanes (the last ones take the shared path). Each op takes a slot as op_begin does (its
 * lane's freed slots, its stash, else the shared lists) and a pair, and is submitted to its
 * lane. One consumer plays the agent: the shared ring and every lane's ready ring, then
 * free_op_slot; lanes of exited threads reclaimed. Checked:
 *   - no event is held by two ops at once (a counter per event, claimed from 0 at take);
 *   - every op submitted comes out exactly once (a mark per op);
 *   - lanes were reused and the shared path served the threads without one;
 *   - conservation: at the end every lane is free and empty, every slot is on the op
 *     pool's free list or on one kept list, every event on its pool's free list or kept
 *     by one free slot, each exactly once.
 * Exit status 0 = pass; prints one "... ok" line per check.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>

#include "pool_harness.h"

namespace {

using c4d::EventPool;
using c4d::g_ops;
using c4d::kNone;
using c4d::OpSlot;
using counting_cuda::fail;

constexpr uint32_t kEvents = 64;  // 32 pairs a device: the pool runs empty now and then
constexpr uint32_t kSlots = 256;
constexpr uint32_t kPerThread = 6000;
constexpr int kWaves = 4;
constexpr int kWaveThreads = 6;                     // 24 threads over the waves: lanes are reused
constexpr int kCrowd = int(c4d::kLanes) + 4;        // the last wave: more threads than lanes
constexpr int kMaxThreads = kWaves * kWaveThreads + kCrowd;

std::atomic<uint32_t> g_held[2][kEvents];  // ops holding each event now
std::atomic<uint8_t> g_seen[kMaxThreads][kPerThread];  // each op's way out
uint64_t g_tag[kSlots];  // the op in a slot (thread << 32 | n), written by its taker
std::atomic<uint64_t> g_double{0}, g_no_pair{0}, g_own{0}, g_shared{0}, g_twice{0};
std::atomic<int> g_lanes_claimed{0}, g_laneless{0};
std::atomic<bool> g_done{false};
pthread_barrier_t g_claimed;  // a wave's threads all hold their lanes (or found none) before any op

bool claim(int dev, uint32_t a, uint32_t b) {
  uint32_t z = 0;
  bool ok = g_held[dev][a].compare_exchange_strong(z, 1);
  z = 0;
  ok = g_held[dev][b].compare_exchange_strong(z, 1) && ok;
  if (!ok) g_double.fetch_add(1);
  return ok;
}

/* One application thread: kPerThread ops, as op_begin takes and hands them over. */
void* producer(void* arg) {
  const int id = int(uintptr_t(arg));
  unsigned seed = unsigned(id) + 1;
  static thread_local uint8_t memo = 0;  // ThreadState::lane (TLS: the thread's exit rewrites it)
  const uint8_t lane = g_ops.lane_of(&memo);
  if (lane == c4d::kNoLane) g_laneless.fetch_add(1);
  else g_lanes_claimed.fetch_add(1);
  pthread_barrier_wait(&g_claimed);
  for (uint32_t n = 0; n < kPerThread;) {
    const int dev = rand_r(&seed) % 8 == 0 ? 1 : 0;  // now and then an op on the other device
    EventPool* p = c4d::event_pool_for(dev);
    uint32_t a = kNone, b = kNone;
    uint32_t i = lane != c4d::kNoLane ? c4d::take_own_slot(lane, p, dev, &a, &b) : kNone;
    if (i != kNone) {
      g_own.fetch_add(1, std::memory_order_relaxed);
    } else {
      i = p->take_kept(&a, &b);
      if (i == kNone) i = c4d::take_any_slot();
      if (i == kNone) {  // every slot in flight: a real hook drops; here wait for one
        sched_yield();
        continue;
      }
      g_shared.fetch_add(1, std::memory_order_relaxed);
    }
    if (a == kNone && !p->take_pair(&a, &b)) a = b = kNone;
    if (a != kNone) claim(dev, a, b);
    else g_no_pair.fetch_add(1, std::memory_order_relaxed);
    OpSlot& s = g_ops.at(i);
    s.device = dev;
    s.ev_start = a;
    s.ev_end = b;
    s.lane = lane;
    g_tag[i] = (uint64_t(id) << 32) | n;
    if (!g_ops.submit(i, lane)) {
      printf("a submit was refused\n");
      abort();
    }
    ++n;
  }
  return nullptr;
}

void finish(uint32_t i) {  // the agent's side of one op
  const uint64_t tag = g_tag[i];
  if (g_seen[tag >> 32][uint32_t(tag)].fetch_add(1) != 0) g_twice.fetch_add(1);
  OpSlot& s = g_ops.at(i);
  if (s.ev_start != kNone) {
    g_held[s.device][s.ev_start].fetch_sub(1);
    g_held[s.device][s.ev_end].fetch_sub(1);
  }
  c4d::free_op_slot(i);
}

/* The agent's drain (agent.cc): lane counts first, the shared ring, the lanes, reclaim. */
bool drain() {
  uint32_t ready[c4d::kLanes], i;
  bool any = false;
  const uint32_t lanes = g_ops.lanes_used();
  for (uint32_t l = 0; l < lanes; ++l) ready[l] = g_ops.lane(uint8_t(l)).ready.ready();
  while (g_ops.next_ready(&i)) {
    finish(i);
    any = true;
  }
  for (uint32_t l = 0; l < lanes; ++l) {
    for (uint32_t n = ready[l]; n > 0 && g_ops.lane(uint8_t(l)).ready.pop(&i); --n) {
      finish(i);
      any = true;
    }
    g_ops.reclaim(uint8_t(l), c4d::free_to_shared);
  }
  return any;
}

void* agent(void*) {
  for (;;) {
    bool done = g_done.load();
    if (!drain()) {
      if (done) return nullptr;  // every producer joined before g_done: nothing more comes
      sched_yield();
    }
  }
}

void wave(int first, int n) {
  pthread_t th[kMaxThreads];
  pthread_barrier_init(&g_claimed, nullptr, unsigned(n));
  for (int k = 0; k < n; ++k) pthread_create(&th[k], nullptr, producer, reinterpret_cast<void*>(uintptr_t(first + k)));
  for (int k = 0; k < n; ++k) pthread_join(th[k], nullptr);
  pthread_barrier_destroy(&g_claimed);
}

}  // namespace

int main() {
  if (!counting_cuda::start(kSlots, kEvents)) return 1;

  pthread_t ag;
  pthread_create(&ag, nullptr, agent, nullptr);
  int id = 0;
  for (int w = 0; w < kWaves; ++w, id += kWaveThreads) wave(id, kWaveThreads);
  wave(id, kCrowd);
  g_done.store(true);
  pthread_join(ag, nullptr);
  drain();  // the lanes of the last wave's threads: reclaimed

  if (g_double.load()) return fail("an event was held by two ops at once");
  if (g_twice.load()) return fail("an op came out twice");
  for (int t = 0; t < kMaxThreads; ++t)
    for (uint32_t n = 0; n < kPerThread; ++n)
      if (g_seen[t][n].load() != 1) return fail("an op was lost");
  printf("ops: %d threads x %u, %llu through lanes, %llu shared, %llu without a pair, each out once ok\n",
         kMaxThreads, kPerThread, static_cast<unsigned long long>(g_own.load()),
         static_cast<unsigned long long>(g_shared.load()), static_cast<unsigned long long>(g_no_pair.load()));

  if (g_lanes_claimed.load() <= int(c4d::kLanes)) return fail("no lane was ever reused");
  if (g_laneless.load() < kCrowd - int(c4d::kLanes)) return fail("more threads than lanes, yet all had one");
  if (g_own.load() == 0) return fail("no op went through a lane");
  printf("lanes: %d claims of %u lanes, %d threads on the shared path ok\n", g_lanes_claimed.load(), c4d::kLanes,
         g_laneless.load());

  // Conservation: every lane free and empty, every slot and event on a shared list once.
  for (uint32_t l = 0; l < c4d::kLanes; ++l) {
    c4d::Lane& ln = g_ops.lane(uint8_t(l));
    uint32_t i;
    if (ln.owner.load() != c4d::Lane::kFree) return fail("a lane of an exited thread was not reclaimed");
    if (ln.free.pop(&i) || ln.stash_at != ln.stash_end || ln.ready.ready()) return fail("a reclaimed lane holds slots");
  }
  uint32_t slot_seen[kSlots] = {0};
  for (uint32_t i; (i = g_ops.take()) != kNone;) ++slot_seen[i];
  for (int dev = 0; dev < 2; ++dev) {
    EventPool* p = c4d::event_pool_for(dev);
    uint32_t seen[kEvents] = {0};
    for (uint32_t e; (e = p->take()) != kNone;) ++seen[e];
    uint32_t a, b;
    for (uint32_t i; (i = p->take_kept(&a, &b)) != kNone;) {
      ++slot_seen[i];
      ++seen[a];
      ++seen[b];
    }
    for (uint32_t e = 0; e < p->size(); ++e)
      if (seen[e] != 1) {
        printf("device %d event %u seen %u times\n", dev, e, seen[e]);
        return fail("events lost or duplicated");
      }
  }
  for (uint32_t i = 0; i < kSlots; ++i)
    if (slot_seen[i] != 1) {
      printf("slot %u seen %u times\n", i, slot_seen[i]);
      return fail("op slots lost or duplicated");
    }
  printf("conservation: lanes free and empty, every slot and event once ok\n");
  return 0;
}
