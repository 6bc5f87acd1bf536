/*
 * Everything the shim reads from the environment, parsed once (at the first NCCL call)
 * into one immutable struct. A malformed value prints exactly one line naming the
 * variable, the bad value and the default used, and the default applies; never a crash.
 */
#ifndef C4D_SHIM_CONFIG_H
#define C4D_SHIM_CONFIG_H

#include <stdint.h>

namespace c4d {

struct Config {
  /* docs/design.md's job-side table */
  uint64_t hang_timeout_us;  // C4D_HANG_TIMEOUT
  int hang_times;            // C4D_HANG_TIMES
  int bw_check_period_s;     // C4D_CONN_BW_CHECK_PERIOD
  int log_level;             // C4D_RUNTIME_LOG_LEVEL, 0 TRACE .. 5 FATAL
  bool stats_output;         // C4D_ENABLE_STATS_OUTPUT
  char master_addr[256];     // C4D_MASTER_ADDR; "" when malformed (nothing is sent)
  bool enable;               // C4D_ENABLE
  char node[40];             // C4D_NODE_NAME, else hostname
  /* the shim's own knobs */
  int heartbeat_ms;          // C4D_HEARTBEAT_MS
  uint32_t queue_capacity;   // C4D_QUEUE_CAPACITY, rounded up to a power of two
  uint32_t event_pool;       // C4D_EVENT_POOL (events per device)
  int send_hwm;              // C4D_SEND_HWM (ZeroMQ messages)
  int exit_flush_ms;         // C4D_EXIT_FLUSH_MS: the exit waits at most this + kExitMarginMs (agent.h)
  int64_t clock_offset_ns;   // C4D_CLOCK_OFFSET_NS (simulated clock skew)
  uint32_t peer_track;       // C4D_PEER_TRACK: transfers the profiler plugin tracks at once
  bool tsc;                  // C4D_TSC: hot-path times from the TSC where the kernel keeps time with it
  char libzmq[1024];         // C4D_LIBZMQ; empty = search
  char curve_server_key[41]; // C4D_CURVE_SERVER_KEY (Z85, or a file holding it); "" = no CURVE
  bool curve_bad;            // C4D_CURVE_SERVER_KEY set but unusable: nothing is sent (master_addr "")
  /* identity, from the launcher's variables */
  char job[24];              // C4D_JOB_ID / TORCHELASTIC_RUN_ID / SLURM_JOB_ID
  int rank;                  // RANK / OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID; -1
  int world_size;            // WORLD_SIZE / OMPI_COMM_WORLD_SIZE / PMI_SIZE / SLURM_NTASKS; -1
  int local_rank;            // LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID; -1
};

extern const char* const kDefaultMasterAddr;

/* Reads the environment into *c. Any thread, but called once (shim.cc). */
void config_load(Config* c);

}  // namespace c4d

#endif  // C4D_SHIM_CONFIG_H
