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

#ifdef __cplusplus
}
#endif

#endif /* C4D_API_H */
