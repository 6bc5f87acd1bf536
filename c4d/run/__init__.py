"""``c4d run``: launch a training job with the shim preloaded and supervise it.

One ``c4d run`` per node. It starts the job's processes (``launcher``), keeps their output
with a timestamp and the node name without masking their exit status (``logs``), hosts
the master the ranks report to, or follows an external one (``diagnoses``), watches for
silent and half-exited jobs (``watch``), dumps the stacks of hung ranks (``stacks``,
``evidence``), isolates the culprit node (``c4d.actions``), and decides whether to restart
(``policy``). ``supervisor`` is the loop that ties them together; ``cli`` its options.
See docs/run.md.
Imports the master, the node agent, ``c4d.actions`` and everything below them; not the command line
(``c4d.cli_common`` aside: exit statuses, the parser).
"""
