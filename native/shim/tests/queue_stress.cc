/*
 * Stress test of queue.h (built and run by tests/test_shim.py, under ThreadSanitizer when
 * the compiler has it). The op-slot cycle of the shim: producers take indices from an
 * IndexStack free list, write a payload, push them through an IndexRing; consumers pop,
 * check the payload and return the index to the stack. Checked: no index lost or
 * duplicated (payload sums, the free list ends full) and, with one consumer as in the
 * shim (the agent), that a push into the ring never fails. With several consumers
 * Vyukov's ring may refuse a push while a consumer is mid-pop; producers then retry.
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

void* producer(void* arg) {
  uint64_t id = uint64_t(reinterpret_cast<uintptr_t>(arg));
  for (uint32_t n = 0; n < kPerProducer;) {
    uint32_t i = g_free.pop();
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
  printf("consumers=%d consumed=%llu sum_ok=%d left=%u free_back=%u refused=%llu %s\n", consumers,
         (unsigned long long)g_consumed.load(), g_sum.load() == want_sum, left, back,
         (unsigned long long)g_refused.load(), ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  if (!g_free.init(kSlots, true) || !g_ready.init(kSlots)) return 2;
  bool ok = run(1);  // the shim's shape: many app threads, one agent
  ok = run(3) && ok;
  return ok ? 0 : 1;
}
