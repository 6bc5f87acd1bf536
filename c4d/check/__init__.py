"""``c4d check``: node health before a job starts and after it fails.

* ``boot`` (``boot.py``): disk tests, GPU count/type, CUDA/PyTorch/NCCL versions, an all-reduce;
* ``nccl`` (``nccl.py``): nccl-tests bandwidth, parsed by ``c4d.formats.nccl_tests``;
* ``troubleshoot``: both, ending in the restart line or the failed nodes;
* ``nodes`` (``nodes.py`` + ``pairing.py``): pairwise GEMM + all-gather rounds that name the bad or
  straggling node; across hosts (one worker per host, torchrun/srun/a Job) in ``multihost.py``.

torch is optional: without it the torch-based checks say "not available" instead of failing
to import. The CLI glue is ``cli.add_parser``.
Imports ``c4d.formats``, ``c4d.engine``, ``c4d.actions`` and ``c4d.cli_common`` (the parser, exit
statuses); not the top command.
"""
