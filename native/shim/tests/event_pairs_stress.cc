/*
 * Kept event pairs (event_pool.h) under stress, built and run by tests/test_shim.py (under
 * ThreadSanitizer when the compiler has it) with the shim's own event_pool.cc, op_pool.cc
 * and log.cc, and a CUDA runtime of counters (no GPU: the events are only names here).
 *
 * Producers play application threads: take a kept slot and pair, else a slot and a pair
 * from the pool (or, as a group of two ops, one pair shared by two slots with set_refs),
 * submit. One consumer plays the agent: keep_pair() or g_ops.release(). Checked:
 *   - no event is held by two ops at once (a counter per event, claimed from 0 at take);
 *   - conservation: at the end every event is on its pool's free stack or kept by one free
 *     slot, exactly once;
 *   - after a burst that empties the pool into kept pairs, a steady single op, and a group,
 *     still get events;
 *   - a fork child's reset leaves none of the parent's kept pairs.
 * Exit status 0 = pass; prints one "... ok" line per check.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <initializer_list>

#include "pool_harness.h"

namespace {

using c4d::EventPool;
using c4d::g_ops;
using c4d::kNone;
using c4d::OpSlot;
using counting_cuda::fail;

constexpr uint32_t kEvents = 16;  // 8 pairs a device: the pool runs empty often
constexpr uint32_t kSlots = 64;
constexpr uint32_t kPerProducer = 40000;
constexpr int kProducers = 3;

std::atomic<uint32_t> g_held[2][kEvents];  // ops holding each event now
std::atomic<uint64_t> g_double{0}, g_no_pair{0}, g_ops_done{0};
std::atomic<int> g_producers_left{kProducers};

bool claim(int dev, uint32_t a, uint32_t b, uint32_t refs) {
  uint32_t z = 0;
  bool ok = g_held[dev][a].compare_exchange_strong(z, refs);
  z = 0;
  ok = g_held[dev][b].compare_exchange_strong(z, refs) && ok;
  if (!ok) g_double.fetch_add(1);
  return ok;
}

void submit(uint32_t i) {
  while (!g_ops.submit(i)) sched_yield();
}

/* An op as op_begin takes it: a kept slot and pair of its device's pool, else a slot and a
 * pair from the pool's free list. False: no pair (the slot is still taken). */
bool take_op(int dev, uint32_t* slot) {
  EventPool* p = c4d::event_pool_for(dev);
  uint32_t a = kNone, b = kNone, i = p->take_kept(&a, &b);
  if (i == kNone) {
    do i = c4d::take_any_slot(); while (i == kNone && (sched_yield(), true));
    if (!p->take_pair(&a, &b)) a = b = kNone;
  }
  OpSlot& s = g_ops.at(i);
  s.device = dev;
  s.ev_start = a;
  s.ev_end = b;
  *slot = i;
  return a != kNone;
}

void* producer(void* arg) {
  unsigned seed = unsigned(uintptr_t(arg));
  for (uint32_t k = 0; k < kPerProducer; ++k) {
    int dev = rand_r(&seed) % 8 == 0 ? 1 : 0;  // now and then an op on the other device
    EventPool* p = c4d::event_pool_for(dev);
    uint32_t i;
    if (rand_r(&seed) % 4 == 0) {  // a group of two ops: slots without pairs, one pair from the pool
      uint32_t j;
      do i = c4d::take_any_slot(); while (i == kNone && (sched_yield(), true));
      do j = c4d::take_any_slot(); while (j == kNone && (sched_yield(), true));
      uint32_t a, b;
      if (!p->take_pair(&a, &b)) {
        a = b = kNone;
        g_no_pair.fetch_add(1);
      } else {
        p->set_refs(a, 2);
        p->set_refs(b, 2);
        claim(dev, a, b, 2);
      }
      for (uint32_t x : {i, j}) {
        OpSlot& s = g_ops.at(x);
        s.device = dev;
        s.ev_start = a;
        s.ev_end = b;
        submit(x);
      }
      continue;
    }
    if (take_op(dev, &i))
      claim(dev, g_ops.at(i).ev_start, g_ops.at(i).ev_end, 1);
    else
      g_no_pair.fetch_add(1);
    submit(i);
  }
  g_producers_left.fetch_sub(1);
  return nullptr;
}

void finish(uint32_t i) {  // the agent's side of one op
  OpSlot& s = g_ops.at(i);
  if (s.ev_start != kNone) {
    g_held[s.device][s.ev_start].fetch_sub(1);
    g_held[s.device][s.ev_end].fetch_sub(1);
  }
  if (!c4d::keep_pair(i)) g_ops.release(i);
  g_ops_done.fetch_add(1);
}

void* consumer(void*) {
  uint32_t i;
  for (;;) {
    if (g_ops.next_ready(&i)) {
      finish(i);
    } else if (g_producers_left.load() == 0) {
      if (!g_ops.next_ready(&i)) return nullptr;
      finish(i);
    } else {
      sched_yield();
    }
  }
}

/* Every event of both pools once: on the free stack or kept by a free slot. Empties the
 * stacks (they are refilled from what was found). */
bool conserved(const char* when) {
  for (int dev = 0; dev < 2; ++dev) {
    EventPool* p = c4d::event_pool_for(dev);
    uint32_t seen[kEvents] = {0};
    uint32_t e, n = 0;
    uint32_t stack[kEvents * 2];
    while ((e = p->take()) != kNone && n < kEvents * 2) stack[n++] = e;
    for (uint32_t k = 0; k < n; ++k) ++seen[stack[k]];
    uint32_t kept = 0, slots[kSlots], ns = 0, a, b, i;
    while ((i = p->take_kept(&a, &b)) != kNone) {
      ++seen[a];
      ++seen[b];
      kept += 2;
      slots[ns++] = i;
    }
    for (uint32_t k = 0; k < ns; ++k) {  // back on the kept list, as they were
      g_ops.at(slots[k]).ev_start = g_ops.at(slots[k]).kept_a;
      g_ops.at(slots[k]).ev_end = g_ops.at(slots[k]).kept_b;
      p->keep(slots[k]);
    }
    for (uint32_t k = 0; k < n; ++k) p->release(stack[k]);  // back (refs are 1)
    for (uint32_t k = 0; k < p->size(); ++k)
      if (seen[k] != 1) {
        printf("%s: device %d event %u seen %u times (%u on the stack, %u kept)\n", when, dev, k, seen[k], n, kept);
        return false;
      }
  }
  return true;
}

}  // namespace

int main() {
  if (!counting_cuda::start(kSlots, kEvents)) return 1;

  pthread_t th[kProducers + 1];
  for (int k = 0; k < kProducers; ++k) pthread_create(&th[k], nullptr, producer, reinterpret_cast<void*>(uintptr_t(k + 1)));
  pthread_create(&th[kProducers], nullptr, consumer, nullptr);
  for (auto& t : th) pthread_join(t, nullptr);
  uint64_t ops = 0;
  for (int k = 0; k < kProducers; ++k) ops += kPerProducer;
  if (g_double.load()) return fail("an event was held by two ops at once");
  if (g_ops_done.load() < ops) return fail("ops lost");
  if (!conserved("after the threads")) return fail("events lost or duplicated");
  printf("threads: %llu ops, %llu without a pair, no event held twice ok\n",
         static_cast<unsigned long long>(g_ops_done.load()), static_cast<unsigned long long>(g_no_pair.load()));

  // A burst takes every pair; once freed, the pool's stack is empty and the pairs are kept.
  EventPool* p = c4d::event_pool_for(0);
  uint32_t burst[kSlots], nb = 0;
  for (;;) {
    uint32_t i;
    bool got = take_op(0, &i);
    burst[nb++] = i;
    if (!got) break;
  }
  if (nb != kEvents / 2 + 1) {
    printf("burst got %u pairs\n", nb - 1);
    return fail("the burst did not get every pair of device 0");
  }
  for (uint32_t k = 0; k < nb; ++k)
    if (!c4d::keep_pair(burst[k])) g_ops.release(burst[k]);
  for (int k = 0; k < 100; ++k) {  // steady: one op, then a group of two sharing a pair
    uint32_t i, j = c4d::take_any_slot();
    if (!take_op(0, &i)) return fail("a steady op found no pair after a burst");
    if (!c4d::keep_pair(i)) return fail("an op's own pair was not kept");
    uint32_t g = c4d::take_any_slot(), a, b;
    if (!p->take_pair(&a, &b)) return fail("a group found no pair after a burst");
    p->set_refs(a, 2);
    p->set_refs(b, 2);
    for (uint32_t x : {g, j}) {
      g_ops.at(x).device = 0;
      g_ops.at(x).ev_start = a;
      g_ops.at(x).ev_end = b;
    }
    if (c4d::keep_pair(g)) return fail("a shared pair was kept");
    g_ops.release(g);
    if (!c4d::keep_pair(j)) return fail("the last holder of a group's pair did not keep it");
  }
  if (!conserved("after the burst")) return fail("events lost or duplicated after the burst");
  printf("burst: steady ops and groups still get pairs ok\n");

  // A fork child: new pools (same storage), every slot free; the parent's kept pairs are not its events.
  c4d::event_pools_reset_after_fork();
  g_ops.reset();
  if (!c4d::event_pool_ensure(0, kEvents) || !c4d::event_pool_ensure(1, kEvents)) return fail("pools after fork");
  for (uint32_t k = 0; k < kEvents / 2; ++k) {
    if (!take_op(0, &burst[k])) return fail("a fork child's op found no pair");
  }
  if (c4d::event_pool_for(0)->take() != kNone) return fail("a fork child has more events than its pool");
  for (uint32_t k = 0; k < kEvents / 2; ++k)
    if (!c4d::keep_pair(burst[k])) return fail("a fork child's op did not keep its pair");
  if (!conserved("after the fork")) return fail("events lost or duplicated after the fork");
  printf("fork: the child keeps none of its parent's pairs ok\n");
  return 0;
}
