"""The record and its files: what a rank sends and how it is kept, nothing that judges it.

``schema`` (the wire record's layout, kinds, ops, flags), ``names`` (the one sanitizer for
strings from the wire), ``columns`` (a batch of records as typed columns), ``opstats``
(nccl-tests' bandwidth formulas on a record's op and bytes), ``wire`` (the message framing a
sender and the collector share), ``framing`` and ``trace`` (the trace file: CRC-checked batches,
the writer, the readers). The floor of the pipeline: it imports only ``c4d.util``, and
importing it loads no engine, no pandas, no ZeroMQ (tests/test_engine_layering.py).
"""
