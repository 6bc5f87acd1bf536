/*
 * Stand-in for the CUDA runtime header, just enough for NVIDIA's nccl.h (the nvidia-nccl-cu12
 * wheel) to compile with a plain host compiler: the wheel's real cuda_runtime.h needs nvcc's
 * crt/ headers and CCCL's <nv/target>, which no light wheel ships. The two typedefs are the
 * ones of driver_types.h in nvidia-cuda-runtime-cu12 (tests/test_conformance_real_nccl.py
 * checks they still are); CUDART_VERSION only picks which headers nccl.h includes.
 */
#ifndef C4D_TEST_CUDA_RUNTIME_STUB_H
#define C4D_TEST_CUDA_RUNTIME_STUB_H
#include <stddef.h>
#define CUDART_VERSION 12090
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif
