/*
 * What one NCCL operation is once issued: the host fills an OpDesc at the call, the
 * stream worker executes a GroupWork (one ncclGroupStart/End, or one bare call).
 */
#ifndef SIMNCCL_OPS_H
#define SIMNCCL_OPS_H

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "c4d/nccl_abi.h"

namespace sim {

struct ProxySet; /* profiler.h */

/* Same numbering as c4d_op_kind in c4d/record.h. */
enum OpKind : uint8_t {
  kAllReduce = 0,
  kBroadcast = 1,
  kReduce = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kAlltoAll = 5,
  kGather = 6,
  kScatter = 7,
  kSend = 8,
  kRecv = 9,
};

const char* op_func_name(int kind); /* NCCL's ncclFuncToString spelling: "AllReduce", "Send", ... */
const char* dtype_name(int dtype);  /* "ncclFloat32", ... */

struct OpDesc {
  uint8_t kind;
  int dtype, redop, peer; /* peer = root of rooted collectives, peer of p2p, -1 otherwise */
  const void* send;
  void* recv;
  size_t count; /* as passed to NCCL */
  ncclComm* comm;
  uint64_t seq; /* collectives: per-comm sequence, 1-based (profiler seqNumber = seq - 1) */
  int step;     /* simSetStep at issue time */
  ProxySet* proxy = nullptr; /* its ProxyOps when a profiler plugin listens (profiler.h) */
};

struct GroupWork {
  std::vector<OpDesc> ops;
  std::vector<std::pair<ncclComm*, uint32_t>> tickets; /* one per comm touched, issue order */
};

}  // namespace sim

#endif  // SIMNCCL_OPS_H
