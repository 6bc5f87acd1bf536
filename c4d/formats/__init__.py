"""Readers for outputs that other tools write (nccl-tests text and JSON, ...).

Each reader is a plain function from text to frozen dataclasses / DataFrames, independent of the
command that uses it, so ``c4d check nccl`` and ``c4d analyze --format nccl-tests`` share it.
Imports ``c4d.record`` and ``c4d.util``, and ``c4d.engine``'s types only inside the functions that
build a diagnosis: importing a reader loads no engine.
"""
