/*
 * libc4d.so's own C API (besides the NCCL symbols it interposes). Safe to call from any
 * thread, in any process the library is loaded into (with or without NCCL).
 */
#ifndef C4D_API_H
#define C4D_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "c4d <version> (rev 0x<git rev>, schema <n>)"; static storage. */
const char* c4d_version(void);

/* Records handed to ZeroMQ and records dropped so far in this process (either pointer
 * may be NULL). */
void c4d_stats(uint64_t* sent, uint64_t* dropped);

/* Staged hang threshold (c4d.hang_timeout in Python): from now on, a hang in which this
 * process is the rank the others wait for is diagnosed after `timeout_us` µs instead of
 * C4D_HANG_TIMEOUT; -1: no hang diagnosis while it lasts; 0: back to the job's value.
 * Any thread, any time (before NCCL is initialised too): a few atomic stores, no lock,
 * no allocation; the value reaches the master with the agent's next poll (a STAGE record). */
void c4d_set_hang_timeout(int64_t timeout_us);

/* The value last set (0 when never set). */
int64_t c4d_hang_timeout(void);

#ifdef __cplusplus
}
#endif

#endif /* C4D_API_H */
