/*
 * Process-wide simulation config (read once from the environment) and the link
 * model: which node a global rank sits on, each link's bandwidth at a training step
 * with SIMNCCL_FAULTS applied, and the deterministic jitter every rank agrees on.
 *
 *   SIMNCCL_INTRA_GBPS      intra-node link bandwidth, GB/s (1e9 bytes/s)    default 4
 *   SIMNCCL_INTER_GBPS      inter-node link bandwidth, GB/s                  default 1
 *   SIMNCCL_LAT_US          per-step latency, microseconds                   default 20
 *   SIMNCCL_RANKS_PER_NODE  node = global_rank / this (0: all on one node)   default 0
 *   SIMNCCL_JITTER          multiplicative noise on modeled times, fraction  default 0.03
 *   SIMNCCL_SEED            seed of that noise (comm rank 0's value wins)   default 1
 *   SIMNCCL_FAULTS          fault specs (fault_spec.h); comm kinds apply here
 *   SIMNCCL_NUM_DEVICES     what cudaGetDeviceCount reports (cuda_runtime.cc)  default 8
 *   SIMNCCL_JOB             shm name prefix /simnccl-<job>-* (comm.cc)       default p<pid>
 */
#ifndef SIMNCCL_CONFIG_H
#define SIMNCCL_CONFIG_H

#include <cstdint>
#include <vector>

#include "fault_spec.h"

namespace sim {

struct Config {
  double intra_bpns; /* bytes per ns */
  double inter_bpns;
  uint64_t lat_ns;
  int ranks_per_node; /* 0: one node */
  double jitter;
  uint64_t seed;
  std::vector<simfault::Fault> comm_faults; /* comm-hang / comm-slow only */
};

/* Parsed on first use; malformed values print one line each, once per process. */
const Config& config();

/* Bandwidth of the transfer src -> dst (global ranks) for an op of training step `step`,
 * in bytes per ns, with the comm faults active at that step applied (fault_spec.h: a rank
 * fault both directions of its links, a link fault the direction(s) it names); 0 = the
 * link is hung (comm-hang). */
double link_bw(int src, int dst, int step);


/* 1 + SIMNCCL_JITTER * u, u uniform in [-1, 1] from (seed, key): equal on every rank
 * that passes the same seed (the comm's: its rank 0's SIMNCCL_SEED). */
double jitter_factor(uint64_t seed, uint64_t key);

/* Current training step as told by simSetStep (host side). */
int current_step();

}  // namespace sim

#endif  // SIMNCCL_CONFIG_H
