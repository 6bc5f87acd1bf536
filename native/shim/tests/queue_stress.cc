/*
 * Stress test of queue.h (built and run by tests/test_shim.py, under ThreadSanitizer when
 * the compiler has it). The op-slot cycle of the shim: producers take indices from an
 * IndexStack free list, write a payload, push them through an IndexRing; consumers pop,
 * check the payload and return the index to the stack. Checked: no index lost or
 * duplicated (payload sums, the free list ends full) and, with one consumer as in the
 * shim (the agent), that a push into the ring never fails. With several consumers
 * Vyukov's ring may refuse a push while a consumer is mid-pop; producers then retry.
 * Again with producers taking their indices in batches (IndexStack::pop_many, as a thread's
 * lane refills its stash). And SpscRing: one producer, one consumer, every value in order.
 * Exit status 0 = pass.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

#include <atomic>

#include "queue.h"

namespace {

constexpr uint32_t kSlots = 64;  // small: the stack runs empty and the ring full often
constexpr uint32_t kPerProducer = 50000;
constexpr int kProducers = 3;

c4d::IndexStack g_free;
c4d::IndexRing g_ready;
uint64_t g_payload[kSlots];  // written by the taker, read by the consumer
std::atomic<uint64_t> g_consumed, g_sum, g_refused;
std::atomic<int> g_producers_left;

bool g_batches = false;  // producers take up to 4 indices at once

void* producer(void* arg) {
  uint64_t id = uint64_t(reinterpret_cast<uintptr_t>(arg));
  uint32_t held[4], n_held = 0, at = 0;
  for (uint32_t n = 0; n < kPerProducer;) {
    uint32_t i;
    if (g_batches) {
      if (at == n_held) {
        n_held = g_free.pop_many(held, 1 + n % 4);
        at = 0;
      }
      i = at < n_held ? held[at++] : c4d::kNone;
    } else {
      i = g_free.pop();
    }
    if (i == c4d::kNone) {  // pool empty: a real hook drops; here wait for a slot
      sched_yield();
      continue;
    }
    g_payload[i] = (id << 32) | n;
    while (!g_ready.push(i)) {
      g_refused.fetch_add(1);
      sched_yield();
    }
    ++n;
  }
  while (at < n_held) g_free.push(held[at++]);  // a batch's rest goes back
  g_producers_left.fetch_sub(1);
  return nullptr;
}

void* consumer(void*) {
  for (;;) {
    uint32_t i = c4d::kNone;
    if (!g_ready.pop(&i)) {
      if (g_producers_left.load() != 0) {
        sched_yield();
        continue;
      }
      if (!g_ready.pop(&i)) return nullptr;  // every push is complete: really empty
    }
    g_sum.fetch_add(g_payload[i] & 0xffffffffu);
    g_consumed.fetch_add(1);
    g_free.push(i);
  }
}

bool run(int consumers) {
  g_free.reset(true);
  g_ready.reset();
  g_consumed = g_sum = g_refused = 0;
  g_producers_left = kProducers;
  pthread_t t[kProducers + 8];
  for (int p = 0; p < kProducers; ++p) pthread_create(&t[p], nullptr, producer, reinterpret_cast<void*>(uintptr_t(p)));
  for (int c = 0; c < consumers; ++c) pthread_create(&t[kProducers + c], nullptr, consumer, nullptr);
  for (int x = 0; x < kProducers + consumers; ++x) pthread_join(t[x], nullptr);
  uint32_t i, left = 0, back = 0;
  while (g_ready.pop(&i)) ++left;
  while ((i = g_free.pop()) != c4d::kNone) ++back;
  uint64_t want_sum = uint64_t(kProducers) * (uint64_t(kPerProducer) * (kPerProducer - 1) / 2);
  bool ok = g_consumed.load() == uint64_t(kProducers) * kPerProducer && g_sum.load() == want_sum && left == 0 &&
            back == kSlots && (consumers > 1 || g_refused.load() == 0);
  printf("%sconsumers=%d consumed=%llu sum_ok=%d left=%u free_back=%u refused=%llu %s\n", g_batches ? "batches " : "", consumers,
         (unsigned long long)g_consumed.load(), g_sum.load() == want_sum, left, back,
         (unsigned long long)g_refused.load(), ok ? "ok" : "FAILED");
  return ok;
}

constexpr uint32_t kSpscValues = 1000000;
uint32_t g_spsc_cells[64];  // small: full and empty often
c4d::SpscRing g_spsc;

void* spsc_producer(void*) {
  for (uint32_t v = 0; v < kSpscValues;)
    if (g_spsc.push(v)) ++v;
    else sched_yield();
  return nullptr;
}

/* One producer, one consumer: every value, in order, once. */
bool run_spsc() {
  g_spsc.init(g_spsc_cells, 64);
  pthread_t t;
  pthread_create(&t, nullptr, spsc_producer, nullptr);
  uint32_t want = 0, v;
  bool order = true;
  while (want < kSpscValues) {
    if (!g_spsc.pop(&v)) {
      sched_yield();
      continue;
    }
    order = order && v == want;
    ++want;
  }
  pthread_join(t, nullptr);
  bool ok = order && !g_spsc.pop(&v) && g_spsc.ready() == 0;
  printf("spsc values=%u in_order=%d %s\n", want, order, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  if (!g_free.init(kSlots, true) || !g_ready.init(kSlots)) return 2;
  bool ok = run(1);  // the shim's shape: many app threads, one agent
  ok = run(3) && ok;
  g_batches = true;
  ok = run(1) && ok;
  ok = run_spsc() && ok;
  return ok ? 0 : 1;
}
