/*
 * The agent: the shim's one background thread (see the diagram at the top of agent.cc).
 */
#ifndef C4D_SHIM_AGENT_H
#define C4D_SHIM_AGENT_H

namespace c4d {

/* Starts the agent thread (all signals blocked in it and in ZeroMQ's threads). Caller
 * holds g_init_mutex; the op pool is initialised. False when the thread can't start. */
bool agent_start();

/* At exit (atexit handler, any thread): stops recording, lets the agent drain, send a
 * FINAL heartbeat and flush for at most C4D_EXIT_FLUSH_MS, then prints the summary
 * line. Never waits longer than that plus kExitMarginMs, whatever the master does
 * (absent, unreachable, never reading): tests/test_reliability_shim.py measures it. */
void agent_shutdown();
constexpr int kExitMarginMs = 50;  // the agent's wake-up and last pass, beyond its flush budget

/* Fork child: the agent thread does not exist here; forget its state. */
void agent_reset_after_fork();

}  // namespace c4d

#endif  // C4D_SHIM_AGENT_H
