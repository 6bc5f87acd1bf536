"""Untrusted records on their way in: ``validate`` (the edge: every record checked and
rewritten before the engine or the bookkeeping sees it, with the limits that bound what a
sender can make the master hold), ``ingest`` (a batch through the edge into the engine, failures
counted and logged at a bounded rate), ``received`` (what each rank and node has sent). Shared by
the live master, the node agent and the offline replay. Imports ``c4d.engine`` (the edge charges
a communicator what the engine's tables will hold), ``c4d.record`` and ``c4d.util``; no file
format, no network, no report.
"""
