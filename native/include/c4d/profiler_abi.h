/*
 * The NCCL profiler plugin interface, version 5 (NCCL 2.28.3+), declared by c4d from
 * the documented facts (docs/design.md, "NCCL's profiler plugin"); we never include
 * NVIDIA's headers. simnccl loads plugins through it, and the shim exports
 * `ncclProfiler_v5` and `ncclProfiler_v6` with it (native/shim/profiler.h). C and C++.
 *
 * v6 and v7 keep these callbacks and extend the descriptor union with new event kinds
 * (v7 also appends fields to coll/p2p), so a v5 plugin keeps working under newer NCCL
 * and a v5 loader (simnccl) must not hand this layout to a v7-only plugin.
 *
 * ---- commId passed to init() (what simnccl passes; real NCCL passes its commHash) ----
 * FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3) over little-endian bytes:
 *   ncclCommInitRank / InitRankConfig:  the 128 bytes of the ncclUniqueId
 *   ncclCommInitRankScalable:           the 128 bytes of commIds[0]
 *   ncclCommInitAll:                    the 128 bytes of the id it got from ncclGetUniqueId
 *                                       (called through the PLT, so an interposer sees it)
 *   ncclCommSplit:   16 bytes { uint64 parent_id; uint32 split_index; int32 color }
 *                    split_index = how many ncclCommSplit calls this rank made on the parent
 *                    before this one (NOCOLOR calls count; 0 for the first split)
 *   ncclCommShrink:  16 bytes { uint64 parent_id; uint32 0x80000000 | shrink_index;
 *                    int32 excludeRanksCount } followed by excludeRanksList as int32s in
 *                    the order given (shrink_index counts earlier Shrink calls on the parent)
 * where parent_id is the parent's commId by the same rules. simnccl uses this id to name
 * its shared memory too, so every member derives it without talking.
 *
 * ---- what simnccl emits, in NCCL 2.30.7's order (native/simnccl/profiler.h) ----
 *   on the launching thread, at the group's end (ncclGroupEnd, a bare op, a graph replay):
 *   Coll {seqNumber = per (comm, function) index from 0 over count > 0 calls, not advanced
 *         by graph replays (NCCL: comm->seqNumber[func], persistent plans excluded),
 *         func "AllReduce"..., count, root (-1 unrooted), datatype "ncclFloat32"...,
 *         nChannels 1, algo "RING", proto "SIMPLE"}  or  P2p {func "Send"/"Recv", buff,
 *         count, datatype, peer}; then the op's proxy ops are posted and the event stopped
 *         ("enqueued": completion is the last ProxyOp's stop)
 *   later, on the proxy progress thread, for transfers to a rank on another node only
 *   (SIMNCCL_RANKS_PER_NODE; inside a node NCCL's NVLink/P2P/SHM transports have no proxy):
 *     ProxyOp {pid, channelId 0, peer = the other end of one transfer (comm rank),
 *              nSteps, chunkSize = bytes per step, isSend}, parentObj = the stopped task
 *       └ ProxyStep {step}: recordEventState(SendWait | RecvWait, transSize) when the
 *              step starts (once every rank reached the op), stopEvent when its data
 *              moved. On a hung link the step stays in SendWait/RecvWait on exactly the
 *              two ranks of that link.
 * parentObj of Coll/P2p is NULL (no Group or API events).
 */
#ifndef C4D_PROFILER_ABI_H
#define C4D_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* pid_t */

#include "c4d/nccl_abi.h" /* ncclResult_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Event type bits: eDescr->type and *eActivationMask. Enabling an event enables its
 * ancestors (ProxyStep → ProxyOp → Coll/P2p). */
enum {
  ncclProfileGroup = (1 << 0),
  ncclProfileColl = (1 << 1),
  ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3),
  ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5),
  ncclProfileKernelCh = (1 << 6),
  ncclProfileNetPlugin = (1 << 7),
  ncclProfileGroupApi = (1 << 8),   /* v5 */
  ncclProfileCollApi = (1 << 9),    /* v5 */
  ncclProfileP2pApi = (1 << 10),    /* v5 */
  ncclProfileKernelLaunch = (1 << 11) /* v5 */
};

typedef enum {
  /* ProxyOp states (deprecated since v4) */
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyOpInProgress_v4 = 19,
  /* ProxyStep states */
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  /* ProxyCtrl states */
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  /* Network plugin, kernel channel, group API */
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24
} ncclProfilerEventState_v5_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

typedef struct {
  uint64_t type;   /* one ncclProfile* bit */
  void* parentObj; /* eHandle of the parent event (NULL for top-level events) */
  int rank;        /* comm rank of the emitting rank */
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid; /* check == getpid() before dereferencing parentObj (PXN) */
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

typedef struct {
  const char* name;
  /* Per communicator. *eActivationMask is one process-wide int: the last init's value wins. */
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

#define C4D_PROFILER_SYMBOL_V5 "ncclProfiler_v5"

/* v6 (NCCL 2.29.2+): the same five callbacks. Its descriptor union adds Copy-Engine
 * events (ceColl/ceCollSync/ceCollBatch, type bits 1<<12..1<<14, states 25-30) after the
 * v5 members, which keep their layout, so a v5 reader of a v6 descriptor sees every v5
 * event type at the same offsets. A plugin may export both symbols with one set of
 * callbacks; NCCL tries the newest first. */
typedef ncclProfiler_v5_t ncclProfiler_v6_t;
#define C4D_PROFILER_SYMBOL_V6 "ncclProfiler_v6"

#ifdef __cplusplus
}
#endif

#endif /* C4D_PROFILER_ABI_H */
