#include "timeline.h"

#include <algorithm>

#include "comm.h"
#include "common.h"
#include "config.h"
#include "profiler.h"

namespace sim {
namespace {

constexpr uint64_t kPipeChunk = 512 * 1024; /* broadcast/reduce pipeline chunk */
constexpr int kPipeMaxChunks = 8;

uint64_t move_ns(const ncclComm* c, int src, int dst, uint64_t bytes, int step, double jit) {
  double bw = link_bw(c->granks[size_t(src)], c->granks[size_t(dst)], step);
  if (bw <= 0) return kNever;
  return uint64_t((double(config().lat_ns) + double(bytes) / bw) * jit);
}

}  // namespace

Schedule model_coll(const ncclComm* c, int kind, uint64_t bytes_unit, int root, int step, uint64_t seq,
                    uint64_t t0) {
  const int n = c->nranks, r = c->rank;
  Schedule s;
  s.t0 = t0;
  s.finish = t0;
  if (n == 1) return s; /* a local copy: no link, no modeled time */
  auto at = [n](int i) { return ((i % n) + n) % n; };
  std::vector<std::pair<int, int>> links; /* directed, comm ranks */
  uint64_t chunk = bytes_unit;
  int steps = n - 1;
  auto ring_links = [&] {
    for (int i = 0; i < n; ++i) links.push_back({i, at(i + 1)});
  };
  struct Mine {
    int peer;
    bool send;
    int first, nsteps;
  };
  std::vector<Mine> mine;
  enum { kDirect, kRing, kChain } flow = kDirect; /* how data moves from link to link */
  int head = 0;
  switch (kind) {
    case kAllReduce:
      steps = 2 * (n - 1);
      chunk = (bytes_unit + uint64_t(n) - 1) / uint64_t(n);
      [[fallthrough]];
    case kAllGather:
    case kReduceScatter:
      ring_links();
      flow = kRing;
      mine.push_back({at(r + 1), true, 0, steps});
      mine.push_back({at(r - 1), false, 0, steps});
      break;
    case kAlltoAll:
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          if (i != j) links.push_back({i, j});
      for (int k = 1; k < n; ++k) {
        mine.push_back({at(r + k), true, k - 1, 1});
        mine.push_back({at(r - k), false, k - 1, 1});
      }
      break;
    case kGather:
    case kScatter: {
      bool gather = kind == kGather;
      for (int j = 0; j < n; ++j) {
        if (j == root) continue;
        links.push_back(gather ? std::make_pair(j, root) : std::make_pair(root, j));
        int idx = at(j - root - 1); /* root serves peers in ring order */
        if (r == root) mine.push_back({j, !gather, idx, 1});
        if (r == j) mine.push_back({root, gather, idx, 1});
      }
      break;
    }
    case kBroadcast:
    case kReduce: {
      int k = int(std::min<uint64_t>(std::max<uint64_t>((bytes_unit + kPipeChunk - 1) / kPipeChunk, 1),
                                     kPipeMaxChunks));
      chunk = (bytes_unit + uint64_t(k) - 1) / uint64_t(k);
      steps = n - 1 + k - 1;
      head = kind == kBroadcast ? root : at(root + 1); /* the chain runs head -> ... -> tail */
      flow = kChain;
      for (int i = 0; i < n - 1; ++i) links.push_back({at(head + i), at(head + i + 1)});
      int pos = at(r - head);
      if (pos > 0) mine.push_back({at(r - 1), false, pos - 1, k});
      if (pos < n - 1) mine.push_back({at(r + 1), true, pos, k});
      break;
    }
    default:
      return s;
  }
  double jit = jitter_factor(c->seed, c->id ^ mix64(seq));
  double bw_min = 0;
  bool hung = false;
  std::vector<char> stops_from(size_t(n), 0); /* a ring's or chain's link leaving comm rank i is hung */
  for (size_t i = 0; i < links.size(); ++i) {
    double bw = link_bw(c->granks[size_t(links[i].first)], c->granks[size_t(links[i].second)], step);
    if (bw <= 0) {
      hung = true;
      stops_from[size_t(links[i].first)] = 1;
    }
    if (i == 0 || bw < bw_min) bw_min = bw;
  }
  s.total_steps = steps;
  s.step_ns = hung ? 0 : uint64_t((double(config().lat_ns) + double(chunk) / bw_min) * jit);
  s.finish = hung ? kNever : t0 + uint64_t(steps) * s.step_ns;
  if (hung) { /* the healthy links still pace their steps at their own rate */
    double slowest_ok = 0;
    for (auto& l : links) {
      double bw = link_bw(c->granks[size_t(l.first)], c->granks[size_t(l.second)], step);
      if (bw > 0 && (slowest_ok == 0 || bw < slowest_ok)) slowest_ok = bw;
    }
    s.step_ns = slowest_ok > 0 ? uint64_t((double(config().lat_ns) + double(chunk) / slowest_ok) * jit)
                               : uint64_t(double(config().lat_ns) * jit);
  }
  for (const Mine& m : mine) {
    int src = m.send ? r : m.peer, dst = m.send ? m.peer : r;
    uint64_t mv = move_ns(c, src, dst, chunk, step, jit);
    int done = mv == kNever ? 0 : m.nsteps;
    if (hung && mv != kNever && flow != kDirect) {
      /* Hops back from this link to the nearest hung one: a ring's link completes that many
       * steps; a chain's, none when a hung link feeds it. */
      for (int d = 1; d < n; ++d) {
        int a = at(src - d);
        if (flow == kChain && at(a - head) >= at(src - head)) break; /* past the chain's head */
        if (stops_from[size_t(a)]) {
          done = flow == kRing ? std::min(d, m.nsteps) : 0;
          break;
        }
      }
    }
    s.mine.push_back({m.peer, m.send, m.first, m.nsteps, chunk, mv, done});
  }
  return s;
}

Schedule model_p2p(const ncclComm* c, int src, int dst, bool me_is_src, uint64_t bytes, int step, uint32_t idx,
                   uint64_t t0) {
  Schedule s;
  s.t0 = t0;
  s.finish = t0;
  if (src == dst) return s; /* a local copy */
  double jit = jitter_factor(c->seed, c->id ^ mix64((uint64_t(uint32_t(src)) << 32) | uint32_t(dst)) ^ mix64(idx + 1));
  uint64_t mv = move_ns(c, src, dst, bytes, step, jit);
  s.total_steps = 1;
  s.step_ns = mv == kNever ? 0 : mv;
  s.finish = mv == kNever ? kNever : t0 + mv;
  s.mine.push_back({me_is_src ? dst : src, me_is_src, 0, 1, bytes, mv, mv == kNever ? 0 : 1});
  return s;
}

void wait_timeline(std::vector<TimedOp>& ops) {
  for (const TimedOp& t : ops)
    if (t.op->proxy) profiler_publish(t.op->proxy, t.sched); /* its ProxySteps may start */
  uint64_t end = 0;
  for (const TimedOp& t : ops) end = std::max(end, t.sched.finish);
  if (end != kNever) {
    sleep_until_ns(end);
    for (const TimedOp& t : ops) /* the kernel ends after its network transfers */
      if (t.op->proxy) profiler_wait(t.op->proxy, t.op->comm);
    return;
  }
  /* A hung link: nobody finishes. Sleep (100 ms at a time) until a comm is aborted. */
  for (;;) {
    for (const TimedOp& t : ops)
      if (t.op->comm->aborted.load()) return;
    sleep_until_ns(now_ns() + 100000000ull);
  }
}

}  // namespace sim
