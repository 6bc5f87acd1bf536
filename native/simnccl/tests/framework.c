/*
 * Test-only stand-in for a framework library with NCCL linked in statically (a source build
 * of PyTorch: libtorch_cuda.so carries NCCL and is dlopen'ed RTLD_LOCAL by Python). Built
 * with simnccl's objects inside (native/simnccl/CMakeLists.txt: libsimnccl-framework.so);
 * the NCCL entry points are exported, and this file calls them through the PLT, as such a
 * library does, so an LD_PRELOADed interposer receives the calls and must find the real
 * functions inside this library (tests/test_shim.py).
 */
#include <stddef.h>

#include "c4d/cuda_abi.h"
#include "c4d/nccl_abi.h"

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);

/* One rank: init, `n` all-reduces of 64 floats (checked), destroy. 0 or the first failure. */
__attribute__((visibility("default"))) int framework_allreduce_loop(int n) {
  ncclUniqueId id;
  ncclComm_t comm;
  cudaStream_t s;
  float in[64], out[64];
  ncclResult_t r;
  for (int i = 0; i < 64; ++i) in[i] = (float)i;
  if ((r = ncclGetUniqueId(&id)) != ncclSuccess) return 100 + (int)r;
  if ((r = ncclCommInitRank(&comm, 1, id, 0)) != ncclSuccess) return 200 + (int)r;
  if (cudaStreamCreate(&s) != 0) return 300;
  for (int k = 0; k < n; ++k)
    if ((r = ncclAllReduce(in, out, 64, ncclFloat32, ncclSum, comm, s)) != ncclSuccess) return 400 + (int)r;
  if (cudaStreamSynchronize(s) != 0) return 500;
  for (int i = 0; i < 64; ++i)
    if (out[i] != in[i]) return 600;
  if ((r = ncclCommDestroy(comm)) != ncclSuccess) return 700 + (int)r;
  cudaStreamDestroy(s);
  return 0;
}
