/*
 * simnccl extensions: what a simulated training loop needs beyond the NCCL API and the
 * CUDA runtime subset. Exported by simnccl's libnccl.so.2 only; real NCCL has none of
 * these, so only the sim driver (c4d-simtrain) calls them.
 */
#ifndef SIMNCCL_SIM_EXT_H
#define SIMNCCL_SIM_EXT_H

#include <stdint.h>

#include "c4d/cuda_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Duration that never ends: the "kernel" occupies its stream forever (a hung kernel). */
#define SIM_COMPUTE_FOREVER UINT64_MAX

/* Queue a "kernel" on `stream` that keeps the stream busy for `duration_ns` of wall time
 * once the stream reaches it. Returns at once, like a kernel launch. */
cudaError_t simLaunchCompute(cudaStream_t stream, uint64_t duration_ns);

/* The driver tells the current training step (host side, before issuing the step's
 * work). Collectives issued from now on carry this step; comm faults of SIMNCCL_FAULTS
 * apply to collectives whose step is >= the fault's step=. */
void simSetStep(int step);

#ifdef __cplusplus
}
#endif

#endif /* SIMNCCL_SIM_EXT_H */
