/*
 * The CUDA runtime, found at run time so that libc4d.so loads in a process with no CUDA.
 * Looked up once, at the first communicator init (by then the application has loaded
 * its runtime): dlsym(RTLD_DEFAULT), then an already-loaded libcudart.so.12 / .13 /
 * libcudart.so (RTLD_NOLOAD: we never load a second runtime). simnccl's libnccl.so.2
 * exports the same names, so the simulator is found by the first step.
 * Absent → no device timing: records carry host times only.
 */
#ifndef C4D_SHIM_CUDA_RT_H
#define C4D_SHIM_CUDA_RT_H

#include "c4d/cuda_abi.h"

namespace c4d {

struct CudaRt {
  bool ok;  // every required function found
  c4d_cudaEventCreateWithFlags_t eventCreateWithFlags;
  c4d_cudaEventRecord_t eventRecord;
  c4d_cudaEventQuery_t eventQuery;
  c4d_cudaEventElapsedTime_t eventElapsedTime;
  c4d_cudaEventDestroy_t eventDestroy;
  c4d_cudaGetDevice_t getDevice;
  c4d_cudaSetDevice_t setDevice;
  c4d_cudaStreamCreateWithFlags_t streamCreateWithFlags;
  c4d_cudaStreamIsCapturing_t streamIsCapturing;  // optional: ops on capturing streams are recognised
  c4d_cudaThreadExchangeStreamCaptureMode_t exchangeCaptureMode;  // optional: the agent's relaxed mode
};

extern CudaRt g_cuda;

/* Resolves g_cuda once; true when device timing is possible. Called under the init
 * mutex (comm init), so no other synchronisation. */
bool cuda_rt_resolve();

/* The calling thread's current device, -1 without CUDA. */
int cuda_current_device();

/* Agent thread only: makes `device` current before a CUDA call about its events or
 * anchors. A thread that never called cudaSetDevice runs on device 0, and the runtime's
 * first call there creates a context on GPU 0 (hundreds of MiB) in every rank. The first
 * call also puts the agent thread in relaxed stream-capture mode. False when the device
 * can't be made current: then the caller makes no CUDA call for it. */
bool cuda_agent_device(int device);

/* The agent starts on a fresh thread (also after a fork): nothing is current yet. */
void cuda_agent_reset();

}  // namespace c4d

#endif  // C4D_SHIM_CUDA_RT_H
