"""A finished trace, judged and shown: ``analyze`` (load any format, replay it through the
edge and the engine, DataFrames and streamed passes; its documented names are re-exported by
the facade ``c4d.analyze``), ``report`` (the HTML report), ``perfetto`` (Chrome/Perfetto trace
export). Imports ``c4d.formats``, ``c4d.intake``, ``c4d.engine``, ``c4d.record`` and
``c4d.util``; never the live master's modules or ZeroMQ (tests/test_engine_layering.py).
"""
