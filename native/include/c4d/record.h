/*
 * c4d record schema — the one definition of what travels from a rank to the master.
 *
 * Every record is C4D_RECORD_SIZE bytes, little-endian, and starts with the same
 * 16-byte header whose first field is the kind tag. Records travel in batches: one
 * ZeroMQ message = one c4d_batch_header followed by `n_records` records. The trace
 * file stores the same records back to back after its own header (see c4d/record/trace.py).
 *
 * Python mirrors this file in c4d/record/schema.py; tests/test_schema.py compiles a probe
 * against this header and checks every size and offset byte for byte.
 *
 * Version bump rule: C4D_SCHEMA_VERSION changes whenever a field moves, changes type
 * or changes meaning. Adding a new record kind, a new value of an enum field (a comm
 * event), or giving meaning to reserved bytes that were zero, does not bump it (old
 * readers skip unknown kinds and values; zero = "unknown").
 * Readers normalise old versions in one place (c4d/record/schema.py: upgrade()).
 *
 * Clocks: every *_ns field is nanoseconds since the Unix epoch on the rank's host
 * (CLOCK_REALTIME plus C4D_CLOCK_OFFSET_NS, which the simulator uses to fake skew).
 * Device times are CUDA event times mapped onto that clock through anchor events
 * (see native/shim/timing.cc); 0 means "not known".
 */
#ifndef C4D_RECORD_H
#define C4D_RECORD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define C4D_SCHEMA_VERSION 2 /* 2: the heartbeat's pending op says its count, dtype and reduction op */
#define C4D_RECORD_SIZE 128
#define C4D_BATCH_MAGIC 0x42443443u /* "C4DB" little-endian */

enum c4d_record_kind {
  C4D_REC_REGISTER = 1,  /* one per process at start-up, repeated every 10 heartbeats */
  C4D_REC_OP = 2,        /* one per NCCL operation, sent once its device times are known */
  C4D_REC_HEARTBEAT = 3, /* per communicator (comm_id 0: the process) every heartbeat */
  C4D_REC_COMM = 4,      /* communicator lifecycle: init, split, shrink, finalize, destroy, abort */
  C4D_REC_PEER = 5,      /* per-peer transfer progress from the NCCL profiler plugin API */
  C4D_REC_TICK = 6,      /* written by the master into traces only: "the engine ran at h.time_ns"
                            (master clock), so an offline replay evaluates exactly when the live run did */
  C4D_REC_STAGE = 7,     /* the training code set this process's hang timeout (c4d.hang_timeout):
                            sent when it changes, and again with every REGISTER repeat */
  C4D_REC_OPSUM = 8,     /* written by a node agent (c4d agent) only: one collective of a communicator
                            whose members all run on the agent's node, reduced from their OP records */
  C4D_REC_OPPART = 9     /* written by a node agent only: two members' OP records of one collective of a
                            communicator that spans nodes, both members on the agent's node */
};

/* c4d_heartbeat_record.hb_flags */
enum c4d_heartbeat_flags {
  C4D_HBF_FINAL = 1u << 0 /* the process is exiting cleanly: its silence from now on is not a loss */
};

/* NCCL operation kinds (c4d's own numbering, stable across NCCL releases). */
enum c4d_op_kind {
  C4D_OP_ALLREDUCE = 0,
  C4D_OP_BROADCAST = 1, /* ncclBroadcast and ncclBcast */
  C4D_OP_REDUCE = 2,
  C4D_OP_ALLGATHER = 3,
  C4D_OP_REDUCESCATTER = 4,
  C4D_OP_ALLTOALL = 5,
  C4D_OP_GATHER = 6,
  C4D_OP_SCATTER = 7,
  C4D_OP_SEND = 8,
  C4D_OP_RECV = 9,
  C4D_OP_COUNT = 10
};

/* c4d_op_record.flags */
enum c4d_op_flags {
  C4D_OPF_DEVICE_TIMING = 1u << 0, /* start_ns/end_ns come from CUDA events */
  C4D_OPF_IN_GROUP = 1u << 1,      /* issued inside ncclGroupStart/End; shares the group's events */
  C4D_OPF_P2P = 1u << 2,           /* seq counts per (comm, direction, peer) */
  C4D_OPF_INPLACE = 1u << 3,       /* sendbuff aliases recvbuff */
  C4D_OPF_CONFIG_CALL = 1u << 4,   /* the ...Config variant was called */
  C4D_OPF_NO_EVENT = 1u << 5,      /* event pool empty: host times only */
  C4D_OPF_EVENT_ERROR = 1u << 6,   /* an event query failed: times unreliable */
  C4D_OPF_COMPUTE_GIVEN = 1u << 7  /* set by a node agent only: compute_ns holds the rank's compute so far */
};

/* c4d_comm_record.event */
enum c4d_comm_event {
  C4D_COMM_INIT_RANK = 1,
  C4D_COMM_INIT_RANK_CONFIG = 2,
  C4D_COMM_INIT_ALL = 3,
  C4D_COMM_INIT_SCALABLE = 4,
  C4D_COMM_SPLIT = 5,
  C4D_COMM_SHRINK = 6,
  C4D_COMM_FINALIZE = 7,
  C4D_COMM_DESTROY = 8,
  C4D_COMM_ABORT = 9,
  C4D_COMM_REVOKE = 10,  /* ncclCommRevoke: in-flight ops stopped, the comm stays until destroyed */
  C4D_COMM_SUSPEND = 11, /* ncclCommSuspend: no ops until ncclCommResume */
  C4D_COMM_RESUME = 12
};

typedef struct c4d_batch_header {
  uint32_t magic;       /* C4D_BATCH_MAGIC */
  uint16_t version;     /* C4D_SCHEMA_VERSION */
  uint16_t record_size; /* C4D_RECORD_SIZE */
  uint32_t n_records;   /* records that follow */
  int32_t rank;         /* sender's global rank (-1 unknown) */
} c4d_batch_header;     /* 16 bytes */

typedef struct c4d_record_header {
  uint16_t kind;    /* enum c4d_record_kind */
  uint16_t version; /* C4D_SCHEMA_VERSION */
  int32_t rank;     /* global rank of the process (RANK env and friends; -1 unknown) */
  uint64_t time_ns; /* host time the record was written */
} c4d_record_header; /* 16 bytes */

typedef struct c4d_register_record {
  c4d_record_header h;
  uint64_t hang_timeout_us;   /* C4D_HANG_TIMEOUT in force */
  int32_t pid;
  int32_t world_size;         /* WORLD_SIZE and friends; -1 unknown */
  int32_t local_rank;         /* LOCAL_RANK; -1 unknown */
  int32_t cuda_device;        /* device at registration; -1 none */
  int32_t nccl_version;       /* ncclGetVersion(); 0 unknown */
  int32_t hang_times;         /* C4D_HANG_TIMES */
  int32_t bw_check_period_s;  /* C4D_CONN_BW_CHECK_PERIOD */
  int32_t heartbeat_ms;       /* C4D_HEARTBEAT_MS */
  uint32_t build_rev;         /* first 8 hex digits of the shim's git revision */
  uint8_t log_level;          /* 0 TRACE .. 5 FATAL */
  uint8_t stats_output;       /* C4D_ENABLE_STATS_OUTPUT */
  uint8_t device_timing;      /* 1 when the CUDA runtime was found */
  uint8_t reserved0;
  char node[40];              /* C4D_NODE_NAME or hostname, NUL-terminated, truncated */
  char job[24];               /* C4D_JOB_ID / TORCHELASTIC_RUN_ID / SLURM_JOB_ID, truncated */
} c4d_register_record;

typedef struct c4d_op_record {
  c4d_record_header h;
  uint64_t comm_id;   /* communicator id, equal on every rank of the communicator */
  uint64_t seq;       /* collectives: per-comm sequence; p2p: per (comm, direction, peer) */
  uint64_t issue_ns;  /* host: the application called NCCL */
  uint64_t start_ns;  /* device: the stream reached the op (start event fired); 0 unknown */
  uint64_t end_ns;    /* device: the op completed on this rank (end event fired); 0 unknown */
  uint64_t count;     /* elements, as passed to NCCL */
  uint64_t bytes;     /* count x datatype size (per rank send size for gathers) */
  uint64_t stream;    /* cudaStream_t value */
  uint64_t group_id;  /* per-process group counter; 0 outside ncclGroupStart/End */
  uint64_t return_ns; /* host: the NCCL call returned */
  int32_t comm_rank;
  int32_t comm_nranks;
  int32_t peer;       /* root for rooted collectives, peer for p2p, -1 otherwise */
  int32_t device;     /* CUDA device of the communicator */
  int32_t result;     /* ncclResult_t returned by NCCL */
  uint8_t op;         /* enum c4d_op_kind */
  uint8_t dtype;      /* ncclDataType_t (255 unknown: imports of data NCCL has no type for) */
  uint8_t redop;      /* ncclRedOp_t (255 none) */
  uint8_t flags;      /* enum c4d_op_flags */
  int64_t compute_ns; /* 0 from the shim. A node agent's forwarded OP (C4D_OPF_COMPUTE_GIVEN): the
                         rank's compute so far, the sum of its gaps between synchronizing ops (ns),
                         which the master cannot compute when the agent summarised some of its ops */
} c4d_op_record;

typedef struct c4d_heartbeat_record {
  c4d_record_header h;
  uint64_t comm_id;        /* 0: process-level heartbeat */
  uint64_t n_issued;       /* collectives issued on this comm (next seq) */
  uint64_t n_arrived;      /* collectives whose start event fired */
  uint64_t n_done;         /* collectives whose end event fired */
  uint64_t last_arrive_ns; /* device start time of the latest arrived collective */
  uint64_t last_done_ns;   /* device end time of the latest completed collective */
  uint64_t pend_seq;       /* oldest op (coll or p2p) not done; UINT64_MAX none */
  uint64_t pend_issue_ns;  /* its host issue time */
  uint64_t pend_start_ns;  /* its device start time; 0 not arrived */
  uint64_t pend_count;     /* its element count, as passed to NCCL; 0 none (version 2) */
  uint64_t sent;           /* process total: records handed to ZeroMQ (queued, not necessarily delivered) */
  uint32_t dropped;        /* process total: records dropped (queue full, no master); saturates
                              at UINT32_MAX (64 bits before version 2) */
  int32_t comm_rank;
  int32_t comm_nranks;
  int32_t pend_peer;       /* its root/peer, -1 none */
  int16_t device;          /* (32 bits before version 2) */
  uint8_t p2p_in_flight;   /* p2p ops issued and not done, saturates at 255 (32 bits before version 2) */
  uint8_t hb_flags;        /* enum c4d_heartbeat_flags (16 bits before version 2) */
  uint8_t pend_op;         /* its enum c4d_op_kind, 255 none */
  uint8_t pend_flags;      /* its enum c4d_op_flags */
  uint8_t pend_dtype;      /* its ncclDataType_t, 255 none or unknown (version 2) */
  uint8_t pend_redop;      /* its ncclRedOp_t, 255 none or unknown (version 2) */
} c4d_heartbeat_record;

typedef struct c4d_comm_record {
  c4d_record_header h;
  uint64_t comm_id;
  uint64_t parent_id; /* split/shrink: parent communicator id; 0 otherwise */
  uint64_t handle;    /* ncclComm_t value in this process (for debugging) */
  int32_t comm_rank;
  int32_t comm_nranks;
  int32_t color;      /* split color (-1 otherwise) */
  int32_t key;        /* split key */
  int32_t device;
  int32_t result;     /* ncclResult_t of the call */
  uint8_t event;      /* enum c4d_comm_event */
  uint8_t reserved[63];
} c4d_comm_record;

typedef struct c4d_peer_record {
  c4d_record_header h;
  uint64_t comm_id;
  uint64_t seq;         /* collective sequence (profiler seqNumber) or p2p seq */
  uint64_t first_ns;    /* first progress seen for this (op, peer, direction) */
  uint64_t last_ns;     /* latest progress */
  uint64_t bytes_done;  /* bytes moved so far in this direction */
  int32_t comm_rank;
  int32_t peer;         /* the peer of this transfer */
  uint32_t steps_total; /* ProxyOp nSteps (summed over channels) */
  uint32_t steps_done;
  uint8_t direction;    /* 0 send, 1 recv */
  uint8_t state;        /* last ProxyStep state (ncclProfilerEventState_t), 0 none */
  uint8_t op;           /* enum c4d_op_kind */
  uint8_t done;         /* 1 when every step finished */
  uint8_t reserved0[4];
  uint64_t wire_ns;     /* send side: summed SendWait -> step stop of its steps (its own transfer
                           time, not the ring's pace); 0 unknown (a receive, an older shim) */
  uint8_t reserved[40];
} c4d_peer_record;

typedef struct c4d_stage_record {
  c4d_record_header h;     /* time_ns: when the training code set the value */
  int64_t hang_timeout_us; /* > 0: hangs this rank causes wait this long; -1: none while it lasts;
                              0: back to the job's C4D_HANG_TIMEOUT */
  uint64_t generation;     /* changes so far in this process (a repeat carries the same one) */
  uint8_t reserved[96];
} c4d_stage_record;

/* Written by a node agent, never by a rank: collective (comm_id, seq) of a communicator of at most
 * C4D_OPSUM_MAX_MEMBERS members that all run on the agent's node, once every member's OP record is
 * in. One host clock, so the times below need no alignment among the members; the master maps
 * them onto its clock with the node's offset. Wait, transfer and margin are as the master's engine
 * computes them from the members' OP records (c4d/engine/state.py: Comm._reduce). */
#define C4D_OPSUM_MAX_MEMBERS 8
typedef struct c4d_opsum_record {
  c4d_record_header h;      /* rank: the member that arrived last; time_ns: the latest of its members' records */
  uint64_t comm_id;
  uint64_t seq;
  uint64_t bytes;
  uint64_t last_arrive_ns;  /* the last member's arrival (device start, else host issue) */
  int64_t transfer_ns;      /* median end minus the last arrival */
  int64_t margin_ns;        /* last arrival minus the next-to-last */
  int64_t wait_med_ns;      /* members' wait for the last one: median */
  int64_t wait_max_ns;      /* and maximum */
  int32_t comm_rank;        /* the member that arrived last */
  int32_t comm_nranks;      /* <= C4D_OPSUM_MAX_MEMBERS */
  float compute_ns[C4D_OPSUM_MAX_MEMBERS]; /* each member's compute before this op since its previous
                                              op of this communicator; NaN unknown or no member */
  uint8_t op;               /* enum c4d_op_kind (collectives only) */
  uint8_t flags;            /* enum c4d_opsum_flags */
  uint8_t sample_shift;     /* the agent sends the ops its slow-window sample keeps (one in
                               2^sample_shift, by a hash of seq: c4d/engine/sampling.py) and each
                               flush's last op; a row outside its own sample is progress only */
  uint8_t reserved[5];
} c4d_opsum_record;

/* c4d_opsum_record.flags */
enum c4d_opsum_flags {
  C4D_OPSF_ENDS_KNOWN = 1u << 0 /* every member's end time was known (end_ns > 0) */
};

/* Written by a node agent, never by a rank: the OP records of two members on the agent's node of one
 * collective (comm_id, seq) of a communicator that spans nodes: the node's part of the op (the other
 * members' come as their own records or in their nodes' parts). Lossless for what the master reads of an OP record:
 * it unpacks the part into the two OP records (c4d/record/oppart.py) before its engine sees them; the
 * stream, the return time and the device are not carried (0, 0 and -1 unpacked). The agent packs two
 * records only when they agree on everything below but the members' own fields, neither is in an
 * ncclGroup, both returned ncclSuccess, the bytes are count x the datatype's size, and every time lies
 * within 2^32 - 2 ns of base_ns; any other record goes as it came. */
#define C4D_OPPART_MEMBERS 2
typedef struct c4d_oppart_record {
  c4d_record_header h;      /* rank: the first member's; time_ns: the later of the two records' */
  uint64_t comm_id;
  uint64_t seq;
  uint64_t count;           /* elements, as passed to NCCL (bytes: count x the datatype's size) */
  uint64_t base_ns;         /* the earliest non-zero time of the two records: the offsets' origin */
  int64_t compute_ns[C4D_OPPART_MEMBERS]; /* each member's compute so far (C4D_OPF_COMPUTE_GIVEN) */
  int32_t comm_nranks;
  int32_t comm_rank;        /* the first member's */
  int32_t rank1;            /* the second member's global rank */
  int32_t comm_rank1;       /* and its comm rank */
  int32_t peer;             /* root for rooted collectives, else -1 */
  uint8_t op;               /* enum c4d_op_kind (collectives only) */
  uint8_t dtype;
  uint8_t redop;
  uint8_t flags;            /* enum c4d_op_flags of both records */
  uint32_t off[C4D_OPPART_MEMBERS][4]; /* per member: its record's time, issue, start and end as
                                          t - base_ns + 1; 0 where the time is 0 (unknown) */
  uint8_t reserved[8];
} c4d_oppart_record;

#ifdef __cplusplus
static_assert(sizeof(c4d_batch_header) == 16, "batch header size");
static_assert(sizeof(c4d_record_header) == 16, "record header size");
static_assert(sizeof(c4d_register_record) == C4D_RECORD_SIZE, "register size");
static_assert(sizeof(c4d_op_record) == C4D_RECORD_SIZE, "op size");
static_assert(sizeof(c4d_heartbeat_record) == C4D_RECORD_SIZE, "heartbeat size");
static_assert(sizeof(c4d_comm_record) == C4D_RECORD_SIZE, "comm size");
static_assert(sizeof(c4d_peer_record) == C4D_RECORD_SIZE, "peer size");
static_assert(sizeof(c4d_stage_record) == C4D_RECORD_SIZE, "stage size");
static_assert(sizeof(c4d_opsum_record) == C4D_RECORD_SIZE, "opsum size");
static_assert(sizeof(c4d_oppart_record) == C4D_RECORD_SIZE, "oppart size");
}
#endif

#endif /* C4D_RECORD_H */
