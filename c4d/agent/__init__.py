"""The node agent (``c4d agent``, and ``c4d run``'s per node): between a node's ranks and the
master. ``agent`` (the loop: receive, the edge, summarise, forward), ``summary`` (what it sends
instead of the raw stream), ``heartbeats`` and ``peers`` (which of those records it forwards),
``replay`` (a recorded trace through agents' summarisers, compared with the direct replay).
Imports the master's collector and status, the offline replay, ``c4d.intake``, ``c4d.engine``,
``c4d.record`` and ``c4d.util``.
"""
