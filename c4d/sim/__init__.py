"""Simulated jobs for tests, demos and benchmarks: ``sim`` (a job of simnccl ranks under the
shim, with a master or an agent), ``faults`` (the fault specs they inject), ``scenarios``
(named jobs with the diagnosis each must give), ``demo`` (``c4d demo``). Imports the master,
the node agent and everything below them, and ``c4d.cli_common`` (exit statuses); not the
command line itself, ``c4d run`` or ``c4d check``.
"""
