/*
 * Calls the real libnccl.so.2 the way an application does on a machine without a GPU, and
 * prints one line per call: what it returned, ncclGetErrorString of that, and
 * ncclGetLastError(NULL) right after. tests/test_conformance_real_nccl.py runs it with and
 * without libc4d.so preloaded and requires the same output, byte for byte.
 *
 * Compiled by that test against NVIDIA's nccl.h from the nvidia-nccl-cu12 wheel (with
 * tests/native/cuda_stub/ for the CUDA types). -DWITH_CUDART links the wheel's
 * libcudart.so.12 too, as PyTorch does, so the shim finds a CUDA runtime (whose calls all
 * fail without a driver).
 *
 * No GPU: every communicator init fails, so the collectives get a NULL comm; NCCL checks the
 * comm before anything else (src/enqueue.cc ncclEnqueueCheck → CommCheck), so the bad
 * datatypes, ops, roots and buffers below reach NCCL's argument checks only with a comm, and
 * here show that the shim passes any value through without reading it.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

#ifdef WITH_CUDART
int cudaGetDeviceCount(int* count); /* cudaError_t: an int-sized enum */
#endif

static void show(const char* what, ncclResult_t r) {
  const char* last = ncclGetLastError(NULL);
  printf("%-44s rc=%d (%s) last='%s'\n", what, (int)r, ncclGetErrorString(r), last ? last : "(null)");
}

#define CALL(expr) show(#expr, (expr))

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0); /* NCCL's own WARN lines go to the same stdout, in order */
#ifdef WITH_CUDART
  int ndev = -1;
  int cerr = cudaGetDeviceCount(&ndev);
  printf("cudaGetDeviceCount: %d, %d devices\n", cerr, ndev);
#endif

  /* queries */
  int version = 0;
  CALL(ncclGetVersion(&version));
  printf("version %d\n", version);
  for (int r = -1; r <= (int)ncclNumResults + 1; ++r) printf("errstr %d '%s'\n", r, ncclGetErrorString((ncclResult_t)r));
  printf("last at start '%s'\n", ncclGetLastError(NULL));

  ncclUniqueId id, zero;
  memset(&id, 0, sizeof id);
  memset(&zero, 0, sizeof zero);
  CALL(ncclGetUniqueId(&id));
  printf("unique id filled: %d\n", memcmp(&id, &zero, sizeof id) != 0);
  CALL(ncclGetUniqueId(NULL));

  /* groups before anything failed: balanced, nested, unbalanced, simulated */
  CALL(ncclGroupStart());
  CALL(ncclGroupEnd());
  CALL(ncclGroupStart());
  CALL(ncclGroupStart());
  CALL(ncclGroupEnd());
  CALL(ncclGroupEnd());
  CALL(ncclGroupEnd()); /* one too many */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CALL(ncclGroupStart());
  CALL(ncclGroupSimulateEnd(&sim));
  CALL(ncclGroupEnd()); /* after a simulated end: still in the group? */
  CALL(ncclGroupSimulateEnd(NULL));
  CALL(ncclGroupSimulateEnd(&sim));

  /* communicators: init fails without a GPU */
  ncclComm_t comm = (ncclComm_t)(uintptr_t)0xdead;
  CALL(ncclCommInitRank(&comm, 1, id, 0));
  printf("comm after a failed init: %s\n", comm == NULL ? "NULL" : comm == (ncclComm_t)(uintptr_t)0xdead ? "untouched" : "set");
  CALL(ncclCommInitRank(NULL, 1, id, 0));
  CALL(ncclCommInitRank(&comm, 0, id, 0));
  CALL(ncclCommInitRank(&comm, 2, id, 5));
  CALL(ncclCommInitRank(&comm, -1, id, 0));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  CALL(ncclCommInitRankConfig(&comm, 1, id, 0, &config));
  CALL(ncclCommInitRankConfig(&comm, 1, id, 0, NULL));
  ncclConfig_t nonblocking = NCCL_CONFIG_INITIALIZER;
  nonblocking.blocking = 0;
  CALL(ncclCommInitRankConfig(&comm, 1, id, 0, &nonblocking));
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  CALL(ncclCommInitRankConfig(&comm, 1, id, 0, &bad));

  ncclComm_t comms[2] = {NULL, NULL};
  int devs[2] = {0, 1};
  CALL(ncclCommInitAll(comms, 1, NULL));
  CALL(ncclCommInitAll(comms, 2, devs));
  CALL(ncclCommInitAll(comms, 0, NULL));
  CALL(ncclCommInitAll(NULL, 1, NULL));
  CALL(ncclCommInitRankScalable(&comm, 1, 0, 1, &id, NULL));
  CALL(ncclCommInitRankScalable(&comm, 1, 0, 0, NULL, NULL));

  ncclComm_t child = NULL;
  int exclude[1] = {0};
  CALL(ncclCommSplit(NULL, 0, 0, &child, NULL));
  CALL(ncclCommSplit(NULL, 0, 0, &child, &config));
  (void)exclude; /* ncclCommShrink(NULL, ...) crashes NCCL 2.32.3 itself (no NULL check): not called */
  CALL(ncclCommFinalize(NULL));
  CALL(ncclCommDestroy(NULL));
  CALL(ncclCommAbort(NULL));
  int n = -7;
  ncclResult_t async = ncclSuccess;
  CALL(ncclCommCount(NULL, &n));
  CALL(ncclCommUserRank(NULL, &n));
  CALL(ncclCommCuDevice(NULL, &n));
  CALL(ncclCommGetAsyncError(NULL, &async));

  /* collectives and p2p on a NULL comm (no communicator can exist here) */
  float buf[64], out[128];
  cudaStream_t s = NULL;
  CALL(ncclAllReduce(buf, out, 64, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclBroadcast(buf, out, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclBcast(buf, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclReduce(buf, out, 64, ncclFloat32, ncclMax, 0, NULL, s));
  CALL(ncclAllGather(buf, out, 64, ncclFloat32, NULL, s));
  CALL(ncclReduceScatter(out, buf, 64, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclAlltoAll(buf, out, 32, ncclFloat32, NULL, s));
  CALL(ncclGather(buf, out, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclScatter(out, buf, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclSend(buf, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclRecv(out, 64, ncclFloat32, 0, NULL, s));

  /* the 2.31+ per-call config variants, with and without a config */
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  CALL(ncclAllReduceConfig(buf, out, 64, ncclFloat32, ncclSum, NULL, s, &cc));
  CALL(ncclAllReduceConfig(buf, out, 64, ncclFloat32, ncclSum, NULL, s, NULL));
  CALL(ncclBroadcastConfig(buf, out, 64, ncclFloat32, 0, NULL, s, &cc));
  CALL(ncclReduceConfig(buf, out, 64, ncclFloat32, ncclSum, 0, NULL, s, &cc));
  CALL(ncclAllGatherConfig(buf, out, 64, ncclFloat32, NULL, s, &cc));
  CALL(ncclReduceScatterConfig(out, buf, 64, ncclFloat32, ncclSum, NULL, s, &cc));
  CALL(ncclAlltoAllConfig(buf, out, 32, ncclFloat32, NULL, s, &cc));
  CALL(ncclGatherConfig(buf, out, 64, ncclFloat32, 0, NULL, s, &cc));
  CALL(ncclScatterConfig(out, buf, 64, ncclFloat32, 0, NULL, s, NULL));

  /* bad arguments: datatype, op, root, peer, count, buffers */
  CALL(ncclAllReduce(buf, out, 64, (ncclDataType_t)99, ncclSum, NULL, s));
  CALL(ncclAllReduce(buf, out, 64, (ncclDataType_t)-1, ncclSum, NULL, s));
  CALL(ncclAllReduce(buf, out, 64, ncclFloat32, (ncclRedOp_t)99, NULL, s));
  CALL(ncclAllReduce(NULL, NULL, 64, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclAllReduce(buf, out, SIZE_MAX, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclBroadcast(buf, out, 64, ncclFloat32, -5, NULL, s));
  CALL(ncclReduce(buf, out, 64, (ncclDataType_t)200, (ncclRedOp_t)-3, 1 << 30, NULL, s));
  CALL(ncclSend(NULL, 64, ncclFloat32, -1, NULL, s));
  CALL(ncclRecv(NULL, SIZE_MAX, (ncclDataType_t)77, 1 << 30, NULL, s));
  CALL(ncclAllGatherConfig(buf, out, 64, (ncclDataType_t)99, NULL, s, &cc));

  /* groups after failed inits and with failing calls inside */
  CALL(ncclGroupStart());
  CALL(ncclAllReduce(buf, out, 64, ncclFloat32, ncclSum, NULL, s));
  CALL(ncclSend(buf, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclRecv(out, 64, ncclFloat32, 0, NULL, s));
  CALL(ncclGroupEnd());
  CALL(ncclGroupEnd()); /* one too many, unless a failed call left NCCL's group depth raised */
  CALL(ncclGroupStart());
  CALL(ncclGroupStart());
  CALL(ncclGroupEnd());
  CALL(ncclGroupEnd());

  /* a comm init after all of that fails the same way */
  CALL(ncclCommInitRank(&comm, 1, id, 0));
  printf("last at end '%s'\n", ncclGetLastError(NULL));
  return 0;
}
