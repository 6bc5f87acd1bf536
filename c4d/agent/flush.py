"""How often a node agent forwards to the master: the master's share of the job's messages.

Every agent's flush is one message (or a few) at the master, and a message costs the master's
loop about 3.5 us whatever it holds (libzmq's and pyzmq's per-message work: the frame, the
pipes' activation; docs/performance.md, Scale), besides what its records cost. At 100 ms
and 2,048 nodes (16,384 ranks of 8 GPUs) that is 20,480 messages a second of about 25 records
each, a fifth of what the master's loop spends on that job. So the period grows with the job
until all agents together send at most ``MASTER_MESSAGES_PER_S``: 100 ms up to 1,000 nodes,
205 ms at 2,048, 820 ms at 8,192.

What waits for a flush is bounded in bytes as well (``FLUSH_BYTES``): a node's records of
several seconds, a flood's of a moment. A flood (a forged REGISTER can claim a world that
lengthens the period to its cap) is then summarised and forwarded in pieces of that size
whatever the period, and the agent's working set stays what it was at 100 ms.

A flush delays a rank's records by up to its period, so the period stays within one heartbeat
of the job (C4D_HEARTBEAT_MS, from REGISTER): a rank's evidence reaches the master at least
every two heartbeats, inside the master's staleness bound (two heartbeats and 250 ms), and the
hang timeout (C4D_HANG_TIMEOUT, 10 s by default) is never the smaller figure. ``c4d agent
--flush-ms`` fixes it instead.
"""

from __future__ import annotations

MASTER_MESSAGES_PER_S = 10_000  # what all the job's agents send the master together, at most
FLUSH_MIN_S = 0.1  # a small job's agents: records at most this late
FLUSH_MAX_S = 1.0
# flushed early past this: 32,768 records, 7 s of a node of 8 ranks at 500 collectives a second
FLUSH_BYTES = 4 << 20


def flush_period_s(world: int, local: int, heartbeat_ms: int) -> float:
    """The agent's period for a job of ``world`` ranks, ``local`` of them on its node (so
    world / local nodes, each with an agent), whose ranks send a heartbeat every
    ``heartbeat_ms`` (0 or less: not known)."""
    nodes = -(-max(world, 1) // max(local, 1))
    top = min(FLUSH_MAX_S, heartbeat_ms / 1000) if heartbeat_ms > 0 else FLUSH_MAX_S
    return max(FLUSH_MIN_S, min(top, nodes / MASTER_MESSAGES_PER_S))
