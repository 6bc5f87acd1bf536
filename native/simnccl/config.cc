#include "config.h"

#include <cstdlib>
#include <mutex>

#include "common.h"
#include "include/simnccl/sim_ext.h"

namespace sim {
namespace {

std::atomic<int> g_step{0};

Config* load() {
  Config* c = new Config; /* leaked on purpose: stream workers may use it during exit */
  c->intra_bpns = env_double("SIMNCCL_INTRA_GBPS", 4.0, 1e-6, 1e6);
  c->inter_bpns = env_double("SIMNCCL_INTER_GBPS", 1.0, 1e-6, 1e6);
  c->lat_ns = uint64_t(env_double("SIMNCCL_LAT_US", 20.0, 0.0, 1e7) * 1000.0);
  c->ranks_per_node = int(env_long("SIMNCCL_RANKS_PER_NODE", 0, 0, 1 << 20));
  c->jitter = env_double("SIMNCCL_JITTER", 0.03, 0.0, 0.9);
  c->seed = uint64_t(env_long("SIMNCCL_SEED", 1, 0, (1L << 62)));
  simfault::ParseResult r = simfault::parse_faults(getenv("SIMNCCL_FAULTS"));
  for (const std::string& e : r.errors) logf("%s", e.c_str());
  for (const simfault::Fault& f : r.faults)
    if (simfault::is_comm_kind(f.kind)) c->comm_faults.push_back(f);
  return c;
}

}  // namespace

const Config& config() {
  static const Config* c = load();
  return *c;
}

double link_bw(int src, int dst, int step) {
  const Config& c = config();
  bool same_node = c.ranks_per_node <= 0 || (src / c.ranks_per_node == dst / c.ranks_per_node);
  double bw = same_node ? c.intra_bpns : c.inter_bpns;
  for (const simfault::Fault& f : c.comm_faults) {
    if (!f.active(step) || !f.touches_link(src, dst)) continue;
    if (f.kind == simfault::Kind::CommHang) return 0.0;
    bw /= f.factor;
  }
  return bw;
}

double jitter_factor(uint64_t seed, uint64_t key) {
  const Config& c = config();
  if (c.jitter <= 0) return 1.0;
  double u = double(mix64(seed ^ mix64(key)) >> 11) * (1.0 / 9007199254740992.0); /* [0,1) */
  return 1.0 + c.jitter * (2.0 * u - 1.0);
}

int current_step() { return g_step.load(std::memory_order_relaxed); }

}  // namespace sim

SIM_API void simSetStep(int step) { sim::g_step.store(step, std::memory_order_relaxed); }
