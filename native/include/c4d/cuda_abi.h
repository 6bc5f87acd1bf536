/*
 * The CUDA runtime subset c4d uses, declared by hand so that nothing links CUDA.
 * libc4d.so resolves these at run time (dlsym), so it loads in a process with no
 * CUDA at all; simnccl implements them on the CPU.
 */
#ifndef C4D_CUDA_ABI_H
#define C4D_CUDA_ABI_H

#include <stddef.h>

#include "c4d/nccl_abi.h" /* cudaStream_t, cudaEvent_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t; /* 0 = cudaSuccess, 600 = cudaErrorNotReady */
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
#define C4D_CUDA_SUCCESS 0
#define C4D_CUDA_ERROR_NOT_READY 600
#define C4D_CUDA_ERROR_INVALID_VALUE 1

#define cudaEventDefault 0x00u
#define cudaEventBlockingSync 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u

/* enum cudaStreamCaptureMode / cudaStreamCaptureStatus (passed as int) */
#define C4D_CUDA_CAPTURE_MODE_GLOBAL 0
#define C4D_CUDA_CAPTURE_MODE_THREAD_LOCAL 1
#define C4D_CUDA_CAPTURE_MODE_RELAXED 2
#define C4D_CUDA_CAPTURE_STATUS_NONE 0
#define C4D_CUDA_CAPTURE_STATUS_ACTIVE 1
#define C4D_CUDA_CAPTURE_STATUS_INVALIDATED 2

enum cudaMemcpyKind_c4d { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                          cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

typedef cudaError_t (*c4d_cudaEventCreateWithFlags_t)(cudaEvent_t*, unsigned int);
typedef cudaError_t (*c4d_cudaEventRecord_t)(cudaEvent_t, cudaStream_t);
typedef cudaError_t (*c4d_cudaEventQuery_t)(cudaEvent_t);
typedef cudaError_t (*c4d_cudaEventElapsedTime_t)(float*, cudaEvent_t, cudaEvent_t);
typedef cudaError_t (*c4d_cudaEventDestroy_t)(cudaEvent_t);
typedef cudaError_t (*c4d_cudaGetDevice_t)(int*);
typedef cudaError_t (*c4d_cudaSetDevice_t)(int);
typedef cudaError_t (*c4d_cudaStreamCreateWithFlags_t)(cudaStream_t*, unsigned int);
typedef cudaError_t (*c4d_cudaStreamGetDevice_t)(cudaStream_t, int*);
typedef cudaError_t (*c4d_cudaStreamIsCapturing_t)(cudaStream_t, int*);
typedef cudaError_t (*c4d_cudaThreadExchangeStreamCaptureMode_t)(int*);

#ifdef __cplusplus
}
#endif

#endif /* C4D_CUDA_ABI_H */
