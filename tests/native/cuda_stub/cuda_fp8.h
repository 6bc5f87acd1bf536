/* Stand-in (see cuda_runtime.h here): nccl.h includes it but its host API uses none of it. */
