"""Readers for outputs that other tools write (nccl-tests text and JSON, ...).

Each reader is a plain function from text to frozen dataclasses / DataFrames, independent of the
command that uses it, so ``c4d check nccl`` and ``c4d analyze --format nccl-tests`` share it.
"""
