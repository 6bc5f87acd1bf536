/*
 * Element-wise reductions for the collectives: sum, prod, max, min, avg over
 * int8/uint8/int32/uint32/int64/uint64, float16, bfloat16, float32, float64.
 * Inputs are combined in rank order 0..n-1, so every rank computes bit-identical
 * results. float16/bfloat16 accumulate in float and round once (to nearest even).
 */
#ifndef SIMNCCL_REDUCE_H
#define SIMNCCL_REDUCE_H

#include <cstddef>

namespace sim {

/* Can (dtype, redop) be reduced? (fp8 types cannot.) */
bool reducible(int dtype, int redop);

/* out[i] = op over r of ins[r][i], i < count. `out` must not alias any input. */
void reduce_n(void* out, const void* const* ins, int n, size_t count, int dtype, int redop);

}  // namespace sim

#endif  // SIMNCCL_REDUCE_H
