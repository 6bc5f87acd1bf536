/*
 * The shim's side of `c4d run` and of `c4d.hang_timeout` (the training code's staged hang
 * thresholds).
 *
 *  application thread                          agent thread
 *  c4d_set_hang_timeout(us)  (c4d_api.h)       stage_poll: generation changed → a STAGE record
 *    3 relaxed/release atomic stores,          stage_repeat: with every REGISTER repeat, the
 *    one clock read: no lock, no allocation      current value again (a master that started late)
 *
 * and, once when the agent starts, `prctl(PR_SET_PTRACER, $C4D_PTRACER_PID)`: under Yama
 * ptrace_scope=1 only a process's ancestors may ptrace it, and the stack dumpers `c4d run`
 * starts are not ancestors of a rank that a launcher (torchrun, c4d sim) started.
 */
#ifndef C4D_SHIM_RUN_SUPPORT_H
#define C4D_SHIM_RUN_SUPPORT_H

#include "profiler.h"  // RecordSink

namespace c4d {

/* Agent, every loop: a STAGE record when the training code changed the value. True if sent. */
bool stage_poll(RecordSink emit);

/* Agent, with every REGISTER repeat: the value again, if the training code ever set one. */
void stage_repeat(RecordSink emit);

/* Agent start: declare $C4D_PTRACER_PID (c4d run) our ptracer, when it is set. */
void declare_ptracer();

/* Fork child: the value stays (it is the code's), it is sent again by the child's agent. */
void stage_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_RUN_SUPPORT_H
