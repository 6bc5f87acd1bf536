"""The live master: ``master`` (the loop: collector -> edge -> engine -> incidents, the trace,
the actions), ``collector`` (the ZeroMQ socket and its untrusted messages), ``engine_process``
(the engine in a child process), ``metrics`` (Prometheus), ``live`` (the terminal view),
``curve`` (the CURVE key pair), ``status`` (the status endpoint). Imports ``c4d.intake``,
``c4d.engine``, ``c4d.actions``, ``c4d.record`` and ``c4d.util``; never the offline analysis
or the command line (tests/test_engine_layering.py).
"""
